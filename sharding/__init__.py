"""jaxfeed sharding: the one place where host batches become device arrays.

Mesh construction, NamedSharding placement of process-local batches (one
device, many devices, many hosts), the prefetching device feed, and the check
that the processes of a job agree before they train.

- `mesh`: `data_mesh`, `batch_sharding`, `DATA_AXIS`.
- `placement`: `place_batch` and its checks.
- `prefetch`: `DeviceFeed`.
- `job`: the multi-process job (`initialize`, `check_agreement`).
"""

from jaxfeed.sharding.job import announce_failure, check_agreement, initialize
from jaxfeed.sharding.mesh import DATA_AXIS, batch_sharding, data_mesh
from jaxfeed.sharding.placement import place_batch
from jaxfeed.sharding.prefetch import DeviceFeed

__all__ = [
    "DATA_AXIS",
    "DeviceFeed",
    "announce_failure",
    "batch_sharding",
    "check_agreement",
    "data_mesh",
    "initialize",
    "place_batch",
]

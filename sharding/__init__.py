"""jaxfeed sharding: the one place where host batches become device arrays.

Mesh construction, NamedSharding placement of process-local batches (one
device, many devices, many hosts), and the prefetching device feed.
"""

from sharding.distributed import initialize
from sharding.mesh import DATA_AXIS, batch_sharding, data_mesh
from sharding.placement import place_batch
from sharding.prefetch import DeviceFeed

__all__ = [
    "DATA_AXIS",
    "DeviceFeed",
    "batch_sharding",
    "data_mesh",
    "initialize",
    "place_batch",
]

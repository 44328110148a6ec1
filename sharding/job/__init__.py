"""The multi-process job: joining it, its roll call, its processes agreeing.

- `distributed`: `initialize`, joining a multi-process job, and leaving it at once.
- `roll_call`: process 0's roll call, each process claiming its id.
- `agreement`: `check_agreement`, the processes comparing their settings.
"""

from jaxfeed.sharding.job.agreement import announce_failure, check_agreement
from jaxfeed.sharding.job.distributed import initialize

__all__ = ["announce_failure", "check_agreement", "initialize"]

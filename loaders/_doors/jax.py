"""JAX's door: the coordination service of a multi-process job.

Checked against jax 0.10.2 (the pin in ``constraints.txt``). jax is imported
inside the function: `jaxfeed.loaders` imports no JAX at module top level.
"""

from __future__ import annotations

from typing import Any


def distributed_state() -> Any:
    """JAX's distributed state: ``.client`` (the coordination-service client,
    None when no job was joined), ``.process_id``, ``.num_processes``.

    JAX has no public handle on the client; its own ``multihost_utils`` reads
    the same ``jax._src.distributed.global_state``.
    """
    from jax._src import distributed

    return distributed.global_state

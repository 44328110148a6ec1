"""What a process leaving through ``os._exit`` must end first: the one
interface the multi-process job uses of the workers."""

from __future__ import annotations

from jaxfeed.loaders._workers.shared_batches import remove_all
from jaxfeed.loaders._workers.spawn import kill_children

__all__ = ["end_workers_and_batches"]


def end_workers_and_batches() -> None:
    """Kills and reaps every worker process this process started and removes
    its batch directories in shared memory: ``os._exit`` runs no ``close()``
    and no exit hook, so none would outlive it otherwise."""
    kill_children()
    remove_all()

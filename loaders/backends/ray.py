"""Ray: per-record transforms as Ray tasks, on a cluster's CPUs.

With a transform, the rows go into Ray's object store once (an on-disk field
as where it lies: every node maps the file itself), and the transform once;
each Ray worker deserializes them once and keeps them for every later task.
Each batch of the shared sampler's order is one task; a bounded window of
tasks is in flight and their results are taken in order, so the batches are
byte-identical to the numpy backend's. Ray retries a task whose worker died
(a lost node costs time, not data); one it gives up on is one error naming
the rows and epoch. A task's batch comes back as read-only views of the
object store (no copy in this process).

Without a transform there is no per-record work to send out: the rows are in
this process (or mapped from its files), so one gather here, as the numpy
backend does, beats a task whose batch would travel back through the object
store; no cluster is contacted.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from jaxfeed.loaders._workers import ray_instance
from jaxfeed.loaders.backends.sampled_source import SampledSource
from jaxfeed.loaders.checks import check_int
from jaxfeed.loaders.data.catalog import ArrayDataset
from jaxfeed.loaders.rows import ArrayRows
from jaxfeed.loaders.sampler import Sampler
from jaxfeed.loaders.transform import RecordTransform

# How often Ray runs a task again after its worker or node died.
MAX_RETRIES = 3

# Tasks in flight per CPU of the cluster: one running, one queued behind it.
_TASKS_PER_CPU = 2


# In a Ray worker: the rows and transform of the last source it served, by
# their object ids. Ray deserializes a task's arguments for every task (for the
# decode workload, ~7 ms of 18 MB of rows against ~65 ms of work per batch);
# a worker process serves many tasks, so it does that once.
_SHARED: dict[tuple[str, str], tuple[ArrayRows, RecordTransform]] = {}


def _read_batch(refs: list, indices: np.ndarray, epoch: int) -> dict[str, np.ndarray]:
    """In a Ray worker: one batch, read and transformed (the task's body).
    ``refs`` (rows, transform) come in a list, so Ray passes them unresolved."""
    import ray

    key = (refs[0].hex(), refs[1].hex())
    if key not in _SHARED:
        _SHARED.clear()  # one source at a time: an older one's rows are let go
        _SHARED[key] = tuple(ray.get(refs))
    rows, transform = _SHARED[key]
    return transform.batch(rows.read_batch(indices), indices, epoch)


class RaySource(SampledSource):
    """Batches transformed by Ray tasks, in the shared sampler's order; without
    a transform, gathered in this process (nothing for Ray to do).

    Args:
      dataset, sampler, transform: as for every backend.
      num_workers: CPUs of a local instance started here, and so the tasks
        in flight (two per CPU); 0: this machine's CPUs, or the CPUs of the
        cluster joined.
      ray_address: the cluster to join (else ``RAY_ADDRESS``, else a local
        instance started on first use and shut down at exit).
      connect_timeout_s: how long that cluster has to answer, at the first
        epoch with a transform (else ``$JAXFEED_RAY_CONNECT_TIMEOUT``, else 30);
        then the epoch raises ``ConnectionError`` naming the address.

    Raises:
      ValueError: ``num_workers`` is not an int >= 0, or ``connect_timeout_s``
        not a number of seconds > 0.
    """

    def __init__(
        self,
        dataset: ArrayDataset,
        sampler: Sampler,
        transform: RecordTransform | None = None,
        num_workers: int = 0,
        ray_address: str | None = None,
        connect_timeout_s: float | None = None,
    ):
        super().__init__(dataset, sampler, transform=transform)
        self.num_workers = check_int("the ray option num_workers", num_workers, 0)
        self.ray_address = ray_address
        if connect_timeout_s is not None:
            connect_timeout_s = ray_instance.connect_timeout(connect_timeout_s)
        self.connect_timeout_s = connect_timeout_s
        self.rows = ArrayRows(dataset.arrays)
        self._refs: tuple[Any, Any] | None = None  # (rows, transform) in the object store
        self._task: Any = None

    def _connect(self) -> Any:
        """Ray, connected; the rows and the transform put in its object store once."""
        ray = ray_instance.connect(
            self.ray_address, self.num_workers or None, timeout_s=self.connect_timeout_s
        )
        if self._refs is None:
            # Put, not passed with every task: one copy serves every task on a node.
            self._refs = (ray.put(self.rows), ray.put(self.transform))
            self._task = ray.remote(max_retries=MAX_RETRIES)(_read_batch)
        return ray

    def _window(self, ray: Any) -> int:
        cpus = self.num_workers or int(ray.cluster_resources().get("CPU", 1))
        return max(1, _TASKS_PER_CPU * cpus)

    def _gathers_here(self) -> bool:
        return self.transform is None  # with one, Ray's tasks gather the rows

    def _fetch(
        self, index_batches: Sequence[np.ndarray], epoch: int
    ) -> Iterator[Mapping[str, np.ndarray]]:
        if self.transform is None:
            for indices in index_batches:
                yield self.rows.read_batch(indices)
            return
        ray = self._connect()
        window = self._window(ray)
        refs = list(self._refs)
        pending: collections.deque = collections.deque()
        todo = iter(index_batches)
        # Closed early, the tasks still in flight are let run and their results
        # dropped with their refs, not cancelled: ray.cancel on a task that is
        # finishing at that moment ends this process (Ray 2.x, "Tried to complete
        # task that was not pending"), and a window holds at most 2 tasks a CPU.
        for indices in todo:
            pending.append((indices, self._task.remote(refs, indices, epoch)))
            if len(pending) >= window:
                yield _result(ray, *pending.popleft(), epoch)
        while pending:
            yield _result(ray, *pending.popleft(), epoch)

    def close(self) -> None:
        """Drops the object-store copies; the next epoch puts them again."""
        self._refs = None
        super().close()


def _result(ray: Any, indices: np.ndarray, ref: Any, epoch: int) -> Mapping[str, np.ndarray]:
    """A task's batch; its failure as the transform's own error, or as one
    error naming the rows when Ray gave up on it."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as err:
        cause = err.cause
        raise (cause if isinstance(cause, Exception) else err) from None
    except ray.exceptions.RayError as err:
        rows = np.asarray(indices)
        raise RuntimeError(
            f"Ray gave up on the batch of rows {rows[:8].tolist()}"
            f"{'...' if len(rows) > 8 else ''} ({len(rows)} rows) of epoch {epoch} after "
            f"{MAX_RETRIES} retries: {type(err).__name__}: {err}. The run can resume from "
            "its last checkpoint once the cluster is back"
        ) from err


OPTIONS: tuple[str, ...] = ("num_workers", "ray_address", "connect_timeout_s")


def build(dataset: ArrayDataset, sampler: Sampler, **options) -> RaySource:
    """The backend's `BatchSource`; ``loaders.make`` has checked ``options``
    against `OPTIONS`."""
    return RaySource(dataset, sampler, **options)

"""torch DataLoaders that serve epochs, their worker processes watched.

The torch backend and ``loaders.wrap`` of a torch map-style dataset both
read through `EpochLoaders`: one DataLoader per epoch, or one whose
persistent workers serve every epoch. `iterate` turns a worker that dies
(killed, out of memory) into an error within a fraction of a second, on
any thread.
"""

from __future__ import annotations

import multiprocessing
import queue
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from jaxfeed.loaders._doors.torch import loader_workers
from jaxfeed.loaders._io.read_ahead import END, pump
from jaxfeed.loaders._workers.spawn import raise_if_dead, reported_start

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

# How often a reader waiting for a batch checks that the workers still run.
_POLL_SECONDS = 0.1


def keep_batch(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``collate_fn``: ``__getitems__`` already returns the collated batch.

    Workers send it back as numpy arrays, pickled through a pipe: for batches
    of this size (~100 KB) that measured ~4x faster than torch tensors, each of
    which torch moves into a fresh shared-memory segment.
    """
    return batch


class _EpochBatches:
    """A DataLoader ``batch_sampler`` whose index batches are swapped per epoch,
    so one DataLoader (and its persistent workers) serves every epoch."""

    def __init__(self) -> None:
        self.batches: Sequence[Any] = ()

    def __iter__(self) -> Iterator[Any]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


class EpochLoaders:
    """Iterates one epoch's index batches at a time through DataLoaders over
    ``dataset``: a new DataLoader per epoch, or, when its workers are
    persistent, one DataLoader (and its workers) shared by every epoch.

    An epoch begun while another still reads the shared loader gets a
    DataLoader (and workers) of its own, as Grain's backend does. The first
    start of spawned workers is reported once (`reported_start`).

    Both the torch backend and ``loaders.wrap`` of a torch map-style dataset
    read through it. ``loader_options`` are DataLoader arguments other than
    the dataset and ``batch_sampler``.
    """

    def __init__(self, dataset: Any, **loader_options: Any):
        self._dataset, self._options = dataset, loader_options
        self._plan = _EpochBatches()
        persistent = loader_options.get("persistent_workers")
        self._shared = self._loader(self._plan) if persistent else None
        self._busy = False  # the shared loader is serving an epoch
        self._reported = False  # the workers' first start

    def _loader(self, batch_sampler: Iterable[Any], **change: Any) -> DataLoader:
        from torch.utils.data import DataLoader  # the user of this module has torch

        options = {**self._options, **change}
        return DataLoader(self._dataset, batch_sampler=batch_sampler, **options)

    def __call__(self, batches: Sequence[Any]) -> Iterator[Any]:
        """The batches of ``batches`` (index lists), read in order."""
        if self._shared is None:
            return self._iterate(self._loader(batches), shared=False)
        if self._busy:  # another epoch reads the shared workers: this one gets its own
            return self._iterate(self._loader(batches, persistent_workers=False), shared=False)
        self._plan.batches = batches
        return self._iterate(self._shared, shared=True)

    def _iterate(self, loader: DataLoader, shared: bool) -> Iterator[Any]:
        if shared:
            self._busy = True
        try:
            batches = iterate(loader)
            if loader.num_workers and not self._reported:
                self._reported = True
                what = f"{loader.num_workers} torch workers"
                context, persistent = loader.multiprocessing_context, loader.persistent_workers
                batches = reported_start(batches, what, context, persistent)
            yield from batches
        finally:
            if shared:
                self._busy = False


def iterate(loader: DataLoader) -> Iterator[Any]:
    """Iterates ``loader``; a worker process that dies is a RuntimeError
    within about ``_POLL_SECONDS``, whichever thread iterates.

    torch notices a dead worker through a SIGCHLD handler it can install on
    the main thread only, and otherwise by a 5 s check that never runs once
    a worker was killed while sending a batch: the half-written batch stays
    in the pipe and reading it blocks forever. So a helper thread reads the
    batches, and this generator waits for them, watching the workers.
    """
    if loader.num_workers == 0:
        yield from loader
        return
    batches = iter(loader)
    workers = _worker_processes(batches)
    if not workers:  # torch's internals changed: iterate unwatched (tests catch it)
        yield from batches
        return
    results: queue.Queue = queue.Queue(maxsize=1)
    stop = threading.Event()
    reader = threading.Thread(
        target=pump, args=(batches, results, stop), name="jaxfeed-torch-reader", daemon=True
    )
    del batches  # only the reader holds the iterator, so its end shuts the workers down
    reader.start()
    try:
        while True:
            try:
                batch, error = results.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                raise_if_dead(workers, "DataLoader worker", "a smaller prefetch_factor")
                continue
            if error is not None:
                raise error
            if batch is END:
                return
            yield batch
    except GeneratorExit:
        # Closed early. Persistent workers serve the next epoch from the same
        # iterator: let the reader finish its batch first, unless a worker has
        # exited (a dead one can stick the reader for good).
        stop.set()
        while reader.is_alive() and all(w.exitcode is None for w in workers):
            reader.join(_POLL_SECONDS)
        raise
    finally:
        stop.set()  # on an error, including Ctrl-C, the reader is left to stop alone


def _worker_processes(batches: Iterator[Any]) -> list[multiprocessing.Process]:
    """The worker processes behind a DataLoader iterator.

    torch 2.13 has no public accessor: its multiprocessing iterator keeps
    them in ``_workers``. An iterator without it yields [] (not watched).
    """
    return loader_workers(batches)

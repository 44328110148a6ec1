"""PyTorch backend: a real ``torch.utils.data.DataLoader`` over a map-style Dataset.

Each batch is ONE vectorised numpy gather: the Dataset defines
``__getitems__`` (which torch's map-style fetcher calls with the whole index
batch when it exists) and the loader's ``collate_fn`` passes the result
through untouched: no per-sample reads, no per-sample collation, and the
batches stay numpy arrays (no round trip through torch tensors).

Workers (``num_workers > 0``) are started with ``multiprocessing_context=
"spawn"``: forking a process that already runs JAX/XLA threads can deadlock.
As with any spawn-based DataLoader, a script that iterates the loader at
module top level needs an ``if __name__ == "__main__":`` guard. A worker
that dies (killed, out of memory) is an error within a fraction of a
second on any thread: see `iterate`, which ``loaders.wrap`` uses too.
"""

from __future__ import annotations

import multiprocessing
import queue
import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
from jaxfeed.loaders import shared_batches
from jaxfeed.loaders.array_dataset import ArrayDataset
from jaxfeed.loaders.backends.sampled_source import SampledSource
from jaxfeed.loaders.data.on_disk import for_pickle, from_pickle
from jaxfeed.loaders.frameworks.torch import loader_workers
from jaxfeed.loaders.read_ahead import END, pump
from jaxfeed.loaders.sampler import Sampler
from jaxfeed.loaders.transform import RecordTransform
from jaxfeed.loaders.workers import (
    SPAWN,
    SPAWN_WITHOUT_MAIN,
    from_main,
    raise_if_dead,
    reported_start,
)
from torch.utils import data as torch_data

OPTIONS = ("order", "num_workers", "prefetch_factor", "persistent_workers")

# How often a reader waiting for a batch checks that the workers still run.
_POLL_SECONDS = 0.1


class ArrayTorchDataset(torch_data.Dataset):
    """Map-style torch Dataset over in-memory arrays (a dict of fields).

    Module-level and holding only numpy arrays, so it pickles into spawned
    workers. With a transform, an index batch comes as ``(epoch, indices)``
    and the transform runs here, in the DataLoader's workers, record by
    record; given a ``handoff`` directory, a worker hands the batch back as a
    file there (`jaxfeed.loaders.shared_batches`: megabytes of augmented
    batch through torch's pipe halved what 2 workers gave).
    """

    def __init__(
        self,
        arrays: Mapping[str, np.ndarray],
        transform: RecordTransform | None = None,
        handoff: str | None = None,
    ):
        self.arrays = dict(arrays)
        self.transform, self.handoff = transform, handoff
        self._rows = len(next(iter(self.arrays.values())))

    def __getstate__(self) -> dict:
        # Into a worker: an on-disk field as where it lies, not as all its bytes.
        return {**self.__dict__, "arrays": for_pickle(self.arrays)}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, arrays=from_pickle(state["arrays"]))

    def __len__(self) -> int:
        return self._rows

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        return {key: array[index] for key, array in self.arrays.items()}

    def __getitems__(self, indices: Sequence[int] | np.ndarray | tuple) -> dict[str, np.ndarray]:
        """The whole batch in one gather (torch's fetcher prefers this to
        ``__getitem__``), transformed when ``indices`` is ``(epoch, indices)``."""
        epoch = None
        if isinstance(indices, tuple):
            epoch, indices = indices
        indices = np.asarray(indices, dtype=np.int64)
        rows = {key: array[indices] for key, array in self.arrays.items()}
        if epoch is None:
            return rows
        batch = self.transform.batch(rows, indices, epoch)
        return (
            batch if self.handoff is None else _Handed(*shared_batches.write(batch, self.handoff))
        )


class _Handed(NamedTuple):
    """A batch a worker wrote to a file (`shared_batches.write`)."""

    path: str
    layout: shared_batches.Layout


def _keep_batch(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
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

    def _loader(self, batch_sampler: Iterable[Any], **change: Any) -> torch_data.DataLoader:
        options = {**self._options, **change}
        return torch_data.DataLoader(self._dataset, batch_sampler=batch_sampler, **options)

    def __call__(self, batches: Sequence[Any]) -> Iterator[Any]:
        """The batches of ``batches`` (index lists), read in order."""
        if self._shared is None:
            return self._iterate(self._loader(batches), shared=False)
        if self._busy:  # another epoch reads the shared workers: this one gets its own
            return self._iterate(self._loader(batches, persistent_workers=False), shared=False)
        self._plan.batches = batches
        return self._iterate(self._shared, shared=True)

    def _iterate(self, loader: torch_data.DataLoader, shared: bool) -> Iterator[Any]:
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


class TorchSource(SampledSource):
    """Batches read through a ``torch.utils.data.DataLoader``.

    Args:
      dataset, sampler, order: see `SampledSource`. ``order="native"`` uses
        ``DistributedSampler(num_replicas=process_count, rank=process_index,
        shuffle, seed, drop_last=drop_remainder)`` with ``set_epoch(epoch)``
        (torch seeds it with ``seed + epoch``), batched by ``BatchSampler``.
        As torch documents, with ``drop_remainder=False`` and several
        processes it repeats a few samples so every process gets as many.
      num_workers: DataLoader worker processes (spawned); 0 reads in the
        calling thread, the fastest for in-memory data.
      prefetch_factor: batches each worker loads ahead (needs ``num_workers > 0``).
      persistent_workers: keep the workers alive across epochs (needs
        ``num_workers > 0``); default: True with workers. Spawned workers
        import torch and your transform's modules as they start, seconds
        each, which every epoch would pay again. An epoch begun while
        another is still being read gets workers of its own.
      transform: see `SampledSource`; it runs in the Dataset, so in the
        DataLoader's workers.

    Raises:
      ValueError: an option of the wrong type or range, or a worker option
        without workers.
    """

    def __init__(
        self,
        dataset: ArrayDataset,
        sampler: Sampler,
        order: str = "sampler",
        *,
        num_workers: int = 0,
        prefetch_factor: int | None = None,
        persistent_workers: bool | None = None,
        transform: RecordTransform | None = None,
    ):
        super().__init__(dataset, sampler, order, transform)
        _check_option("num_workers", num_workers, int, 0)
        if prefetch_factor is not None:  # None: torch's default
            _check_option("prefetch_factor", prefetch_factor, int, 1)
        if persistent_workers is None:
            persistent_workers = num_workers > 0
        _check_option("persistent_workers", persistent_workers, bool)
        if num_workers == 0 and (prefetch_factor is not None or persistent_workers):
            name = "prefetch_factor" if prefetch_factor is not None else "persistent_workers"
            raise ValueError(
                f"{name} needs worker processes, but num_workers=0; "
                f"pass num_workers=2 (or more) or drop {name}"
            )
        handoff = None
        if transform is not None and num_workers:
            transform.check_picklable(f"torch's num_workers={num_workers}")
            handoff = shared_batches.make_directory()
            weakref.finalize(self, shared_batches.remove_directory, handoff)
        self.torch_dataset = ArrayTorchDataset(dataset.arrays, transform, handoff)
        self.num_workers = num_workers
        options: dict[str, Any] = {"num_workers": num_workers, "collate_fn": _keep_batch}
        if num_workers > 0:
            options.update(
                # Spawned: a fork of a process running JAX/XLA threads can deadlock; the
                # workers leave Ctrl-C to this process (`loaders.workers`) and skip the
                # main script (its JAX imports) unless the transform comes from it.
                multiprocessing_context=(
                    SPAWN if from_main(self.torch_dataset) else SPAWN_WITHOUT_MAIN
                ),
                prefetch_factor=prefetch_factor,
                persistent_workers=persistent_workers,
            )
        self._read = EpochLoaders(self.torch_dataset, **options)

    def _fetch(
        self, index_batches: Sequence[np.ndarray], epoch: int
    ) -> Iterator[Mapping[str, np.ndarray]]:
        if self.transform is None:
            return self._read(index_batches)
        # The workers' transform needs the epoch; their batches come back as files.
        batches = self._read([(epoch, indices) for indices in index_batches])
        return (shared_batches.collect(*b) if isinstance(b, _Handed) else b for b in batches)

    def _native_epoch(self, epoch: int) -> Iterator[Mapping[str, np.ndarray]]:
        s = self.sampler
        order = torch_data.DistributedSampler(
            self.torch_dataset,
            num_replicas=s.process_count,
            rank=s.process_index,
            shuffle=s.shuffle,
            seed=s.seed,
            drop_last=s.drop_remainder,
        )
        order.set_epoch(epoch)
        batches = torch_data.BatchSampler(order, s.batch_size, drop_last=s.drop_remainder)
        # DistributedSampler pads (or trims) to a multiple of the process count,
        # so every process gets ceil(ceil(N/P)/B) == ceil(N/(P*B)) batches (floor
        # likewise): the sampler's count, as multi-process training needs.
        assert len(batches) == s.num_batches, (len(batches), s.num_batches)
        return self._read(batches)


def _check_option(name: str, value: Any, kind: type, minimum: int | None = None) -> None:
    """Refuses a worker option of the wrong type, e.g. the string a mistyped
    ``--loader-option num_workers=2x`` gives."""
    # bool is an int subclass: num_workers=True is a mistake, not 1.
    if type(value) is kind and (minimum is None or value >= minimum):
        return
    want = f"an int >= {minimum}" if kind is int else f"a {kind.__name__}"
    raise ValueError(f"the torch option {name} must be {want}, got {value!r}")


def iterate(loader: torch_data.DataLoader) -> Iterator[Any]:
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


def build(dataset: ArrayDataset, sampler: Sampler, **options: Any) -> TorchSource:
    """The backend's `BatchSource`; ``loaders.make`` has checked ``options``
    against `OPTIONS`."""
    return TorchSource(dataset, sampler, **options)

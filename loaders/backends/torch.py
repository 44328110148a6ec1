"""PyTorch backend: a real ``torch.utils.data.DataLoader`` over a map-style Dataset.

Each batch is ONE vectorised numpy gather: the Dataset defines
``__getitems__`` (which torch's map-style fetcher calls with the whole index
batch when it exists) and the loader's ``collate_fn`` passes the result
through untouched: no per-sample reads, no per-sample collation, and the
batches stay numpy arrays (no round trip through torch tensors). A worker
hands each batch back in shared memory, not pickled through torch's pipe:
it gathers the rows straight into a slot of the epoch's ring
(`jaxfeed.loaders._workers.batch_ring`) that came with its index batch, and
this process copies them out and frees the slot; a batch goes as a file
(`jaxfeed.loaders._workers.shared_batches`) only when the ring is full.
Pickling through the pipe, and then a file per batch (its pages allocated
and freed every batch), each cost more CPU per GB than the gather itself
(benchmarks/README.md, bigger_than_memory.py).

Workers (``num_workers > 0``) are started with ``multiprocessing_context=
"spawn"``: forking a process that already runs JAX/XLA threads can deadlock.
As with any spawn-based DataLoader, a script that iterates the loader at
module top level needs an ``if __name__ == "__main__":`` guard. A worker
that dies (killed, out of memory) is an error within a fraction of a
second on any thread: see `jaxfeed.loaders._workers.torch_epochs`, which
``loaders.wrap`` uses too.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
from jaxfeed.loaders._workers import batch_ring, shared_batches
from jaxfeed.loaders._workers.main_script import from_main
from jaxfeed.loaders._workers.spawn import SPAWN, SPAWN_WITHOUT_MAIN
from jaxfeed.loaders._workers.torch_epochs import EpochLoaders, keep_batch
from jaxfeed.loaders.array_dataset import ArrayDataset
from jaxfeed.loaders.backends.sampled_source import SampledSource
from jaxfeed.loaders.rows import ArrayRows
from jaxfeed.loaders.sampler import Sampler
from jaxfeed.loaders.transform import RecordTransform
from torch.utils import data as torch_data

OPTIONS = ("order", "num_workers", "prefetch_factor", "persistent_workers")


class ArrayTorchDataset(ArrayRows, torch_data.Dataset):
    """Map-style torch Dataset over in-memory arrays (a dict of fields): the
    shared `ArrayRows`, a torch ``Dataset``, plus the transform.

    With a transform, an index batch comes as ``(epoch, indices)`` and the
    transform runs here, in the DataLoader's workers, record by record.
    Given a ``handoff`` directory, a worker hands every batch back as a file
    there (`jaxfeed.loaders._workers.shared_batches`: megabytes of batch
    through torch's pipe halved what 2 workers gave).
    """

    def __init__(
        self,
        arrays: Mapping[str, np.ndarray],
        transform: RecordTransform | None = None,
        handoff: str | None = None,
    ):
        super().__init__(arrays)
        self.transform, self.handoff = transform, handoff

    def __getitems__(
        self, indices: Sequence[int] | np.ndarray | tuple
    ) -> dict[str, np.ndarray] | shared_batches.Handed | batch_ring.Ringed:
        """The whole batch in one gather (torch's fetcher prefers this to
        ``__getitem__``), transformed when ``indices`` is ``(epoch, indices)``
        or a `_Task` with an epoch; put in the task's ring slot if it has one."""
        if self.handoff is not None:  # in a worker: its parent's, to remove if it is killed
            shared_batches.removed_with_owner(self.handoff)
        slot = epoch = None
        if isinstance(indices, _Task):
            slot, epoch, indices = indices
        elif isinstance(indices, tuple):
            epoch, indices = indices
        indices = np.asarray(indices, dtype=np.int64)
        if slot is not None and epoch is None and self._plain:
            ringed = batch_ring.gather_into(slot, self.arrays, indices)
            if ringed is not None:
                return ringed
        batch = self.read_batch(indices)
        if epoch is not None:
            batch = self.transform.batch(batch, indices, epoch)
        if slot is not None:
            ringed = batch_ring.write(slot, batch)
            if ringed is not None:
                return ringed
        return batch if self.handoff is None else shared_batches.write(batch, self.handoff)

    @property
    def _plain(self) -> bool:
        """Every field an array (not encoded bytes): rows gather straight into a slot."""
        return all(type(a) in (np.ndarray, np.memmap) for a in self.arrays.values())


class _Task(NamedTuple):
    """An index batch as a worker gets it: the ring slot to put the batch in
    (None: hand a file), the epoch for the transform (None: no transform)."""

    slot: batch_ring.Slot | None
    epoch: int | None
    indices: Any


class _Tasks:
    """An epoch's index batches as tasks (`_Task`), each leasing the next free slot
    of ``ring`` as torch's loader asks for it (a ``batch_sampler``)."""

    def __init__(self, batches: Sequence[Any], epoch: int | None, ring: batch_ring.BatchRing):
        self.batches, self.epoch, self.ring = batches, epoch, ring

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[_Task]:
        for indices in self.batches:
            yield _Task(self.ring.lease() if self.ring else None, self.epoch, indices)


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
        if num_workers:
            if transform is not None:
                transform.check_picklable(f"torch's num_workers={num_workers}")
            handoff = shared_batches.make_directory()
            weakref.finalize(self, shared_batches.remove_directory, handoff)
        self.torch_dataset = ArrayTorchDataset(dataset.arrays, transform, handoff)
        self.num_workers = num_workers
        # Slots taken at most: torch keeps prefetch_factor index batches per
        # worker out until it returns one in order, then sends one more; the
        # reader thread (`torch_epochs.iterate`) holds one and queues one.
        # A slot to spare: a fuller ring hands files, never waits.
        self._ring_slots = num_workers * (prefetch_factor or 2) + 3
        options: dict[str, Any] = {"num_workers": num_workers, "collate_fn": keep_batch}
        if num_workers > 0:
            options.update(
                # Spawned: a fork of a process running JAX/XLA threads can deadlock; the
                # workers leave Ctrl-C to this process (`loaders._workers.spawn`) and skip the
                # main script (its JAX imports) unless the transform comes from it.
                multiprocessing_context=(
                    SPAWN if from_main(self.torch_dataset) else SPAWN_WITHOUT_MAIN
                ),
                prefetch_factor=prefetch_factor,
                persistent_workers=persistent_workers,
            )
        self._read = EpochLoaders(self.torch_dataset, **options)

    def _gathers_here(self) -> bool:
        return self.num_workers == 0  # workers gather from mappings of their own

    def _fetch(
        self, index_batches: Sequence[np.ndarray], epoch: int
    ) -> Iterator[Mapping[str, np.ndarray]]:
        # The workers' transform needs the epoch.
        epoch_or_none = None if self.transform is None else epoch
        if self.torch_dataset.handoff is not None:
            return self._handed(index_batches, epoch_or_none)
        if epoch_or_none is not None:
            index_batches = [(epoch, indices) for indices in index_batches]
        return iter(self._read(index_batches))

    def _handed(self, batches: Sequence[Any], epoch: int | None) -> Iterator[dict]:
        """The batches of ``batches`` read by the workers, handed back through
        an epoch's `batch_ring.BatchRing` (as files when it is full or
        there is no room for one)."""
        layout = [(k, np.dtype(d).str, (self.batch_size, *s)) for k, (s, d) in self._rows.items()]
        try:
            ring = batch_ring.BatchRing(
                self.torch_dataset.handoff, shared_batches.layout_bytes(layout), self._ring_slots
            )
        except OSError:  # no room in shared memory: a file per batch
            ring = None
        read = self._read(_Tasks(batches, epoch, ring))
        try:
            for batch in read:
                if isinstance(batch, batch_ring.Ringed):
                    yield ring.collect(batch)
                elif isinstance(batch, shared_batches.Handed):
                    yield shared_batches.collect(*batch)
                else:
                    yield batch
        finally:
            read.close()
            if ring is not None:
                ring.close()

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
        if self.torch_dataset.handoff is not None:
            return self._handed(batches, None)
        return iter(self._read(batches))


def _check_option(name: str, value: Any, kind: type, minimum: int | None = None) -> None:
    """Refuses a worker option of the wrong type, e.g. the string a mistyped
    ``--loader-option num_workers=2x`` gives."""
    # bool is an int subclass: num_workers=True is a mistake, not 1.
    if type(value) is kind and (minimum is None or value >= minimum):
        return
    want = f"an int >= {minimum}" if kind is int else f"a {kind.__name__}"
    raise ValueError(f"the torch option {name} must be {want}, got {value!r}")


def build(dataset: ArrayDataset, sampler: Sampler, **options: Any) -> TorchSource:
    """The backend's `BatchSource`; ``loaders.make`` has checked ``options``
    against `OPTIONS`."""
    return TorchSource(dataset, sampler, **options)

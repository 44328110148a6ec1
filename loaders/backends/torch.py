"""PyTorch backend: a real ``torch.utils.data.DataLoader`` over a map-style Dataset.

Each batch is ONE vectorised numpy gather: the Dataset defines
``__getitems__`` (which torch's map-style fetcher calls with the whole index
batch when it exists) and the loader's ``collate_fn`` passes the result
through untouched: no per-sample reads, no per-sample collation, and the
batches stay numpy arrays (no round trip through torch tensors). A worker
hands each batch back as a file in shared memory
(`jaxfeed.loaders.workers.shared_batches`), not pickled through torch's
pipe: read from a file set in the page cache, 2 workers spent 3.6 CPU
seconds per GB pickling, sending and receiving (numpy in-process: 0.5).

Workers (``num_workers > 0``) are started with ``multiprocessing_context=
"spawn"``: forking a process that already runs JAX/XLA threads can deadlock.
As with any spawn-based DataLoader, a script that iterates the loader at
module top level needs an ``if __name__ == "__main__":`` guard. A worker
that dies (killed, out of memory) is an error within a fraction of a
second on any thread: see `jaxfeed.loaders.workers.torch_epochs`, which
``loaders.wrap`` uses too.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from jaxfeed.loaders.array_dataset import ArrayDataset
from jaxfeed.loaders.backends.sampled_source import SampledSource
from jaxfeed.loaders.rows import ArrayRows
from jaxfeed.loaders.sampler import Sampler
from jaxfeed.loaders.transform import RecordTransform
from jaxfeed.loaders.workers import shared_batches
from jaxfeed.loaders.workers.main_script import from_main
from jaxfeed.loaders.workers.spawn import SPAWN, SPAWN_WITHOUT_MAIN
from jaxfeed.loaders.workers.torch_epochs import EpochLoaders, keep_batch
from torch.utils import data as torch_data

OPTIONS = ("order", "num_workers", "prefetch_factor", "persistent_workers")


class ArrayTorchDataset(ArrayRows, torch_data.Dataset):
    """Map-style torch Dataset over in-memory arrays (a dict of fields): the
    shared `ArrayRows`, a torch ``Dataset``, plus the transform.

    With a transform, an index batch comes as ``(epoch, indices)`` and the
    transform runs here, in the DataLoader's workers, record by record.
    Given a ``handoff`` directory, a worker hands every batch back as a file
    there (`jaxfeed.loaders.workers.shared_batches`: megabytes of batch
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
    ) -> dict[str, np.ndarray] | shared_batches.Handed:
        """The whole batch in one gather (torch's fetcher prefers this to
        ``__getitem__``), transformed when ``indices`` is ``(epoch, indices)``."""
        epoch = None
        if isinstance(indices, tuple):
            epoch, indices = indices
        indices = np.asarray(indices, dtype=np.int64)
        batch = self.read_batch(indices)
        if epoch is not None:
            batch = self.transform.batch(batch, indices, epoch)
        return batch if self.handoff is None else shared_batches.write(batch, self.handoff)


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
        options: dict[str, Any] = {"num_workers": num_workers, "collate_fn": keep_batch}
        if num_workers > 0:
            options.update(
                # Spawned: a fork of a process running JAX/XLA threads can deadlock; the
                # workers leave Ctrl-C to this process (`loaders.workers.spawn`) and skip the
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
        if self.transform is not None:  # the workers' transform needs the epoch
            index_batches = [(epoch, indices) for indices in index_batches]
        return _collected(self._read(index_batches))

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
        return _collected(self._read(batches))


def _collected(batches: Iterator[Any]) -> Iterator[Mapping[str, np.ndarray]]:
    """The batches, those a worker handed back as files read in (and deleted)."""
    handed = shared_batches.Handed
    return (shared_batches.collect(*b) if isinstance(b, handed) else b for b in batches)


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

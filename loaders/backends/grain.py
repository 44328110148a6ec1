"""Grain backend: a `grain.MapDataset` whose elements are whole batches.

Grain's per-record path (``MapDataset.source(src).batch(B)``) reads one record
per ``__getitem__`` call and stacks them in Python. Here each element of the
MapDataset is one batch of indices, and a single vectorised read fetches the
whole batch from the random-access source, so Grain's threads, worker
processes and ordering guarantees apply to batches instead of records.

With worker processes, sampler order reads one long-lived pipeline over every
epoch back to back (`_AllEpochs`), so the workers start once, not per epoch.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import grain
import numpy as np
from jaxfeed.loaders._doors.grain import mark_absl_flags_parsed
from jaxfeed.loaders._doors.tf import import_tfds
from jaxfeed.loaders._workers.owned_segments import worker_init
from jaxfeed.loaders._workers.spawn import children_ignore_stop_signals
from jaxfeed.loaders.array_dataset import ArrayDataset, found_ragged, narrowed
from jaxfeed.loaders.backends.sampled_source import SampledSource
from jaxfeed.loaders.backends.tfds_store import split_name, store
from jaxfeed.loaders.protocol import Batch
from jaxfeed.loaders.ragged_field import RaggedField
from jaxfeed.loaders.rows import ArrayRows
from jaxfeed.loaders.sampler import Sampler
from jaxfeed.loaders.transform import RecordTransform

SOURCES = ("memory", "tfds", "files")
OPTIONS = ("order", "source", "num_workers", "num_threads")


class TfdsSource:
    """A TFDS ``array_record`` data source, read a batch at a time."""

    def __init__(self, source: Sequence[Mapping[str, np.ndarray]], dataset: ArrayDataset):
        self.source = source
        self._empty = ArrayRows({key: array[:0] for key, array in dataset.head.items()})

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> Mapping[str, np.ndarray]:
        return self.source[index]

    def read_batch(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        """One ``__getitems__`` call (one ArrayRecord batch read), then a stack."""
        if len(indices) == 0:
            return self._empty.read_batch(indices)
        records = self.source.__getitems__([int(i) for i in indices])
        return {key: _stack([r[key] for r in records], array.dtype)
                for key, array in self._empty.arrays.items()}  # fmt: skip


class ArrayRecordRows:
    """The user's ArrayRecord files read in place through Grain's own
    ``ArrayRecordDataSource``, a batch per ``__getitems__`` call, parsed
    and checked as the columnar copy parses and checks its records (so
    batches are the same, and a bad record is named by file and index when
    it is read). The dataset's fields are never built (`ArrayDataset.deferred`).

    Args:
      files: the split's files that hold records, in order.
      examples: whether they hold Examples (else raw records).
      dataset: gives each field's dtype and row shape (``head``) and each
        file's records (``units``).
    """

    def __init__(self, files: Sequence[str], examples: bool, dataset: ArrayDataset):
        self.source = grain.sources.ArrayRecordDataSource(list(files))
        self.files, self.examples, self.name = tuple(files), examples, dataset.name
        self._empty = ArrayRows({key: array[:0] for key, array in dataset.head.items()})
        self._starts = np.cumsum([0, *dataset.units])  # the first row of each file
        if len(self.source) != len(dataset) or len(files) != len(dataset.units):
            raise ValueError(
                f"{len(self.source)} records in {list(files)[:2]}... but {len(dataset)} rows "
                f"in {dataset.name}: a file changed while the source was being built"
            )
        self._schema = None
        if examples:
            from jaxfeed.loaders.data.formats.example import example_schema

            self._schema = example_schema((self.files[0], 0, self.source[0]))

    def __len__(self) -> int:
        return len(self.source)

    def read_batch(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        from jaxfeed.loaders.data.formats.arrayrecord import RAW_FIELD, damaged
        from jaxfeed.loaders.data.formats.example import example_batch

        if len(indices) == 0:
            return self._empty.read_batch(indices)
        rows = [int(i) for i in indices]
        try:
            records = self.source.__getitems__(rows)
        except RuntimeError as err:  # Riegeli's, naming no file
            raise damaged(err, self._places(indices), lambda k: self.source[rows[k]]) from err
        if not self.examples:
            return {RAW_FIELD: _stack(list(records), np.dtype(object))}
        places = self._places(indices)
        named = [(*place, record) for place, record in zip(places, records, strict=True)]
        batch = example_batch(named, self._schema)
        out = {}
        for key, array in self._empty.arrays.items():
            if isinstance(batch[key], RaggedField):  # a VarLen feature: only a plan batches it
                raise ValueError(found_ragged(self.name, [key]))
            if array.dtype.kind == "O":
                out[key] = _stack(batch[key], array.dtype)
            else:
                values = narrowed(np.asarray(batch[key]), array.dtype, f"{self.name}, {key!r}")
                out[key] = values.reshape(-1, *array.shape[1:])
        return out

    def _places(self, indices: np.ndarray) -> list[tuple[str, int]]:
        """Each row's file and index within it."""
        in_file = np.searchsorted(self._starts, indices, side="right") - 1
        where = zip(in_file.tolist(), (indices - self._starts[in_file]).tolist(), strict=True)
        return [(self.files[f], i) for f, i in where]


def _stack(values: list, dtype: np.dtype) -> np.ndarray:
    """Records' values as one array; bytes as an object array (a bytes
    dtype would drop trailing zero bytes)."""
    if dtype.kind != "O":
        return np.stack(values)
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


class _GatherBatch(grain.transforms.Map):
    """Maps one array of indices to one batch (picklable for worker processes);
    ``(epoch, indices)`` to ``(epoch, indices, batch)`` for `_TransformBatch`."""

    def __init__(self, records: ArrayRows | TfdsSource | ArrayRecordRows):
        self.records = records

    def map(self, element: np.ndarray | tuple) -> dict[str, np.ndarray] | tuple:
        if isinstance(element, tuple):
            epoch, indices = element
            return epoch, indices, self.records.read_batch(np.asarray(indices, dtype=np.int64))
        return self.records.read_batch(np.asarray(element, dtype=np.int64))


class _TransformBatch(grain.transforms.Map):
    """The per-record transform, as a Grain map step (so in Grain's workers)."""

    def __init__(self, transform: RecordTransform):
        self.transform = transform

    def map(self, element: tuple) -> dict[str, np.ndarray]:
        epoch, indices, rows = element
        return self.transform.batch(rows, indices, epoch)


class _AllEpochs:
    """The index batches of every epoch back to back, computed on demand.

    Element ``i`` is batch ``i % num_batches`` of epoch ``i // num_batches``.
    Endless (Grain reads ``len == sys.maxsize`` as infinite) and picklable, so
    one pipeline and its worker processes serve every epoch; each worker
    computes an epoch's plan once, from the shared sampler.
    """

    def __init__(self, sampler: Sampler, with_epoch: bool = False):
        self.sampler, self.with_epoch = sampler, with_epoch
        self._plan: tuple[int, list[np.ndarray]] = (-1, [])

    def __len__(self) -> int:
        return sys.maxsize

    def __getitem__(self, index: int) -> np.ndarray | tuple[int, np.ndarray]:
        epoch, step = divmod(index, self.sampler.num_batches)
        plan = self._plan  # read once: reader threads may replace it meanwhile
        if plan[0] != epoch:
            plan = (epoch, [indices for indices, _ in self.sampler.epoch_plan(epoch)])
            self._plan = plan
        return (epoch, plan[1][step]) if self.with_epoch else plan[1][step]


class _Reader:
    """Gathers the batches of ``index_batches`` (a MapDataset no worker may
    reach the end of, see `GrainSource._iterate`) through Grain, by position.

    ``next_batch(position)`` continues the running iterator when it stands at
    ``position``, and otherwise closes it and starts a new one there: worker
    processes live as long as the reads are sequential.
    """

    def __init__(
        self,
        index_batches: grain.MapDataset,
        records: ArrayRows | TfdsSource,
        num_workers: int,
        num_threads: int,
        transform: RecordTransform | None = None,
    ):
        self._batches = index_batches.map(_GatherBatch(records))
        if transform is not None:
            self._batches = self._batches.map(_TransformBatch(transform))
        self._num_workers, self._num_threads = num_workers, num_threads
        self._iterator: Iterator[dict[str, np.ndarray]] | None = None
        self.position: int | None = None  # what the running iterator reads next

    def next_batch(self, position: int) -> dict[str, np.ndarray]:
        if self._iterator is None or position != self.position:
            self.close()
            # Read-ahead bounded by the threads, not Grain's 500 elements:
            # `index_batches` may be endless, and a restart discards it.
            threads = self._num_threads
            options = grain.ReadOptions(num_threads=threads, prefetch_buffer_size=2 * threads)
            ds = self._batches[position:].to_iter_dataset(options)
            if self._num_workers:
                mark_absl_flags_parsed()
                # The workers end with this process and name their segments after it.
                ds = ds.mp_prefetch(
                    grain.MultiprocessingOptions(num_workers=self._num_workers),
                    worker_init_fn=worker_init(),
                )
            self._iterator, self.position = iter(ds), position
        try:
            with children_ignore_stop_signals("grain"):  # Grain starts workers at the first read
                batch = next(self._iterator)
        except BaseException:
            self.close()  # a failed iterator is not reused
            raise
        self.position += 1
        if not self._num_workers:
            return batch
        # Workers hand batches over in shared memory. A copy frees the segment
        # now; an array still viewing one at interpreter exit leaks it.
        return {key: np.array(value) for key, value in batch.items()}

    def close(self) -> None:
        """Stops the iterator and its workers. Idempotent."""
        iterator, self._iterator, self.position = self._iterator, None, None
        if iterator is not None:
            iterator.close()


class GrainSource(SampledSource):
    """Batches from a Grain pipeline over a batch-level random-access source.

    Args:
      dataset, sampler, order: see `SampledSource`. ``order="native"`` uses
        Grain's own seeded ``shuffle`` (reseeded each epoch as ``repeat``
        does) and ``[process_index::process_count]`` sharding.
      source: ``"memory"``: the in-memory (or memory-mapped) arrays.
        ``"tfds"``: a TFDS dataset in ``array_record`` format, built once
        under the cache. ``"files"``: the user's ArrayRecord files in place,
        through Grain's ``ArrayRecordDataSource``. Default: ``"files"`` for
        a dataset read from ArrayRecord files, else ``"memory"``.
      num_workers: Grain worker processes (``IterDataset.mp_prefetch``);
        0 reads in this process. In sampler order the workers are started
        once and read epoch after epoch; reading an epoch from any other
        batch than where the last one stopped restarts them there. An epoch
        begun while another is still being read gets workers of its own.
        ``close()`` (or garbage collection, or exit) stops them.
      num_threads: Grain reader threads per process (``grain.ReadOptions``);
        default 0 for the in-memory source (a gather is too cheap to share
        out), 16 (Grain's default) for TFDS.
      transform: see `SampledSource`; a Grain map step after the gather, so
        it runs in Grain's worker processes.
    """

    def __init__(
        self,
        dataset: ArrayDataset,
        sampler: Sampler,
        order: str = "sampler",
        source: str | None = None,
        num_workers: int = 0,
        num_threads: int | None = None,
        transform: RecordTransform | None = None,
    ):
        super().__init__(dataset, sampler, order, transform)
        in_place = dataset.in_place.arrayrecord if dataset.in_place else ()
        if source is None:
            source = "files" if in_place else "memory"
        if source == "files" and not in_place:
            raise ValueError(f"source='files' reads ArrayRecord files; {dataset.name} is not")
        if source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
        for name, value in (("num_workers", num_workers), ("num_threads", num_threads)):
            if value is not None and (type(value) is not int or value < 0):
                raise ValueError(f"the grain option {name} must be an int >= 0, got {value!r}")
        self.source = source
        self.num_workers = num_workers
        self.num_threads = (0 if source != "tfds" else 16) if num_threads is None else num_threads
        if source == "memory":
            self.records = ArrayRows(dataset.arrays)
        elif source == "files":
            self.records = ArrayRecordRows(in_place, dataset.in_place.examples, dataset)
        else:
            self.records = TfdsSource(_tfds_data_source(dataset), dataset)
        self._workers: _Reader | None = None
        self._reading = threading.Lock()  # held while an epoch reads `_workers`
        if transform is not None and num_workers:
            transform.check_picklable(f"Grain's num_workers={num_workers}", by_value=True)
        if order == "sampler" and num_workers:
            everything = grain.MapDataset.source(_AllEpochs(sampler, transform is not None))
            self._workers = _Reader(
                everything, self.records, num_workers, self.num_threads, transform
            )
            weakref.finalize(self, self._workers.close)  # also runs at exit

    def _read_fields(self) -> Mapping[str, np.ndarray]:
        """None of the dataset's fields where Grain reads the files (or its TFDS store)."""
        return self.dataset.arrays if self.source == "memory" else {}

    def iter_epoch(self, epoch: int = 0, *, start: int = 0) -> Iterator[Batch]:
        if self._workers is None:
            return super().iter_epoch(epoch, start=start)
        self._checked_disk()  # now, as `SampledSource.iter_epoch` checks
        return self._iter_workers(epoch, start)

    def close(self) -> None:
        """Stops the long-lived worker processes; a later epoch starts new ones.

        Call it when no epoch is being read (Grain iterators are not thread-safe).
        """
        if self._workers is not None:
            self._workers.close()

    def __enter__(self) -> GrainSource:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _iter_workers(self, epoch: int, start: int) -> Iterator[Batch]:
        valid_rows = [num_valid for _, num_valid in self.sampler.epoch_plan(epoch, start)]
        if not self._reading.acquire(blocking=False):
            # Another epoch is reading the long-lived workers: this one gets its own.
            yield from super().iter_epoch(epoch, start=start)
            return
        try:
            position = self._position(epoch, start)
            for offset, num_valid in enumerate(valid_rows):
                yield self._finish(self._workers.next_batch(position + offset), num_valid)
        finally:
            self._reading.release()

    def _position(self, epoch: int, start: int) -> int:
        """Global batch ``start`` of ``epoch`` in `_AllEpochs`."""
        running = self._workers.position
        if not self.sampler.shuffle and self.transform is None and running is not None:
            # Unshuffled epochs are identical: stay in the epoch being read, so
            # re-reading epoch 0 (an evaluation set) keeps the workers too.
            epoch = running // self.num_batches
        return epoch * self.num_batches + start

    def _gathers_here(self) -> bool:
        return not self.num_workers  # workers gather from mappings of their own

    def _fetch(
        self, index_batches: Sequence[np.ndarray], epoch: int
    ) -> Iterator[Mapping[str, np.ndarray]]:
        if self.transform is not None:  # the transform step needs the epoch
            index_batches = [(epoch, indices) for indices in index_batches]
        return self._iterate(grain.MapDataset.source(list(index_batches)))

    def _native_epoch(self, epoch: int) -> Iterator[Mapping[str, np.ndarray]]:
        s = self.sampler
        n = s.num_examples
        ds = grain.MapDataset.range(n)
        if s.shuffle:
            # repeat() folds the epoch into the shuffle seed; slice out this epoch.
            ds = ds.seed(s.seed).shuffle().repeat()[epoch * n : (epoch + 1) * n]
        ds = ds[s.process_index :: s.process_count]
        yield from self._iterate(ds.batch(s.batch_size, drop_remainder=s.drop_remainder))

    def _iterate(self, index_batches: grain.MapDataset) -> Iterator[Mapping[str, np.ndarray]]:
        """One pass over ``index_batches``, with workers of its own."""
        count = len(index_batches)
        if self.num_workers and count:
            # Repeated, so no worker reaches the end: Grain 0.2.18 hands a
            # worker's end of data on as an exception whose traceback keeps the
            # worker's last batch (in shared memory) in a reference cycle,
            # leaked if no garbage collection runs before exit.
            index_batches = index_batches.repeat(reseed_each_epoch=False)
        reader = _Reader(
            index_batches, self.records, self.num_workers, self.num_threads, self.transform
        )
        try:
            for position in range(count):
                yield reader.next_batch(position)
        finally:
            reader.close()  # stops worker processes now, not at garbage collection


def _tfds_data_source(dataset: ArrayDataset) -> Sequence[Mapping[str, np.ndarray]]:
    """A TFDS ``array_record`` data source over ``dataset``, stored once."""
    builder = import_tfds().builder_from_directory(store(dataset, "array_record"))
    return builder.as_data_source(split=split_name(dataset))


def build(dataset: ArrayDataset, sampler: Sampler, **options: Any) -> GrainSource:
    """The backend's `BatchSource`; ``loaders.make`` has checked ``options``
    against `OPTIONS`."""
    return GrainSource(dataset, sampler, **options)

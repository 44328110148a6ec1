"""TensorFlow backend: tf.data over a TFDS-format copy of the dataset, or over
the dataset's own files when it is on disk.

A dataset held in memory is stored once as a real TFDS dataset (``tfrecord``
files plus ``dataset_info.json``, see `jaxfeed.loaders.backends.tfds_store`),
read back whole with ``tfds.builder_from_directory(...).as_dataset`` and held
as tensors. A dataset on disk (memory-mapped fields, e.g. a directory of
``.npy`` files) may be bigger than memory: tf.data reads its rows in place,
through ``tf.numpy_function``, with no copy to convert and none held. Either
way batches come from one long-lived tf.data iterator per source that
gathers the sampler's index batches (see `_Pipeline`).

A Python ``transform`` runs in this process on the records the pipeline
gathers (``num_workers=0``), or, with ``num_workers=k``, in ``k`` worker
processes (a `RecordPool`) whose finished batches the pipeline takes in
through ``tf.data.Dataset.from_generator``: tf.data's parallel calls are
threads, and the transform's Python holds the GIL.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from jaxfeed.loaders._doors.tf import import_tensorflow, import_tfds
from jaxfeed.loaders._io.mapped_files import file_rows
from jaxfeed.loaders._workers.record_pool import RecordPool
from jaxfeed.loaders.array_dataset import ArrayDataset
from jaxfeed.loaders.backends.sampled_source import SampledSource
from jaxfeed.loaders.backends.tfds_store import split_name, store
from jaxfeed.loaders.bytes_field import BytesField
from jaxfeed.loaders.checks import check_workers
from jaxfeed.loaders.rows import ArrayRows
from jaxfeed.loaders.sampler import Sampler
from jaxfeed.loaders.transform import RecordTransform

OPTIONS = ("order", "num_workers")

BYTES_PER_STEP = 4 << 20  # images gathered per tf.data element (see _Pipeline)


def _gather(fields: Mapping[str, Any], indices: Any, batch_size: int) -> dict[str, Any]:
    """Several batches at once, shaped ``[batches, batch_size, ...]``: one
    vectorised ``tf.gather`` per tensor field, and one ``tf.numpy_function``
    that reads the rows of every on-disk (numpy) field in place."""
    tf = import_tensorflow()
    on_disk = [key for key, column in fields.items() if isinstance(column, np.ndarray)]
    rows = {key: tf.gather(column, indices) for key, column in fields.items() if key not in on_disk}
    if on_disk:
        read = tf.numpy_function(
            lambda at: [fields[key][at] for key in on_disk],
            [indices],
            [tf.as_dtype(fields[key].dtype) for key in on_disk],
            stateful=False,
        )
        rows.update(zip(on_disk, read, strict=True))
    return {
        key: tf.reshape(rows[key], [-1, batch_size, *column.shape[1:]])
        for key, column in fields.items()
    }


class _Pipeline:
    """A sampler-order tf.data pipeline and its iterator, both made once.

    Creating a tf.data iterator costs ~10 ms here, as much as reading an MNIST
    epoch, so each pipeline keeps ONE iterator over an endless dataset whose
    map reads row ``cursor`` of an index table held in ``tf.Variable``s; a new
    epoch assigns the table and resets the cursor. This is only correct
    because the map is sequential with no prefetch (tf.data's autotuning,
    injected prefetch and parallel map are off): nothing reads a row before it
    is asked for. (jaxfeed's DeviceFeed reads ahead on its own thread.) Each
    row gathers ``per_step`` batches (~4 MiB), amortising the iterator step.
    The table holds int32 indices for splits under 2**31 rows: an epoch of 36M
    rows is then 144 MB in the variable, not 288.
    """

    def __init__(self, fields: Mapping[str, Any], num_batches: int, batch_size: int):
        tf = import_tensorflow()
        row_bytes = sum(int(np.prod(c.shape[1:])) * np.dtype(c.dtype.name).itemsize
                        for c in fields.values())  # fmt: skip
        batch_bytes = max(1, batch_size * row_bytes)
        self.per_step = max(1, min(BYTES_PER_STEP // batch_bytes, num_batches))
        self.steps = -(-num_batches // self.per_step)
        self.shape = (self.steps * self.per_step, batch_size)
        rows = len(next(iter(fields.values())))
        self.index_dtype = np.int32 if rows < 2**31 else np.int64
        table = tf.Variable(
            tf.zeros([self.steps, self.per_step * batch_size], tf.as_dtype(self.index_dtype))
        )
        cursor = tf.Variable(0, dtype=tf.int64)
        self.table, self.cursor = table, cursor

        def next_row(_: Any) -> dict[str, Any]:
            row = cursor.assign_add(1) - 1
            return _gather(fields, tf.gather(table, row), batch_size)

        options = tf.data.Options()
        options.autotune.enabled = False
        options.experimental_optimization.inject_prefetch = False
        options.experimental_optimization.map_parallelization = False
        elements = tf.data.Dataset.range(1).repeat().map(next_row).with_options(options)
        self.iterator = elements.as_numpy_iterator()

    def batches(self, index_batches: Sequence[np.ndarray]) -> Iterator[Mapping[str, np.ndarray]]:
        """The batches of ``index_batches`` (at most ``num_batches`` of them), in order."""
        if not len(index_batches):
            return
        table = np.zeros(self.shape, self.index_dtype)
        table[: len(index_batches)] = index_batches
        self.table.assign(table.reshape(self.steps, -1))
        self.cursor.assign(0)
        remaining = len(index_batches)
        while remaining > 0:
            element = next(self.iterator)
            for i in range(min(self.per_step, remaining)):
                yield {key: value[i] for key, value in element.items()}
            remaining -= self.per_step


class TfSource(SampledSource):
    """Batches from a tf.data pipeline over a TFDS-format copy of the dataset,
    or over its files, read in place, when it is on disk.

    Args:
      dataset, sampler, order: see `SampledSource`. ``order="sampler"``: the
        sampler's index batches, gathered by `_Pipeline`. ``order="native"``:
        the order of the tf.data idiom ``Dataset.range(N).shuffle(N,
        seed=sampler.epoch_seed(epoch)).shard(process_count, process_index)``,
        cut into batches as ``.batch(batch_size, drop_remainder)`` would and
        gathered by the same pipeline. Like torch's DistributedSampler, with
        several processes and ``drop_remainder=False`` the order is first
        padded with its own head to a multiple of ``process_count``, so every
        process yields the same number of batches.
      transform: see `SampledSource`. With ``num_workers=0`` it runs in this
        process, on each batch's records as the tf.data pipeline gathers
        them (see `_transformed`).
      num_workers: with a transform, ``k`` spawned worker processes (a
        `RecordPool`, kept across epochs until `close`) each read rows of the
        dataset's arrays and transform whole batches; the tf.data pipeline is
        ``Dataset.from_generator`` over their finished batches, in order (see
        `_from_workers`). Processes, not tf.data's threads: a Python
        transform holds the GIL except where it calls code that releases it.

    Raises:
      RuntimeError: the cached TFDS dataset does not match ``dataset``.
      ValueError: ``num_workers`` without a transform.
    """

    def __init__(
        self,
        dataset: ArrayDataset,
        sampler: Sampler,
        order: str = "sampler",
        transform: RecordTransform | None = None,
        num_workers: int = 0,
    ):
        super().__init__(dataset, sampler, order, transform)
        self.num_workers = check_workers("tf", num_workers, transform)
        self._idle: list[_Pipeline] = []  # one per epoch read at once (normally one)
        self._lock = threading.Lock()
        self._workers: RecordPool | None = None
        if self.num_workers:
            # The workers read the dataset's own arrays (in place for files): no TFDS copy.
            self._workers = RecordPool(
                ArrayRows(dataset.arrays).read_batch, transform, self.num_workers
            )
            self.builder_dir = None
            return
        as_they_are = dataset.in_place is not None and dataset.in_place.arrays
        if as_they_are or any(file_rows(a) is not None for a in dataset.arrays.values()):
            # On disk, or to be read as they are: in place (a TFDS copy would double the
            # disk and take minutes; of a ragged field's values, a record per value).
            self.builder_dir = None
            self._fields = dict(dataset.arrays)
            return
        self.builder_dir = store(dataset, "tfrecord")
        builder = import_tfds().builder_from_directory(self.builder_dir)
        split = builder.as_dataset(split=split_name(dataset), batch_size=-1)
        if split.keys() != dataset.arrays.keys() or not all(
            _same_values(split[key].numpy(), array) for key, array in dataset.arrays.items()
        ):
            entry = self.builder_dir.parents[1]
            raise RuntimeError(
                f"the TFDS cache entry {entry} does not hold {dataset.name}'s data; "
                f"delete that directory (rm -r '{entry}') and run again to rebuild it"
            )
        self._fields = {key: split[key] for key in dataset.arrays}

    def _gathers_here(self) -> bool:
        return self._workers is None  # workers gather with a cache of their own

    def _fetch(
        self, index_batches: Sequence[np.ndarray], epoch: int = 0
    ) -> Iterator[Mapping[str, np.ndarray]]:
        if self._workers is not None:
            yield from self._from_workers(index_batches, epoch)
            return
        if self.transform is not None:
            yield from self._transformed(index_batches, epoch)
            return
        with self._lock:
            pipeline = self._idle.pop() if self._idle else None
        if pipeline is None:
            pipeline = _Pipeline(self._fields, self.num_batches, self.batch_size)
        try:
            yield from pipeline.batches(index_batches)
        finally:
            with self._lock:
                self._idle.append(pipeline)

    def _transformed(
        self, index_batches: Sequence[np.ndarray], epoch: int
    ) -> Iterator[Mapping[str, np.ndarray]]:
        """The transform in this process, on each batch's records as a tf.data
        pipeline over this call's index batches gathers them (bytes as
        ``tf.string``), one batch ahead (``prefetch(1)``) while the transform
        works. Fields on disk are read here. In the reading thread, not in a
        ``tf.numpy_function`` inside the pipeline: that handed every batch to a
        tf.data thread and back, and left a core idle for a fifth of the time
        (docs/data.md)."""
        tf = import_tensorflow()
        tensors = {
            k: v for k, v in self._fields.items() if not isinstance(v, np.ndarray | BytesField)
        }
        held = {k: v for k, v in self._fields.items() if k not in tensors}
        gathered: Iterator[dict[str, Any]] = ({} for _ in index_batches)
        if tensors and len(index_batches):

            def gather(indices: Any) -> dict[str, Any]:
                return {key: tf.gather(column, indices) for key, column in tensors.items()}

            batches = tf.data.Dataset.from_tensor_slices(np.stack(index_batches))
            gathered = batches.map(gather).prefetch(1).as_numpy_iterator()
        for indices, rows in zip(index_batches, gathered, strict=True):
            rows.update({key: field[indices] for key, field in held.items()})
            yield self.transform.batch(rows, indices, epoch)

    def _from_workers(
        self, index_batches: Sequence[np.ndarray], epoch: int
    ) -> Iterator[Mapping[str, np.ndarray]]:
        """The tf.data idiom for batches made by Python elsewhere:
        ``Dataset.from_generator`` over the worker processes' finished
        batches. No ``prefetch``: the pool already keeps ``2 * num_workers``
        batches in flight, and nothing runs the generator but the reader, so
        closing the epoch closes it here (its pending batches dropped)."""
        if not len(index_batches):
            return
        tf = import_tensorflow()
        finished, failures = self._workers.batches(index_batches, epoch), []

        def generate() -> Iterator[Mapping[str, np.ndarray]]:
            try:
                yield from finished
            except Exception as err:  # re-raised as is by the reader, not as a TF error
                failures.append(err)
                raise

        signature = {
            key: tf.TensorSpec((self.batch_size, *shape), tf.as_dtype(dtype))
            for key, (shape, dtype) in self._rows.items()
        }
        batches = _from_generator(generate, signature)
        try:
            yield from _reraising(batches.as_numpy_iterator(), failures)
        finally:
            finished.close()

    def close(self) -> None:
        """Stops the worker processes (if any); the next epoch starts new ones."""
        super().close()
        if self._workers is not None:
            self._workers.close()

    def _native_epoch(self, epoch: int) -> Iterator[Mapping[str, np.ndarray]]:
        tf = import_tensorflow()
        s, n = self.sampler, len(self.dataset)
        order = tf.data.Dataset.range(n)
        if s.shuffle:
            order = order.shuffle(n, seed=s.epoch_seed(epoch), reshuffle_each_iteration=False)
        pad = 0 if s.drop_remainder else -n % s.process_count
        if pad:
            order = order.repeat(2).take(n + pad)  # same order twice: pad with its head
        # This process's whole shard as ONE element: a tf.data iterator step costs
        # far more than the gather it feeds, so batching happens on the result.
        mine = order.shard(s.process_count, s.process_index).batch(n + pad).get_single_element()
        # drop_remainder: shards may differ by one example; keep equal batch counts.
        count = min(len(mine), s.num_batches * s.batch_size)
        table = np.zeros(s.num_batches * s.batch_size, np.int64)
        table[:count] = mine.numpy()[:count]
        batches = self._fetch(list(table.reshape(s.num_batches, s.batch_size)))
        for step, batch in enumerate(batches):
            valid = min(s.batch_size, count - step * s.batch_size)
            yield {key: value[:valid] for key, value in batch.items()}


def build(dataset: ArrayDataset, sampler: Sampler, **options: Any) -> TfSource:
    """The backend's `BatchSource`; ``loaders.make`` has checked ``options``
    against `OPTIONS`."""
    return TfSource(dataset, sampler, **options)


def _from_generator(generate: Callable[[], Iterator[Any]], signature: Mapping[str, Any]) -> Any:
    """``Dataset.from_generator(generate)`` with tf.data's autotuning off: it
    has nothing to tune (no parallel map, no prefetch: the pool is the
    parallelism), and its optimisation thread made deleting each epoch's
    iterator wait for that thread's next wake-up, whose period grows with
    the iterator's age: up to ~1 s per epoch, at random (benchmarks/README.md)."""
    tf = import_tensorflow()
    options = tf.data.Options()
    options.autotune.enabled = False
    return tf.data.Dataset.from_generator(generate, output_signature=signature).with_options(
        options
    )


def _reraising(iterator: Iterator[Any], failures: list[Exception]) -> Iterator[Any]:
    """``iterator``'s elements; a TF error that wraps an error of the
    transform's (the first of ``failures``) raised as that error, which names
    the row."""
    tf = import_tensorflow()
    while True:
        try:
            element = next(iterator)
        except StopIteration:
            return
        except tf.errors.OpError:
            if failures:
                raise failures[0] from None
            raise
        yield element


def _same_values(cached: np.ndarray, array: np.ndarray | BytesField) -> bool:
    """Equal, NaN where NaN (a float field's NaN is data, not a difference)."""
    if isinstance(array, BytesField):
        return len(cached) == len(array) and list(cached) == list(array[np.arange(len(array))])
    return np.array_equal(cached, array, equal_nan=array.dtype.kind in "fc")

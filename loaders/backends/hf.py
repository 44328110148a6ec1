"""Hugging Face backend: a `datasets.Dataset` in Arrow, memory-mapped from the cache.

The split is written once as an Arrow dataset directory (``save_to_disk``)
under ``cache_root()/"hf"``, keyed by its content, and read back with
``load_from_disk``. Rows are gathered in sampler order, several batches per
call (`BYTES_PER_TAKE`): Arrow's ``take`` on the dataset's table (default),
or ``ds[indices]``; each batch is then a numpy view of the gathered rows.

Batches are read in ``"arrow"`` format and turned into numpy zero-copy: the
``"numpy"`` format upcasts every integer column to int64 and is much slower.
Each field is a column of its own dtype; a field with more than one value
per row (an image) is a fixed-size list of them (``Array3D`` reads back far
slower), reshaped on the way out, which is free.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
from jaxfeed.loaders.array_dataset import ArrayDataset
from jaxfeed.loaders.backends.sampled_source import SampledSource
from jaxfeed.loaders.data.cache import build_once, cache_entry
from jaxfeed.loaders.sampler import Sampler

OPTIONS = ("order", "read")
READS = ("take", "getitem")
# Bump when the stored layout changes: old caches are then not reused.
# v2: entries carry a manifest (jaxfeed.loaders.data.cache.build_once).
LAYOUT_VERSION = "v2"
# Rows gathered per Arrow call. A take and its conversion to numpy cost more
# per call than copying a whole 128-image batch (pyarrow 26, datasets 5.2), so
# small batches share a call; the cap bounds the memory one call holds.
BYTES_PER_TAKE = 4 << 20


class HFSource(SampledSource):
    """Batches read from an Arrow `datasets.Dataset` memory-mapped from the cache.

    Args:
      dataset, sampler, order: see `SampledSource`. ``order="native"`` uses
        ``Dataset.shuffle`` (a new seed per epoch), ``Dataset.shard(...,
        contiguous=True)`` per process and ``Dataset.iter``.
      read: how a batch is gathered in sampler order. ``"take"`` (default):
        Arrow's ``Table.take`` on the dataset's table, joined into one chunk
        once when the source is made (a copy of the split in memory).
        ``"getitem"``: ``ds[indices]``, the `datasets` row access; it slices
        out every row separately and joins them, which is much slower.
        Either way one call gathers as many whole batches as fit in
        `BYTES_PER_TAKE` (at least one).
    """

    def __init__(
        self, dataset: ArrayDataset, sampler: Sampler, order: str = "sampler", read: str = "take"
    ):
        super().__init__(dataset, sampler, order)
        if read not in READS:
            raise ValueError(f"read must be one of {READS}, got {read!r}")
        self.read = read
        self.path = arrow_cache(dataset)
        self.rows = datasets.load_from_disk(str(self.path)).with_format("arrow")
        # The cache file holds 1,000-row record batches, and take() on a chunked
        # table joins all chunks on every call: join them once instead.
        self._table = self.rows[:].combine_chunks() if read == "take" else None

    def _fetch(self, index_batches: Sequence[np.ndarray]) -> Iterator[Mapping[str, np.ndarray]]:
        row_bytes = sum(array[:1].nbytes for array in self.dataset.arrays.values())
        per_call = max(1, BYTES_PER_TAKE // (self.batch_size * row_bytes))
        for first in range(0, len(index_batches), per_call):
            group = index_batches[first : first + per_call]
            indices = np.concatenate(group)
            rows = self.rows[indices] if self._table is None else self._table.take(indices)
            columns = self._to_numpy(rows)
            # Batches are views of the call's rows (no copy), so one the caller
            # keeps also keeps the rest of its call's rows in memory.
            stop = 0
            for batch_indices in group:
                start, stop = stop, stop + len(batch_indices)
                yield {key: column[start:stop] for key, column in columns.items()}

    def _native_epoch(self, epoch: int) -> Iterator[Mapping[str, np.ndarray]]:
        s = self.sampler
        ds = self.rows
        # keep_in_memory: the index mappings are tiny; don't write them into the cache.
        if s.shuffle:
            ds = ds.shuffle(seed=s.epoch_seed(epoch), keep_in_memory=True)
        if s.process_count > 1:
            ds = ds.shard(s.process_count, s.process_index, contiguous=True, keep_in_memory=True)
        for table in ds.iter(batch_size=s.batch_size, drop_last_batch=s.drop_remainder):
            yield self._to_numpy(table)

    def _to_numpy(self, table: pa.Table) -> dict[str, np.ndarray]:
        """Arrow columns to numpy: one copy to join the gathered rows, then views."""
        # ds[indices] returns one chunk per row; joining the whole table at once
        # is cheaper than joining column by column.
        (rows,) = table.combine_chunks().to_batches()
        out = {}
        for key, array in self.dataset.arrays.items():
            column = rows.column(key)
            if array.ndim > 1:  # a fixed-size list of the row's values, flattened
                column = column.flatten()
            # Bools are bit-packed in Arrow: the one field that must be copied.
            values = column.to_numpy(zero_copy_only=array.dtype != np.bool_)
            out[key] = values.reshape(-1, *array.shape[1:])
        return out


def cache_path(dataset: ArrayDataset) -> Path:
    """Where ``dataset``'s Arrow copy lives: a readable name plus its content key."""
    return cache_entry("hf", dataset.name, LAYOUT_VERSION, *dataset.content())


def arrow_cache(dataset: ArrayDataset) -> Path:
    """The Arrow dataset directory holding ``dataset``, written once (`build_once`).

    Returns:
      A directory that ``datasets.load_from_disk`` reads.

    Raises:
      ValueError: the copy is not there yet and the cache is not writable.
      RuntimeError: the copy fails its manifest (a truncated or changed file);
        the message names the directory to delete.
    """
    features = {}
    for key, array in dataset.arrays.items():
        value = datasets.Value(array.dtype.name)
        # A field with several values per row is a fixed-size list of them,
        # reshaped on the way out (free); ArrayND features read back far slower.
        width = int(np.prod(array.shape[1:]))
        features[key] = value if array.ndim == 1 else datasets.Sequence(value, length=width)

    def build(scratch: Path) -> None:
        # Arrow arrays straight from the buffers: no per-row Python.
        columns = {}
        for key, array in dataset.arrays.items():
            flat = pa.array(array.reshape(-1))
            if array.ndim > 1:
                flat = pa.FixedSizeListArray.from_arrays(flat, int(np.prod(array.shape[1:])))
            columns[key] = flat
        with _no_progress_bars():
            rows = datasets.Dataset.from_dict(columns, features=datasets.Features(features))
            rows.save_to_disk(str(scratch))

    return build_once(cache_path(dataset), build)


@contextlib.contextmanager
def _no_progress_bars() -> Iterator[None]:
    enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if enabled:
            datasets.enable_progress_bars()


def build(dataset: ArrayDataset, sampler: Sampler, **options: Any) -> HFSource:
    """The backend's `BatchSource`; ``loaders.make`` has checked ``options``
    against `OPTIONS`."""
    return HFSource(dataset, sampler, **options)

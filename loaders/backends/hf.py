"""Hugging Face backend: a `datasets.Dataset` in Arrow, memory-mapped from the cache.

The split is written once as one Arrow file under ``cache_root()/"hf"``,
keyed by its content (an on-disk dataset by its files' identity), and opened
with ``Dataset.from_file``, which memory-maps it (a dataset read in place
from the user's Arrow IPC files opens those files instead: no copy,
`arrow_files_dataset`). The file is written
streaming, straight from the dataset's buffers (memory-mapped ones too), in
record batches of `chunk_rows` rows (one, unless an array would pass Arrow's
2**31 - 1 values), so the conversion holds no copy in memory and runs at disk
speed, with a progress bar for large data. Rows are gathered in sampler
order, several batches per call (`BYTES_PER_TAKE`): Arrow's ``take`` on each
record batch that holds some of them (default), or ``ds[indices]``; each
batch is then a numpy view of the gathered rows. ``take`` on a table of
several chunks would join them all first, a copy of the whole split on every
call: so a call takes from each chunk on its own.

Batches are read in ``"arrow"`` format and turned into numpy zero-copy: the
``"numpy"`` format upcasts every integer column to int64 and is much slower.
Each field is a column of its own dtype; a field with more than one value
per row (an image) is a fixed-size list of them (``Array3D`` reads back far
slower), reshaped on the way out, which is free.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import weakref
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import datasets
import numpy as np
import pyarrow as pa
from jaxfeed.loaders._io.disk_read_ahead import MappedRows
from jaxfeed.loaders._io.on_disk_fields import OnDiskFields
from jaxfeed.loaders.array_dataset import ArrayDataset
from jaxfeed.loaders.backends.sampled_source import SampledSource
from jaxfeed.loaders.data import superseded
from jaxfeed.loaders.data.cache import build_once, cache_entry
from jaxfeed.loaders.sampler import Sampler
from jaxfeed.loaders.transform import RecordTransform
from tqdm import tqdm

OPTIONS = ("order", "read", "num_workers")
READS = ("take", "getitem")
# Bump when the stored layout changes: old caches are then not reused.
# v2: entries carry a manifest (jaxfeed.loaders.data.cache.build_once).
# v3: one Arrow file of one record batch, written streaming (Dataset.from_file).
LAYOUT_VERSION = "v3"
ARROW_FILE = "data.arrow"
# Written to disk in slices of this size, so the progress bar moves.
_WRITE_SLICE = 64 << 20
# Conversions at least this large show a progress bar.
_PROGRESS_BYTES = 256 << 20
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
        Arrow's ``take`` on the record batches of the memory-mapped file.
        ``"getitem"``: ``ds[indices]``, the `datasets` row access; it slices
        out every row separately and joins them, which is much slower.
        Either way one call gathers as many whole batches as fit in
        `BYTES_PER_TAKE` (at least one), and only those rows are read.
      transform: see `SampledSource`. As ``Dataset.with_transform`` does, it
        runs on the rows as they are read from Arrow, in this process; or,
        with ``num_workers``, in that many worker processes (a `RecordPool`),
        each mapping the Arrow file and reading its own rows. (`datasets`
        has no worker processes of its own for on-the-fly transforms;
        ``Dataset.map(num_proc=...)`` computes a new copy once, which fits
        a deterministic preprocessing, not a new augmentation every epoch.)
      num_workers: worker processes for the transform (needs one).
    """

    def __init__(
        self,
        dataset: ArrayDataset,
        sampler: Sampler,
        order: str = "sampler",
        read: str = "take",
        transform: RecordTransform | None = None,
        num_workers: int = 0,
    ):
        super().__init__(dataset, sampler, order, transform)
        if read not in READS:
            raise ValueError(f"read must be one of {READS}, got {read!r}")
        self.read = read
        # The user's own Arrow files, read in place (no copy), or the Arrow copy.
        self.files, self.path = dataset.in_place.arrow if dataset.in_place else (), None
        if not self.files:
            self.path = _read_arrow_cache(self, dataset)
            self.files = (str(self.path / ARROW_FILE),)
        self.rows = arrow_files_dataset(self.files).with_format("arrow")
        # The files' record batches, memory-mapped: views, not copies.
        self._chunks = self.rows.data.table.to_batches() if read == "take" else None
        self._layout = {key: (a.shape[1:], a.dtype) for key, a in dataset.arrays.items()}
        self._start_pool("hf", ArrowRows(self.files, self._layout), num_workers)

    def _fetch(
        self, index_batches: Sequence[np.ndarray], epoch: int
    ) -> Iterator[Mapping[str, np.ndarray]]:
        row_bytes = sum(array[:1].nbytes for array in self.dataset.arrays.values())
        per_call = max(1, BYTES_PER_TAKE // (self.batch_size * row_bytes))
        for first in range(0, len(index_batches), per_call):
            group = index_batches[first : first + per_call]
            indices = np.concatenate(group)
            rows = self.rows[indices] if self._chunks is None else take(self._chunks, indices)
            columns = to_numpy(rows, self._layout)
            # Batches are views of the call's rows (no copy), so one the caller
            # keeps also keeps the rest of its call's rows in memory.
            stop = 0
            for batch_indices in group:
                start, stop = stop, stop + len(batch_indices)
                batch = {key: column[start:stop] for key, column in columns.items()}
                if self.transform is not None:
                    batch = self.transform.batch(batch, batch_indices, epoch)
                yield batch

    def _ranged_fields(self) -> list:
        return []  # batches come from the Arrow copy, not the dataset's fields

    def _on_disk(self) -> OnDiskFields:
        """The dataset's arrays, and the memory-mapped Arrow file this source
        reads: advised, and its rows read ahead."""
        disk = super()._on_disk()
        mapped = list(disk.mapped)
        for chunk in self._chunks or ():
            for column in chunk.columns:
                for buffer in column.buffers():
                    if buffer is not None:
                        mapped.append(np.frombuffer(buffer, np.uint8))
        return disk._replace(mapped=mapped, layouts=self._read_rows())

    def _read_rows(self) -> list[MappedRows]:
        """The Arrow copy's rows (what this source reads), chunk by chunk; bools
        (bit-packed) are left to the kernel."""
        if not self._chunks or self.path is None:  # the user's own files' columns' layouts
            return []
        layouts = []
        for column, array in enumerate(self.dataset.arrays.values()):
            if array.dtype == np.bool_ or array.dtype == object:  # no fixed row size (bytes)
                continue
            data = [chunk.column(column).buffers()[-1] for chunk in self._chunks]
            bases = np.array([buffer.address for buffer in data], np.int64)
            layouts.append(MappedRows(bases, self._chunks[0].num_rows, array[:1].nbytes))
        return layouts

    def _native_epoch(self, epoch: int) -> Iterator[Mapping[str, np.ndarray]]:
        s = self.sampler
        ds = self.rows
        # keep_in_memory: the index mappings are tiny; don't write them into the cache.
        if s.shuffle:
            ds = ds.shuffle(seed=s.epoch_seed(epoch), keep_in_memory=True)
        if s.process_count > 1:
            ds = ds.shard(s.process_count, s.process_index, contiguous=True, keep_in_memory=True)
        for table in ds.iter(batch_size=s.batch_size, drop_last_batch=s.drop_remainder):
            yield to_numpy(table, self._layout)


def arrow_files_dataset(files: Sequence[str]) -> datasets.Dataset:
    """Arrow IPC files as one `datasets.Dataset`, memory-mapped in place:
    ``Dataset.from_file`` for the stream format (what `datasets` writes);
    the file format (``.arrow``/``.feather`` from pyarrow), which it does not
    open, through pyarrow's IPC file reader over a memory map, wrapped as a
    ``Dataset`` (its buffers are the map's: no copy)."""
    parts = []
    with _no_progress_bars():
        for path in files:
            with open(path, "rb") as file:
                is_file_format = file.read(6) == b"ARROW1"
            if is_file_format:
                table = pa.ipc.open_file(pa.memory_map(path)).read_all()
                parts.append(datasets.Dataset(table))
            else:
                parts.append(datasets.Dataset.from_file(path))
        return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)


def take(chunks: Sequence[pa.RecordBatch], indices: np.ndarray) -> pa.Table:
    """Rows ``indices`` in that order: one ``take`` per record batch that holds some."""
    if len(chunks) == 1:
        return pa.Table.from_batches([chunks[0].take(indices)])
    starts = np.cumsum([0] + [chunk.num_rows for chunk in chunks])
    chunk = np.searchsorted(starts, indices, side="right") - 1
    by_chunk = np.argsort(chunk, kind="stable")
    bounds = np.searchsorted(chunk[by_chunk], np.arange(len(chunks) + 1))
    pieces = [
        chunks[c].take(indices[by_chunk[lo:hi]] - starts[c])
        for c, (lo, hi) in enumerate(itertools.pairwise(bounds))
        if hi > lo
    ]
    # Back from chunk order to the asked order: a take on the few rows gathered.
    return pa.Table.from_batches(pieces).take(np.argsort(by_chunk))


Layout = Mapping[str, tuple[tuple[int, ...], np.dtype]]
"""Each field's row shape and dtype (object: bytes), as the dataset holds it."""


def to_numpy(table: pa.Table, layout: Layout) -> dict[str, np.ndarray]:
    """Arrow columns to numpy: one copy to join the gathered rows, then views
    (bytes: an object array of them)."""
    # ds[indices] returns one chunk per row; joining the whole table at once
    # is cheaper than joining column by column.
    (rows,) = table.combine_chunks().to_batches()
    out = {}
    for key, (shape, dtype) in layout.items():
        column = rows.column(key)
        if shape:  # a fixed-size list of the row's values, flattened
            column = column.flatten()
        if np.dtype(dtype).kind == "O":
            out[key] = _bytes_values(column)
            continue
        # Bools are bit-packed in Arrow: the fields that are copied. A user's
        # file may hold another width (int64 labels) than the dataset (int32).
        values = column.to_numpy(zero_copy_only=dtype != np.bool_)
        out[key] = values.astype(dtype, copy=False).reshape(-1, *shape)
    return out


def _bytes_values(column: pa.Array) -> np.ndarray:
    """A bytes field's rows as an object array of ``bytes``: a user's file may
    hold them as strings or in an HF ``Image`` struct's ``bytes``, as the
    dataset's field was read (`jaxfeed.loaders.data.formats.tables`)."""
    if pa.types.is_struct(column.type):
        column = column.field("bytes")
    if pa.types.is_string(column.type):  # UTF-8 already: the same buffers, as bytes
        column = column.cast(pa.binary())
    elif pa.types.is_large_string(column.type):
        column = column.cast(pa.large_binary())
    return column.to_numpy(zero_copy_only=False)


class ArrowRows:
    """Rows of the Arrow files, for worker processes: each maps the files itself
    (so a pickle holds its path, not its bytes) and gathers with `take`."""

    def __init__(self, files: Sequence[str], layout: Layout):
        self.files, self.layout = tuple(files), dict(layout)
        self._chunks: list[pa.RecordBatch] | None = None

    def __getstate__(self) -> dict:
        return {"files": self.files, "layout": self.layout, "_chunks": None}

    def __call__(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        if self._chunks is None:
            self._chunks = arrow_files_dataset(self.files).data.table.to_batches()
        return to_numpy(take(self._chunks, indices), self.layout)


def cache_path(dataset: ArrayDataset) -> Path:
    """Where ``dataset``'s Arrow copy lives: a readable name, the writing
    ``datasets`` version and its content key."""
    return cache_entry("hf", dataset.name, LAYOUT_VERSION, *dataset.content(), writer="datasets")


def arrow_cache(dataset: ArrayDataset) -> Path:
    """The cache directory holding ``dataset`` as `ARROW_FILE`, written once (`build_once`).

    Returns:
      A directory whose `ARROW_FILE` ``datasets.Dataset.from_file`` opens.

    Raises:
      ValueError: the copy is not there yet and the cache is not writable.
      RuntimeError: the copy fails its manifest (a truncated or changed file);
        the message names the directory to delete.
    """

    built = []

    def build(scratch: Path) -> None:
        built.append(scratch)
        superseded.record_source(scratch, dataset.name)
        rows = chunk_rows(dataset)
        total = sum(array.nbytes for array in dataset.arrays.values())
        schema = _schema(dataset)
        with (
            open(scratch / ARROW_FILE, "wb") as file,
            tqdm(total=total, unit="B", unit_scale=True, desc=f"Arrow copy of {dataset.name}",
                 disable=total < _PROGRESS_BYTES) as bar,
            pa.ipc.new_stream(pa.PythonFile(_Sliced(file, bar), mode="w"), schema) as out,
        ):  # fmt: skip
            for start in range(0, len(dataset), rows):
                out.write_batch(_record_batch(dataset, schema, start, start + rows))

    path = build_once(cache_path(dataset), build)
    if built:  # a new copy: the ones it supersedes go, unless some process reads them
        superseded.prune(path, dataset.name)
    return path


def _read_arrow_cache(reader: object, dataset: ArrayDataset) -> Path:
    """`arrow_cache`, held as read (`superseded.hold_reading`) for the life of
    ``reader``, so a newer copy's build does not prune it meanwhile."""
    for _ in range(3):
        path = arrow_cache(dataset)
        handle = superseded.hold_reading(path)
        if handle is not None:
            weakref.finalize(reader, os.close, handle)
            return path
    raise RuntimeError(f"the Arrow copy {path} was pruned 3 times while being opened")


def chunk_rows(dataset: ArrayDataset) -> int:
    """Rows per record batch: all of them, unless a field's values would pass
    the 2**31 - 1 that Arrow writes in one array."""
    widths = [int(np.prod(array.shape[1:])) for array in dataset.arrays.values()]
    return max(1, min(len(dataset), *((2**31 - 1) // max(1, w) for w in widths)))


def _schema(dataset: ArrayDataset) -> pa.Schema:
    """The HF features that ``datasets`` reads back: a field with several values
    per row is a fixed-size list of them, reshaped on the way out (``ArrayND``
    features read back far slower)."""
    features = {}
    for key, array in dataset.arrays.items():
        if array.dtype == object:  # bytes (a store's too): int64 offsets, no 2 GiB limit
            features[key] = datasets.Value("large_binary")
            continue
        value = datasets.Value(array.dtype.name)
        width = int(np.prod(array.shape[1:]))
        features[key] = value if array.ndim == 1 else datasets.Sequence(value, length=width)
    return datasets.Features(features).arrow_schema


def _record_batch(
    dataset: ArrayDataset, schema: pa.Schema, start: int, stop: int
) -> pa.RecordBatch:
    """Rows ``start:stop`` as an Arrow record batch over the dataset's own
    buffers (no copy, except bools, which Arrow packs into bits)."""
    columns = []
    for array in dataset.arrays.values():
        if array.dtype == object:  # a BytesField, or a store's read in place: its slice is one
            part = array[start:stop]
            buffers = [None, pa.py_buffer(part.offsets), pa.py_buffer(part.data)]
            columns.append(pa.Array.from_buffers(pa.large_binary(), len(part), buffers))
            continue
        flat = array[start:stop].reshape(-1)
        if array.dtype == np.bool_:
            values = pa.array(flat)
        else:
            values = pa.Array.from_buffers(pa.from_numpy_dtype(array.dtype), len(flat),
                                           [None, pa.py_buffer(flat)])  # fmt: skip
        width = int(np.prod(array.shape[1:]))
        columns.append(
            values if array.ndim == 1 else pa.FixedSizeListArray.from_arrays(values, width)
        )
    return pa.RecordBatch.from_arrays(columns, schema=schema)


class _Sliced:
    """A binary file that writes in `_WRITE_SLICE` pieces and counts them on a bar."""

    def __init__(self, file: BinaryIO, bar: tqdm) -> None:
        self._file, self._bar = file, bar
        self.closed = False

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        for start in range(0, len(view), _WRITE_SLICE):
            piece = view[start : start + _WRITE_SLICE]
            self._file.write(piece)
            self._bar.update(len(piece))
        return len(view)

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self.closed = True  # the caller closes the file


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

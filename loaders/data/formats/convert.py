"""``jaxfeed convert``: a dataset's splits rewritten as Parquet shards,
ArrayRecord shards of ``tf.train.Example`` records (the TFDS convention, what
Grain reads) or ``.npy`` fields, for random access at disk speed.

The source is read through its columnar copy (`jaxfeed.loaders.data.formats`),
so memory stays bounded by one shard; each output file is written under a
``.partial`` name and renamed when complete, and a rerun after a kill skips
the complete ones.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
from jaxfeed.loaders.array_dataset import ArrayDataset
from jaxfeed.loaders.bytes_field import BytesField

__all__ = ["TARGETS", "convert"]

TARGETS = ("parquet", "arrayrecord", "npy")
_COPY_BYTES = 64 << 20  # per chunk of an .npy copy
_CHUNK = 1024  # rows read at once into an ArrayRecord shard
_CHUNK_BYTES = 64 << 20  # at most (on average): large images make fewer rows, not more memory


def convert(
    source: str | os.PathLike,
    destination: str | os.PathLike,
    to: str,
    format: str | None = None,
    rows_per_shard: int = 10_000,
    progress: Callable[[str], None] = lambda line: None,
) -> list[Path]:
    """Writes each split ``source`` holds under ``destination/<split>/``.

    Returns:
      The files written or found complete, in order.

    Raises:
      ValueError: an unknown target; ``npy`` for a bytes field (``.npy`` holds
        numbers: convert to Parquet instead); no split at all.
    """
    from jaxfeed.loaders.data.catalog import SPLITS, load_dataset
    from jaxfeed.loaders.data.on_disk import MissingSplitError

    if to not in TARGETS:
        raise ValueError(f"unknown target {to!r}; choose one of {list(TARGETS)}")
    written: list[Path] = []
    for split in SPLITS:
        try:
            data = load_dataset(os.fspath(source), split, format=format)
        except MissingSplitError:
            continue
        directory = Path(destination) / split
        directory.mkdir(parents=True, exist_ok=True)
        write = {"parquet": _parquet, "arrayrecord": _arrayrecord, "npy": _npy}[to]
        written += write(
            data, directory, rows_per_shard, lambda s, sp=split: progress(f"{sp}: {s}")
        )
    if not written:
        raise ValueError(f"{source} holds no split of {list(SPLITS)} to convert")
    return written


def _finish(partial: Path, final: Path) -> Path:
    os.replace(partial, final)
    return final


def _parquet(data: ArrayDataset, directory: Path, rows: int, progress) -> list[Path]:
    import pyarrow as pa
    from pyarrow import parquet

    count = -(-len(data) // rows)
    out = []
    for shard in range(count):
        final = directory / f"{shard:05d}-of-{count:05d}.parquet"
        if not final.exists():
            part = slice(shard * rows, min(len(data), (shard + 1) * rows))
            table = pa.table({name: _arrow(field, part) for name, field in data.arrays.items()})
            partial = directory / f".{final.name}.partial"
            parquet.write_table(table, partial)
            _finish(partial, final)
        out.append(final)
        progress(
            f"shard {shard + 1}/{count}, {min(len(data), (shard + 1) * rows)}/{len(data)} rows"
        )
    return out


def _arrayrecord(data: ArrayDataset, directory: Path, rows: int, progress) -> list[Path]:
    """Shards of ``rows`` Example records each; ``group_size:1`` (each record
    its own chunk) is what random access reads fastest. Records holding
    encoded bytes (images: compressed already) are written uncompressed:
    zstd gained nothing on them and took four times the rest of the write,
    and every random read skips its decompression."""
    from array_record.python.array_record_module import ArrayRecordWriter
    from jaxfeed.loaders.data.formats.example import serialize_examples

    options = "group_size:1,uncompressed" if data.bytes_fields() else "group_size:1"
    total = sum(
        f.data.nbytes if isinstance(f, BytesField) else f.nbytes for f in data.arrays.values()
    )
    step = max(1, min(_CHUNK, _CHUNK_BYTES * len(data) // max(1, total)))  # rows read at once
    count = -(-len(data) // rows)
    out = []
    for shard in range(count):
        final = directory / f"{shard:05d}-of-{count:05d}.array_record"
        if not final.exists():
            partial = directory / f".{final.name}.partial"
            writer = ArrayRecordWriter(str(partial), options)
            try:
                for start in range(shard * rows, min(len(data), (shard + 1) * rows), step):
                    part = np.arange(start, min(len(data), (shard + 1) * rows, start + step))
                    columns = {name: field[part] for name, field in data.arrays.items()}
                    for record in serialize_examples(columns):
                        writer.write(record)
            finally:
                writer.close()
            _finish(partial, final)
        out.append(final)
        progress(
            f"shard {shard + 1}/{count}, {min(len(data), (shard + 1) * rows)}/{len(data)} rows"
        )
    return out


def _arrow(field: np.ndarray | BytesField, part: slice):
    import pyarrow as pa

    if isinstance(field, BytesField):
        rows = field[part]  # a BytesField: its offsets and data, not a bytes object per row
        if len(rows.data) < 1 << 31:  # Arrow's binary type holds 32-bit offsets
            offsets = np.asarray(rows.offsets, np.int32)
            buffers = [None, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(rows.data))]
            return pa.Array.from_buffers(pa.binary(), len(rows), buffers)
        return pa.array(list(field[np.arange(part.start, part.stop)]), pa.binary())
    values = np.ascontiguousarray(field[part])
    array = pa.array(values.reshape(-1))
    for size in values.shape[:0:-1]:  # innermost dimension first
        array = pa.FixedSizeListArray.from_arrays(array, size)
    return array


def _npy(data: ArrayDataset, directory: Path, rows: int, progress) -> list[Path]:
    encoded = data.bytes_fields()
    if encoded:
        raise ValueError(
            f"{data.name}: field(s) {encoded} hold encoded bytes, which .npy files cannot "
            "(they hold numbers); convert to parquet instead (to='parquet')"
        )
    out = []
    for name, field in data.arrays.items():
        final = directory / f"{name}.npy"
        if not final.exists():
            partial = directory / f".{name}.npy.partial"
            copy = np.lib.format.open_memmap(partial, "w+", field.dtype, field.shape)
            step = max(1, _COPY_BYTES // max(1, field[:1].nbytes))
            for start in range(0, len(field), step):
                copy[start : start + step] = field[start : start + step]
            copy.flush()
            del copy
            _finish(partial, final)
        out.append(final)
        progress(f"{final.name} ({len(field)} rows)")
    return out

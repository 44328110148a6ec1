"""``jaxfeed convert``: a dataset's splits rewritten as Parquet shards,
ArrayRecord shards of ``tf.train.Example`` records (the TFDS convention, what
Grain reads) or ``.npy`` fields, for random access at disk speed. A field
whose rows differ in length (a `RaggedField`) becomes a Parquet list column,
a variable-length Example feature, or a ``<field>.values.npy`` and
``<field>.offsets.npy`` pair.

The source is read through its columnar copy (`jaxfeed.loaders.data.formats`),
so memory stays bounded by one shard. The output is built in a directory
beside the destination (``.<name>.jaxfeed-partial``) and renamed into place
when every split is complete, with a manifest (``.jaxfeed-convert.json``)
naming the conversion and its files; each file is written under a
``.partial`` name and renamed when complete, and a rerun of the same
conversion after a kill skips the complete ones. A destination holding
anything else is refused: another conversion unless ``overwrite=True`` (which
removes only the files the manifest names), files jaxfeed did not write
always; so is a destination inside the source, or holding it.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from jaxfeed.loaders.array_dataset import ArrayDataset
from jaxfeed.loaders.bytes_field import BytesField
from jaxfeed.loaders.checks import check_bool
from jaxfeed.loaders.ragged_field import RaggedField

__all__ = ["TARGETS", "convert"]

TARGETS = ("parquet", "arrayrecord", "npy")
_COPY_BYTES = 64 << 20  # per chunk of an .npy copy
_CHUNK = 1024  # rows read at once into an ArrayRecord shard
_CHUNK_BYTES = 64 << 20  # at most (on average): large images make fewer rows, not more memory
MANIFEST = ".jaxfeed-convert.json"  # hidden: no reader takes it for data


def convert(
    source: str | os.PathLike,
    destination: str | os.PathLike,
    to: str,
    format: str | None = None,
    rows_per_shard: int = 10_000,
    progress: Callable[[str], None] = lambda line: None,
    overwrite: bool = False,
    storage_options: Mapping[str, Any] | None = None,
) -> list[Path]:
    """Writes each split ``source`` holds under ``destination/<split>/``.

    Args:
      overwrite: replace a previous conversion (of another source, format or
        shard size) that ``destination`` holds; files jaxfeed did not write
        are never removed, and refused even so.
      storage_options: for a ``source`` URL, its store's options, as
        `load_dataset` takes them.

    Returns:
      The files written or found complete, in order.

    Raises:
      ValueError: an unknown target or ``rows_per_shard`` below 1; ``npy`` for
        a bytes field (``.npy`` holds numbers: convert to Parquet instead);
        ``arrayrecord`` for a ragged field of frames (an Example has no
        shapes: convert to Parquet or ``npy`` instead); no
        split at all; a destination that is, holds or lies inside the source,
        that holds files no conversion wrote, or another conversion without
        ``overwrite=True``; ``storage_options`` for a ``source`` that is no URL.
      TypeError: ``overwrite`` is not a bool.
    """
    from jaxfeed.loaders.data.catalog import SPLITS, check_storage_options, load_dataset
    from jaxfeed.loaders.data.on_disk import MissingSplitError

    if to not in TARGETS:
        raise ValueError(f"unknown target {to!r}; choose one of {list(TARGETS)}")
    whole = isinstance(rows_per_shard, int | np.integer) and not isinstance(rows_per_shard, bool)
    if not whole or rows_per_shard < 1:
        raise ValueError(f"rows_per_shard={rows_per_shard!r}: expected a whole number >= 1")
    rows_per_shard = int(rows_per_shard)  # the manifest is JSON
    overwrite = check_bool("overwrite", overwrite)
    check_storage_options(os.fspath(source), storage_options)  # before any file is written
    destination = Path(destination).expanduser().absolute()
    key = {"source": _source_key(source), "to": to, "format": format, "rows": rows_per_shard}
    work, previous = _start(destination, key, overwrite)
    written: list[Path] = []
    for split in SPLITS:
        try:
            data = load_dataset(
                os.fspath(source), split, format=format, storage_options=storage_options
            ).with_fields()
        except MissingSplitError:
            continue
        directory = work / split
        directory.mkdir(parents=True, exist_ok=True)
        write = {"parquet": _parquet, "arrayrecord": _arrayrecord, "npy": _npy}[to]
        written += write(
            data, directory, rows_per_shard, lambda s, sp=split: progress(f"{sp}: {s}")
        )
    if not written:
        raise ValueError(f"{key['source']} holds no split of {list(SPLITS)} to convert")
    files = [p.relative_to(work).as_posix() for p in written]
    _write_manifest(work, {**key, "files": files})
    _put_in_place(work, destination, previous)
    return [destination / f for f in files]


def _source_key(source: str | os.PathLike) -> str:
    """The source as the manifest names it: its absolute path (a glob's too),
    or its URL without what may be a secret (`remote.shown_url`)."""
    from jaxfeed.loaders.data import remote

    text = os.fspath(source)
    if remote.is_url(text) and not text.startswith("file://"):
        return remote.shown_url(text)
    return os.path.abspath(os.path.expanduser(text.removeprefix("file://").removeprefix("idx:")))


def _source_root(source: str) -> Path | None:
    """The file or directory ``source`` reads from (a glob's fixed leading
    directories); None for a name that is no path (``mnist``)."""
    parts = Path(source).parts
    fixed = next((i for i, part in enumerate(parts) if glob.has_magic(part)), len(parts))
    root = Path(*parts[:fixed]) if fixed else Path(".")
    return root.resolve() if root.exists() else None


def _start(destination: Path, key: dict, overwrite: bool) -> tuple[Path, list[str]]:
    """The directory to build in (a rerun's, when it was this conversion's)
    and the files of the previous conversion to remove when done.

    Refuses a destination that is the source, inside it or holding it: a
    conversion never writes into the data it reads (nor reads its own output)."""
    root, target = _source_root(key["source"]), destination.resolve()
    if root is not None and (root == target or root in target.parents or target in root.parents):
        raise ValueError(
            f"destination {destination} is, holds or lies inside the source {root}; convert "
            "into a directory outside the source"
        )
    if destination.exists() and not destination.is_dir():
        raise ValueError(f"destination {destination} is a file; name a directory")
    manifest = _manifest(destination)
    previous = manifest.get("files", [])
    owned = {MANIFEST, *previous, *(_partial(f) for f in previous)}
    others = [p for p in _entries(destination) if p not in owned]
    if others:
        more = f", ... ({len(others)} in all)" if len(others) > 4 else ""
        raise ValueError(
            f"destination {destination} holds files no jaxfeed conversion wrote "
            f"({', '.join(others[:4])}{more}); convert into a new or empty directory "
            "(jaxfeed never removes files it did not write)"
        )
    same = bool(manifest) and _same(manifest, key)
    if manifest and not same and not overwrite:
        raise ValueError(
            f"destination {destination} holds another conversion ({manifest.get('source')} "
            f"to {manifest.get('to')}, {manifest.get('rows')} rows per shard); pass "
            "overwrite=True to replace it, or convert into a new or empty directory"
        )
    work = destination.with_name(f".{destination.name}.jaxfeed-partial")
    if work.exists():
        if not (work / MANIFEST).is_file():
            raise ValueError(f"{work} is in the way of the conversion, and jaxfeed did not make it")
        if same or not _same(_manifest(work), key):
            shutil.rmtree(work)  # ours: a kill's leftovers of another conversion
    if same:
        os.rename(destination, work)  # a rerun: resumed beside, put back when complete
        return work, []
    work.mkdir(parents=True, exist_ok=True)
    _write_manifest(work, {**key, "files": []})  # in progress: no files listed yet
    return work, previous


def _same(manifest: dict, key: dict) -> bool:
    return {k: manifest.get(k) for k in key} == key


def _partial(file: str) -> str:
    folder, _, name = file.rpartition("/")
    return f"{folder}/.{name}.partial" if folder else f".{name}.partial"


def _entries(directory: Path) -> list[str]:
    """Every file (or link) under ``directory``, as a relative posix path."""
    if not directory.is_dir():
        return []
    found = (p for p in sorted(directory.rglob("*")) if p.is_symlink() or not p.is_dir())
    return [p.relative_to(directory).as_posix() for p in found]


def _manifest(directory: Path) -> dict:
    try:
        found = json.loads((directory / MANIFEST).read_text())
    except (FileNotFoundError, NotADirectoryError):
        return {}
    except ValueError:
        found = None
    if not isinstance(found, dict) or not isinstance(found.get("files"), list):
        raise ValueError(
            f"{directory / MANIFEST} is not a manifest jaxfeed wrote; remove it, or convert "
            "into a new or empty directory"
        )
    return found


def _write_manifest(directory: Path, manifest: dict) -> None:
    partial = directory / f"{MANIFEST}.partial"
    partial.write_text(json.dumps(manifest, indent=1))
    os.replace(partial, directory / MANIFEST)


def _put_in_place(work: Path, destination: Path, previous: list[str]) -> None:
    """Replaces the previous conversion's files (only those) by the complete
    output: the destination never holds a mix, nor a half-written split."""
    if destination.exists():
        for file in [*previous, *(_partial(f) for f in previous), MANIFEST]:
            (destination / file).unlink(missing_ok=True)
        for folder in sorted({(destination / f).parent for f in previous}, reverse=True):
            if folder != destination and folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        destination.rmdir()  # empty now, or it raises: a file arrived meanwhile
    os.rename(work, destination)


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

    framed = [k for k in data.ragged_fields() if data.arrays[k].frame_shape]
    if framed:
        raise ValueError(
            f"{data.name}: field(s) {framed} hold rows of frames of different lengths, which "
            "an Example cannot (it has no shapes: the frames would read back as one flat "
            "row); convert to parquet or npy instead (to='parquet')"
        )
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
                    columns = {  # a ragged field's slice: its values and offsets, no row objects
                        name: field[part[0] : part[-1] + 1]
                        if isinstance(field, RaggedField)
                        else field[part]
                        for name, field in data.arrays.items()
                    }
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


def _arrow(field: np.ndarray | BytesField | RaggedField, part: slice):
    import pyarrow as pa

    if isinstance(field, RaggedField):  # a list column of its rows (of frames: fixed lists)
        rows = field[part]
        large = len(rows.values) >= 1 << 31
        offsets = pa.array(rows.offsets, pa.int64() if large else pa.int32())
        values = _arrow(np.ascontiguousarray(rows.values), slice(None))
        kind = pa.LargeListArray if large else pa.ListArray
        return kind.from_arrays(offsets, values)

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
        parts = {"": field}  # a ragged field: <name>.values.npy and <name>.offsets.npy
        if isinstance(field, RaggedField):
            parts = {".values": field.values, ".offsets": field.offsets}
        finals = [directory / f"{name}{suffix}.npy" for suffix in parts]
        for final, array in zip(finals, parts.values(), strict=True):
            if not final.exists():
                _npy_copy(array, directory / f".{final.name}.partial")
                _finish(directory / f".{final.name}.partial", final)
        out += finals
        progress(f"{', '.join(final.name for final in finals)} ({len(field)} rows)")
    return out


def _npy_copy(array: np.ndarray, partial: Path) -> None:
    """``array`` into a new ``.npy`` file, a bounded chunk at a time."""
    copy = np.lib.format.open_memmap(partial, "w+", array.dtype, array.shape)
    step = max(1, _COPY_BYTES // max(1, array[:1].nbytes))
    for start in range(0, len(array), step):
        copy[start : start + step] = array[start : start + step]
    copy.flush()
    del copy

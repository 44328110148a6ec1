"""The user's files through ``make``: TFRecord, ArrayRecord, Parquet, Arrow IPC,
image folders, prepared TFDS and Hugging Face directories.

Arrow IPC files are read in place: memory-mapped, with a small index in the
cache (`arrow_in_place`). ArrayRecord files are read in place by the grain
backend, through Grain's own source, with only their row 0 and record counts:
their dataset is `ArrayDataset.deferred`, and the copy below is built when
another backend first reads its fields. A compressed Arrow file, and every
other format, is streamed once from its files, in sorted name order, into a
columnar copy in jaxfeed's cache (`columns`), keyed by every file's path,
size, modification and change times and inode, so a file changed on disk is
never served stale. The copy is memory-mapped: every backend reads it in the
shared sampler's order, as any on-disk field. The copy records the rows of
each unit it was read from (a TFRecord or ArrayRecord shard, a Parquet row
group, an Arrow record batch) as the dataset's ``units``, which
``shuffle="blocks"`` keeps its blocks inside.

- `detect`: the format and a split's files from a directory, glob or list.
- `columns`: the columnar copy, written and mapped.
- `example`: ``tf.train.Example`` parsed without TensorFlow.
- `arrow_in_place`: Arrow IPC files read in place.
- `tfrecord`, `arrayrecord`, `tables`, `imagefolder`, `prepared`: one
  format each (``tables``: Parquet and Arrow IPC; ``prepared``: TFDS and HF
  directories).
- `riegeli`: ArrayRecord files parsed from their bytes (a store's objects,
  read in place by ``ranged_arrayrecord``).
- `convert`: a dataset rewritten as Parquet shards or ``.npy`` fields.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

from jaxfeed.loaders.array_dataset import ArrayDataset, InPlaceFiles
from jaxfeed.loaders.data.cache import build_once, cache_root
from jaxfeed.loaders.data.formats import (
    arrayrecord,
    arrow_in_place,
    columns,
    imagefolder,
    tables,
    tfrecord,
)
from jaxfeed.loaders.data.formats.detect import FORMATS, Found, locate, unknown_directory
from jaxfeed.loaders.data.formats.example import example_batches

__all__ = ["FORMATS", "load", "load_files", "locate", "unknown_directory"]

# Of the columnar copy: bumping it stops old copies from being reused (v3: a
# column whose type differs between files is widened or refused, not wrapped).
LAYOUT_VERSION = "v3"


def load_files(found: Found, split: str) -> ArrayDataset:
    """One split of ``found`` (`locate`'s answer) as memory-mapped fields,
    built into the cache on first use.

    Raises:
      ValueError: a record or column jaxfeed cannot read (named with its file
        and index).
    """
    if (found.record_format or found.format) == "arrayrecord":
        return _records_in_place(found, split)
    in_place = _in_place(found, split)
    fields, description = in_place or _copied(found, split)
    files = InPlaceFiles(arrow=tuple(str(p.resolve()) for p in found.files)) if in_place else None
    return ArrayDataset(
        f"{found.name}/{split}",
        fields,
        classes=description.get("classes", ()),
        units=description.get("units", ()),
        in_place=files,
    )


def _records_in_place(found: Found, split: str) -> ArrayDataset:
    """An ArrayRecord split from its row 0 and its files' record counts (no
    pass over the records); its fields, the copy, built on first use."""
    counts = arrayrecord.record_counts(found.files)
    head, examples = arrayrecord.first_row(found.files)
    build = functools.partial(_copied_fields, found, split, _entry(found, split))
    files = tuple(str(path) for path, count in zip(found.files, counts, strict=True) if count)
    return ArrayDataset.deferred(
        f"{found.name}/{split}",
        head,
        sum(counts),
        build,
        classes=found.classes,
        units=[count for count in counts if count],
        in_place=InPlaceFiles(arrayrecord=files, examples=examples),
    )


def _copied_fields(found: Found, split: str, entry: Path) -> dict:
    """The copy's fields, if the files are still those ``entry`` was keyed on."""
    if _entry(found, split) != entry:
        raise ValueError(
            f"{found.name}, {split} split: a file changed since the dataset was made "
            f"({', '.join(map(str, found.files[:4]))}); make the source again"
        )
    return _copied(found, split)[0]


def _copied(found: Found, split: str) -> tuple[dict, dict]:
    entry = build_once(_entry(found, split), lambda scratch: _write(found, scratch))
    return columns.open_columns(entry)


def _in_place(found: Found, split: str) -> tuple[dict, dict] | None:
    """An Arrow split's fields read in place, or None where its files cannot
    be (compressed): then the copy reads them."""
    if (found.record_format or found.format) != "arrow":
        return None
    index = _entry(found, split, layout=arrow_in_place.LAYOUT_VERSION)
    build_once(index, lambda scratch: arrow_in_place.write_index(found.files, scratch))
    opened = arrow_in_place.open_index(index)
    if opened is not None:
        opened[1]["classes"] = list(found.classes)  # of an HF directory's ClassLabel
    return opened


def _entry(found: Found, split: str, layout: str = LAYOUT_VERSION) -> Path:
    digest = hashlib.sha1(repr((found.format, found.record_format, found.classes, split)).encode())
    for path in _content_files(found):
        stat = os.stat(path)
        where = (str(path), stat.st_ino, stat.st_dev)  # resolved paths: see _content_files
        digest.update(repr((*where, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)).encode())
    slug = re.sub(r"[^a-z0-9]+", "-", f"{found.name}-{split}".lower()).strip("-")[-40:]
    return cache_root() / "formats" / f"{slug}-{layout}-{digest.hexdigest()[:16]}"


def _content_files(found: Found) -> Iterator[Path]:
    """The files whose identity keys the copy, by resolved path (an image
    folder's directory resolved once, not each of its files: a resolve per
    file cost as much as reading it)."""
    if found.format != "imagefolder":
        yield from (path.resolve() for path in found.files)
        return
    for directory in (path.resolve() for path in found.files):
        subdirectories = imagefolder.class_directories(directory)  # by NFC name
        for name in found.classes:
            if name in subdirectories:
                yield subdirectories[name]
                yield from imagefolder.files_in(subdirectories[name])


def _write(found: Found, scratch: Path) -> None:
    files = ", ".join(str(p) for p in found.files[:4]) + (", ..." if len(found.files) > 4 else "")
    units: list[int] = []  # filled while the batches stream; written when they end
    columns.write_columns(
        scratch,
        _batches(found, units),
        lambda row: f"{found.name}: row {row} (counting through {files} in order)",
        classes=list(found.classes),
        units=units,
    )


def _batches(found: Found, units: list[int]) -> Iterator[dict]:
    """The rows of ``found``, appending the rows of each unit to ``units``
    (none for an image folder: one file per row)."""
    kind = found.record_format or found.format
    if found.format == "imagefolder":
        return imagefolder.folder_batches(found.files[0], list(found.classes))
    if kind in ("parquet", "arrow"):
        types = tables.common_types(found.files, kind)
        return itertools.chain.from_iterable(_table(p, kind, units, types) for p in found.files)
    readers = {
        "tfrecord": tfrecord.tfrecord_records,
        "arrayrecord": arrayrecord.arrayrecord_records,
    }
    records = itertools.chain.from_iterable(_counted(readers[kind](p), units) for p in found.files)
    first = next(records, None)
    if first is None:
        raise ValueError(f"{', '.join(map(str, found.files))} hold no records")
    records = itertools.chain([first], records)
    if kind == "arrayrecord" and not arrayrecord.holds_examples(first[2]):
        return arrayrecord.raw_batches(records)
    return example_batches(records)


def _counted(records: Iterator, units: list[int]) -> Iterator:
    """``records`` (one file's), appending their number to ``units`` at the end."""
    count = 0
    for record in records:
        count += 1
        yield record
    if count:
        units.append(count)


def _table(path: Path, kind: str, units: list[int], types: dict) -> Iterator[dict]:
    """One Parquet file's batches, then its row groups' rows to ``units``; an
    Arrow file's record batches, each one unit; ``types``: `tables.common_types`."""
    for batch in tables.table_batches(path, kind, types):
        if kind == "arrow" and len(next(iter(batch.values()))):
            units.append(len(next(iter(batch.values()))))
        yield batch
    if kind == "parquet":
        units += tables.row_groups([path])


def load(
    target: str | os.PathLike | Sequence[str | os.PathLike],
    split: str,
    splits: Sequence[str],
    format: str | None = None,
) -> ArrayDataset | None:
    """`locate` then `load_files`; None for a directory of no known format."""
    found = locate(target, split, splits, format)
    return None if found is None else load_files(found, split)

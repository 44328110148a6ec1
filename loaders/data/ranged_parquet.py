"""A store's Parquet split read in place, by ranged reads of row groups, as
they are asked for: how a Parquet split bigger than the cache trains.

Each object's footer is read by ranged reads (pyarrow's ``ParquetFile`` over
`_RangedFile`, whose reads go through `RemoteObjects.read`: retried, never
short). A row is found by the cumulative row counts of the objects' row
groups, in the order the local reader reads them. A row group, its columns
alone, is one block: one ranged read of its column chunks, decoded by
pyarrow as the local reader decodes it (`tables.column_values`), held in a
`ranged_npy.BlockCache` (a quarter of ``JAXFEED_CACHE_BYTES`` per process
that reads). A batch's rows are grouped by row group, the missing groups
read in the cache's sliding window (`BlockCache.blocks`), and every column's
rows gathered at once, so a group is read once per batch. The dataset's
``units`` are the row groups, as for the local copy, so ``shuffle="blocks"``
keeps its blocks inside them.

Every column the local copy reads is read in place: numbers and fixed-size
lists of them as arrays (`RangedParquet`); binary and string columns (and a
struct holding ``bytes``, an HF ``Image``) as `ranged_values.RangedBytes`,
a batch's rows gathered from their groups; a list column of numbers (or of
fixed-size lists of them) as the local copy makes it: an array where every
row holds one length, else a `RaggedField` whose values are
`ranged_values.RangedValues`. A list column's row lengths (its offsets,
which the local copy holds too, and which decide its kind) come from one
pass over its column chunks, saved in jaxfeed's cache per object version
(`LENGTHS_DIR`, as `ranged_tfrecord` saves its index). Nulls are refused
as the local copy refuses them. Pickled into a worker, a field travels as
its URL, the footers, the lengths and an empty cache; the worker opens the
store itself (`RemoteObjects.read`).
"""

from __future__ import annotations

import functools
import hashlib
import io
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from jaxfeed.loaders.array_dataset import device_dtype, narrowed
from jaxfeed.loaders.bytes_field import BytesField
from jaxfeed.loaders.data.cache import build_once, cache_root
from jaxfeed.loaders.data.formats import tables
from jaxfeed.loaders.data.formats.detect import locate
from jaxfeed.loaders.data.object_cache import entry_key
from jaxfeed.loaders.data.ranged_npy import (
    READ_ENV,
    BatchFields,
    Block,
    BlockCache,
    RangedRows,
    read_mode,
)
from jaxfeed.loaders.data.ranged_values import (
    FieldBlock,
    RangedBytes,
    RangedValues,
    blocks_for,
    gather_rows,
    gather_values,
)
from jaxfeed.loaders.data.remote import CACHE_BYTES_ENV, RemoteObjects, cache_bytes
from jaxfeed.loaders.ragged_field import RaggedField

__all__ = ["LENGTHS_DIR", "RangedParquet", "parquet_fields"]

LENGTHS_DIR = "parquet-lengths"  # under jaxfeed's cache: a list column's row lengths per object
LAYOUT = "v1"  # of a lengths entry: bumping it builds them again
LOCAL_BATCH_ROWS = 1024  # the local reader's batches (`tables.table_batches`): they decide kinds


def parquet_fields(
    objects: RemoteObjects, split: str, splits: tuple[str, ...], format: str | None = None
) -> tuple[dict[str, RangedParquet], list[int]] | None:
    """``split``'s columns as `RangedParquet` fields and its row groups' rows
    (the dataset's ``units``), or None where its objects are fetched whole:
    ``READ_ENV`` is ``whole``, or ``auto`` (the default) and the objects fit
    the cache, or they are not all Parquet objects (by name).

    Raises:
      ValueError: a column the local copy refuses (nulls, a list of lists, a
        type it does not read), one whose kind differs between objects, a
        row group past the block cache's bound, an object that is not
        readable Parquet, or the split's files refused as local files would
        be (named by URL).
      MissingSplitError: the objects hold other splits but not ``split``.
    """
    if (
        read_mode(objects) is None
        or format not in (None, "parquet")
        or not all(
            _parquet_or_none(r or objects.path, v.size) for r, v in objects.made_from.items()
        )
    ):
        return None
    groups = _RowGroups(objects, _split_objects(objects, split, splits, format))
    return groups.fields(), groups.units


def _parquet_or_none(relative: str, size: int) -> bool:
    """Whether the local reader reads the object as Parquet by its name, or
    as no data (empty, or hidden): a Parquet split is read in place only
    when no other object could be in it."""
    name = relative.rpartition("/")[2].lower()
    parquet = name.endswith(".parquet") and ".tfrecord" not in name and ".array_record" not in name
    return parquet or size == 0 or name.startswith(".")


def _split_objects(
    objects: RemoteObjects, split: str, splits: tuple[str, ...], format: str | None
) -> list[str]:
    """The objects of ``split`` (relative paths, in reading order), chosen by
    the local reader's own rules (`detect.locate`) from empty files laid out
    as the objects are; its errors and warnings named by the URL."""
    url = objects.url.rstrip("/")
    with tempfile.TemporaryDirectory(prefix="jaxfeed-layout-") as scratch:
        root = Path(scratch) / "d"
        for relative in objects.made_from:
            (root / (relative or Path(objects.path).name)).parent.mkdir(parents=True, exist_ok=True)
            (root / (relative or Path(objects.path).name)).touch()
        if "" in objects.made_from:
            target: Any = root / Path(objects.path).name
        else:
            target = root if objects.members is None else [root / m for m in objects.members]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                found = locate(target, split, splits, format)
            except (ValueError, FileNotFoundError) as error:
                raise type(error)(str(error).replace(str(root), url)) from None
        for warning in caught:
            warnings.warn(str(warning.message).replace(str(root), url), warning.category, 3)
    if found is None or found.format != "parquet":  # only empty or hidden objects
        raise FileNotFoundError(
            f"{url} holds no Parquet data for the {split!r} split, only empty or hidden "
            "objects; check the URL"
        )
    return ["" if "" in objects.made_from else str(p.relative_to(root)) for p in found.files]


class _RowGroups:
    """The row groups of a split's Parquet objects, read as blocks of their
    columns through one `BlockCache` (shared by the split's fields)."""

    def __init__(self, objects: RemoteObjects, files: list[str]):
        import pyarrow as pa

        self.url = objects.url
        self._objects, self._files = objects, files
        self._sizes = [objects.made_from[r].size for r in files]
        self.cache = BlockCache(cache_bytes() // 4)
        footers = list(self.cache.pool().map(self._footer, range(len(files))))
        self._metadata = [metadata for metadata, _ in footers]
        schemas = [(self._url(i), schema) for i, (_, schema) in enumerate(footers)]
        kinds = _columns(schemas)
        self._list_columns = [_list_columns(schema) for _, schema in schemas]
        self._struct_columns = [
            {f.name for f in schema if pa.types.is_struct(f.type)} for _, schema in schemas
        ]
        # Every non-empty row group in reading order: (file, group, its first row in the file).
        self._groups: list[tuple[int, int, int]] = []
        self.units: list[int] = []
        for i, metadata in enumerate(self._metadata):
            first = 0
            for group in range(metadata.num_row_groups):
                rows = metadata.row_group(group).num_rows
                if rows:
                    self._groups.append((i, group, first))
                    self.units.append(rows)
                first += rows
        self._starts = np.cumsum([0, *self.units])
        # Each column: ("array", dtype, row shape), ("bytes", ...) or ("ragged", dtype, frame).
        self.columns: dict[str, tuple[str, np.dtype, tuple[int, ...]]] = {}
        self._offsets: dict[str, np.ndarray] = {}  # a ragged column's, over the split's rows
        lists = [name for name, (kind, _, _) in kinds.items() if kind == "list"]
        lengths = self._list_lengths(lists)
        for name, (kind, dtype, shape) in kinds.items():
            if kind != "list":
                self.columns[name] = (kind, dtype, shape)
                continue
            length = _list_kind(name, [(self._url(i), n[name]) for i, n in enumerate(lengths)])
            if length is None:
                self.columns[name] = ("ragged", dtype, shape)
                every = np.concatenate([n[name] for n in lengths])
                self._offsets[name] = np.concatenate([[0], np.cumsum(every)]).astype(np.int64)
            else:  # one length in every row: an array of that length, as the local copy holds it
                self.columns[name] = ("array", dtype, (length, *shape))
        # The columns each block holds: every row-indexed one (a batch's rows of a
        # group gathered at once), and each ragged one alone (its values gathered
        # by value: only the column a field reads is read).
        row_columns = tuple(n for n, c in self.columns.items() if c[0] != "ragged")
        ragged = [(n,) for n, c in self.columns.items() if c[0] == "ragged"]
        self._block_columns = ([row_columns] if row_columns else []) + ragged
        self._row_columns = row_columns
        self._check()
        self._fields = BatchFields(self.cache.max_bytes)

    def fields(self) -> dict[str, Any]:
        """Each column as the local copy holds it (see the module)."""
        out: dict[str, Any] = {}
        for name, (kind, dtype, shape) in self.columns.items():
            if kind == "array":
                out[name] = RangedParquet(self, name)
            elif kind == "bytes":
                where = f"{self.url.rstrip('/')}#{name}"
                out[name] = RangedBytes(self, name, self.rows, self._column_bytes(name), where)
            else:
                offsets = self._offsets[name]
                where = f"{self.url.rstrip('/')}#{name}"
                total = int(offsets[-1])
                values = RangedValues(self, name, total, shape, device_dtype(dtype), where)
                out[name] = RaggedField(values, offsets)
        return out

    def _url(self, file: int) -> str:
        return self._objects.object_url(self._files[file])

    def _footer(self, file: int) -> tuple[Any, Any]:
        from pyarrow import ArrowInvalid, parquet

        try:
            opened = parquet.ParquetFile(self._file(file))
            return opened.metadata, opened.schema_arrow
        except ArrowInvalid as error:  # a failed read is an OSError, named already
            raise ValueError(
                f"{self._url(file)} is not a readable parquet file ({error}); pass format= "
                "to say what it is, or write it again"
            ) from None

    def _file(self, file: int, held: tuple[int, bytes] = (0, b"")) -> _RangedFile:
        return _RangedFile(self._objects, self._files[file], self._sizes[file], held)

    def _list_lengths(self, names: list[str]) -> list[dict[str, np.ndarray]]:
        """Per object, each list column's row lengths (over its rows, in
        order), from one pass over those columns' chunks unless jaxfeed's
        cache holds them for this version of the object (`LENGTHS_DIR`)."""
        if not names:
            return [{} for _ in self._files]

        def lengths(file: int) -> dict[str, np.ndarray]:
            listed = self._objects.made_from[self._files[file]]
            key = entry_key(self._url(file), listed.size, listed.identity)
            digest = hashlib.sha256(repr(names).encode()).hexdigest()[:8]
            path = build_once(
                cache_root() / LENGTHS_DIR / f"{key}-{digest}-{LAYOUT}",
                lambda scratch: self._write_lengths(file, names, scratch),
            )
            with np.load(path / "lengths.npz") as saved:
                return {name: saved[f"c{i}"] for i, name in enumerate(names)}

        return list(self.cache.pool().map(lengths, range(len(self._files))))

    def _write_lengths(self, file: int, names: list[str], scratch: Path) -> None:
        """One object's list columns' row lengths, a row group at a time (one
        ranged read of those columns' chunks each); a null refused as the
        local copy refuses it (`tables.column_values`), naming the row."""
        metadata = self._metadata[file]
        found: dict[str, list[np.ndarray]] = {name: [] for name in names}
        first = 0
        for group in range(metadata.num_row_groups):
            rows = metadata.row_group(group).num_rows
            if rows:
                table = self._read_group(file, group, names)
                for name in names:
                    column = table.column(name).combine_chunks()
                    if column.null_count or column.flatten().null_count:
                        tables.column_values(column, f"{self._url(file)}, column {name!r}", first)
                    found[name].append(np.asarray(column.value_lengths(), np.int64))
            first += rows
        parts = {
            f"c{i}": np.concatenate(found[n]) if found[n] else np.zeros(0, np.int64)
            for i, n in enumerate(names)
        }
        np.savez(scratch / "lengths.npz", **parts)

    def _read_group(self, file: int, group: int, names: list[str]) -> Any:
        """Row group ``group`` of ``file``, its columns ``names`` alone, from one
        ranged read of their chunks."""
        from pyarrow import ArrowException, parquet

        chunks = self._metadata[file].row_group(group)
        spans = [
            _span(chunks.column(c))
            for c in range(chunks.num_columns)
            if chunks.column(c).path_in_schema.split(".")[0] in names
        ]
        start, end = min(s for s, _ in spans), max(e for _, e in spans)
        held = (start, self._objects.read(self._files[file], start, end))
        opened = parquet.ParquetFile(self._file(file, held), metadata=self._metadata[file])
        try:
            return opened.read_row_group(group, columns=names)
        except ArrowException as error:  # a ranged read is not pinned to a version
            raise ValueError(
                f"{self._url(file)}, row group {group} does not decode ({error}); was the "
                "object changed since the source was made? Make the source again"
            ) from None

    def _column_bytes(self, name: str, group: int | None = None) -> int:
        """Column ``name``'s bytes uncompressed (in row group ``group`` of the
        split, else in all of them), as its chunks' metadata say, and its
        offsets: about what the decoded rows take."""
        total = 0
        for index in range(len(self._groups)) if group is None else [group]:
            file, g, _ = self._groups[index]
            chunks = self._metadata[file].row_group(g)
            total += 8 * (self.units[index] + 1)
            for c in range(chunks.num_columns):
                if chunks.column(c).path_in_schema.split(".")[0] == name:
                    total += chunks.column(c).total_uncompressed_size
        return total

    def _group_bytes(self, index: int, names: tuple[str, ...]) -> int:
        """What the columns ``names`` of row group ``index`` (of the split's)
        take decoded, about: exactly for arrays and ragged values, by the
        metadata for bytes."""
        rows, total = self.units[index], 0
        for name in names:
            kind, dtype, shape = self.columns[name]
            if kind == "array":
                total += rows * dtype.itemsize * int(np.prod(shape))
            elif kind == "bytes":
                total += self._column_bytes(name, index)
            elif kind == "ragged":
                first, stop = self._starts[index], self._starts[index + 1]
                values = int(self._offsets[name][stop] - self._offsets[name][first])
                total += values * dtype.itemsize * int(np.prod(shape)) + 8 * (rows + 1)
        return total

    def _check(self) -> None:
        """Refuses, from the footers, a row group past the block cache's bound
        and a column the footer says holds nulls (the local copy refuses it;
        a list column's nulls were refused by the pass over its lengths, and
        its statistics count an empty list as a null)."""
        bound = self.cache.max_bytes
        for index, ((file, group, _), rows) in enumerate(
            zip(self._groups, self.units, strict=True)
        ):
            nbytes = max(self._group_bytes(index, names) for names in self._block_columns)
            if nbytes > bound:
                raise ValueError(
                    f"{self._url(file)}, row group {group}: {rows} rows of about "
                    f"{nbytes // rows} bytes, {nbytes} bytes, past the block cache's bound of "
                    f"{bound} bytes (a quarter of {CACHE_BYTES_ENV}) that a row group read in "
                    f"place must fit; raise {CACHE_BYTES_ENV} to at least {4 * nbytes}, or "
                    "write the files with smaller row groups (pyarrow's row_group_size=)"
                )
            chunks = self._metadata[file].row_group(group)
            for column in range(chunks.num_columns):
                path = chunks.column(column).path_in_schema
                name = path.split(".")[0]
                if name not in self.columns or name in self._list_columns[file]:
                    continue
                if name in self._struct_columns[file] and path != f"{name}.bytes":
                    continue  # an HF Image's other fields (a null path): not read
                stats = chunks.column(column).statistics
                if stats is not None and stats.has_null_count and stats.null_count:
                    raise ValueError(
                        f"{self._url(file)}, column {name!r} holds {stats.null_count} nulls in "
                        f"row group {group}: every field needs a value in every row; fill the "
                        "nulls, or leave the column out"
                    )

    @property
    def rows(self) -> int:
        return int(self._starts[-1])

    def rows_of(self, name: str, rows: np.ndarray) -> np.ndarray:
        """Column ``name``'s ``rows`` (as stored; a bytes column's as an object
        array of ``bytes``). Every such column's rows are gathered at once
        (`BatchFields`): a row group is read once per batch, not once per field."""
        return self._fields.field(name, rows, self._gather)

    def _gather(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        fields = {n: self.columns[n] for n in self._row_columns}
        block = functools.partial(self._block, names=self._row_columns)
        return gather_rows(self.cache, block, self._starts, rows, fields)

    def blocks_of(self, rows: np.ndarray) -> list[Block]:
        """The row groups a gather of ``rows`` reads (`_gather`'s blocks)."""
        block = functools.partial(self._block, names=self._row_columns)
        return blocks_for(block, self._starts, rows)

    def values_of(self, name: str, values: np.ndarray) -> np.ndarray:
        """The ragged column ``name``'s ``values`` (indices into its values
        back to back, as stored), a row group at a time."""
        _, dtype, frame = self.columns[name]
        block, starts = self._value_blocks(name)
        return gather_values(self.cache, block, starts, values, name, dtype, frame)

    def value_blocks(self, name: str, values: np.ndarray) -> list[Block]:
        """The blocks `values_of` reads for ``values``."""
        return blocks_for(*self._value_blocks(name), values)

    def _value_blocks(self, name: str) -> tuple[Callable[[int], Block], np.ndarray]:
        """The ragged column ``name``'s blocks (the column alone, a row group
        each) and each one's first value."""
        return functools.partial(self._block, names=(name,)), self._offsets[name][self._starts]

    def _block(self, index: int, names: tuple[str, ...]) -> Block:
        """The columns ``names`` of row group ``index`` (of all the split's),
        from one ranged read of their chunks, decoded as the local copy
        decodes them."""
        file, group, first = self._groups[index]

        def read() -> FieldBlock:
            table = self._read_group(file, group, list(names))
            block = FieldBlock()
            for name in names:
                kind, dtype, _ = self.columns[name]
                where = f"{self._url(file)}, column {name!r}"
                column = table.column(name).combine_chunks()
                if kind == "ragged":
                    block[name] = self._ragged(name, column, index, where, first)
                    continue
                values = tables.column_values(column, where, first)
                if kind == "bytes":
                    block[name] = BytesField.from_values(values)
                else:
                    block[name] = np.asarray(values).astype(dtype, copy=False)
            if block.nbytes > self.cache.max_bytes:
                raise ValueError(
                    f"{self._url(file)}, row group {group} takes {block.nbytes} bytes decoded, "
                    f"past the block cache's bound of {self.cache.max_bytes} bytes (a quarter "
                    f"of {CACHE_BYTES_ENV}); raise {CACHE_BYTES_ENV} to at least "
                    f"{4 * block.nbytes}, or write the files with smaller row groups"
                )
            return block

        key = (self._files[file], group, names)
        return Block(key, "big", self._group_bytes(index, names), read)

    def _ragged(self, name: str, column: Any, index: int, where: str, first: int) -> RaggedField:
        """A ragged column's rows of one group (its nulls refused already by
        the pass over its lengths), checked against those lengths."""
        _, dtype, frame = self.columns[name]
        lengths = np.asarray(column.value_lengths(), np.int64)
        offsets = self._offsets[name][self._starts[index] : self._starts[index + 1] + 1]
        if not np.array_equal(lengths, np.diff(offsets)):
            raise ValueError(
                f"{where}, row {first} on no longer holds the list lengths it was read with: "
                "the object changed since the source was made; make the source again"
            )
        flat = column.flatten()
        values = np.zeros((0, *frame), dtype)
        if len(flat):
            values = np.asarray(tables.column_values(flat, where, first)).astype(dtype, copy=False)
        return RaggedField.from_lengths(values.reshape(-1, *frame), lengths)


def _columns(schemas: list[tuple[str, Any]]) -> dict[str, tuple[str, np.dtype, tuple[int, ...]]]:
    """Each column's kind, dtype (widened as the local copy widens it) and
    shape, in the first object's order, from every object's schema (``(url,
    schema)``): ``("array", dtype, row shape)``, ``("bytes", object, ())``
    or ``("list", dtype, frame)`` (a list whose rows may differ in length).

    Raises:
      ValueError: a column the local copy does not read (named with its
        type), objects whose columns differ, or a column whose kind or shape
        differs between them.
    """
    widened = tables.schema_types(schemas)
    first, names = schemas[0][0], schemas[0][1].names
    columns: dict[str, tuple[str, np.dtype, tuple[int, ...]]] = {}
    for where, schema in schemas:
        if set(schema.names) != set(names):
            raise ValueError(
                f"{where} has the columns {sorted(schema.names)} where {first} has "
                f"{sorted(names)}: a split's files hold the same columns; write them again "
                "with one schema, or pass one kind's files (a list or a glob)"
            )
        for field in schema:
            kind, dtype, shape = _column_kind(where, field)
            dtype = widened.get(field.name, dtype)
            seen = columns.setdefault(field.name, (kind, dtype, shape))
            if seen[0] != kind or seen[2] != shape:
                said = {"array": "rows of shape", "list": "lists of steps of shape"}
                raise ValueError(
                    f"{where}, column {field.name!r} holds {said.get(kind, kind)} {shape} where "
                    f"{first} holds {said.get(seen[0], seen[0])} {seen[2]}: a column's rows "
                    "have one kind and shape in every file read in place; write them again with "
                    f"one schema, or set {READ_ENV}=whole to fetch the objects into the cache"
                )
    return {name: columns[name] for name in names}


def _column_kind(where: str, field: Any) -> tuple[str, np.dtype, tuple[int, ...]]:
    """One column's kind, dtype and shape (see `_columns`) from its type."""
    import pyarrow as pa

    kind = field.type
    fixed = tables.fixed_shape(kind)
    if fixed is not None:
        return "array", fixed[0], fixed[1]
    if pa.types.is_struct(kind) and kind.get_field_index("bytes") >= 0:  # HF Image / Audio
        kind = kind.field("bytes").type
    text = (pa.types.is_binary, pa.types.is_large_binary, pa.types.is_string)
    if any(is_kind(kind) for is_kind in text) or pa.types.is_large_string(kind):
        return "bytes", np.dtype(object), ()
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        steps = tables.fixed_shape(kind.value_type)
        if steps is not None:
            return "list", steps[0], steps[1]
    raise ValueError(
        f"{where}, column {field.name!r} is {field.type}: read in place (by ranged reads) "
        "are numbers, fixed-size lists of them, binary and string columns and lists of "
        f"numbers or of fixed-size lists of numbers; set {READ_ENV}=whole to fetch the "
        f"objects into the cache (raise {CACHE_BYTES_ENV} to hold them) and read them as "
        "local files, or leave the column out"
    )


def _list_columns(schema: Any) -> set[str]:
    """The columns of variable-length list type in ``schema``."""
    import pyarrow as pa

    return {f.name for f in schema if pa.types.is_list(f.type) or pa.types.is_large_list(f.type)}


def _list_kind(name: str, lengths: list[tuple[str, np.ndarray]]) -> int | None:
    """A list column's kind as the local copy decides it from its rows'
    lengths (per object, in reading order): the one length every row holds,
    or None where rows differ (a `RaggedField`). The local copy reads each
    object in batches of `LOCAL_BATCH_ROWS`: a batch of rows of one length
    is an array of that length, a batch whose rows differ ragged (and then
    the whole column); this follows it.

    Raises:
      ValueError: what the local copy refuses: a batch whose rows are all
        empty lists, or a batch of another one length than earlier batches
        while every batch so far held one.
    """
    kind: int | str | None = None
    for url, counts in lengths:
        for start in range(0, len(counts), LOCAL_BATCH_ROWS):
            batch = counts[start : start + LOCAL_BATCH_ROWS]
            if np.any(batch != batch[0]):
                kind = "ragged"
                continue
            if batch[0] == 0:
                raise ValueError(
                    f"{url}, column {name!r}, rows {start} to {start + len(batch) - 1} of the "
                    "file hold empty lists: the local copy reads a batch of rows that are all "
                    "empty as rows of no values, which it refuses; drop those rows, or leave "
                    "the column out"
                )
            if kind is None:
                kind = int(batch[0])
            elif kind != "ragged" and kind != batch[0]:
                raise ValueError(
                    f"{url}, column {name!r}, row {start} of the file on: rows of "
                    f"{int(batch[0])} values where every earlier row holds {kind}: the local "
                    "copy reads such a column as rows of one length and refuses the rest; "
                    "write the column with rows of one length, or with rows that differ "
                    "within a batch"
                )
    return None if kind == "ragged" else kind


def _span(chunk: Any) -> tuple[int, int]:
    """The bytes of one column chunk: its dictionary page (if any), then its data pages."""
    start = chunk.data_page_offset
    if chunk.has_dictionary_page and chunk.dictionary_page_offset:
        start = min(start, chunk.dictionary_page_offset)
    return start, start + chunk.total_compressed_size


class _RangedFile(io.RawIOBase):
    """One object as a read-only file for pyarrow: reads inside ``held``
    (``(start, bytes)``, read already) served from it, others by a ranged read."""

    def __init__(self, objects: RemoteObjects, relative: str, size: int, held: tuple[int, bytes]):
        super().__init__()
        self._objects, self._relative, self._size, self._held = objects, relative, size, held
        self._at = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._at

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._at = {io.SEEK_SET: 0, io.SEEK_CUR: self._at, io.SEEK_END: self._size}[whence]
        self._at += offset
        return self._at

    def readinto(self, buffer: Any) -> int:
        start, end = self._at, min(self._size, self._at + len(buffer))
        if end <= start:
            return 0
        at, held = self._held
        if at <= start and end <= at + len(held):
            data = memoryview(held)[start - at : end - at]
        else:
            data = self._objects.read(self._relative, start, end)
        buffer[: end - start] = data
        self._at = end
        return end - start


class RangedParquet(RangedRows):
    """One column of a store's Parquet split, read in place (a `RemoteField`;
    see the module)."""

    def __init__(self, groups: _RowGroups, name: str):
        self.url, self.name, self._groups = groups.url, name, groups
        _, stored, row = groups.columns[name]
        self.shape = (groups.rows, *row)
        self.dtype = device_dtype(stored)
        self.nbytes = groups.rows * self.dtype.itemsize * int(np.prod(row))

    def __repr__(self) -> str:
        return f"RangedParquet({self.url!r}, {self.name!r}, {self.dtype} {list(self.shape)})"

    def _gather(self, rows: np.ndarray) -> np.ndarray:
        return self._groups.rows_of(self.name, rows)

    def _blocks_of(self, rows: np.ndarray) -> list[Block]:
        return self._groups.blocks_of(rows)

    def _served(self, rows: np.ndarray) -> np.ndarray:
        return narrowed(rows, self.dtype, f"{self.url}, column {self.name!r}")

    @property
    def cache(self) -> BlockCache:
        """The block cache the split's fields share in this process."""
        return self._groups.cache

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

Numeric columns and fixed-size lists of them are read in place; binary,
string and variable-length list columns (the local copy makes bytes and
ragged fields of them, from all their rows) are refused by name. Pickled
into a worker, a field travels as its URL, the footers and an empty cache;
the worker opens the store itself (`RemoteObjects.read`).
"""

from __future__ import annotations

import io
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from jaxfeed.loaders.array_dataset import device_dtype, narrowed
from jaxfeed.loaders.data.formats import tables
from jaxfeed.loaders.data.formats.detect import locate
from jaxfeed.loaders.data.ranged_npy import (
    READ_ENV,
    BatchFields,
    Block,
    BlockCache,
    RangedRows,
    read_mode,
)
from jaxfeed.loaders.data.remote import CACHE_BYTES_ENV, RemoteObjects, cache_bytes

__all__ = ["RangedParquet", "parquet_fields"]


def parquet_fields(
    objects: RemoteObjects, split: str, splits: tuple[str, ...], format: str | None = None
) -> tuple[dict[str, RangedParquet], list[int]] | None:
    """``split``'s columns as `RangedParquet` fields and its row groups' rows
    (the dataset's ``units``), or None where its objects are fetched whole:
    ``READ_ENV`` is ``whole``, or ``auto`` (the default) and the objects fit
    the cache, or they are not all Parquet objects (by name).

    Raises:
      ValueError: a column read in place cannot serve as the local copy does
        (binary, string, a list whose length may vary: the fix is
        ``JAXFEED_READ=whole``), a row group past the block cache's bound,
        an object that is not readable Parquet, or the split's files refused
        as local files would be (named by URL).
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
    fields = {name: RangedParquet(groups, name) for name in groups.columns}
    return fields, groups.units


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
        self.url = objects.url
        self._objects, self._files = objects, files
        self._sizes = [objects.made_from[r].size for r in files]
        self.cache = BlockCache(cache_bytes() // 4)
        footers = list(self.cache.pool().map(self._footer, range(len(files))))
        self._metadata = [metadata for metadata, _ in footers]
        schemas = [(self._url(i), schema) for i, (_, schema) in enumerate(footers)]
        self.columns = _columns(schemas)
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
        self._row_bytes = sum(d.itemsize * int(np.prod(s)) for d, s in self.columns.values())
        self._check()
        self._fields = BatchFields(self.cache.max_bytes)

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

    def _check(self) -> None:
        """Refuses, from the footers, a row group past the block cache's bound
        and a column the footer says holds nulls (the local copy refuses it)."""
        bound = self.cache.max_bytes
        for (file, group, _), rows in zip(self._groups, self.units, strict=True):
            if rows * self._row_bytes > bound:
                raise ValueError(
                    f"{self._url(file)}, row group {group}: {rows} rows of {self._row_bytes} "
                    f"bytes, {rows * self._row_bytes} bytes, past the block cache's bound of "
                    f"{bound} bytes (a quarter of {CACHE_BYTES_ENV}) that a row group read in "
                    f"place must fit; raise {CACHE_BYTES_ENV} to at least "
                    f"{4 * rows * self._row_bytes}, or write the files with smaller row groups "
                    "(pyarrow's row_group_size=)"
                )
            chunks = self._metadata[file].row_group(group)
            for column in range(chunks.num_columns):
                stats = chunks.column(column).statistics
                if stats is not None and stats.has_null_count and stats.null_count:
                    name = chunks.column(column).path_in_schema.split(".")[0]
                    raise ValueError(
                        f"{self._url(file)}, column {name!r} holds {stats.null_count} nulls in "
                        f"row group {group}: every field needs a value in every row; fill the "
                        "nulls, or leave the column out"
                    )

    @property
    def rows(self) -> int:
        return int(self._starts[-1])

    def gather(self, name: str, rows: np.ndarray) -> np.ndarray:
        """Column ``name``'s ``rows`` (as stored). Every column's rows are
        gathered at once (`BatchFields`): a row group is read once per batch,
        not once per field."""
        return self._fields.field(name, rows, self._gather)

    def _gather(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """Every column's ``rows``, read a row group at a time: a batch's rows
        of one group come from one block, the missing blocks read in the
        cache's sliding window (`BlockCache.blocks`)."""
        out = {n: np.empty((len(rows), *s), d) for n, (d, s) in self.columns.items()}
        groups = self._group_of(rows)
        order = np.argsort(groups, kind="stable")
        needed, starts = np.unique(groups[order], return_index=True)
        wheres = np.split(order, starts[1:])
        for i, block in self.cache.blocks([self._block(int(g)) for g in needed]):
            where = wheres[i]
            for name, array in out.items():
                array[where] = block[name][rows[where] - self._starts[needed[i]]]
        return out

    def _group_of(self, rows: np.ndarray) -> np.ndarray:
        return np.searchsorted(self._starts, rows, side="right") - 1

    def blocks_of(self, rows: np.ndarray) -> list[Block]:
        """The row groups a gather of ``rows`` reads."""
        return [self._block(int(g)) for g in np.unique(self._group_of(rows))]

    def _block(self, index: int) -> Block:
        """Row group ``index`` (of all the split's): its columns, decoded."""
        file, group, first = self._groups[index]

        def read() -> _Block:
            from pyarrow import ArrowException, parquet

            chunks = self._metadata[file].row_group(group)
            spans = [_span(chunks.column(c)) for c in range(chunks.num_columns)]
            start, end = min(s for s, _ in spans), max(e for _, e in spans)
            held = (start, self._objects.read(self._files[file], start, end))
            opened = parquet.ParquetFile(self._file(file, held), metadata=self._metadata[file])
            try:
                table = opened.read_row_group(group, columns=list(self.columns))
            except ArrowException as error:  # a ranged read is not pinned to a version
                raise ValueError(
                    f"{self._url(file)}, row group {group} does not decode ({error}); was the "
                    "object changed since the source was made? Make the source again"
                ) from None
            block = _Block()
            for name, (dtype, _) in self.columns.items():
                where = f"{self._url(file)}, column {name!r}"
                values = tables.column_values(table.column(name).combine_chunks(), where, first)
                block[name] = np.asarray(values).astype(dtype, copy=False)
            return block

        nbytes = self.units[index] * self._row_bytes
        return Block((self._files[file], group), "big", nbytes, read)


def _columns(schemas: list[tuple[str, Any]]) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """Each column's dtype (widened as the local copy widens it) and row shape,
    in the first object's order, from every object's schema (``(url, schema)``).

    Raises:
      ValueError: a column whose rows' shape its type does not fix, objects
        whose columns differ, or a column's shape that differs between them.
    """
    widened = tables.schema_types(schemas)
    first, names = schemas[0][0], schemas[0][1].names
    columns: dict[str, tuple[np.dtype, tuple[int, ...]]] = {}
    for where, schema in schemas:
        if set(schema.names) != set(names):
            raise ValueError(
                f"{where} has the columns {sorted(schema.names)} where {first} has "
                f"{sorted(names)}: a split's files hold the same columns; write them again "
                "with one schema, or pass one kind's files (a list or a glob)"
            )
        for field in schema:
            fixed = tables.fixed_shape(field.type)
            if fixed is None:
                raise ValueError(
                    f"{where}, column {field.name!r} is {field.type}: read in place (by ranged "
                    "reads) are numeric columns and fixed-size lists of them; set "
                    f"{READ_ENV}=whole to fetch the objects into the cache (raise "
                    f"{CACHE_BYTES_ENV} to hold them) and read them as local files, or leave "
                    "the column out"
                )
            dtype = widened.get(field.name, fixed[0])
            shape = columns.setdefault(field.name, (dtype, fixed[1]))[1]
            if fixed[1] != shape:
                raise ValueError(
                    f"{where}, column {field.name!r} holds rows of shape {fixed[1]} where "
                    f"{first} holds rows of shape {shape}: a column's rows have one shape in "
                    "every file; write them again with one schema"
                )
    return {name: columns[name] for name in names}


def _span(chunk: Any) -> tuple[int, int]:
    """The bytes of one column chunk: its dictionary page (if any), then its data pages."""
    start = chunk.data_page_offset
    if chunk.has_dictionary_page and chunk.dictionary_page_offset:
        start = min(start, chunk.dictionary_page_offset)
    return start, start + chunk.total_compressed_size


class _Block(dict):
    """One row group's columns (name -> rows), as the `BlockCache` holds it."""

    @property
    def nbytes(self) -> int:
        return sum(array.nbytes for array in self.values())


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
        stored, row = groups.columns[name]
        self.shape = (groups.rows, *row)
        self.dtype = device_dtype(stored)
        self.nbytes = groups.rows * self.dtype.itemsize * int(np.prod(row))

    def __repr__(self) -> str:
        return f"RangedParquet({self.url!r}, {self.name!r}, {self.dtype} {list(self.shape)})"

    def _gather(self, rows: np.ndarray) -> np.ndarray:
        return self._groups.gather(self.name, rows)

    def _blocks_of(self, rows: np.ndarray) -> list[Block]:
        return self._groups.blocks_of(rows)

    def _served(self, rows: np.ndarray) -> np.ndarray:
        return narrowed(rows, self.dtype, f"{self.url}, column {self.name!r}")

    @property
    def cache(self) -> BlockCache:
        """The block cache the split's fields share in this process."""
        return self._groups.cache

"""Parquet and Arrow IPC files (and the Arrow files of a Hugging Face
``save_to_disk`` directory), read with pyarrow one record batch at a time.

Columns are fields: a numeric column an array, a binary or string column a
bytes field (an HF ``Image`` column, a struct holding ``bytes``, too), a
fixed-size list column (or a list column whose rows all have one length) an
array of that length per row, a list column whose rows differ in length
(``list`` or ``large_list`` of numbers, or of fixed-size lists of them: the
frames) a `RaggedField`. Nulls, lists of variable-length lists and empty
fixed-length lists are refused by column, row and file. A column whose type
differs between a split's files is read in the one type that holds every
file's values exactly (`common_types`), or refused naming both files.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from jaxfeed.loaders.data.formats.columns import common_dtype
from jaxfeed.loaders.ragged_field import RaggedField

__all__ = [
    "ARROW_MAGIC",
    "PARQUET_MAGIC",
    "column_values",
    "common_types",
    "fixed_shape",
    "schema_types",
    "table_batches",
]

PARQUET_MAGIC = b"PAR1"
ARROW_MAGIC = b"ARROW1"  # the file format; the stream format starts with 0xFFFFFFFF
_BATCH_ROWS = 1024


def row_groups(paths: Sequence[Path]) -> list[int]:
    """The rows of each row group of the Parquet files ``paths``, in order
    (from the footers: no data is read)."""
    from pyarrow import parquet

    out = []
    for path in paths:
        metadata = parquet.ParquetFile(path).metadata
        out += [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
    return [rows for rows in out if rows]


def common_types(paths: Sequence[Path], kind: str) -> dict[str, np.dtype]:
    """The numeric columns whose type differs between the ``"parquet"`` or
    ``"arrow"`` files ``paths``, each with the type that holds every file's
    values exactly (`common_dtype`: ints widen to a wider int, floats to a
    wider float), from the files' schemas (no data is read).

    Raises:
      ValueError: a column that no one type holds exactly (bool in one file,
        numbers in another; ints and floats; numbers and bytes), named with
        both files and both types; or a file that does not open as ``kind``.
    """
    return schema_types((path, _schema(path, kind)) for path in paths)


def schema_types(schemas: Iterable[tuple[object, Any]]) -> dict[str, np.dtype]:
    """`common_types` of schemas already read: ``(file, schema)`` pairs, the
    file (a path or an object's URL) named in errors."""
    seen: dict[str, tuple[object, object, str | None]] = {}  # name -> widest file, type, leaf
    out: dict[str, np.dtype] = {}
    for path, schema in schemas:
        for field in schema:
            leaf = _leaf(field.type)
            if field.name not in seen:
                seen[field.name] = (path, field.type, leaf)
                continue
            first, first_type, common = seen[field.name]
            if leaf == common or leaf is None or common is None:  # None: column_values names it
                continue
            both = None if "bytes" in (leaf, common) else common_dtype(common, leaf)
            if both is None:
                raise ValueError(
                    f"column {field.name!r} is {_named(field.type)} in {path} but "
                    f"{_named(first_type)} in {first}: no one type holds both exactly (jaxfeed "
                    "widens ints to a wider int and floats to a wider float, and never mixes "
                    "bools, ints, floats and bytes); cast the files to one type and write "
                    "them again, e.g. with pyarrow's table.cast(schema)"
                )
            holder = (path, field.type) if both == np.dtype(leaf) else (first, first_type)
            seen[field.name] = (*holder, both.str)
            out[field.name] = both
    return out


def _schema(path: Path, kind: str):
    import pyarrow as pa
    from pyarrow import parquet

    try:
        if kind == "parquet":
            return parquet.read_schema(path)
        with pa.memory_map(str(path)) as source:
            is_file = source.read(6) == ARROW_MAGIC
            source.seek(0)
            return (pa.ipc.open_file(source) if is_file else pa.ipc.open_stream(source)).schema
    except (pa.ArrowInvalid, OSError) as err:
        raise _unreadable(path, kind, err) from None


def _leaf(kind) -> str | None:
    """The numpy dtype (``.str``) of a column's values, lists unwrapped;
    ``"bytes"`` for binary and string; None for a type jaxfeed does not read."""
    import pyarrow as pa

    if pa.types.is_struct(kind) and kind.get_field_index("bytes") >= 0:
        return _leaf(kind.field("bytes").type)
    binary = (pa.types.is_binary, pa.types.is_large_binary, pa.types.is_string)
    if any(is_kind(kind) for is_kind in binary) or pa.types.is_large_string(kind):
        return "bytes"
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
        return np.dtype(kind.to_pandas_dtype()).str
    if pa.types.is_fixed_size_list(kind) or pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _leaf(kind.value_type)
    return None


def fixed_shape(kind) -> tuple[np.dtype, tuple[int, ...]] | None:
    """A column's dtype and row shape as `column_values` gives them, where
    its type alone fixes them: numbers, and fixed-size lists of them (nested);
    None for the rest (binary and string, lists whose rows may differ in
    length, empty lists, types jaxfeed does not read)."""
    import pyarrow as pa

    shape = []
    while pa.types.is_fixed_size_list(kind):
        shape.append(kind.list_size)
        kind = kind.value_type
    if 0 in shape or not (
        pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)
    ):
        return None
    return np.dtype(kind.to_pandas_dtype()), tuple(shape)


def _named(kind) -> str:
    """A type as a user reads it: numpy's names for numbers (``float32``, not
    Arrow's ``float``), Arrow's for the rest."""
    import pyarrow as pa

    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
        return np.dtype(kind.to_pandas_dtype()).name
    return str(kind)


def _unreadable(path: Path, kind: str, err: Exception) -> ValueError:
    return ValueError(
        f"{path} is not a readable {kind} file ({err}); pass format= to say what "
        "it is, or write it again"
    )


def table_batches(
    path: Path, kind: str, types: dict[str, np.dtype] | None = None
) -> Iterator[dict]:
    """Batches of rows (`ColumnWriter` input) of a ``"parquet"`` or ``"arrow"``
    file; a column named in ``types`` (`common_types`) as that type.

    Raises:
      ValueError: the file does not open as ``kind``, or a column jaxfeed
        cannot hold (named with its type, the row and the file).
    """
    import pyarrow as pa
    from pyarrow import parquet

    row = 0
    try:
        if kind == "parquet":
            batches = parquet.ParquetFile(path).iter_batches(batch_size=_BATCH_ROWS)
        else:
            with open(path, "rb") as file:
                is_file = file.read(6) == ARROW_MAGIC
            source = pa.memory_map(str(path))
            reader = pa.ipc.open_file(source) if is_file else pa.ipc.open_stream(source)
            batches = (
                (reader.get_batch(i) for i in range(reader.num_record_batches))
                if is_file
                else iter(reader)
            )
        for batch in batches:
            values = {
                name: column_values(batch.column(i), f"{path}, column {name!r}", row)
                for i, name in enumerate(batch.schema.names)
            }
            for name, dtype in (types or {}).items():
                if name in values:  # widened: exact, by common_types's rule
                    values[name] = np.asarray(values[name]).astype(dtype)
            yield values
            row += batch.num_rows
    except (pa.ArrowInvalid, OSError) as err:
        raise _unreadable(path, kind, err) from None


def column_values(
    column, where: str, row: int, width: int = 1
) -> list[bytes] | np.ndarray | RaggedField:
    """One Arrow column's values as a field holds them (`ColumnWriter` input):
    bytes rows or an array; one it cannot hold is refused naming ``where`` and
    the row of the file (``row``: the file's row that ``column`` starts at;
    ``width``: how many of ``column``'s values each row holds, for a list's values)."""
    import pyarrow as pa

    kind = column.type
    if column.null_count:
        first = np.flatnonzero(~column.is_valid().to_numpy(zero_copy_only=False))[0]
        what = "is null" if width == 1 else "holds a null in its list"
        raise ValueError(
            f"{where}, row {row + first // width} of the file {what}: every field needs a "
            "value in every row; fill the nulls, or leave the column out"
        )
    if pa.types.is_struct(kind) and kind.get_field_index("bytes") >= 0:  # HF Image / Audio
        return column_values(column.field("bytes"), f"{where}['bytes']", row, width)
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return column.to_pylist()
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return [value.encode("utf-8") for value in column.to_pylist()]
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
        return column.to_numpy(zero_copy_only=False)
    if pa.types.is_fixed_size_list(kind) or pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _lists(column, where, row, width)
    raise ValueError(
        f"{where} is {kind}; jaxfeed reads numbers, fixed-length lists of numbers, "
        "binary and string columns: convert it, or leave the column out"
    )


def _lists(column, where: str, row: int, width: int) -> np.ndarray | RaggedField:
    import pyarrow as pa

    sizes = np.asarray(column.value_lengths())
    differ = np.flatnonzero(sizes != sizes[0]) if len(sizes) else sizes
    if len(differ) and width == 1 and not pa.types.is_fixed_size_list(column.type):
        return _ragged(column, sizes, where, row)
    if len(differ) or (len(sizes) and sizes[0] == 0):
        bad = int(differ[0]) if len(differ) else 0
        raise ValueError(
            f"{where}, row {row + bad // width} holds {sizes[bad]} values where row {row} holds "
            f"{sizes[0]}: jaxfeed reads a column's rows as fixed-shape steps, so only the "
            "outer list may vary in length; pad the inner lists to one length, or store "
            "them as bytes and decode them in transform="
        )
    flat = column.flatten()
    if isinstance(flat, pa.ChunkedArray):
        flat = flat.combine_chunks()
    inner = column_values(flat, where, row, width * int(sizes[0]) if len(sizes) else width)
    if not isinstance(inner, np.ndarray):
        raise ValueError(f"{where} is a list of {flat.type}; lists of numbers only")
    return inner.reshape(len(column), -1, *inner.shape[1:]) if len(column) else inner


def _ragged(column, sizes: np.ndarray, where: str, row: int) -> RaggedField:
    """A list column whose rows differ in length: its values (numbers, or
    fixed-size lists of them) back to back, and each row's length. A null
    among the values is named by its row (``row``: the file's row the column
    starts at)."""
    import pyarrow as pa

    flat = column.flatten()
    if isinstance(flat, pa.ChunkedArray):
        flat = flat.combine_chunks()
    ends = np.cumsum(sizes)
    level, per = flat, 1  # each level's items per value of the list
    while True:
        if level.null_count:
            first = np.flatnonzero(~level.is_valid().to_numpy(zero_copy_only=False))[0]
            bad = int(np.searchsorted(ends, first // per, side="right"))
            raise ValueError(
                f"{where}, row {row + bad} of the file holds a null in its list: every field "
                "needs a value in every row; fill the nulls, or leave the column out"
            )
        if not pa.types.is_fixed_size_list(level.type):
            break
        per *= level.type.list_size
        level = level.flatten()
    values = column_values(flat, where, row)
    if not isinstance(values, np.ndarray):
        raise ValueError(
            f"{where} is a list of {flat.type}: jaxfeed reads lists of numbers, or of "
            "fixed-size lists of numbers, whose rows differ in length; convert it, or leave "
            "the column out"
        )
    return RaggedField.from_lengths(values, sizes)

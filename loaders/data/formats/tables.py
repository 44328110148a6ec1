"""Parquet and Arrow IPC files (and the Arrow files of a Hugging Face
``save_to_disk`` directory), read with pyarrow one record batch at a time.

Columns are fields: a numeric column an array, a binary or string column a
bytes field (an HF ``Image`` column, a struct holding ``bytes``, too), a
fixed-size list column (or a list column whose rows all have one length) an
array of that length per row. Nulls and variable-length lists are refused
by column, row and file.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

__all__ = ["ARROW_MAGIC", "PARQUET_MAGIC", "column_values", "table_batches"]

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


def table_batches(path: Path, kind: str) -> Iterator[dict]:
    """Batches of rows (`ColumnWriter` input) of a ``"parquet"`` or ``"arrow"`` file.

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
            yield {
                name: column_values(batch.column(i), f"{path}, column {name!r}", row)
                for i, name in enumerate(batch.schema.names)
            }
            row += batch.num_rows
    except (pa.ArrowInvalid, OSError) as err:
        raise ValueError(
            f"{path} is not a readable {kind} file ({err}); pass format= to say what "
            "it is, or write it again"
        ) from None


def column_values(column, where: str, row: int) -> list[bytes] | np.ndarray:
    """One Arrow column's values as a field holds them (`ColumnWriter` input):
    bytes rows or an array; one it cannot hold is refused naming ``where`` and ``row``."""
    import pyarrow as pa

    kind = column.type
    if column.null_count:
        first = row + next(i for i, valid in enumerate(column.is_valid().to_pylist()) if not valid)
        raise ValueError(
            f"{where}, row {first} is null: every field needs a value in every row; "
            "fill the nulls, or leave the column out"
        )
    if pa.types.is_struct(kind) and kind.get_field_index("bytes") >= 0:  # HF Image / Audio
        return column_values(column.field("bytes"), f"{where}['bytes']", row)
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return column.to_pylist()
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return [value.encode("utf-8") for value in column.to_pylist()]
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
        return column.to_numpy(zero_copy_only=False)
    if pa.types.is_fixed_size_list(kind) or pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _lists(column, where, row)
    raise ValueError(
        f"{where} is {kind}; jaxfeed reads numbers, fixed-length lists of numbers, "
        "binary and string columns: convert it, or leave the column out"
    )


def _lists(column, where: str, row: int) -> np.ndarray:
    import pyarrow as pa

    sizes = np.asarray(column.value_lengths())
    differ = np.flatnonzero(sizes != sizes[0]) if len(sizes) else sizes
    if len(differ) or (len(sizes) and sizes[0] == 0):
        bad = int(differ[0]) if len(differ) else 0
        raise ValueError(
            f"{where}, row {row + bad} holds {sizes[bad]} values where row {row} holds "
            f"{sizes[0]}: jaxfeed reads fixed-length lists only (one row shape per field); "
            "pad them to one length, or store them as bytes and decode them in transform="
        )
    flat = column.flatten()
    if isinstance(flat, pa.ChunkedArray):
        flat = flat.combine_chunks()
    inner = column_values(flat, where, 0)
    if not isinstance(inner, np.ndarray):
        raise ValueError(f"{where} is a list of {flat.type}; lists of numbers only")
    return inner.reshape(len(column), -1, *inner.shape[1:]) if len(column) else inner

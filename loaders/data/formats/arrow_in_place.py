"""Arrow IPC files read in place: the user's files memory-mapped, and only a
small index in jaxfeed's cache.

An uncompressed IPC file (the file format, ``.arrow``/``.feather``, or the
stream format that ``datasets`` writes) holds each column of each record
batch as buffers at fixed places in the file. A binary or string column (an
HF ``Image`` struct's ``bytes`` too) becomes a `BytesField` whose rows are
placed in the mapped files: the index holds each row's length, file and
first byte (16 bytes a row). Numeric columns (labels, fixed-length lists,
and list columns whose rows differ in length: a `RaggedField`'s values and
offsets) are copied into the index like the columnar copy's, since their
record batches' buffers are many pieces, not one array. Each record batch is a unit
of ``shuffle="blocks"``.

A split whose files cannot be read in place (compressed buffers, which
pyarrow decompresses into memory; nulls, types the copy names in its error;
a column whose type differs between files, which the copy widens)
gets an index that says so, and why (`open_index` answers None): the caller
builds the columnar copy instead, and that answer is cached like an index.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
from jaxfeed.loaders.bytes_field import BytesField
from jaxfeed.loaders.data.formats import columns, tables
from jaxfeed.loaders.ragged_field import RaggedField

__all__ = ["LAYOUT_VERSION", "NotInPlace", "open_index", "write_index"]

# Of the index: bumping it stops old indexes from being reused (v2: files whose
# column types differ are copied, widened, or refused, not wrapped).
# v3: list columns whose rows differ in length are indexed (a RaggedField), not refused.
LAYOUT_VERSION = "arrow-index-v3"
_PLACED = "placed.json"
_REFUSED = "not-in-place.txt"


class NotInPlace(Exception):
    """An Arrow file whose columns are not all in the file as they are read."""


def write_index(paths: Sequence[Path], scratch: Path) -> None:
    """Indexes the Arrow IPC files ``paths`` (one split, in order) into
    ``scratch``, or writes why they cannot be read in place (a column that is
    compressed, has nulls, or is of a type only the copy reads or names in its
    error)."""
    try:
        _write_index(paths, scratch)
    except NotInPlace as why:
        for stale in scratch.iterdir():
            stale.unlink()
        (scratch / _REFUSED).write_text(str(why))


def _write_index(paths: Sequence[Path], scratch: Path) -> None:
    # A type no one type holds is refused here; one that widens, copied.
    if widened := tables.common_types(paths, "arrow"):
        raise NotInPlace(f"columns {sorted(widened)} differ in type between files")
    numeric = columns.ColumnWriter(scratch)
    placed: dict[str, dict] = {}  # name -> its files in scratch, open while indexing
    units: list[int] = []
    rows, order = 0, []
    with contextlib.ExitStack() as open_files:
        open_files.callback(lambda: numeric.close(rows=rows, units=units))
        for file_number, path in enumerate(paths):
            file_start = rows  # errors name the row of the file
            for batch, mapped in _batches(path):
                order = order or list(batch.schema.names)
                if list(batch.schema.names) != order:  # the copy names the difference
                    raise NotInPlace(f"{path} has columns {batch.schema.names}, not {order}")
                numbers = {}
                for i, name in enumerate(batch.schema.names):
                    column, where = batch.column(i), f"{path}, column {name!r}"
                    if (binary := _binary(column)) is None:
                        numbers[name] = _numbers(column, where, rows - file_start)
                        continue
                    if name not in placed:
                        placed[name] = _placed_files(scratch, len(placed), open_files)
                    _add_rows(placed[name], binary, mapped, file_number)
                if numbers:
                    numeric.add(numbers)
                if batch.num_rows:
                    units.append(batch.num_rows)
                rows += batch.num_rows
    placed_fields = {name: files["stem"] for name, files in placed.items()}
    files = [str(Path(path).resolve()) for path in paths]
    (scratch / _PLACED).write_text(
        json.dumps({"fields": placed_fields, "files": files, "order": order})
    )


def open_index(directory: Path) -> tuple[dict[str, np.ndarray | BytesField], dict] | None:
    """The fields of an index `write_index` built, in the files' column order:
    numeric ones mapped from the index, binary ones placed in the mapped
    files; and the description (``rows``, ``units``). None where the files
    cannot be read in place."""
    if (directory / _REFUSED).exists():
        return None
    numbers, description = columns.open_columns(directory)
    placed = json.loads((directory / _PLACED).read_text())
    rows = description["rows"]
    files = tuple(np.memmap(path, np.uint8, mode="r") for path in placed["files"])
    fields = dict(numbers)
    for name, stem in placed["fields"].items():
        offsets = np.memmap(directory / f"{stem}.offsets", np.int64, mode="r", shape=(rows + 1,))
        places = np.memmap(directory / f"{stem}.places", np.int64, mode="r", shape=(rows, 2))
        fields[name] = BytesField(offsets, files, places)
    return {name: fields[name] for name in placed["order"]}, description


def _batches(path: Path) -> Iterator[tuple[object, tuple[int, int]]]:
    """``path``'s record batches, memory-mapped, with the address of the file's
    first byte and its size (a buffer's place in the file is its address
    minus that first one; a buffer elsewhere was decompressed into memory)."""
    import pyarrow as pa

    with open(path, "rb") as file:
        is_file = file.read(6) == tables.ARROW_MAGIC
    try:
        source = pa.memory_map(str(path))
        base = source.read_buffer(1).address if source.size() else 0
        source.seek(0)
        if is_file:
            reader = pa.ipc.open_file(source)
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
        else:
            batches = iter(pa.ipc.open_stream(source))
        for batch in batches:
            yield batch, (base, source.size())
    except (pa.ArrowInvalid, OSError) as err:
        raise NotInPlace(f"{path} does not open as Arrow IPC ({err})") from None


def _binary(column):
    """The binary/string array a column's rows are (an HF ``Image`` struct's
    ``bytes``), or None for another type."""
    import pyarrow as pa

    kind = column.type
    if pa.types.is_struct(kind) and kind.get_field_index("bytes") >= 0:
        if column.null_count:
            raise NotInPlace("nulls")
        return _binary(column.field("bytes"))
    binary_types = (pa.types.is_binary, pa.types.is_large_binary, pa.types.is_string,
                    pa.types.is_large_string)  # fmt: skip
    if any(is_kind(kind) for is_kind in binary_types):
        if column.null_count:
            raise NotInPlace("nulls")
        return column
    return None


def _numbers(column, where: str, row: int) -> np.ndarray | RaggedField:
    try:
        values = tables.column_values(column, where, row)
    except ValueError as err:
        raise NotInPlace(str(err)) from None
    if not isinstance(values, np.ndarray | RaggedField):
        raise NotInPlace(f"{where}: not numbers")
    return values


def _placed_files(scratch: Path, number: int, open_files: contextlib.ExitStack) -> dict:
    """A placed field's two index files, open for appending (with row 0's start)."""
    stem = f"placed{number}"
    files = {"stem": stem, "end": 0}
    for kind in ("offsets", "places"):
        files[kind] = open_files.enter_context(open(scratch / f"{stem}.{kind}", "wb"))  # noqa: SIM115 (the stack closes it)
    files["offsets"].write(np.zeros(1, np.int64).tobytes())
    return files


def _add_rows(files: dict, binary, mapped: tuple[int, int], file_number: int) -> None:
    """Appends each row's end and (file, first byte) for ``binary``'s rows;
    ``mapped``: the file's first address and size."""
    import pyarrow as pa

    _, offsets_buffer, data_buffer = binary.buffers()[:3]
    large = pa.types.is_large_binary(binary.type) or pa.types.is_large_string(binary.type)
    width = np.int64 if large else np.int32
    offsets = np.frombuffer(offsets_buffer, width)[binary.offset : binary.offset + len(binary) + 1]
    offsets = offsets.astype(np.int64)
    if data_buffer is None:  # every row empty
        start = 0
    else:
        start = data_buffer.address - mapped[0]
        if not 0 <= start <= start + data_buffer.size <= mapped[1]:
            raise NotInPlace("compressed: its buffers are decompressed into memory")
    files["offsets"].write((files["end"] + offsets[1:] - offsets[0]).tobytes())
    files["end"] += int(offsets[-1] - offsets[0])
    places = np.empty((len(binary), 2), np.int64)
    places[:, 0] = file_number
    places[:, 1] = start + offsets[:-1]
    files["places"].write(places.tobytes())

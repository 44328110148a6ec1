"""ArrayRecord files, read with ``array_record``'s own reader (installed with Grain).

Records are serialized ``tf.train.Example`` (the TFDS convention); a file
whose first record is not one holds raw records, read as one bytes field,
``record``. A split's row 0 and its files' record counts (`first_row`,
`record_counts`) take no pass over the records: the grain backend reads the
files in place with them alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from jaxfeed.loaders.data.formats.example import (
    Record,
    example_batch,
    example_schema,
    parse_example,
)

__all__ = [
    "RAW_FIELD",
    "arrayrecord_records",
    "damaged",
    "first_row",
    "holds_examples",
    "raw_batches",
    "record_counts",
]

RAW_FIELD = "record"
_CHUNK = 1024  # records per read: bounded memory, few calls


def arrayrecord_records(path: Path) -> Iterator[Record]:
    """Each record of ``path`` in order, as ``(file, index, bytes)``.

    Raises:
      ValueError: the file cannot be opened as an ArrayRecord file, or a
        record cannot be read (named with the file and the record).
    """
    reader = _reader(path)
    try:
        count = reader.num_records()
        for start in range(0, count, _CHUNK):
            for offset, record in enumerate(_read(reader, path, start, min(count, start + _CHUNK))):
                yield str(path), start + offset, record
    finally:
        reader.close()


def record_counts(paths: Sequence[Path]) -> list[int]:
    """Each file's number of records, from its footer.

    Raises:
      ValueError: a file that does not open as ArrayRecord (named).
    """
    counts = []
    for path in paths:
        reader = _reader(path)
        try:
            counts.append(reader.num_records())
        finally:
            reader.close()
    return counts


def first_row(paths: Sequence[Path]) -> tuple[dict, bool]:
    """The first record of ``paths`` as the one-row batch the columnar copy
    starts with, and whether the files hold Examples.

    Raises:
      ValueError: no records, or a first Example jaxfeed cannot read (named).
    """
    for path in paths:
        reader = _reader(path)
        try:
            first = _read(reader, path, 0, 1) if reader.num_records() else None
        finally:
            reader.close()
        if first:
            record = (str(path), 0, first[0])
            if not holds_examples(record[2]):
                return {RAW_FIELD: [record[2]]}, False
            return example_batch([record], example_schema(record)), True
    raise ValueError(f"{', '.join(map(str, paths))} hold no records")


def _reader(path: Path):
    from array_record.python.array_record_module import ArrayRecordReader

    try:
        reader = ArrayRecordReader(str(path))
        if not reader.ok():  # a damaged footer: it would read as no records
            reader.close()  # raises Riegeli's error
        return reader
    except (RuntimeError, ValueError, OSError) as err:
        raise ValueError(
            f"{path} is not a readable ArrayRecord file ({err}); pass format= to say "
            "what it is, or write it again"
        ) from err


def _read(reader, path: Path, start: int, stop: int) -> list[bytes]:
    """Records ``start`` to ``stop`` of ``path`` (open in ``reader``).

    Raises:
      ValueError: one cannot be read (named with the file and the record).
    """
    try:
        return reader.read(start, stop)
    except RuntimeError as err:
        places = [(str(path), index) for index in range(start, stop)]
        raise damaged(err, places, lambda k: reader.read(start + k, start + k + 1)) from err


def damaged(
    err: RuntimeError, places: Sequence[tuple[str, int]], read_one: Callable[[int], object]
) -> ValueError:
    """Riegeli's ``err`` from reading the records at ``places`` (``(file,
    index)`` each) named with the first of them that ``read_one(k)`` (the
    k-th place read alone) fails on, or with their files; raise it from
    ``err``. Riegeli's message names no file."""
    for k, (path, index) in enumerate(places):
        try:
            read_one(k)
        except RuntimeError:
            where = f"{path}, record {index}"
            break
    else:  # each alone reads: name them all
        where = ", ".join(dict.fromkeys(path for path, _ in places))
    return ValueError(
        f"{where} cannot be read ({err}): the ArrayRecord file is damaged; write it again"
    )


def holds_examples(first: bytes) -> bool:
    """Whether a file's first record is a ``tf.train.Example`` with features."""
    try:
        return bool(parse_example(first))
    except (ValueError, UnicodeDecodeError):
        return False


def raw_batches(records: Iterator[Record]) -> Iterator[dict]:
    """Raw records as batches of the one bytes field ``record``."""
    pending: list[bytes] = []
    for _, _, record in records:
        pending.append(record)
        if len(pending) == _CHUNK:
            yield {RAW_FIELD: pending}
            pending = []
    if pending:
        yield {RAW_FIELD: pending}

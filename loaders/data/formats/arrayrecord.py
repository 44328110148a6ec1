"""ArrayRecord files, read with ``array_record``'s own reader (installed with Grain).

Records are serialized ``tf.train.Example`` (the TFDS convention); a file
whose first record is not one holds raw records, read as one bytes field,
``record``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from jaxfeed.loaders.data.formats.example import Record, parse_example

__all__ = ["RAW_FIELD", "arrayrecord_records", "holds_examples", "raw_batches"]

RAW_FIELD = "record"
_CHUNK = 1024  # records per read: bounded memory, few calls


def arrayrecord_records(path: Path) -> Iterator[Record]:
    """Each record of ``path`` in order, as ``(file, index, bytes)``.

    Raises:
      ValueError: the file cannot be opened as an ArrayRecord file (named).
    """
    from array_record.python.array_record_module import ArrayRecordReader

    try:
        reader = ArrayRecordReader(str(path))
    except (RuntimeError, ValueError, OSError) as err:
        raise ValueError(
            f"{path} is not a readable ArrayRecord file ({err}); pass format= to say "
            "what it is, or write it again"
        ) from None
    try:
        count = reader.num_records()
        for start in range(0, count, _CHUNK):
            for offset, record in enumerate(reader.read(start, min(count, start + _CHUNK))):
                yield str(path), start + offset, record
    finally:
        reader.close()


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

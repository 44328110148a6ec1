"""TFRecord files (plain or gzip-compressed), read record by record.

A TFRecord file is a sequence of ``length (uint64) | CRC-32C of length |
data | CRC-32C of data``. It has no index, so it is read once from the
start, streaming (a gzip file is decompressed on the way), into the
columnar copy (`jaxfeed.loaders.data.formats.columns`), which gives every
backend random access. Each length's checksum is checked, so a damaged
file is named with the record where it breaks; the data's checksum is not
(a pure-Python CRC-32C of every byte would be the slowest step), and a
damaged record usually fails to parse as an Example instead.
"""

from __future__ import annotations

import gzip
import struct
from collections.abc import Iterator
from pathlib import Path

from jaxfeed.loaders.data.formats.example import Record

__all__ = ["GZIP_MAGIC", "tfrecord_records"]

GZIP_MAGIC = b"\x1f\x8b"


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def masked_crc32c(data: bytes) -> int:
    """TFRecord's checksum: CRC-32C, rotated and offset ("masked")."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord_records(path: Path) -> Iterator[Record]:
    """Each record of ``path`` in order, as ``(file, index, bytes)``.

    Raises:
      ValueError: the file ends inside a record, or a length fails its
        checksum (the message names the file and the record).
    """
    with open(path, "rb") as raw:
        compressed = raw.read(2) == GZIP_MAGIC
    with gzip.open(path, "rb") if compressed else open(path, "rb") as file:
        index = 0
        while header := file.read(12):
            length, length_crc = struct.unpack("<QI", header.ljust(12, b"\0"))
            if len(header) < 12 or masked_crc32c(header[:8]) != length_crc:
                raise _damaged(path, index, "its length header is damaged")
            data = file.read(length)
            if len(data) < length or len(file.read(4)) < 4:
                raise _damaged(path, index, f"the file ends inside it ({length} bytes long)")
            yield str(path), index, data
            index += 1


def _damaged(path: Path, index: int, problem: str) -> ValueError:
    return ValueError(
        f"{path}, record {index}: {problem}; the file is cut short or damaged (or not a "
        "TFRecord file: pass format= to say what it is); write it again"
    )

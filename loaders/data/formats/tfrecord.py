"""TFRecord files (plain or gzip-compressed), read record by record.

A TFRecord file is a sequence of ``length (uint64) | CRC-32C of length |
data | CRC-32C of data``. It has no index, so it is read once from the
start, streaming (a gzip file is decompressed on the way), into the
columnar copy (`jaxfeed.loaders.data.formats.columns`), which gives every
backend random access.

The file is read a few MB at a time (a gzip file inflated by zlib, which
checks each member's CRC-32) and framed in bulk: one tight loop follows the
lengths, then numpy computes all their checksums at once, so a damaged file
is still named with the record where it breaks: a damaged length can send
the walk astray, but only after itself, so its checksum is the first that
fails, and the records before it are served first. Each record's data is
checked against its checksum too, as TensorFlow's reader checks it, by
``google-crc32c`` (compiled: a CRC-32C of every byte in numpy would be the
slowest step by far), so a flipped byte in an image is refused by record,
not decoded into other pixels.

A record's length is bounded before its bytes are gathered, so a damaged
length costs no memory: in a plain file, a length past the file's end is
refused at once; in a gzip file, whose size after inflating is unknown until
it is inflated, a length over ``JAXFEED_MAX_RECORD_BYTES`` (default 1 GiB).
"""

from __future__ import annotations

import itertools
import os
import struct
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np
from jaxfeed.loaders.data.formats.example import Record

__all__ = [
    "DEFAULT_MAX_RECORD_BYTES",
    "GZIP_MAGIC",
    "MAX_RECORD_ENV",
    "framed_records",
    "masked_crc32c",
    "tfrecord_records",
]

GZIP_MAGIC = b"\x1f\x8b"
MAX_RECORD_ENV = "JAXFEED_MAX_RECORD_BYTES"
DEFAULT_MAX_RECORD_BYTES = 1 << 30  # of a gzip file's record; a record is gathered whole
_CHUNK_BYTES = 4 << 20  # read at once: few calls, bounded memory
_HEADER, _FOOTER = 12, 4  # length + its CRC; the data's CRC


def _crc32c_table() -> np.ndarray:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return np.array(table, np.uint32)


_TABLE = _crc32c_table()


def masked_crc32c(data: bytes) -> int:
    """TFRecord's checksum: CRC-32C, rotated and offset ("masked")."""
    from google_crc32c import value

    return _masked(value(bytes(data)))


def _masked(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _masked_crc32c_rows(rows: np.ndarray) -> np.ndarray:
    """The masked CRC-32C of each row of a ``uint8 [n, k]`` array (all rows
    at once: one numpy step per byte column)."""
    crc = np.full(len(rows), 0xFFFFFFFF, np.uint32)
    for column in rows.T:
        crc = _TABLE[(crc ^ column) & 0xFF] ^ (crc >> 8)
    crc ^= np.uint32(0xFFFFFFFF)
    return ((crc >> 15) | (crc << 17)) + np.uint32(0xA282EAD8)  # wraps: uint32


def tfrecord_records(path: Path) -> Iterator[Record]:
    """Each record of ``path`` in order, as ``(file, index, bytes)``.

    Raises:
      ValueError: the file ends inside a record (in a plain file, known from
        its length before the record is read), a length or a record's data
        fails its checksum, a gzip file's record is longer than
        ``JAXFEED_MAX_RECORD_BYTES``, or the gzip stream is damaged (the
        message names the file and the record), after the records before it.
    """
    with open(path, "rb") as raw:
        compressed = raw.read(2) == GZIP_MAGIC
    with open(path, "rb") as file:
        if compressed:
            yield from framed_records(_gunzipped(file), str(path), None)
        else:
            chunks = iter(lambda: file.read(_CHUNK_BYTES), b"")
            yield from framed_records(chunks, str(path), os.fstat(file.fileno()).st_size)


def framed_records(chunks: Iterable[bytes], name: str, size: int | None) -> Iterator[Record]:
    """Each record of the TFRecord bytes ``chunks`` (a file's or a store
    object's, named ``name``), as `tfrecord_records` gives and checks them;
    ``size``: the bytes in all (a plain file's), or None for a gzip file's
    inflated bytes (then a record is bounded by ``JAXFEED_MAX_RECORD_BYTES``)."""
    from google_crc32c import value as crc32c

    index, most = 0, _max_record_bytes() if size is None else None
    pieces: list[bytes] = []
    have, wanted, offset = 0, _HEADER, 0  # offset: where ``pieces`` start in the stream
    try:
        for chunk in itertools.chain(chunks, [b""]):
            pieces.append(chunk)
            have += len(chunk)
            if chunk and have < wanted:  # a record longer than a chunk: gather more first
                continue
            data = b"".join(pieces)
            room = _Room(offset, None if size is None else size - offset, most)
            frames, rest, error = _frames(data, name, index, room, at_end=not chunk)
            for start, stop in frames:
                record = data[start:stop]
                if _masked(crc32c(record)) != _CHECKSUM.unpack_from(data, stop)[0]:
                    raise _damaged(name, index, "its data fails its checksum")
                yield name, index, record
                index += 1
            if error is not None:
                raise error
            pieces, offset = [data[rest:]], offset + rest
            have, wanted = len(pieces[0]), _wanted(pieces[0])
    except (EOFError, zlib.error) as err:
        raise _damaged(name, index, f"its gzip stream is damaged ({err})") from None


def _max_record_bytes() -> int:
    """The longest record a gzip file may hold: ``JAXFEED_MAX_RECORD_BYTES``, else
    `DEFAULT_MAX_RECORD_BYTES`.

    Raises:
      ValueError: the variable is not a positive whole number.
    """
    value = os.environ.get(MAX_RECORD_ENV)
    if value is None:
        return DEFAULT_MAX_RECORD_BYTES
    try:
        most = int(value)
    except ValueError:
        most = 0
    if most <= 0:
        raise ValueError(
            f"{MAX_RECORD_ENV}={value!r} is not a positive whole number of bytes; set it to "
            f"e.g. {2 * DEFAULT_MAX_RECORD_BYTES} or unset it (default {DEFAULT_MAX_RECORD_BYTES})"
        )
    return most


def _gunzipped(file) -> Iterator[bytes]:
    """The decompressed bytes of a gzip file (of one or more members), a few
    MB at a time; zlib checks each member's CRC-32 and length.

    Raises:
      EOFError: the stream ends inside a member.
      zlib.error: the stream is damaged.
    """
    inflate = zlib.decompressobj(wbits=31)
    while data := file.read(_CHUNK_BYTES // 4):
        while data:
            out = inflate.decompress(data, _CHUNK_BYTES)  # bounded: a run of zeros inflates a lot
            if not inflate.eof:
                data = inflate.unconsumed_tail
            else:  # the rest is the next member's (unconsumed_tail may repeat it)
                data = inflate.unused_data
                if data:
                    inflate = zlib.decompressobj(wbits=31)
            if out:
                yield out
    if out := inflate.flush():  # what the last bounded call held back
        yield out
    if not inflate.eof:
        raise EOFError("it ends before its end-of-stream marker")


def _wanted(data: bytes) -> int:
    """How many bytes the record at the start of ``data`` takes whole."""
    if len(data) < _HEADER:
        return _HEADER
    return _HEADER + struct.unpack_from("<Q", data)[0] + _FOOTER


_LENGTH, _CHECKSUM = struct.Struct("<Q"), struct.Struct("<I")


class _Room(NamedTuple):
    """What bounds the records of ``data`` (`_frames`) before they are read."""

    start: int  # where ``data`` starts in the file (a gzip file's: in its inflated bytes)
    end: int | None  # a plain file's end, counted from ``start``; None: unknown (gzip)
    most: int | None  # the longest record a gzip file may hold; None: a plain file's

    def where(self, pos: int) -> str:
        """Where the record at ``pos`` in ``data`` starts, as a user finds it."""
        inflated = "" if self.most is None else " of the inflated data"
        return f"at byte {self.start + pos}{inflated}"


def _frames(
    data: bytes, path: str, index: int, room: _Room, at_end: bool
) -> tuple[list[tuple[int, int]], int, ValueError | None]:
    """The ``(start, stop)`` of each whole record in ``data`` (its first is
    record ``index``), where the rest begins, and the error that stops the
    file after those records: a length that fails its checksum, one longer
    than ``room`` leaves (the record is not read), or (when ``at_end``:
    nothing follows ``data``) data that ends inside a record."""
    size, heads, pos = len(data), [], 0
    while pos + _HEADER <= size:  # the walk: lengths checked below, all at once
        heads.append(pos)
        pos += _HEADER + _LENGTH.unpack_from(data, pos)[0] + _FOOTER
    bad = _first_bad_length(data, heads)
    frames, most = [], room.most
    for pos in heads[:bad]:
        length = _LENGTH.unpack_from(data, pos)[0]
        stop = pos + _HEADER + length
        if most is not None and length > most:
            return frames, pos, _too_long(path, index + len(frames), length, room.where(pos), most)
        if stop + _FOOTER > size:  # the last head: not whole in ``data``
            end = size if at_end else room.end
            if end is None or stop + _FOOTER <= end:  # the rest of it is still to read
                return frames, pos, None
            problem = (
                f"the file ends inside it (its header, {room.where(pos)}, says {length} bytes; "
                f"{end - pos - _HEADER} follow it)"
            )
            return frames, pos, _damaged(path, index + len(frames), problem)
        frames.append((pos + _HEADER, stop))
    rest = frames[-1][1] + _FOOTER if frames else 0
    if bad < len(heads) or (at_end and rest < size):  # or less than a length is left
        where = room.where(heads[bad] if bad < len(heads) else rest)
        problem = f"its length header is damaged ({where})"
        return frames, rest, _damaged(path, index + len(frames), problem)
    return frames, rest, None


def _first_bad_length(data: bytes, heads: list[int]) -> int:
    """The position in ``heads`` of the first length whose checksum fails
    (``len(heads)`` when none does)."""
    if not heads:
        return 0
    at = np.array(heads, np.int64)[:, None]
    buffer = np.frombuffer(data, np.uint8)
    stored = buffer[at + np.arange(8, 12)].copy().view("<u4")[:, 0]
    bad = np.flatnonzero(_masked_crc32c_rows(buffer[at + np.arange(8)]) != stored)
    return int(bad[0]) if len(bad) else len(heads)


def _too_long(path: str, index: int, length: int, where: str, most: int) -> ValueError:
    return ValueError(
        f"{path}, record {index}: its length header ({where}) says {length} bytes, more than "
        f"the {most} a gzip file's record may hold ({MAX_RECORD_ENV}); the file is damaged "
        f"(write it again), or its records are that long: set {MAX_RECORD_ENV} higher"
    )


def _damaged(path: str, index: int, problem: str) -> ValueError:
    return ValueError(
        f"{path}, record {index}: {problem}; the file is cut short or damaged (or not a "
        "TFRecord file: pass format= to say what it is); write it again"
    )

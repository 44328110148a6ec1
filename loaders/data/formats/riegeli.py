"""ArrayRecord files parsed from their bytes, without ``array_record``: what a
store's object read by ranged reads needs (`ranged_arrayrecord`).

An ArrayRecord file is a Riegeli/records file (its format is specified in
Riegeli's ``doc/riegeli_records_file_format.md``): chunks of records, the
byte stream interrupted by a 24-byte block header at every multiple of
64 KiB. Its last 64 KiB block holds the postscript, which says where the
footer chunk begins; the footer lists each data chunk's offset and record
count. A data chunk is *simple* (its records' sizes, then their bytes, each
part compressed as the writer chose: none, zstd, brotli or snappy) or
*transposed* (a proto-aware columnar encoding, written under
``transpose:true``: not parsed here, refused by name).

Every header's hash and every chunk's data hash (HighwayHash-64 with
Riegeli's key) is checked, as the local reader checks them (a caller that
has checked a chunk's bytes otherwise may skip its data hash: `chunk_data`):
a damaged or changed object is refused, never read as other records. Compressed parts are
decoded by pyarrow's codecs; without pyarrow they are refused by name.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import NamedTuple

__all__ = [
    "BLOCK_SIZE",
    "CHUNK_HEADER_SIZE",
    "ChunkHeader",
    "Footer",
    "NotParsed",
    "RiegeliError",
    "chunk_header",
    "chunk_records",
    "footer",
    "highway_hash",
    "postscript_footer_offset",
    "unframed",
]

BLOCK_SIZE = 1 << 16
BLOCK_HEADER_SIZE = 24
CHUNK_HEADER_SIZE = 40
POSTSCRIPT_MAGIC = 0x71930E704FDAE05E  # ArrayRecord's, in its postscript
SIMPLE, TRANSPOSED = 0x72, 0x74  # chunk types: 'r', 't'
# The compression byte of a simple chunk -> pyarrow's codec name.
CODECS = {0x7A: "zstd", 0x62: "brotli", 0x73: "snappy"}

_MASK = (1 << 64) - 1
_KEY = (0x2F696C6567656952, 0x0A7364726F636572) * 2  # 'Riegeli/', 'records\n'
_MUL0 = (0xDBE6D5D5FE4CCE2F, 0xA4093822299F31D0, 0x13198A2E03707344, 0x243F6A8885A308D3)
_MUL1 = (0x3BD39E10CB0EF593, 0xC0ACF169B5F18A8C, 0xBE5466CF34E90C6C, 0x452821E638D01377)
_LANES = struct.Struct("<4Q")


class RiegeliError(ValueError):
    """Bytes that are not what an ArrayRecord file holds there (damaged, or
    not an ArrayRecord file, or changed since it was indexed)."""


class NotParsed(RiegeliError):
    """A chunk of a kind not parsed here (transposed, of a compression without
    its decoder): ``reason`` says which."""

    def __init__(self, where: str, reason: str):
        super().__init__(f"{where}: {reason}")
        self.reason = reason


class ChunkHeader(NamedTuple):
    data_size: int
    data_hash: int
    chunk_type: int
    num_records: int
    decoded_data_size: int


class Footer(NamedTuple):
    """An ArrayRecord footer: its data chunks' offsets and record counts, and
    the writer's options (``"group_size:1,transpose:false,zstd:3"``...)."""

    offsets: list[int]
    records: list[int]
    writer_options: str


# HighwayHash-64 (the algorithm published with github.com/google/highwayhash),
# on Python ints: Riegeli's headers and chunk data are hashed with it.
def _zipper(v1: int, v0: int) -> tuple[int, int]:
    """The two addends of ZipperMergeAndAdd for lanes (v1, v0): (add1, add0)."""
    add0 = (
        (((v0 & 0xFF000000) | (v1 & 0xFF00000000)) >> 24)
        | (((v0 & 0xFF0000000000) | (v1 & 0xFF000000000000)) >> 16)
        | (v0 & 0xFF0000)
        | ((v0 & 0xFF00) << 32)
        | ((v1 & 0xFF00000000000000) >> 8)
        | ((v0 << 56) & _MASK)
    )
    add1 = (
        (((v1 & 0xFF000000) | (v0 & 0xFF00000000)) >> 24)
        | (v1 & 0xFF0000)
        | ((v1 & 0xFF0000000000) >> 16)
        | ((v1 & 0xFF00) << 24)
        | ((v0 & 0xFF000000000000) >> 8)
        | ((v1 & 0xFF) << 48)
        | (v0 & 0xFF00000000000000)
    )
    return add1, add0


def _update(state: list[list[int]], lanes: tuple[int, ...]) -> None:
    v0, v1, mul0, mul1 = state
    for i in range(4):
        v1[i] = (v1[i] + mul0[i] + lanes[i]) & _MASK
        mul0[i] ^= (v1[i] & 0xFFFFFFFF) * (v0[i] >> 32)
        v0[i] = (v0[i] + mul1[i]) & _MASK
        mul1[i] ^= (v0[i] & 0xFFFFFFFF) * (v1[i] >> 32)
    for add, src, i in ((v0, v1, 0), (v0, v1, 2), (v1, v0, 0), (v1, v0, 2)):
        add1, add0 = _zipper(src[i + 1], src[i])
        add[i + 1] = (add[i + 1] + add1) & _MASK
        add[i] = (add[i] + add0) & _MASK


def _rotated_halves(lane: int, count: int) -> int:
    """Each 32-bit half of ``lane`` rotated left by ``count``."""
    out = 0
    for shift in (0, 32):
        half = (lane >> shift) & 0xFFFFFFFF
        out |= (((half << count) | (half >> (32 - count))) & 0xFFFFFFFF) << shift
    return out


def highway_hash(data: bytes) -> int:
    """HighwayHash-64 of ``data`` under Riegeli's key."""
    swap = [((k >> 32) | (k << 32)) & _MASK for k in _KEY]
    state = [
        [m ^ k for m, k in zip(_MUL0, _KEY, strict=True)],
        [m ^ s for m, s in zip(_MUL1, swap, strict=True)],
        list(_MUL0),
        list(_MUL1),
    ]
    full = len(data) - len(data) % 32
    for at in range(0, full, 32):
        _update(state, _LANES.unpack_from(data, at))
    size = len(data) - full
    if size:
        v0, v1 = state[0], state[1]
        for i in range(4):
            v0[i] = (v0[i] + (size << 32) + size) & _MASK
            v1[i] = _rotated_halves(v1[i], size) if size % 32 else v1[i]
        packet = bytearray(32)
        whole = size & ~3
        packet[:whole] = data[full : full + whole]
        tail = data[full + whole :]
        if size & 16:
            packet[28:32] = data[full + whole + len(tail) - 4 : full + whole + len(tail)]
        elif tail:
            packet[16:19] = bytes((tail[0], tail[len(tail) >> 1], tail[-1]))
        _update(state, _LANES.unpack(bytes(packet)))
    for _ in range(4):
        v0 = state[0]
        swapped = [((v0[j] >> 32) | (v0[j] << 32)) & _MASK for j in (2, 3, 0, 1)]
        _update(state, tuple(swapped))
    v0, v1, mul0, mul1 = state
    return (v0[0] + v1[0] + mul0[0] + mul1[0]) & _MASK


def unframed(data: bytes, offset: int, at: int, size: int, where: str) -> tuple[bytes, int]:
    """``size`` bytes of the record stream from file position ``at`` (``data``
    holds the file from ``offset``), without the block headers that interrupt
    it (each checked); and the file position after them.

    Raises:
      RiegeliError: ``data`` ends first, or a block header's hash fails.
    """
    parts = []
    while size > 0:  # a block header after the last byte is the next chunk's
        in_block = at % BLOCK_SIZE
        if in_block < BLOCK_HEADER_SIZE:  # a block header: skip it (a chunk never starts there)
            header = data[at - in_block - offset : at - in_block - offset + BLOCK_HEADER_SIZE]
            if len(header) < BLOCK_HEADER_SIZE or at - in_block < offset:
                raise RiegeliError(f"{where}: cut short at byte {at}")
            if highway_hash(header[8:]) != int.from_bytes(header[:8], "little"):
                raise RiegeliError(f"{where}: the block header at byte {at - in_block} is damaged")
            at += BLOCK_HEADER_SIZE - in_block
        take = min(size, BLOCK_SIZE - at % BLOCK_SIZE)
        part = data[at - offset : at - offset + take]
        if len(part) < take or at < offset:
            raise RiegeliError(f"{where}: cut short at byte {at + len(part)}")
        parts.append(part)
        at, size = at + take, size - take
    return b"".join(parts), at


def chunk_header(data: bytes, offset: int, at: int, where: str) -> tuple[ChunkHeader, int]:
    """The chunk header at file position ``at`` (hash checked), and the
    position of its data.

    Raises:
      RiegeliError: damaged, or ``data`` ends first.
    """
    raw, after = unframed(data, offset, at, CHUNK_HEADER_SIZE, where)
    stored, data_size, data_hash, kind_and_count, decoded = struct.unpack("<5Q", raw)
    if highway_hash(raw[8:]) != stored:
        raise RiegeliError(f"{where}: the chunk header at byte {at} is damaged")
    header = ChunkHeader(data_size, data_hash, kind_and_count & 0xFF, kind_and_count >> 8, decoded)
    return header, after


def chunk_data(
    data: bytes, offset: int, at: int, where: str, check_data: bool = True
) -> tuple[ChunkHeader, bytes, int]:
    """The chunk at file position ``at``: its header, its data (hash checked
    unless ``check_data`` is False: the caller has checked those bytes
    otherwise) and the file position where its data ends."""
    header, after = chunk_header(data, offset, at, where)
    body, end = unframed(data, offset, after, header.data_size, where)
    if check_data and highway_hash(body) != header.data_hash:
        raise RiegeliError(f"{where}: the chunk at byte {at} fails its data hash")
    return header, body, end


def _varint(data: bytes, at: int, where: str) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise RiegeliError(f"{where}: a malformed varint")
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if byte < 0x80:
            return value, at


def _decompressed(part: bytes, compression: int, where: str) -> bytes:
    if compression == 0:
        return part
    size, at = _varint(part, 0, where)
    try:
        import pyarrow
    except ImportError:
        raise RiegeliError(
            f"{where}: {CODECS[compression]}-compressed chunks are decoded by pyarrow; "
            "pip install pyarrow"
        ) from None
    try:
        return pyarrow.decompress(
            part[at:], decompressed_size=size, codec=CODECS[compression]
        ).to_pybytes()
    except (pyarrow.ArrowException, OSError) as error:
        raise RiegeliError(
            f"{where}: a {CODECS[compression]} part does not decode ({error})"
        ) from None


def _not_parsed(header: ChunkHeader, body: bytes) -> str | None:
    """Why a data chunk is not parsed here, or None."""
    if header.chunk_type == TRANSPOSED:
        return "its chunks are transposed (written with transpose:true)"
    if header.chunk_type != SIMPLE:
        return f"it holds a chunk of type {header.chunk_type:#x}, not one of records"
    if body and body[0] != 0 and body[0] not in CODECS:
        return f"its chunks are compressed with an unknown type {body[0]:#x}"
    if body and body[0] in CODECS:
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            codec = CODECS[body[0]]
            return f"its chunks are {codec}-compressed and pyarrow (their decoder) is missing"
    return None


def chunk_records(header: ChunkHeader, body: bytes, where: str) -> list[bytes]:
    """The records of a simple chunk.

    Raises:
      NotParsed: not a simple chunk of a compression decoded here.
      RiegeliError: its sizes disagree with its header.
    """
    refused = _not_parsed(header, body)
    if refused is not None:
        raise NotParsed(where, refused)
    if header.num_records == 0:
        return []
    compression = body[0]
    sizes_size, at = _varint(body, 1, where)
    sizes = _decompressed(body[at : at + sizes_size], compression, where)
    values = _decompressed(body[at + sizes_size :], compression, where)
    records, pos, start = [], 0, 0
    for _ in range(header.num_records):
        length, pos = _varint(sizes, pos, where)
        records.append(values[start : start + length])
        start += length
    if pos != len(sizes) or start != len(values) or start != header.decoded_data_size:
        raise RiegeliError(f"{where}: a chunk's record sizes disagree with its data")
    return records


def postscript_footer_offset(tail: bytes, size: int, where: str) -> int:
    """Where the footer begins, from ``tail`` (the file's last 64 KiB; the
    file is ``size`` bytes).

    Raises:
      RiegeliError: no ArrayRecord postscript there.
    """
    at = size - BLOCK_SIZE
    if at < 0 or at % BLOCK_SIZE or len(tail) != BLOCK_SIZE:
        raise RiegeliError(f"{where}: {size} bytes is no ArrayRecord file (no postscript block)")
    header, body, _ = chunk_data(tail, at, at, where)
    records = chunk_records(header, body, where)
    if not records:
        raise RiegeliError(f"{where}: its postscript holds no record")
    fields = dict(_proto_fields(records[0], where))
    if fields.get(2) != POSTSCRIPT_MAGIC or not isinstance(fields.get(1), int):
        raise RiegeliError(f"{where}: no ArrayRecord postscript (its magic differs)")
    return fields[1]


def footer(data: bytes, offset: int, where: str) -> Footer:
    """The footer chunk at ``offset`` (``data`` holds the file from there).

    Raises:
      RiegeliError: damaged, transposed or of an unknown compression; not an
        ArrayRecord footer.
    """
    header, body, _ = chunk_data(data, offset, offset, where)
    records = chunk_records(header, body, where)
    meta = dict(_proto_fields(records[0], where)) if records else {}
    array_record = dict(_proto_fields(meta[1], where)) if isinstance(meta.get(1), bytes) else {}
    if array_record.get(1) != 1:
        raise RiegeliError(f"{where}: its footer is not an ArrayRecord v1 footer")
    chunks = [dict(_proto_fields(r, where)) for r in records[1:]]
    if len(chunks) != array_record.get(2, 0):
        raise RiegeliError(
            f"{where}: its footer lists {len(chunks)} chunks, says {array_record.get(2)}"
        )
    options = array_record.get(4, b"")
    return Footer(
        [c.get(1, 0) for c in chunks],
        [c.get(3, 0) for c in chunks],
        options.decode() if isinstance(options, bytes) else "",
    )


def _proto_fields(message: bytes, where: str) -> Iterator[tuple[int, int | bytes]]:
    """A protobuf message's (field number, value): varints as ints,
    length-delimited fields as bytes (all the footer and postscript hold)."""
    at = 0
    while at < len(message):
        key, at = _varint(message, at, where)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _varint(message, at, where)
            yield number, value
        elif wire == 2:
            length, at = _varint(message, at, where)
            yield number, message[at : at + length]
            at += length
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            yield number, int.from_bytes(message[at : at + width], "little")
            at += width
        else:
            raise RiegeliError(f"{where}: a malformed footer (wire type {wire})")

"""jaxfeed's own ArrayRecord parser (loaders/data/formats/riegeli.py) against
``array_record``'s reader: the same records from files written with several
options, records across 64 KiB block headers, empty files; HighwayHash on
the Riegeli spec's fixed file signature; damage and transposed chunks named."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from jaxfeed.loaders.data.formats.riegeli import (
    BLOCK_SIZE,
    NotParsed,
    RiegeliError,
    chunk_data,
    chunk_records,
    footer,
    highway_hash,
    postscript_footer_offset,
)

# The first 64 bytes of every Riegeli/records file (the spec's file signature):
# a block header, then a chunk header; each starts with the hash of its rest.
SIGNATURE = bytes.fromhex(
    "83af70d10d884a3f 0000000000000000 4000000000000000 91bac23c9287e1a9"
    "0000000000000000 e19f13c0e9b1c372 7300000000000000 0000000000000000"
)


def _write(path: Path, records: list[bytes], options: str) -> bytes:
    from array_record.python.array_record_module import ArrayRecordWriter

    writer = ArrayRecordWriter(str(path), options)
    for record in records:
        writer.write(record)
    writer.close()
    return path.read_bytes()


def _theirs(path: Path) -> list[bytes]:
    from array_record.python.array_record_module import ArrayRecordReader

    reader = ArrayRecordReader(str(path))
    try:
        return list(reader.read_all()) if reader.num_records() else []
    finally:
        reader.close()


def _mine(data: bytes, where: str = "f") -> tuple[list[bytes], list[int]]:
    """The records of ``data`` and each chunk's record count, as the footer lists them."""
    size = len(data)
    at = postscript_footer_offset(data[size - BLOCK_SIZE :], size, where)
    listed = footer(data[at : size - BLOCK_SIZE], at, where)
    records = []
    for offset, count in zip(listed.offsets, listed.records, strict=True):
        header, body, _ = chunk_data(data, 0, offset, where)
        found = chunk_records(header, body, where)
        assert len(found) == count == header.num_records
        records += found
    return records, listed.records


def test_highway_hash_gives_the_spec_signature_hashes():
    assert len(SIGNATURE) == 64
    assert highway_hash(SIGNATURE[8:24]) == int.from_bytes(SIGNATURE[:8], "little")
    assert highway_hash(SIGNATURE[32:64]) == int.from_bytes(SIGNATURE[24:32], "little")
    assert highway_hash(b"") == int.from_bytes(SIGNATURE[40:48], "little")  # empty data


@pytest.mark.parametrize(
    "options",
    [
        "group_size:1",  # jaxfeed's writer's default: zstd
        "group_size:1,uncompressed",
        "group_size:7,uncompressed",
        "group_size:100",
        "group_size:5,brotli",
        "group_size:5,snappy",
        "group_size:3,zstd:1",
        "",
    ],
)
@pytest.mark.parametrize("kind", ["empty", "one", "small", "across-blocks"])
def test_the_parser_reads_array_records_records(tmp_path, options, kind):
    rng = np.random.default_rng(len(options) + len(kind))
    records = {
        "empty": [],
        "one": [b"only"],
        "small": [rng.bytes(int(rng.integers(0, 300))) for _ in range(600)],
        # each record longer than a block: every chunk crosses a block header
        "across-blocks": [rng.bytes(70_000 + i) for i in range(4)] + [b"", b"x" * 65_000],
    }[kind]
    path = tmp_path / "f.array_record"
    data = _write(path, records, options)
    mine, counts = _mine(data)
    assert mine == _theirs(path) == records
    assert sum(counts) == len(records)
    assert data[:64] == SIGNATURE


def test_a_damaged_header_or_chunk_is_named_with_its_byte(tmp_path):
    data = bytearray(_write(tmp_path / "f.ar", [b"a" * 100] * 10, "group_size:1,uncompressed"))
    size = len(data)
    at = postscript_footer_offset(bytes(data[-BLOCK_SIZE:]), size, "f")
    third = footer(bytes(data[at : size - BLOCK_SIZE]), at, "f").offsets[3]
    damaged = bytearray(data)
    damaged[third + 10] ^= 1  # its header's data_size
    with pytest.raises(RiegeliError, match=rf"f: the chunk header at byte {third} is damaged"):
        chunk_data(bytes(damaged), 0, third, "f")
    damaged = bytearray(data)
    damaged[third + 60] ^= 1  # its data
    with pytest.raises(RiegeliError, match=rf"f: the chunk at byte {third} fails its data hash"):
        chunk_data(bytes(damaged), 0, third, "f")
    with pytest.raises(RiegeliError, match=r"no ArrayRecord file \(no postscript block\)"):
        postscript_footer_offset(b"\0" * 100, 100, "f")
    tail = bytearray(data[-BLOCK_SIZE:])
    tail[9] ^= 1  # the postscript block's header
    with pytest.raises(RiegeliError, match=rf"f: the block header at byte {size - BLOCK_SIZE} is"):
        postscript_footer_offset(bytes(tail), size, "f")


def test_transposed_chunks_are_refused_by_name(tmp_path):
    data = _write(tmp_path / "t.ar", [b"\x08\x01"] * 10, "group_size:4,transpose:true")
    size = len(data)
    at = postscript_footer_offset(data[-BLOCK_SIZE:], size, "t")
    listed = footer(data[at : size - BLOCK_SIZE], at, "t")
    assert "transpose:true" in listed.writer_options
    header, body, _ = chunk_data(data, 0, listed.offsets[0], "t")
    with pytest.raises(NotParsed, match=r"t: its chunks are transposed"):
        chunk_records(header, body, "t")


def test_a_chunk_ending_at_a_block_boundary_reads_without_the_next_block(tmp_path):
    """The first chunk's header is at byte 64 and its data 5 bytes of framing
    then the record: a record of 65,427 bytes ends the chunk at byte 65,536
    exactly; the next chunk formally begins there, before the block header."""
    records = [b"a" * 65_427, b"b" * 10, b"c" * 5]
    path = tmp_path / "f.array_record"
    data = _write(path, records, "group_size:1,uncompressed")
    header, body, end = chunk_data(data[:BLOCK_SIZE], 0, 64, "f")  # nothing past the block
    assert end == BLOCK_SIZE and chunk_records(header, body, "f") == records[:1]
    header, body, _ = chunk_data(data, 0, BLOCK_SIZE, "f")
    assert chunk_records(header, body, "f") == records[1:2]
    assert _mine(data)[0] == _theirs(path) == records

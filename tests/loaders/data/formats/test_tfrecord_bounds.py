"""A TFRecord length is bounded before its record is gathered: one past a
plain file's end, or over ``JAXFEED_MAX_RECORD_BYTES`` in a gzip file, is
refused at once, naming the file, the record and its header's byte, so a
damaged length (with a valid checksum) costs no memory."""

import gzip
import re
import struct
import subprocess
import sys
import zlib

import pytest
from jaxfeed.loaders.data.formats import tfrecord

_READ = """
import resource, sys
from pathlib import Path
from jaxfeed.loaders.data.formats.tfrecord import tfrecord_records

before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    for _ in tfrecord_records(Path(sys.argv[1])):
        pass
except ValueError as error:
    print(error)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)  # KiB: MiB
"""


def _framed(records: list[bytes]) -> bytes:
    out = []
    for record in records:
        out += [_header(len(record)), record, struct.pack("<I", tfrecord.masked_crc32c(record))]
    return b"".join(out)


def _header(length: int) -> bytes:
    """A length and its valid checksum."""
    length_bytes = struct.pack("<Q", length)
    return length_bytes + struct.pack("<I", tfrecord.masked_crc32c(length_bytes))


@pytest.mark.parametrize(
    ("kind", "named"),
    [
        ("plain", r"the file ends inside it \(its header, at byte 26, says 1099511627776"),
        ("gzip", r"its length header \(at byte 26 of the inflated data\) says 1099511627776"),
    ],
    ids=["plain", "gzip"],
)
def test_a_length_of_2_to_the_40_is_refused_before_its_record_is_read(tmp_path, kind, named):
    start = _framed([b"x" * 10]) + _header(2**40)  # record 0 whole, then a claim of 1 TiB
    path = tmp_path / ("claims.tfrecord" + (".gz" if kind == "gzip" else ""))
    with open(path, "wb") as file:
        if kind == "plain":
            file.write(start)
            file.truncate(200 << 20)  # 200 MB of zeros after it, sparse: no disk
        else:
            stream = zlib.compressobj(1, zlib.DEFLATED, 31)  # ~200 KB inflating to 200 MB
            file.write(stream.compress(start))
            for _ in range(200):
                file.write(stream.compress(bytes(1 << 20)))
            file.write(stream.flush())
    run = subprocess.run(
        [sys.executable, "-c", _READ, str(path)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, f"status {run.returncode}: {run.stderr[-2000:]}"
    message, grown_mib = run.stdout.strip().rsplit("\n", 1)
    assert int(grown_mib) < 100, f"grew by {grown_mib} MiB"  # gathering the zeros: ~400
    assert message.startswith(f"{path}, record 1: ") and re.search(named, message), message


def test_the_longest_gzip_record_is_set_by_the_environment(tmp_path, monkeypatch):
    path = tmp_path / "long.tfrecord.gz"
    path.write_bytes(gzip.compress(_framed([b"a" * 100, b"b" * 5000, b"c"])))
    monkeypatch.setenv(tfrecord.MAX_RECORD_ENV, "4096")
    got = []
    with pytest.raises(ValueError, match=r"long\.tfrecord\.gz, record 1: .* says 5000 bytes, more "
                       r"than the 4096 .* set JAXFEED_MAX_RECORD_BYTES higher"):  # fmt: skip
        got.extend(tfrecord.tfrecord_records(path))
    assert [record for _, _, record in got] == [b"a" * 100]  # the records before it first
    monkeypatch.setenv(tfrecord.MAX_RECORD_ENV, "5000")
    assert len(list(tfrecord.tfrecord_records(path))) == 3
    monkeypatch.setenv(tfrecord.MAX_RECORD_ENV, "1 GiB")
    with pytest.raises(ValueError, match=r"JAXFEED_MAX_RECORD_BYTES='1 GiB' is not a positive"):
        list(tfrecord.tfrecord_records(path))

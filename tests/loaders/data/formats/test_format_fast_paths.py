"""The bulk paths of the copy and of ``convert`` give what the record-by-record
ones give, and still name a damaged record: TFRecord framing a chunk at a
time (lengths' checksums all at once), Examples read a batch at a time,
Examples written a batch at a time, image files read with few calls."""

import gzip
import struct

import numpy as np
import pytest
from jaxfeed.loaders.data.formats import example, imagefolder, tfrecord
from jaxfeed.loaders.ragged_field import RaggedField

from jaxfeed import loaders


def _masked_crc32c(data: bytes) -> int:
    """TFRecord's checksum, written out here apart from the one under test."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _framed(records: list[bytes]) -> bytes:
    out = []
    for record in records:
        length = struct.pack("<Q", len(record))
        out += [length, struct.pack("<I", _masked_crc32c(length)), record]
        out.append(struct.pack("<I", _masked_crc32c(record)))
    return b"".join(out)


RECORDS = [bytes([i % 251]) * size for i, size in enumerate([0, 1, 5, 300, 20, 4000, 7] * 6)]


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 256 bytes: records cross chunk ends and outgrow a chunk."""
    monkeypatch.setattr(tfrecord, "_CHUNK_BYTES", 256)


@pytest.fixture(params=["default", "small"])
def chunks(request):
    """Each test that takes it, with the default chunks and with `small_chunks`."""
    if request.param == "small":
        request.getfixturevalue("small_chunks")


def test_the_checksum_is_crc32c_masked():
    unmasked = 0xE3069283  # CRC-32C of b"123456789", the standard check value
    masked = (((unmasked >> 15) | (unmasked << 17)) + 0xA282EAD8) & 0xFFFFFFFF
    assert tfrecord.masked_crc32c(b"123456789") == masked == _masked_crc32c(b"123456789")


def test_bulk_framing_reads_every_record_plain_and_gzip(tmp_path, chunks):
    data = _framed(RECORDS)
    (tmp_path / "plain.tfrecord").write_bytes(data)
    half = len(data) // 3  # two gzip members, split inside a record
    (tmp_path / "two.tfrecord").write_bytes(gzip.compress(data[:half]) + gzip.compress(data[half:]))
    for name in ("plain", "two"):
        got = list(tfrecord.tfrecord_records(tmp_path / f"{name}.tfrecord"))
        assert [r for _, _, r in got] == RECORDS
        assert [i for _, i, _ in got] == list(range(len(RECORDS)))


@pytest.mark.parametrize("damage", ["length", "checksum"])
def test_a_damaged_length_is_named_after_the_records_before_it(tmp_path, chunks, damage):
    data = bytearray(_framed(RECORDS))
    bad = 23
    at = len(_framed(RECORDS[:bad])) + (1 if damage == "length" else 9)
    data[at] ^= 0x40  # a length that skips ahead into other bytes, or a checksum off by a bit
    (tmp_path / "bad.tfrecord").write_bytes(bytes(data))
    got = []
    with pytest.raises(ValueError, match=rf"bad\.tfrecord, record {bad}: its length header"):
        got.extend(tfrecord.tfrecord_records(tmp_path / "bad.tfrecord"))
    assert [r for _, _, r in got] == RECORDS[:bad]


@pytest.mark.parametrize("kind", ["plain", "gzip"])
def test_a_flipped_data_byte_is_named_after_the_records_before_it(tmp_path, chunks, kind):
    data = bytearray(_framed(RECORDS))
    bad = 26  # 4000 bytes: across small chunks
    data[len(_framed(RECORDS[:bad])) + 12 + 1000] ^= 0x01  # one bit of its data
    path = tmp_path / ("bad.tfrecord" + (".gz" if kind == "gzip" else ""))
    path.write_bytes(gzip.compress(bytes(data)) if kind == "gzip" else bytes(data))
    got = []
    with pytest.raises(ValueError, match=rf"bad\.tfrecord(\.gz)?, record {bad}: its data fails"):
        got.extend(tfrecord.tfrecord_records(path))
    assert [r for _, _, r in got] == RECORDS[:bad]


def test_make_refuses_an_example_whose_data_fails_its_checksum(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXFEED_CACHE_DIR", str(tmp_path / "cache"))
    rows = example.serialize_examples({"image": [bytes(100 + i) for i in range(8)],
                                       "label": np.arange(8)})  # fmt: skip
    data = bytearray(_framed(rows))
    data[len(_framed(rows[:5])) + 12 + len(rows[5]) - 40] ^= 0x01  # an image byte: still parses
    (tmp_path / "train.tfrecord").write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"train\.tfrecord, record 5: its data fails its checksum"):
        loaders.load_dataset(tmp_path / "train.tfrecord")


def test_a_cut_file_or_gzip_stream_names_the_record(tmp_path, small_chunks):
    data = _framed(RECORDS)
    (tmp_path / "cut.tfrecord").write_bytes(data[:-6])  # inside the last record's data
    last = len(RECORDS) - 1
    with pytest.raises(ValueError, match=rf"cut\.tfrecord, record {last}: the file ends inside"):
        list(tfrecord.tfrecord_records(tmp_path / "cut.tfrecord"))
    (tmp_path / "tail.tfrecord").write_bytes(data + b"\x01\x02")  # less than a length
    with pytest.raises(ValueError, match=rf"record {last + 1}: its length header is damaged"):
        list(tfrecord.tfrecord_records(tmp_path / "tail.tfrecord"))
    (tmp_path / "cut.tfrecord.gz").write_bytes(gzip.compress(data)[:-20])
    with pytest.raises(ValueError, match=r"cut\.tfrecord\.gz, record \d+: its gzip stream"):
        list(tfrecord.tfrecord_records(tmp_path / "cut.tfrecord.gz"))


def _rows(count: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    images = np.empty(count, object)
    images[:] = [rng.bytes(int(n)) for n in rng.integers(0, 20_000, count)]  # 1-3 byte lengths
    return {
        "image": images,
        "label": rng.integers(-(2**63), 2**63 - 1, count),  # one to ten byte varints
        "small": rng.integers(0, 100, (count, 3)).astype(np.int32),
        "unsigned": rng.integers(0, 2**64 - 1, (count, 2), dtype=np.uint64),
        "flag": rng.integers(0, 2, count).astype(bool),
        "box": rng.random((count, 2, 2)),
        "empty": np.zeros(count, object),
    }


def test_examples_written_a_batch_at_a_time_are_the_bytes_of_one_at_a_time():
    columns = _rows(40)
    columns["empty"][:] = [b""] * 40
    batch = example.serialize_examples(columns)
    for i, record in enumerate(batch):
        assert record == example.serialize_example({k: v[i] for k, v in columns.items()})


def test_examples_read_a_batch_at_a_time_match_record_by_record_and_name_a_bad_one():
    columns = _rows(40)
    columns["empty"][:] = [b"x"] * 40
    records = [("f.tfrecord", i, r) for i, r in enumerate(example.serialize_examples(columns))]
    schema = example.example_schema(records[0])
    fast, checked = example._fast_batch(records, schema), example._checked_batch(records, schema)
    assert fast is not None and fast.keys() == checked.keys()
    for name in fast:
        if isinstance(fast[name], list):
            assert fast[name] == checked[name]
        else:
            assert fast[name].dtype == checked[name].dtype
            np.testing.assert_array_equal(fast[name], checked[name])
    np.testing.assert_array_equal(fast["unsigned"].view(np.uint64), columns["unsigned"])
    # A record whose features come in another order: read record by record, the same rows.
    row = {k: columns[k][5] for k in reversed(columns)}
    records[5] = ("f.tfrecord", 5, example.serialize_example(row))
    assert example._fast_batch(records, schema) is None
    (got,) = example.example_batches(records)
    np.testing.assert_array_equal(got["label"], columns["label"])
    # One holding three values where the others hold two: a ragged field, whichever path reads it.
    row = {k: columns[k][7] for k in columns} | {"unsigned": np.arange(3, dtype=np.uint64)}
    records[7] = ("f.tfrecord", 7, example.serialize_example(row))
    fast, checked = (
        example._fast_batch(records[6:], schema),
        example._checked_batch(records[6:], schema),
    )
    for got in (
        fast["unsigned"],
        checked["unsigned"],
        example.example_batch(records, schema)["unsigned"][6:],
    ):
        assert isinstance(got, RaggedField)
        np.testing.assert_array_equal(got.lengths, [2, 3] + [2] * 32)
        np.testing.assert_array_equal(got[1], np.arange(3))
        np.testing.assert_array_equal(got[2].view(np.uint64), columns["unsigned"][8])


def test_image_files_are_read_whole_small_and_large(tmp_path):
    sizes = [0, 1, 2**16 - 1, 2**16, 2**16 + 1, 3 * 2**16]
    for i, size in enumerate(sizes):
        (tmp_path / "cat").mkdir(exist_ok=True)
        (tmp_path / "cat" / f"{i}.png").write_bytes(bytes([i + 1]) * size)
    assert [len(data) for data in imagefolder.read_files(imagefolder.files_in(tmp_path))] == sizes
    ds = loaders.load_dataset(tmp_path)
    assert list(ds["image"][np.arange(len(ds))]) == [
        bytes([i + 1]) * n for i, n in enumerate(sizes)
    ]


def test_large_records_make_smaller_batches_of_the_same_rows(monkeypatch):
    columns = _rows(40)
    columns["empty"][:] = [b"x"] * 40
    records = [("f.tfrecord", i, r) for i, r in enumerate(example.serialize_examples(columns))]
    (whole,) = example.example_batches(records)
    monkeypatch.setattr(example, "_BATCH_BYTES", sum(len(r) for _, _, r in records) // 5)
    parts = list(example.example_batches(records))
    assert len(parts) >= 5 and sum(len(p["label"]) for p in parts) == 40
    assert [image for p in parts for image in p["image"]] == whole["image"]
    np.testing.assert_array_equal(np.concatenate([p["box"] for p in parts]), whole["box"])

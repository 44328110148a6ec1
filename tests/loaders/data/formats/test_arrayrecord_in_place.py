"""ArrayRecord files are read in place by grain: no columnar copy in the
cache, the same batches as numpy's (which reads the copy, built on its first
use), a bad record named by file and index when grain reads it, and a file
changed on disk never served stale."""

import os

import numpy as np
import pytest
from backend_helpers import assert_same_batches
from format_files import augmented_epochs, example, records, write_arrayrecord
from transform_helpers import augment_image

from jaxfeed import loaders


def raw_png(record: dict, rng: np.random.Generator) -> dict:
    """`augment_image` of a raw record (PNG bytes, no label)."""
    return augment_image({"image": record["record"], "label": np.int64(0)}, rng)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache of the test's own, to see what reading puts there."""
    monkeypatch.setenv("JAXFEED_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """The train records as Examples and as raw PNG records, each in two
    shards (and an empty third, which holds no unit)."""
    root = tmp_path_factory.mktemp("arrayrecord-in-place")
    png, labels = records()["train"]
    serialized = {
        "examples": [example(p, label) for p, label in zip(png, labels, strict=True)],
        "raw": png,
    }
    for name, rows in serialized.items():
        (root / name).mkdir()
        for shard, part in enumerate((rows[:10], rows[10:], [])):
            write_arrayrecord(root / name / f"train-{shard}.array_record", part)
    return root


def copies(cache) -> list[str]:
    """The columnar copies in the cache (entries with a fields description)."""
    formats = cache / "formats"
    return (
        [e.name for e in formats.iterdir() if (e / "fields.json").exists()]
        if formats.exists()
        else []
    )


@pytest.mark.parametrize("name", ["examples", "raw"])
def test_grain_reads_in_place_with_no_copy_and_numpy_gets_the_copy(written, cache, name):
    transform = augment_image if name == "examples" else raw_png
    grain = loaders.make("grain", dataset=written / name, batch_size=7, seed=5, transform=transform)
    assert grain.source == "files"
    got = [list(grain.iter_epoch(epoch)) for epoch in (0, 1)]
    assert copies(cache) == []
    assert grain.dataset.units == (10, 14)
    want = augmented_epochs("numpy", written / name) if name == "examples" else [
        list(loaders.make("numpy", dataset=written / name, batch_size=7, seed=5,
                          transform=raw_png).iter_epoch(epoch)) for epoch in (0, 1)
    ]  # fmt: skip
    assert len(copies(cache)) == 1  # numpy reads the copy
    assert not np.array_equal(want[0][0]["image"], want[1][0]["image"])
    for epoch in (0, 1):
        assert_same_batches(got[epoch], want[epoch])


def test_a_bad_record_is_named_when_grain_reads_it(tmp_path, cache):
    png, labels = records()["train"]
    rows = [example(p, label) for p, label in zip(png, labels, strict=True)]
    rows[12] = example(png[12], labels[12])[:-3]  # cut short: not an Example
    rows[17] = example(png[17], labels[17], extra=[1.0])  # a feature the first record lacks
    write_arrayrecord(tmp_path / "a.array_record", rows[:10])
    write_arrayrecord(tmp_path / "b.array_record", rows[10:])
    grain = loaders.make("grain", dataset=tmp_path, batch_size=4, transform=augment_image,
                         shuffle=False)  # fmt: skip
    batches = grain.iter_epoch(0)
    for _ in range(3):  # rows 0-11 are whole
        next(batches)
    with pytest.raises(ValueError, match=r"b.array_record, record 2 is not a readable"):
        next(batches)  # rows 12-15
    with pytest.raises(ValueError, match=r"b.array_record, record 7 has feature\(s\) \['extra'\]"):
        list(grain.iter_epoch(0, start=4))  # rows 16-19
    assert copies(cache) == []


def test_a_changed_file_is_not_served_stale(tmp_path, cache):
    png, labels = records()["train"]
    path = tmp_path / "train.array_record"
    write_arrayrecord(path, [example(p, label) for p, label in zip(png, labels, strict=True)])
    made = loaders.load_dataset(tmp_path, split="train")
    before = augmented_epochs("grain", tmp_path)
    stat = os.stat(path)
    write_arrayrecord(path, [example(p, 2 - label) for p, label in zip(png, labels, strict=True)])
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # even at the same mtime
    after = augmented_epochs("grain", tmp_path)
    np.testing.assert_array_equal(after[0][0]["label"], 2 - before[0][0]["label"])
    for epoch in (0, 1):
        assert_same_batches(after[epoch], augmented_epochs("numpy", tmp_path)[epoch])
    with pytest.raises(ValueError, match="a file changed since the dataset was made"):
        loaders.make("numpy", dataset=made, batch_size=7, transform=augment_image)


def test_an_int64_that_does_not_fit_int32_is_refused_not_wrapped(tmp_path, cache):
    png, labels = records()["train"]
    rows = [example(p, label) for p, label in zip(png, labels, strict=True)]
    rows[6] = example(png[6], 2**40)  # JAX without x64 makes int32 of int64
    write_arrayrecord(tmp_path / "a.array_record", rows)
    grain = loaders.make("grain", dataset=tmp_path, batch_size=4, transform=augment_image,
                         shuffle=False)  # fmt: skip
    batches = grain.iter_epoch(0)
    next(batches)  # rows 0-3 fit
    with pytest.raises(ValueError, match=r"'label' holds .*1099511627776, which does not fit"):
        next(batches)


def first_bytes(record: dict, rng: np.random.Generator) -> dict:
    """A raw record's first 8 bytes as numbers."""
    return {"head": np.frombuffer(record["record"][:8], np.uint8)}


def damaged_arrayrecord(path, flip: int | None = None) -> None:
    """40 raw records, 4 a chunk, uncompressed (so a record's bytes lie as
    they are in the file); a byte flipped in record 13 (in the chunk of
    records 12-15) or, with ``flip``, at that offset from the end."""
    from array_record.python.array_record_module import ArrayRecordWriter

    writer = ArrayRecordWriter(str(path), "group_size:4,uncompressed")
    for i in range(40):
        writer.write(b"raw-%04d" % i + bytes(100))
    writer.close()
    data = bytearray(path.read_bytes())
    data[data.find(b"raw-0013") + 5 if flip is None else len(data) - flip] ^= 0xFF
    path.write_bytes(data)


def test_a_damaged_chunk_names_its_file_and_record(tmp_path, cache):
    damaged_arrayrecord(tmp_path / "bad.array_record")
    grain = loaders.make("grain", dataset=tmp_path, batch_size=4, transform=first_bytes,
                         shuffle=False)  # fmt: skip
    batches = grain.iter_epoch(0)
    for _ in range(3):  # rows 0-11 are whole
        next(batches)
    named = r"bad\.array_record, record 12 cannot be read \(.*hash mismatch.*\): the ArrayRecord"
    with pytest.raises(ValueError, match=named) as grain_error:
        next(batches)  # rows 12-15: in place, through Grain's source
    with pytest.raises(ValueError, match=named) as copy_error:
        loaders.make("numpy", dataset=tmp_path, batch_size=4, transform=first_bytes)  # the copy
    for raised in (grain_error, copy_error):
        assert isinstance(raised.value.__cause__, RuntimeError)  # Riegeli's own, kept


def test_a_damaged_footer_is_refused_naming_its_file_not_read_as_empty(tmp_path, cache):
    # Riegeli puts the footer's postscript at the start of the file's last
    # 64 KiB block; damaged, the reader says it holds no records.
    damaged_arrayrecord(tmp_path / "bad.array_record", flip=65536 - 64)
    with pytest.raises(ValueError, match=r"bad\.array_record is not a readable ArrayRecord") as e:
        loaders.load_dataset(tmp_path)
    assert isinstance(e.value.__cause__, RuntimeError)

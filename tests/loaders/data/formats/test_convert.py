"""``jaxfeed convert``: the user's files rewritten as Parquet or ArrayRecord
shards or .npy fields hold the same records; a rerun after a kill skips
complete files; the Examples jaxfeed writes are TensorFlow's bytes."""

import numpy as np
import pytest
from backend_helpers import assert_same_batches
from format_files import CLASSES, records
from transform_helpers import augment_image

from jaxfeed import loaders
from jaxfeed.cli import main


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """An image folder (no TensorFlow to import), train and test."""
    root = tmp_path_factory.mktemp("convert-source")
    for split, (png, labels) in records().items():
        for i, (image, label) in enumerate(zip(png, labels, strict=True)):
            (root / split / CLASSES[label]).mkdir(parents=True, exist_ok=True)
            (root / split / CLASSES[label] / f"{i:03d}.png").write_bytes(image)
    return root


def test_parquet_holds_the_same_records_and_a_rerun_skips_complete_shards(shards, tmp_path):
    out = tmp_path / "out"
    args = ["convert", str(shards), str(out), "--to", "parquet", "--rows-per-shard", "10"]
    assert main(args) == 0
    for split in ("train", "test"):
        want, got = loaders.load_dataset(shards, split), loaders.load_dataset(out, split)
        assert list(got) == list(want)
        for name in want:
            np.testing.assert_array_equal(
                got[name][np.arange(len(got))], want[name][np.arange(len(want))]
            )
    first, second = sorted((out / "train").glob("*.parquet"))[:2]
    stamp = first.stat().st_mtime_ns
    second.unlink()  # a kill before this shard was renamed into place
    (out / "train" / f".{second.name}.partial").write_bytes(b"half")
    assert main(args) == 0
    assert first.stat().st_mtime_ns == stamp and second.is_file()
    again, want = loaders.load_dataset(out)["image"], loaders.load_dataset(shards)["image"]
    rows = np.arange(len(want))
    assert list(again[rows]) == list(want[rows])


def test_npy_takes_numbers_and_refuses_bytes(shards, tmp_path, capsys):
    source = tmp_path / "numbers.parquet"
    import pyarrow as pa
    from pyarrow import parquet

    parquet.write_table(pa.table({"x": np.arange(12.0), "label": np.arange(12) % 3}), source)
    assert main(["convert", str(source), str(tmp_path / "npy"), "--to", "npy"]) == 0
    np.testing.assert_array_equal(
        np.load(tmp_path / "npy" / "train" / "x.npy"), np.arange(12.0, dtype=np.float32)
    )
    assert main(["convert", str(shards), str(tmp_path / "no"), "--to", "npy"]) == 2
    assert "hold encoded bytes, which .npy files cannot" in capsys.readouterr().err


def test_arrayrecord_holds_the_same_records_as_examples_tensorflow_reads(shards, tmp_path):
    import tensorflow as tf

    out = tmp_path / "out"
    args = ["convert", str(shards), str(out), "--to", "arrayrecord", "--rows-per-shard", "10"]
    assert main(args) == 0
    shard_files = sorted((out / "train").glob("*.array_record"))
    assert [p.name for p in shard_files] == [f"{i:05d}-of-00003.array_record" for i in range(3)]
    for split in ("train", "test"):
        want, got = loaders.load_dataset(shards, split), loaders.load_dataset(out, split)
        assert list(got) == list(want)
        rows = np.arange(len(want))
        for name in want:
            assert list(got[name][rows]) == list(want[name][rows]), name
    # make reads the shards as it reads the source: the same batches.
    options = dict(batch_size=7, seed=3, transform=augment_image)
    assert_same_batches(
        list(loaders.make("numpy", dataset=out, **options).iter_epoch(1)),
        list(loaders.make("numpy", dataset=shards, **options).iter_epoch(1)),
    )
    # TensorFlow's own parser reads the records jaxfeed wrote.
    from array_record.python.array_record_module import ArrayRecordReader

    reader = ArrayRecordReader(str(shard_files[0]))
    first = tf.train.Example.FromString(reader.read([0])[0])
    reader.close()
    want_image = loaders.load_dataset(shards, "train")["image"][0]
    assert first.features.feature["image"].bytes_list.value == [want_image]
    assert list(first.features.feature["label"].int64_list.value) == [0]


def test_examples_jaxfeed_writes_are_the_bytes_tensorflow_writes():
    import tensorflow as tf
    from jaxfeed.loaders.data.formats.example import parse_example, serialize_example

    row = {"x": np.array([1.5, -2.0], np.float32), "n": np.array([-3, 2**40]), "b": b"\x00hi"}
    feature = {
        "x": tf.train.Feature(float_list=tf.train.FloatList(value=[1.5, -2.0])),
        "n": tf.train.Feature(int64_list=tf.train.Int64List(value=[-3, 2**40])),
        "b": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"\x00hi"])),
    }
    ours = serialize_example(row)
    assert tf.train.Example.FromString(ours) == tf.train.Example(
        features=tf.train.Features(feature=feature)
    )
    parsed = parse_example(ours)
    assert parsed["b"] == ("bytes", [b"\x00hi"])
    np.testing.assert_array_equal(parsed["n"][1], [-3, 2**40])


def _numbers(root, start, rows=30):
    """A train and a test Parquet file of ``rows`` numbers from ``start``."""
    import pyarrow as pa
    from pyarrow import parquet

    root.mkdir(parents=True, exist_ok=True)
    for split, offset in (("train", 0), ("test", rows)):
        x = np.arange(start + offset, start + offset + rows, dtype=np.int64)
        parquet.write_table(pa.table({"x": x, "label": x % 3}), root / f"{split}-0.parquet")
    return root


def _rows(directory, split="train"):
    data = loaders.load_dataset(directory, split)
    return list(data["x"][np.arange(len(data))])


@pytest.mark.parametrize("to", ["parquet", "npy", "arrayrecord"])
def test_another_conversion_is_refused_unless_overwrite(tmp_path, capsys, to):
    a, b, out = _numbers(tmp_path / "a", 0), _numbers(tmp_path / "b", 1000), tmp_path / "out"
    args = ["convert", str(b), str(out), "--to", to, "--rows-per-shard", "7"]
    assert main(["convert", str(a), str(out), "--to", to, "--rows-per-shard", "7"]) == 0
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "holds another conversion" in err and "--overwrite" in err, err
    assert _rows(out) == list(range(30))  # A's, untouched
    assert main([*args, "--overwrite"]) == 0
    assert _rows(out) == list(range(1000, 1030)) and _rows(out, "test")[0] == 1030
    assert main(args) == 0  # a rerun of the conversion it holds: its own


def test_another_shard_size_replaces_every_old_shard(tmp_path, capsys):
    source, out = _numbers(tmp_path / "a", 0, rows=3000), tmp_path / "out"
    assert main(["convert", str(source), str(out), "--to", "parquet"]) == 0
    again = ["convert", str(source), str(out), "--to", "parquet", "--rows-per-shard", "1000"]
    assert main(again) == 2 and "holds another conversion" in capsys.readouterr().err
    assert main([*again, "--overwrite"]) == 0
    assert _rows(out) == list(range(3000))  # 3,000 rows, not both shard sets' 6,000
    assert [p.name for p in sorted((out / "train").iterdir())] == [
        f"{i:05d}-of-00003.parquet" for i in range(3)
    ]


def test_files_it_did_not_write_are_refused_and_kept(tmp_path, capsys):
    source, out = _numbers(tmp_path / "a", 0), tmp_path / "out"
    (out / "train").mkdir(parents=True)
    mine = out / "train" / "00000-of-00001.parquet"
    mine.write_bytes(b"the user's own")
    for flags in ([], ["--overwrite"]):
        assert main(["convert", str(source), str(out), "--to", "parquet", *flags]) == 2
        assert "holds files no jaxfeed conversion wrote" in capsys.readouterr().err
        assert mine.read_bytes() == b"the user's own"
    # Beside a conversion, too: overwrite removes only what the manifest names.
    assert main(["convert", str(source), str(tmp_path / "ok"), "--to", "parquet"]) == 0
    (tmp_path / "ok" / "notes.txt").write_text("mine")
    args = ["convert", str(source), str(tmp_path / "ok"), "--to", "npy", "--overwrite"]
    assert main(args) == 2 and "notes.txt" in capsys.readouterr().err
    assert (tmp_path / "ok" / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("where", ["the source", "inside it", "above it"])
def test_it_never_writes_into_its_source(tmp_path, capsys, where):
    source = _numbers(tmp_path / "data" / "a", 0)
    before = sorted(p.name for p in source.iterdir())
    destination = {
        "the source": source,
        "inside it": source / "out",
        "above it": tmp_path / "data",
    }[where]
    assert main(["convert", str(source), str(destination), "--to", "parquet"]) == 2
    assert "is, holds or lies inside the source" in capsys.readouterr().err
    assert sorted(p.name for p in source.iterdir()) == before
    assert _rows(source, "test") == list(range(30, 60))
    # A glob or a file names the same source.
    files = str(source / "*.parquet")
    assert main(["convert", files, str(source / "out"), "--to", "parquet"]) == 2
    assert main(["convert", str(source / "train-0.parquet"), str(source), "--to", "npy"]) == 2


def test_a_failed_conversion_leaves_no_destination_and_resumes(tmp_path, monkeypatch):
    from jaxfeed.loaders.data.formats import convert as module

    source, out = _numbers(tmp_path / "a", 0), tmp_path / "out"
    write = module._parquet

    def fail_on_test(data, directory, *args):
        if directory.name == "test":
            raise OSError("disk full")
        return write(data, directory, *args)

    monkeypatch.setattr(module, "_parquet", fail_on_test)
    with pytest.raises(OSError, match="disk full"):
        module.convert(source, out, "parquet", rows_per_shard=7)
    assert not out.exists()  # nothing there reads as a complete conversion
    monkeypatch.setattr(module, "_parquet", write)
    files = module.convert(source, out, "parquet", rows_per_shard=7)
    assert files[0] == out / "train" / "00000-of-00005.parquet"
    assert _rows(out) == list(range(30)) and _rows(out, "test") == list(range(30, 60))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "out"]  # nothing left beside


def test_rows_per_shard_below_one_is_refused_by_name(tmp_path):
    from jaxfeed.loaders.data.formats.convert import convert

    with pytest.raises(ValueError, match="rows_per_shard=0"):
        convert(_numbers(tmp_path / "a", 0), tmp_path / "out", "parquet", rows_per_shard=0)

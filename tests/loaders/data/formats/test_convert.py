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

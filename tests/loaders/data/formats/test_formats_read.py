"""The user's files through ``load_dataset`` / ``make``: every format holds the
same records and reads back the same fields, in the same order; splits,
``format=``, refusals and errors name what they found."""

import pickle
from pathlib import Path

import numpy as np
import pytest
from format_files import CLASSES, TEST_ROWS, TRAIN_ROWS, example, records, write_all, write_tfrecord
from jaxfeed.loaders.data.on_disk import MissingSplitError
from transform_helpers import augment_image

from jaxfeed import loaders

FORMATS = ("tfrecord", "tfrecord-gzip", "arrayrecord", "parquet", "arrow", "imagefolder", "hf")


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    return write_all(tmp_path_factory.mktemp("formats"))


@pytest.fixture(scope="module")
def want():
    return records()


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("split", ["train", "test"])
def test_every_format_reads_the_records_in_order(written, want, name, split):
    ds = loaders.load_dataset(written[name], split)
    png, labels = want[split]
    assert len(ds) == (TRAIN_ROWS if split == "train" else TEST_ROWS)
    assert sorted(ds) == ["image", "label"]
    assert list(ds["image"][np.arange(len(ds))]) == png
    np.testing.assert_array_equal(ds["label"], labels)
    assert ds["label"].dtype == np.int32
    if name in ("imagefolder", "hf"):
        assert ds.classes == CLASSES
    # Memory-mapped: into a worker goes where the bytes lie, not the bytes.
    assert len(pickle.dumps(ds["image"])) < ds["image"].nbytes // 10


def test_formats_holding_the_same_records_give_the_same_batches(written):
    def batches(name):
        source = loaders.make(
            "numpy", dataset=written[name], batch_size=5, seed=3, transform=augment_image
        )
        return [list(source.iter_epoch(epoch)) for epoch in (0, 1)]

    want = batches("parquet")
    assert not all(np.array_equal(a["image"], b["image"]) for a, b in zip(*want, strict=True))
    for name in FORMATS:
        got = batches(name)
        for epoch in (0, 1):
            for a, b in zip(got[epoch], want[epoch], strict=True):
                assert a.keys() == b.keys()
                for key in a:
                    np.testing.assert_array_equal(a[key], b[key], err_msg=f"{name} {key}")


def test_exact_start(written):
    source = loaders.make(
        "numpy", dataset=written["tfrecord"], batch_size=5, transform=augment_image
    )
    whole = list(source.iter_epoch(1))
    for got, want in zip(source.iter_epoch(1, start=2), whole[2:], strict=True):
        np.testing.assert_array_equal(got["image"], want["image"])


def test_a_glob_a_list_and_format(written, tmp_path):
    shards = sorted(str(p) for p in written["tfrecord"].glob("train-*"))
    by_glob = loaders.load_dataset(str(written["tfrecord"] / "train-*"))
    by_list = loaders.load_dataset(shards[::-1])  # read in name order all the same
    np.testing.assert_array_equal(by_glob["label"], by_list["label"])
    assert len(by_list) == TRAIN_ROWS
    unnamed = tmp_path / "records.bin"  # no extension, no magic bytes: say which
    unnamed.write_bytes(Path(shards[0]).read_bytes())
    ds = loaders.load_dataset([unnamed], format="tfrecord")
    assert len(ds) == TRAIN_ROWS // 2


def test_a_missing_split_is_named(written, tmp_path):
    alone = tmp_path / "alone.parquet"  # names no split: the train split only
    alone.write_bytes((written["parquet"] / "train-0.parquet").read_bytes())
    with pytest.raises(MissingSplitError, match=r"has no 'test' split.*one split, 'train'"):
        loaders.load_dataset(alone, "test")
    (tmp_path / "folder" / "train" / "cat").mkdir(parents=True)
    (tmp_path / "folder" / "train" / "cat" / "a.png").write_bytes(want_png(written))
    with pytest.raises(MissingSplitError, match=r"has no 'test' split.*\['train'\]"):
        loaders.load_dataset(tmp_path / "folder", "test")


def want_png(written):
    return next((written["imagefolder"] / "train").rglob("*.png")).read_bytes()


def test_a_variable_length_feature_is_ragged_and_a_missing_one_refused_by_name(tmp_path):
    varying = [example(b"x", 0, box=[1.0, 2.0]), example(b"y", 1, box=[1.0, 2.0, 3.0])]
    write_tfrecord(tmp_path / "varying.tfrecord", varying)
    box = loaders.load_dataset(tmp_path / "varying.tfrecord")["box"]
    assert isinstance(box, loaders.RaggedField)
    np.testing.assert_array_equal(box[1], [1.0, 2.0, 3.0])
    missing = [example(b"x", 0, box=[1.0]), example(b"y", 1)]
    write_tfrecord(tmp_path / "missing.tfrecord", missing)
    with pytest.raises(ValueError, match=r"missing\.tfrecord, record 1 has no feature 'box'"):
        loaders.load_dataset(tmp_path / "missing.tfrecord")


def test_fixed_length_features_are_arrays(tmp_path):
    rows = [example(b"x", 0, box=[1.0, 2.0]), example(b"yy", 1, box=[3.0, 4.0])]
    write_tfrecord(tmp_path / "boxes.tfrecord", rows)
    ds = loaders.load_dataset(tmp_path / "boxes.tfrecord")
    np.testing.assert_array_equal(ds["box"], [[1.0, 2.0], [3.0, 4.0]])
    assert ds["box"].dtype == np.float32 and ds["image"][1] == b"yy"


def test_a_damaged_record_names_its_file_and_index(written, tmp_path):
    whole = (written["tfrecord"] / "train-00000-of-00002.tfrecord").read_bytes()
    cut = tmp_path / "cut.tfrecord"
    cut.write_bytes(whole[:-30])
    with pytest.raises(ValueError, match=rf"cut\.tfrecord, record {TRAIN_ROWS // 2 - 1}: the file"):
        loaders.load_dataset(cut)


def test_a_changed_file_is_read_again(written, tmp_path):
    target = tmp_path / "one.parquet"
    target.write_bytes((written["parquet"] / "train-0.parquet").read_bytes())
    before = loaders.load_dataset(target)
    target.write_bytes((written["parquet"] / "train-1.parquet").read_bytes())
    after = loaders.load_dataset(target)
    assert list(before["image"][[0]]) != list(after["image"][[0]])


def test_raw_arrayrecord_records_are_one_bytes_field(tmp_path):
    from format_files import write_arrayrecord

    write_arrayrecord(tmp_path / "raw.array_record", [b"\x00raw-a", b"\x00raw-bb"])
    ds = loaders.load_dataset(tmp_path)
    assert list(ds) == ["record"] and ds["record"][1] == b"\x00raw-bb"


def test_an_unknown_directory_names_the_formats_and_what_it_holds(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(FileNotFoundError, match=r"holds no dataset.*TFRecord.*Parquet.*notes\.txt"):
        loaders.make("numpy", dataset=tmp_path)


@pytest.mark.parametrize("file_format", ["tfrecord", "array_record"])
def test_a_prepared_tfds_directory(want, file_format):
    from jaxfeed.loaders.backends.tfds_store import store  # tfds's own writer, offline

    png, labels = want["train"]
    prepared = store(
        loaders.ArrayDataset("pets/train", {"image": png, "label": labels}), file_format
    )
    ds = loaders.load_dataset(prepared.parent)  # <name>/: its newest version
    assert ds.name == f"{prepared.parent.name}/train"
    assert list(ds["image"][np.arange(len(ds))]) == png
    np.testing.assert_array_equal(ds["label"], labels)
    with pytest.raises(MissingSplitError, match=r"has no 'test' split: its TFDS splits are"):
        loaders.load_dataset(prepared, "test")


@pytest.mark.parametrize(
    ("column", "kind", "named"),
    [
        ("box", "list", r"row 500 of the file holds a null in its list"),
        ("label", "scalar", r"row 1100 of the file is null"),  # in the file's second batch
    ],
)
def test_a_null_names_its_row_in_its_file(tmp_path, column, kind, named):
    import pyarrow as pa
    from pyarrow import parquet

    boxes, labels = [[1.0, 2.0, 3.0]] * 2000, list(range(2000))
    if kind == "list":
        boxes[500] = [1.0, None, 3.0]  # the 1502nd of the file's values
    else:
        labels[1100] = None
    for name, rows in (("a", slice(0, 10)), ("b", slice(None))):  # a.parquet: 10 whole rows
        columns = {"box": pa.array(boxes[rows], pa.list_(pa.float32())), "label": labels[rows]}
        parquet.write_table(pa.table(columns), tmp_path / f"{name}.parquet")
    with pytest.raises(ValueError, match=rf"b\.parquet, column '{column}', {named}: every field"):
        loaders.load_dataset(tmp_path)

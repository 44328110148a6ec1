"""A column whose type differs between a split's files is read exactly, in one
type that holds every file's values, or refused naming both files and both
types: never served in the first file's type, wrapped or truncated (it was:
``row 50 served -56, file holds 200``)."""

import struct

import numpy as np
import pytest
from jaxfeed.loaders.data.formats.columns import ColumnWriter, RowError, common_dtype
from jaxfeed.loaders.data.formats.example import serialize_example
from jaxfeed.loaders.data.formats.tfrecord import masked_crc32c

from jaxfeed import loaders

KINDS = ("parquet", "arrow")
# (shard 0's type, shard 1's, the type both are read in, shard 1's first value)
WIDENED = [
    ("int8", "int64", "int64", 200),
    ("uint8", "int16", "int16", -50),
    ("float16", "float64", "float64", 5000),
    ("int64", "int8", "int64", 50),
]
REFUSED = [
    ("int8", "float32"),
    ("uint8", "float32"),
    ("int64", "float64"),
    ("bool", "int64"),
    ("int64", "string"),
    ("uint64", "int8"),  # their common type is float64
]


def _write(directory, kind: str, columns: list[dict]) -> None:
    """One shard per ``columns`` entry (name -> pyarrow array), in order."""
    import pyarrow as pa
    from pyarrow import feather, parquet

    directory.mkdir(exist_ok=True)
    for shard, table in enumerate(pa.table(c) for c in columns):
        path = directory / f"train-{shard:05d}.{kind}"
        if kind == "parquet":
            parquet.write_table(table, path)
        else:
            feather.write_feather(table, path, compression="uncompressed")


def _shards(kind: str, tmp_path, first: str, second: str, start: int = 50):
    """Shard 0 holds ``0..49`` as ``first``, shard 1 ``start..start+49`` as ``second``."""
    import pyarrow as pa

    values = [np.arange(50), np.arange(start, start + 50)]
    if first == "bool":
        values[0] %= 2
    columns = [{"x": pa.array(v).cast(t)} for v, t in zip(values, (first, second), strict=True)]
    _write(tmp_path / kind, kind, columns)
    return tmp_path / kind


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("first", "second", "common", "start"), WIDENED)
def test_types_that_widen_are_read_exactly(tmp_path, kind, first, second, common, start):
    directory = _shards(kind, tmp_path, first, second, start)
    x = np.asarray(loaders.load_dataset(directory)["x"])
    # Row 50 holds 200, not -56 (int8); 5001.0, not 5000.0 (float16).
    np.testing.assert_array_equal(x, np.r_[0:50, start : start + 50])
    without_x64 = {"int64": "int32", "float64": "float32"}  # JAX's dtypes
    assert x.dtype == without_x64.get(common, common)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("first", "second"), REFUSED)
def test_types_no_one_type_holds_are_refused_naming_both_files(tmp_path, kind, first, second):
    directory = _shards(kind, tmp_path, first, second)
    with pytest.raises(
        ValueError,
        match=rf"column 'x' is {second} in \S*train-00001\.{kind} but {first} in "
        rf"\S*train-00000\.{kind}: no one type holds both exactly.*cast the files to one type",
    ):
        loaders.load_dataset(directory)


def test_list_columns_widen_by_their_values(tmp_path):
    import pyarrow as pa

    shards = [
        {"box": pa.array([[1, 2], [3, 4]], pa.list_(pa.int8()))},
        {"box": pa.array([[300, 400]], pa.list_(pa.int32()))},
    ]
    _write(tmp_path / "lists", "parquet", shards)
    box = loaders.load_dataset(tmp_path / "lists")["box"]
    np.testing.assert_array_equal(box, [[1, 2], [3, 4], [300, 400]])


@pytest.mark.parametrize("backend", ["numpy", "hf"])
def test_arrow_files_whose_types_widen_are_served_exactly_by_every_reader(tmp_path, backend):
    """Arrow files are read in place where they can be; those whose types
    differ are copied (widened), hf's own reader of the files included."""
    import pyarrow as pa

    shards = [
        {"x": pa.array([0.5, 1.5], pa.float32()), "label": pa.array([1, 2], pa.int8())},
        {"x": pa.array([2.5, 3.5], pa.float32()), "label": pa.array([300, 400], pa.int64())},
    ]
    _write(tmp_path / "arrow", "arrow", shards)
    source = loaders.make(backend, dataset=tmp_path / "arrow", batch_size=4, shuffle=False)
    (batch,) = list(source.iter_epoch(0))
    np.testing.assert_array_equal(batch["label"], [1, 2, 300, 400])
    np.testing.assert_array_equal(batch["x"], [0.5, 1.5, 2.5, 3.5])


def test_the_copy_refuses_a_later_batch_its_dtype_does_not_hold(tmp_path):
    assert common_dtype("uint8", "int8") == np.int16
    assert common_dtype("int64", "float64") is None and common_dtype("bool", "int8") is None
    writer = ColumnWriter(tmp_path)
    writer.add({"x": np.arange(3, dtype=np.int64)})
    writer.add({"x": np.arange(3, dtype=np.int8)})  # held exactly
    with pytest.raises(RowError, match=r"field 'x' holds float32 where earlier rows hold int64"):
        writer.add({"x": np.arange(3, dtype=np.float32)})
    writer.close()


def _tfrecord(path, records: list[bytes]) -> None:
    with open(path, "wb") as file:
        for data in records:
            length = struct.pack("<Q", len(data))
            file.write(length + struct.pack("<I", masked_crc32c(length)))
            file.write(data + struct.pack("<I", masked_crc32c(data)))


@pytest.mark.parametrize("kind", ["tfrecord", "array_record"])
def test_an_example_feature_of_another_kind_in_a_later_shard_is_refused(tmp_path, kind):
    """Example features are int64 or float32 only, and a shard whose feature
    is of the other kind is refused naming its file and record."""
    from format_files import write_arrayrecord

    write = _tfrecord if kind == "tfrecord" else write_arrayrecord
    write(tmp_path / f"train-0.{kind}", [serialize_example({"x": np.array([1], np.int64)})])
    write(tmp_path / f"train-1.{kind}", [serialize_example({"x": np.array([0.5], np.float32)})])
    with pytest.raises(
        ValueError,
        match=rf"train-1\.{kind}, record 0: feature 'x' holds float values where the first "
        "record holds int64: jaxfeed reads a feature as one kind",
    ):
        np.asarray(loaders.load_dataset(tmp_path)["x"])

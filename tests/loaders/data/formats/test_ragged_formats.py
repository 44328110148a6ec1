"""Rows of different lengths from the user's files (issue 43, item 1): a
Parquet or Arrow list column, a variable-length Example feature (TFRecord,
ArrayRecord), a tokenized HF ``Sequence`` and a ``.npy`` values/offsets pair
each load as a `RaggedField` and batch as the same rows given in memory."""

import numpy as np
import pytest
from format_files import write_arrayrecord, write_tfrecord
from jaxfeed.loaders._io.mapped_files import memmap_of
from jaxfeed.loaders.data.cache import fingerprint
from jaxfeed.loaders.ragged_field import RaggedField

from jaxfeed import loaders

FORMATS = ("parquet", "arrow", "tfrecord", "arrayrecord", "hf", "npy-offsets", "npy-lengths")


def _rows() -> list[np.ndarray]:
    """40 rows of token ids of 1 to 40 values, some past one varint byte."""
    rng = np.random.default_rng(43)
    return [rng.integers(0, 50_000, int(n)).astype(np.int32) for n in rng.integers(1, 41, 40)]


def _example(ids: np.ndarray) -> bytes:
    import tensorflow as tf

    feature = tf.train.Feature(int64_list=tf.train.Int64List(value=ids.tolist()))
    return tf.train.Example(features=tf.train.Features(feature={"ids": feature}))


def _write(kind: str, root, rows: list[np.ndarray]):
    """``rows`` as one field ``ids`` in the format ``kind``, under ``root``."""
    import pyarrow as pa

    root.mkdir()
    lists = [row.tolist() for row in rows]
    if kind == "parquet":
        from pyarrow import parquet

        table = pa.table({"ids": pa.array(lists, pa.list_(pa.int32()))})
        parquet.write_table(table, root / "train.parquet", row_group_size=16)
    elif kind == "arrow":  # large_list, in record batches of 7 rows
        table = pa.table({"ids": pa.array(lists, pa.large_list(pa.int64()))})
        with pa.ipc.new_file(str(root / "train.arrow"), table.schema) as writer:
            writer.write_table(table, max_chunksize=7)
    elif kind in ("tfrecord", "arrayrecord"):
        examples = [_example(row).SerializeToString() for row in rows]
        if kind == "tfrecord":
            write_tfrecord(root / "train.tfrecord", examples)
        else:
            write_arrayrecord(root / "train.array_record", examples)
    elif kind == "hf":
        import datasets

        features = datasets.Features({"ids": datasets.Sequence(datasets.Value("int32"))})
        datasets.Dataset.from_dict({"ids": lists}, features=features).save_to_disk(root / "hf")
        return root / "hf"
    else:
        field = RaggedField.from_rows(rows)
        np.save(root / "ids.values.npy", field.values)
        bound = "offsets" if kind == "npy-offsets" else "lengths"
        np.save(root / f"ids.{bound}.npy", getattr(field, bound))
    return root


def _batches(dataset, backend: str = "numpy", **layout) -> list[dict]:
    source = loaders.make(backend, dataset=dataset, batch_size=4, seed=5, **layout)
    return [list(source.iter_epoch(epoch)) for epoch in (0, 1)]


def _assert_same(got: list, want: list) -> None:
    for got_epoch, want_epoch in zip(got, want, strict=True):
        assert len(got_epoch) == len(want_epoch)
        for a, b in zip(got_epoch, want_epoch, strict=True):
            assert a.keys() == b.keys()
            for key in a:
                assert a[key].dtype == b[key].dtype, key
                np.testing.assert_array_equal(a[key], b[key], err_msg=key)


@pytest.mark.parametrize("kind", FORMATS)
def test_each_format_loads_a_ragged_field_batched_as_the_rows_in_memory(tmp_path, kind):
    rows = _rows()
    path = _write(kind, tmp_path / kind, rows)
    field = loaders.load_dataset(path).with_fields()["ids"]  # ArrayRecord: made from row 0
    assert isinstance(field, RaggedField) and field.dtype == np.int32
    np.testing.assert_array_equal(field.lengths, [len(row) for row in rows])
    np.testing.assert_array_equal(field.values, np.concatenate(rows))
    for layout in ({"pack": 64}, {"pad": 40}):
        _assert_same(_batches(path, **layout), _batches({"ids": rows}, **layout))


@pytest.mark.parametrize("backend", ["numpy", "torch", "grain", "hf", "tf"])
def test_every_backend_reads_a_tokenized_hf_directory_alike(tmp_path, backend):
    rows = _rows()
    path = _write("hf", tmp_path / "hf", rows)
    _assert_same(_batches(path, backend, pack=64), _batches({"ids": rows}, pack=64))


def test_an_npy_pair_is_read_in_place_and_a_bad_pair_is_named(tmp_path):
    path = _write("npy-offsets", tmp_path / "npy", _rows())
    np.save(path / "label.npy", np.arange(40, dtype=np.int32))
    dataset = loaders.load_dataset(path)
    assert list(dataset) == ["ids", "label"]
    assert memmap_of(dataset["ids"].values) is not None  # not a copy in memory
    (path / "ids.offsets.npy").rename(path / "ids.lengths.npy")
    np.save(path / "ids.offsets.npy", dataset["ids"].offsets)
    with pytest.raises(ValueError, match=r"ids\.lengths\.npy, ids\.offsets\.npy, ids\.values\.npy"):
        loaders.load_dataset(path)
    (path / "ids.lengths.npy").unlink()
    np.save(path / "ids.values.npy", np.concatenate(_rows()).astype(">i4"))
    with pytest.raises(ValueError, match=r"ids\.values\.npy, which is read in place; rewrite"):
        loaders.load_dataset(path)


def test_64_bit_ids_that_do_not_fit_32_bits_are_refused_by_field(tmp_path):
    rows = [np.array([1, 2, 3]), np.array([2**40])]
    write_tfrecord(tmp_path / "big.tfrecord", [_example(r).SerializeToString() for r in rows])
    with pytest.raises(ValueError, match=r"field 'ids' holds 1\.\.1099511627776, which does not"):
        loaders.load_dataset(tmp_path / "big.tfrecord")


def test_list_columns_nulls_frames_and_nested_lists(tmp_path):
    import pyarrow as pa
    from pyarrow import parquet

    lists = [[1.0, 2.0]] * 30 + [[1.0]] * 30
    lists[45] = [1.0, None]
    parquet.write_table(
        pa.table({"x": pa.array(lists, pa.list_(pa.float32()))}), tmp_path / "a.parquet"
    )
    with pytest.raises(
        ValueError, match=r"a\.parquet, column 'x', row 45 of the file holds a null"
    ):
        loaders.load_dataset(tmp_path / "a.parquet")
    frames = [np.arange(2 * n, dtype=np.float32).reshape(n, 2).tolist() for n in (1, 3, 2)]
    kind = pa.list_(pa.list_(pa.float32(), 2))
    parquet.write_table(pa.table({"f": pa.array(frames, kind)}), tmp_path / "f.parquet")
    field = loaders.load_dataset(tmp_path / "f.parquet")["f"]
    assert field.frame_shape == (2,)
    np.testing.assert_array_equal(field[1], frames[1])
    nested = pa.array([[[1], [2, 3]], [[4]]], pa.list_(pa.list_(pa.int32())))
    parquet.write_table(pa.table({"n": nested}), tmp_path / "n.parquet")
    with pytest.raises(ValueError, match=r"n\.parquet, column 'n' is a list of list<"):
        loaders.load_dataset(tmp_path / "n.parquet")


@pytest.mark.parametrize("backend", ["numpy", "grain"])  # grain: read in place, the Examples
def test_arrayrecord_made_from_row_0_names_the_ragged_field_without_a_layout(tmp_path, backend):
    path = _write("arrayrecord", tmp_path / "records", _rows())
    with pytest.raises(ValueError, match=r"field\(s\) \['ids'\] hold rows of different lengths"):
        next(iter(loaders.make(backend, dataset=path, batch_size=4)))


def test_fingerprint_covers_a_ragged_fields_values_and_offsets(tmp_path):
    rows = _rows()
    path = _write("npy-offsets", tmp_path / "npy", rows)

    def key():
        return fingerprint(*loaders.load_dataset(path).content())

    before = key()
    offsets = np.load(path / "ids.offsets.npy")
    offsets[1] += 1  # the same values, split otherwise
    np.save(path / "ids.offsets.npy", offsets)
    moved = key()
    values = np.load(path / "ids.values.npy")
    values[-1] += 1
    np.save(path / "ids.values.npy", values)
    assert len({before, moved, key()}) == 3


@pytest.mark.parametrize("to", ["parquet", "arrayrecord", "npy"])
def test_convert_writes_a_ragged_field_that_reads_back_equal(tmp_path, to):
    from jaxfeed.loaders.data.formats.convert import convert

    rows = _rows()
    source = _write("npy-lengths", tmp_path / "source", rows)
    convert(source, tmp_path / "out", to, rows_per_shard=15)
    field = loaders.load_dataset(tmp_path / "out").with_fields()["ids"]
    np.testing.assert_array_equal(field.lengths, [len(row) for row in rows])
    np.testing.assert_array_equal(field.values, np.concatenate(rows))
    if to == "npy":
        assert memmap_of(loaders.load_dataset(tmp_path / "out")["ids"].values) is not None


def test_convert_refuses_frames_as_examples_by_name(tmp_path):
    from jaxfeed.loaders.data.formats.convert import convert

    (tmp_path / "source").mkdir()
    np.save(tmp_path / "source" / "boxes.values.npy", np.zeros((6, 4), np.float32))
    np.save(tmp_path / "source" / "boxes.lengths.npy", np.array([1, 2, 3]))
    with pytest.raises(ValueError, match=r"field\(s\) \['boxes'\] hold rows of frames"):
        convert(tmp_path / "source", tmp_path / "out", "arrayrecord")

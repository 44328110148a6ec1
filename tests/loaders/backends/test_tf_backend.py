"""Quirks of the tf backend: the TFDS cache, tf.data order, no GPU for TF."""

import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from backend_helpers import indexed_dataset
from jaxfeed.loaders.backends import tf as tf_backend
from jaxfeed.loaders.backends import tfds_store

from jaxfeed import loaders

BATCH = 512  # 8 batches of mnist-sample/train, the last one padded


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXFEED_CACHE_DIR", str(tmp_path))
    return tmp_path


def _no_build(*args, **kwargs):
    raise AssertionError("the TFDS dataset was rebuilt instead of reused")


def test_cache_is_a_real_tfds_dataset_built_once(empty_cache, monkeypatch):
    source = loaders.make("tf", dataset="mnist-sample", split="test", batch_size=BATCH)
    builder_dir = source.builder_dir
    assert builder_dir.is_relative_to(empty_cache / "tfds")
    info_file = builder_dir / "dataset_info.json"
    stamp = info_file.stat().st_mtime_ns

    builder = tfds.builder_from_directory(builder_dir)
    assert builder.info.splits["test"].num_examples == 1000
    assert builder.info.file_format.value == "tfrecord"
    # Plain tfds.load finds it too: a real TFDS dataset, not files of our own.
    data_dir = builder_dir.parents[1]
    ds = tfds.load(tfds_store.TFDS_NAME, split="test", data_dir=data_dir, download=False)
    first = next(iter(tfds.as_numpy(ds)))
    np.testing.assert_array_equal(first["image"], source.dataset["image"][0])

    monkeypatch.setattr(tfds.dataset_builders, "store_as_tfds_dataset", _no_build)
    again = loaders.make("tf", dataset="mnist-sample", split="test", batch_size=BATCH)
    assert again.builder_dir == builder_dir and info_file.stat().st_mtime_ns == stamp
    assert sorted(p.name for p in (empty_cache / "tfds").iterdir()) == [builder_dir.parents[1].name]


def test_other_data_gets_its_own_cache(empty_cache):
    a = tfds_store.store(indexed_dataset(100))
    b = tfds_store.store(indexed_dataset(101))
    assert a != b and a.parents[1].name.startswith("indexed-train-tfrecord-")


@pytest.mark.parametrize("drop_remainder", [False, True])
def test_matches_numpy_backend(drop_remainder):
    options = dict(dataset="mnist-sample", batch_size=BATCH, seed=5, drop_remainder=drop_remainder)
    numpy_source, tf_source = loaders.make("numpy", **options), loaders.make("tf", **options)
    for epoch in range(2):
        want = list(numpy_source.iter_epoch(epoch))
        got = list(tf_source.iter_epoch(epoch))
        assert len(got) == len(want) == (7 if drop_remainder else 8)
        for g, w in zip(got, want, strict=True):
            assert g.keys() == w.keys()
            for key in w:
                assert type(g[key]) is np.ndarray and g[key].dtype == w[key].dtype
                np.testing.assert_array_equal(g[key], w[key])
    resumed = list(tf_source.iter_epoch(1, start=6))
    np.testing.assert_array_equal(resumed[0]["image"], want[6]["image"])
    assert list(tf_source.iter_epoch(1, start=tf_source.num_batches)) == []


def test_pipeline_is_built_once_and_epochs_can_interleave(monkeypatch):
    built = []
    pipeline = tf_backend._Pipeline

    def counting(*args, **kwargs):
        built.append(pipeline(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(tf_backend, "_Pipeline", counting)
    options = dict(dataset="mnist-sample", batch_size=BATCH, seed=4)
    source, reference = loaders.make("tf", **options), loaders.make("numpy", **options)
    for epoch in range(3):
        for got, want in zip(source.iter_epoch(epoch), reference.iter_epoch(epoch), strict=True):
            np.testing.assert_array_equal(got["image"], want["image"])
    assert len(built) == 1  # later epochs reuse the pipeline and its traced map function
    # Two epochs read at once each get a pipeline, so neither sees the other's order.
    pairs = zip(
        source.iter_epoch(0),
        source.iter_epoch(1),
        reference.iter_epoch(0),
        reference.iter_epoch(1),
        strict=True,
    )
    for got0, got1, want0, want1 in pairs:
        np.testing.assert_array_equal(got0["label"], want0["label"])
        np.testing.assert_array_equal(got1["label"], want1["label"])
    assert len(built) == 2


def test_tensorflow_sees_no_gpu():
    loaders.make("tf", dataset="mnist-sample", batch_size=BATCH)
    assert tf.config.get_visible_devices("GPU") == []
    assert os.environ.get("TF_CPP_MIN_LOG_LEVEL")


def test_options_are_checked():
    with pytest.raises(
        TypeError,
        match=r"unknown option\(s\) \['num_threads'\]; it takes \['order', 'num_workers'\]",
    ):
        loaders.make("tf", dataset="mnist-sample", num_threads=2)
    with pytest.raises(ValueError, match="order must be one of"):
        loaders.make("tf", dataset="mnist-sample", order="random")


def test_a_nan_in_a_float_field_is_data_not_a_stale_cache():
    # NaN != NaN: the cache check once took every dataset holding one for another's.
    x = np.arange(40, dtype=np.float32).reshape(20, 2)
    x[3, 1] = np.nan
    data = {"x": x, "label": np.arange(20, dtype=np.int32)}
    source = loaders.make("tf", dataset=data, batch_size=8, shuffle=False)
    got = np.concatenate([b["x"][b["mask"]] for b in source.iter_epoch(0)])
    np.testing.assert_array_equal(got, x)  # (NaN where NaN was)

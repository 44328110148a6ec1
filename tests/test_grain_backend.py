"""Quirks of the Grain backend (the shared contract suite covers the rest)."""

import numpy as np
import pytest
from backend_helpers import assert_same_batches, indexed_dataset, valid_labels

import loaders
from loaders import grain_backend
from loaders.cache import cache_root
from loaders.datasets import ArrayDataset
from loaders.sampler import Sampler


def _native(data: ArrayDataset, **sampler_args) -> grain_backend.GrainSource:
    sampler = Sampler(num_examples=len(data), **sampler_args)
    return grain_backend.build(data, sampler, order="native")


@pytest.mark.slow
def test_worker_processes_match_in_process_and_numpy_after_jax_runs():
    import jax

    jax.numpy.ones(3).block_until_ready()  # spawned workers must not hang on jax's threads
    args = dict(dataset="mnist-sample", batch_size=384, seed=7)  # 4000 % 384 != 0: a padded batch
    numpy_source = loaders.make("numpy", **args)
    in_process = loaders.make("grain", **args)
    workers = loaders.make("grain", num_workers=2, **args)
    for epoch in (0, 1):
        expected = list(numpy_source.iter_epoch(epoch))
        assert_same_batches(list(workers.iter_epoch(epoch)), expected)
        assert_same_batches(list(in_process.iter_epoch(epoch)), expected)


def test_sampler_order_reads_whole_batches(monkeypatch):
    calls = []
    read_batch = grain_backend.ArraySource.read_batch

    def counting(self, indices):
        calls.append(len(indices))
        return read_batch(self, indices)

    def per_record(self, index):
        raise AssertionError("the batched path must not read single records")

    monkeypatch.setattr(grain_backend.ArraySource, "read_batch", counting)
    monkeypatch.setattr(grain_backend.ArraySource, "__getitem__", per_record)
    source = loaders.make("grain", dataset="mnist-sample", split="test", batch_size=96)
    batches = list(source.iter_epoch(0, start=2))
    assert len(batches) == source.num_batches - 2
    assert calls == [96] * len(batches)  # one gather per batch, full static shape


def test_native_order_is_seeded_reshuffled_and_covers_each_sample_once():
    data = indexed_dataset()
    first = valid_labels(_native(data, batch_size=32, seed=5), 0)
    assert np.array_equal(first, valid_labels(_native(data, batch_size=32, seed=5), 0))
    assert np.array_equal(np.sort(first), np.arange(len(data)))
    second = valid_labels(_native(data, batch_size=32, seed=5), 1)
    assert np.array_equal(np.sort(second), np.arange(len(data)))
    assert not np.array_equal(first, second)
    assert not np.array_equal(first, valid_labels(_native(data, batch_size=32, seed=6), 0))
    assert not np.array_equal(first, np.arange(len(data)))


@pytest.mark.parametrize("drop_remainder", [False, True])
def test_native_order_shards_over_processes(drop_remainder):
    data = indexed_dataset(301)  # shards of 101, 100, 100 rows
    shards = [
        _native(
            data, batch_size=16, process_index=p, process_count=3, drop_remainder=drop_remainder
        )
        for p in range(3)
    ]
    seen = np.concatenate([valid_labels(s, 0) for s in shards])  # equal batch counts asserted
    assert len(seen) == len(set(seen.tolist()))
    if drop_remainder:
        assert len(seen) == shards[0].num_batches * 16 * 3
    else:
        assert np.array_equal(np.sort(seen), np.arange(len(data)))


@pytest.mark.slow
def test_tfds_array_record_source_matches_numpy_and_is_built_once(monkeypatch):
    args = dict(dataset="mnist-sample", split="test", batch_size=128, seed=1)
    source = loaders.make("grain", source="tfds", **args)
    assert_same_batches(
        list(source.iter_epoch(1)), list(loaders.make("numpy", **args).iter_epoch(1))
    )
    root = cache_root() / "tfds-array_record"
    assert [p.name for p in root.iterdir() if p.name.startswith(".build-")] == []

    import tensorflow_datasets as tfds

    def no_rebuild(*args, **kwargs):
        raise AssertionError("the TFDS dataset was rebuilt")

    monkeypatch.setattr(tfds.dataset_builders, "store_as_tfds_dataset", no_rebuild)
    assert len(loaders.make("grain", source="tfds", **args).records) == 1000


def test_options_are_checked():
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['nmu_workers'\]"):
        loaders.make("grain", dataset="mnist-sample", nmu_workers=2)
    with pytest.raises(ValueError, match="source must be one of"):
        loaders.make("grain", dataset="mnist-sample", source="parquet")
    with pytest.raises(ValueError, match="num_workers must be an int >= 0, got -1"):
        loaders.make("grain", dataset="mnist-sample", num_workers=-1)

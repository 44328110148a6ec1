"""Quirks of the Grain backend (the shared contract suite covers the rest)."""

import pytest
from backend_helpers import assert_same_batches

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

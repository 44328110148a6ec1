"""Quirks of the Grain backend (the shared contract suite covers the rest)."""

import itertools
import multiprocessing
import re
import subprocess
import sys
from pathlib import Path

import pytest
from backend_helpers import assert_same_batches
from jaxfeed.loaders.backends import grain as grain_backend
from jaxfeed.loaders.backends import tfds_store
from jaxfeed.loaders.data.cache import cache_root
from jaxfeed.loaders.data.catalog import ArrayDataset
from jaxfeed.loaders.rows import ArrayRows
from jaxfeed.loaders.sampler import Sampler

from jaxfeed import loaders

# 4000 % 384 != 0: every epoch ends with a padded batch.
PADDED = dict(dataset="mnist-sample", batch_size=384, seed=7)


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
    read_batch = ArrayRows.read_batch

    def counting(self, indices):
        calls.append(len(indices))
        return read_batch(self, indices)

    def per_record(self, index):
        raise AssertionError("the batched path must not read single records")

    monkeypatch.setattr(ArrayRows, "read_batch", counting)
    monkeypatch.setattr(ArrayRows, "__getitem__", per_record)
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
    root = cache_root() / "tfds"
    entries = sorted(p.name for p in root.iterdir() if "test-array-record" in p.name)
    assert len(entries) == 1 and not entries[0].startswith("."), entries  # no scratch left

    import tensorflow_datasets as tfds

    def no_rebuild(*args, **kwargs):
        raise AssertionError("the TFDS dataset was rebuilt")

    monkeypatch.setattr(tfds.dataset_builders, "store_as_tfds_dataset", no_rebuild)
    assert len(loaders.make("grain", source="tfds", **args).records) == 1000
    built = root / entries[0] / tfds_store.TFDS_NAME / tfds_store.TFDS_VERSION
    assert tfds_store.store(source.dataset, "array_record") == built
    assert sorted(p.name for p in root.iterdir() if "test-array-record" in p.name) == entries


def test_options_are_checked():
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['nmu_workers'\]"):
        loaders.make("grain", dataset="mnist-sample", nmu_workers=2)
    with pytest.raises(ValueError, match="source must be one of"):
        loaders.make("grain", dataset="mnist-sample", source="parquet")
    with pytest.raises(ValueError, match="num_workers must be an int >= 0, got -1"):
        loaders.make("grain", dataset="mnist-sample", num_workers=-1)
    # What `--loader-option num_workers=junk` passes: a string.
    with pytest.raises(
        ValueError, match="the grain option num_workers must be an int >= 0, got 'junk'"
    ):
        loaders.make("grain", dataset="mnist-sample", num_workers="junk")
    with pytest.raises(ValueError, match=re.escape("num_threads must be an int >= 0, got 1.5")):
        loaders.make("grain", dataset="mnist-sample", num_threads=1.5)


def _children() -> set[int]:
    return {p.pid for p in multiprocessing.active_children()}


@pytest.mark.slow
def test_workers_match_numpy_over_consecutive_epochs():
    want = loaders.make("numpy", **PADDED)
    with loaders.make("grain", num_workers=2, **PADDED) as source:
        for epoch in range(3):
            got = list(source.iter_epoch(epoch))
            assert got[-1]["mask"].sum() == 4000 % 384  # the padded last batch
            assert_same_batches(got, list(want.iter_epoch(epoch)))


@pytest.mark.slow
@pytest.mark.parametrize("shuffle", [True, False])
def test_workers_live_across_epochs(shuffle):
    before = _children()
    source = loaders.make("grain", num_workers=2, shuffle=shuffle, **PADDED)
    want = loaders.make("numpy", shuffle=shuffle, **PADDED)
    # Unshuffled, each pass re-reads epoch 0, as evaluating a test split does.
    epochs = [0, 1, 2] if shuffle else [0, 0, 0]
    workers = None
    for epoch in epochs:
        assert_same_batches(list(source.iter_epoch(epoch)), list(want.iter_epoch(epoch)))
        if workers is None:
            workers = _children() - before
            assert len(workers) == 2
        assert _children() - before == workers  # the same processes, none restarted
    source.close()
    assert not workers & _children()


@pytest.mark.slow
def test_partial_epochs_and_jumps_give_exact_batches():
    want = loaders.make("numpy", **PADDED)
    source = loaders.make("grain", num_workers=2, **PADDED)
    first = source.iter_epoch(1)
    got = [next(first) for _ in range(3)]
    first.close()
    got += list(source.iter_epoch(1, start=3))  # resumes where it stopped
    assert_same_batches(got, list(want.iter_epoch(1)))
    assert len(list(itertools.islice(source.iter_epoch(2), 2))) == 2  # abandoned part way
    assert_same_batches(list(source.iter_epoch(0, start=4)), list(want.iter_epoch(0, start=4)))
    assert_same_batches(list(source.iter_epoch(2)), list(want.iter_epoch(2)))
    source.close()
    assert_same_batches(list(source.iter_epoch(3)), list(want.iter_epoch(3)))  # new workers
    source.close()


@pytest.mark.slow
def test_an_epoch_begun_during_another_gets_its_own_workers():
    want = loaders.make("numpy", **PADDED)
    before = _children()
    source = loaders.make("grain", num_workers=2, **PADDED)
    assert_same_batches(list(source.iter_epoch(0)), list(want.iter_epoch(0)))
    workers = _children() - before
    pairs = list(zip(source.iter_epoch(1), source.iter_epoch(2), strict=True))
    assert_same_batches([a for a, _ in pairs], list(want.iter_epoch(1)))
    assert_same_batches([b for _, b in pairs], list(want.iter_epoch(2)))
    # Epoch 1 kept the long-lived workers, which now go on into epoch 2.
    assert_same_batches(list(source.iter_epoch(2)), list(want.iter_epoch(2)))
    assert _children() - before == workers
    source.close()


@pytest.mark.slow
def test_no_shared_memory_leaks_at_exit():
    script = """
import itertools
from jaxfeed import loaders

args = dict(dataset="mnist-sample", batch_size=384, num_workers=2)
source = loaders.make("grain", **args)
for epoch in range(2):
    kept = list(source.iter_epoch(epoch))[0]  # a full (unpadded) batch, held at exit
list(itertools.islice(source.iter_epoch(5), 3))  # leaves the workers reading ahead
native = loaders.make("grain", order="native", **args)
assert len(list(native.iter_epoch(0))) == native.num_batches
print("read")
"""
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=Path(__file__).resolve().parents[3],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0 and result.stdout.strip() == "read", result.stderr
    assert "leaked" not in result.stderr, result.stderr

"""Quirks of the Hugging Face backend (the shared contract suite covers the rest)."""

import datasets
import numpy as np
import pytest
from backend_helpers import assert_same_batches, indexed_dataset, valid_labels
from jaxfeed.loaders.backends import hf as hf_backend
from jaxfeed.loaders.backends import numpy as numpy_backend
from jaxfeed.loaders.data import cache
from jaxfeed.loaders.data.catalog import ArrayDataset
from jaxfeed.loaders.sampler import Sampler

from jaxfeed import loaders


def _native(data: ArrayDataset, **sampler_args) -> hf_backend.HFSource:
    sampler = Sampler(num_examples=len(data), **sampler_args)
    return hf_backend.build(data, sampler, order="native")


def _count_saves(monkeypatch) -> list:
    saves = []
    schema = hf_backend._schema

    def counting(data):
        saves.append(data.name)
        return schema(data)

    monkeypatch.setattr(hf_backend, "_schema", counting)
    return saves


def test_cache_is_an_arrow_file_built_once(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXFEED_CACHE_DIR", str(tmp_path))
    saves = _count_saves(monkeypatch)
    source = loaders.make("hf", dataset="mnist-sample", split="test", batch_size=50)
    assert len(saves) == 1
    assert source.path.parent == tmp_path / "hf"
    assert source.path.name.startswith("mnist-sample-test-")

    stored = datasets.Dataset.from_file(str(source.path / hf_backend.ARROW_FILE))
    assert stored.num_rows == 1000
    assert len(stored.data.table.column("image").chunks) == 1  # one record batch: take() reads rows
    assert stored.features == datasets.Features(
        {
            "image": datasets.Sequence(datasets.Value("uint8"), length=784),
            "label": datasets.Value("int32"),
        }
    )
    data = loaders.load_dataset("mnist-sample", "test")
    rows = stored.with_format("numpy", dtype=np.uint8)[[0, 999]]["image"]
    np.testing.assert_array_equal(rows.reshape(2, 28, 28, 1), data["image"][[0, 999]])

    again = loaders.make("hf", dataset="mnist-sample", split="test", batch_size=50)
    assert again.path == source.path and len(saves) == 1  # reused, not rebuilt
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == [source.path.name]


def test_cache_written_by_another_datasets_version_is_not_reused(tmp_path, monkeypatch):
    # An Arrow copy written by datasets 5.2 broke datasets 3.0 (its features did not load).
    monkeypatch.setenv("JAXFEED_CACHE_DIR", str(tmp_path))
    saves = _count_saves(monkeypatch)
    monkeypatch.setattr(cache, "writer_version", lambda distribution: "5.2.0")
    newer = loaders.make("hf", dataset="mnist-sample", split="test", batch_size=50)
    monkeypatch.setattr(cache, "writer_version", lambda distribution: "3.0.0")
    older = loaders.make("hf", dataset="mnist-sample", split="test", batch_size=50)
    assert len(saves) == 2 and newer.path != older.path  # built again, not reused
    assert "-datasets-5.2.0-" in newer.path.name and "-datasets-3.0.0-" in older.path.name
    again = loaders.make("hf", dataset="mnist-sample", split="test", batch_size=50)
    assert again.path == older.path and len(saves) == 2  # the same version reuses its own


@pytest.mark.parametrize("read", ["take", "getitem"])
def test_batches_match_numpy_for_two_epochs(read):
    args = dict(dataset="mnist-sample", batch_size=384, seed=3)  # 4000 % 384 != 0: padding
    source = loaders.make("hf", read=read, **args)
    reference = loaders.make("numpy", **args)
    for epoch in (0, 1):
        assert_same_batches(list(source.iter_epoch(epoch)), list(reference.iter_epoch(epoch)))


@pytest.mark.parametrize("read", ["take", "getitem"])
@pytest.mark.parametrize("per_call", [1, 3, 4])
@pytest.mark.parametrize("start", [0, 4])
def test_several_batches_per_call_match_numpy(monkeypatch, read, per_call, start):
    data = indexed_dataset()  # 300 rows: 10 batches of 32, the last padded
    row_bytes = data["image"][:1].nbytes + data["label"].itemsize
    monkeypatch.setattr(hf_backend, "BYTES_PER_TAKE", per_call * 32 * row_bytes)
    calls = _count_getitems(monkeypatch)
    sampler = Sampler(num_examples=len(data), batch_size=32, seed=1)
    source = hf_backend.build(data, sampler, read=read)
    reference = numpy_backend.build(data, sampler)
    got = list(source.iter_epoch(1, start=start))
    assert_same_batches(got, list(reference.iter_epoch(1, start=start)))
    if read == "getitem":  # one ds[indices] per call, covering up to per_call batches
        assert calls == [min(per_call, 10 - first) * 32 for first in range(start, 10, per_call)]


def _count_getitems(monkeypatch) -> list[int]:
    """The number of rows asked for by each list-indexed ``ds[...]``."""
    calls = []
    getitem = datasets.Dataset.__getitem__

    def counting(self, key):
        if isinstance(key, np.ndarray):
            calls.append(len(key))
        return getitem(self, key)

    monkeypatch.setattr(datasets.Dataset, "__getitem__", counting)
    return calls


def test_native_order_writes_no_index_files_next_to_the_cache():
    # datasets' shuffle/shard indices mappings stay in memory (keep_in_memory).
    source = _native(indexed_dataset(), batch_size=32, seed=5)
    valid_labels(source, 0)
    assert [p.name for p in source.path.iterdir() if "cache-" in p.name] == []


def test_options_are_checked():
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['prefetch_factor'\]"):
        loaders.make("hf", dataset="mnist-sample", prefetch_factor=2)
    with pytest.raises(ValueError, match="read must be one of"):
        loaders.make("hf", dataset="mnist-sample", read="select")


def test_chunked_arrow_files_read_the_same_rows(monkeypatch, tmp_path):
    # Past 2**31 - 1 values a field is written in several record batches; a take
    # then reads each chunk on its own (a take on the whole table would join them).
    monkeypatch.setenv("JAXFEED_CACHE_DIR", str(tmp_path))  # built here, in chunks
    monkeypatch.setattr(hf_backend, "chunk_rows", lambda data: 70)
    data = indexed_dataset()  # 300 rows: chunks of 70, the last of 20
    sampler = Sampler(num_examples=len(data), batch_size=32, seed=1)
    source = hf_backend.build(data, sampler)
    assert [c.num_rows for c in source._chunks] == [70, 70, 70, 70, 20]
    reference = numpy_backend.build(data, sampler)
    for epoch in (0, 1):
        assert_same_batches(list(source.iter_epoch(epoch)), list(reference.iter_epoch(epoch)))


def _regenerate(directory, seed: int) -> None:
    directory.mkdir(exist_ok=True)
    rng = np.random.default_rng(seed)
    np.save(directory / "x.npy", rng.normal(size=(64, 3)).astype(np.float32))
    np.save(directory / "label.npy", rng.integers(0, 10, 64).astype(np.int32))


def test_copies_of_a_regenerated_dataset_are_pruned_unless_read(tmp_path, monkeypatch):
    # Every regeneration of an on-disk dataset kept a full Arrow copy, for good.
    import gc

    monkeypatch.setenv("JAXFEED_CACHE_DIR", str(tmp_path / "cache"))
    directory = tmp_path / "data"

    def copies():
        return sorted(
            p.name for p in (tmp_path / "cache").rglob("*") if (p / "data.arrow").is_file()
        )

    def make():
        return loaders.make("hf", dataset=directory, batch_size=16, shuffle=False)

    _regenerate(directory, 0)
    reading = make()  # a live reader of the first copy
    first = copies()
    for seed in (1, 2, 3):
        _regenerate(directory, seed)
        make()
    # The first copy is read, so it stays; of the others only the newest is left.
    assert len(first) == 1 and first[0] in copies() and len(copies()) == 2, copies()
    # Its files were rewritten under it: its next epoch is refused by name, as on
    # every backend, not served from the old copy (the backends would disagree).
    with pytest.raises(ValueError, match=r"label\.npy changed after the source was made"):
        next(iter(reading.iter_epoch(0)))
    del reading
    gc.collect()
    _regenerate(directory, 4)
    latest = make()
    assert copies() == [latest.path.name]  # one copy per source
    np.testing.assert_array_equal(
        np.concatenate([b["label"] for b in latest.iter_epoch(0)]),
        np.load(directory / "label.npy"),
    )

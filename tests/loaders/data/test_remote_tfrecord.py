"""A store's TFRecord split bigger than the cache, read in place from an offset
index per object version (loaders/data/ranged_tfrecord.py), against the moto
S3 server of test_object_storage.py on 127.0.0.1: the local copy's batches,
the index built once, a changed object refused, damage and what cannot be
read in place named."""

from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path

import numpy as np
import pytest
from faulty_proxy import FaultyProxy
from jaxfeed.loaders.data.formats.example import serialize_example
from jaxfeed.loaders.data.formats.tfrecord import masked_crc32c
from jaxfeed.loaders.data.ranged_tfrecord import INDEX_DIR, RangedExamples
from test_object_storage import BUCKET, _epochs, _same, store

import jaxfeed

__all__ = ["store"]  # the moto fixture, shared

CACHE_BYTES = 16 << 10  # the split is ~30 KB: each process holds 4 KiB of ~1 KiB blocks
BATCH = 40  # five batches an epoch: each reads most blocks (a full shuffle), so few batches


def _tfrecord(rows: list[bytes]) -> bytes:
    out = []
    for data in rows:
        length = struct.pack("<Q", len(data))
        out += [length, struct.pack("<I", masked_crc32c(length))]
        out += [data, struct.pack("<I", masked_crc32c(data))]
    return b"".join(out)


def _rows(rng: np.random.Generator, count: int, start: int = 0) -> list[bytes]:
    return [
        serialize_example(
            {
                "x": rng.normal(size=16).astype(np.float32),
                "y": np.array([(start + i) % 10]),
                "ids": rng.integers(-(1 << 30), 1 << 20, 3),
            }
        )
        for i in range(count)
    ]


def _put(store, local: Path, prefix: str, shards: dict[str, bytes]) -> str:
    """``shards`` (relative name -> bytes) under ``local`` and ``prefix``; its URL."""
    for name, data in shards.items():
        (local / name).parent.mkdir(parents=True, exist_ok=True)
        (local / name).write_bytes(data)
        store["s3"].put_object(Bucket=BUCKET, Key=f"{prefix}{name}", Body=data)
    return f"s3://{BUCKET}/{prefix}"


@pytest.fixture(scope="module")
def shards(store, tmp_path_factory):
    """Four train shards and a test shard, in the store and on local disk,
    with the cache bound below their size."""
    local = tmp_path_factory.mktemp("tfr")
    rng = np.random.default_rng(2)
    counts = {"train-00000-of-00004": 70, "train-00001-of-00004": 50}
    counts |= {"train-00002-of-00004": 0, "train-00003-of-00004": 80, "test-00000-of-00001": 30}
    made = {f"{n}.tfrecord": _tfrecord(_rows(rng, c)) for n, c in counts.items()}
    url = _put(store, local, "tfr-big/", made)
    with store["env"].context() as env:
        env.setenv("JAXFEED_CACHE_BYTES", str(CACHE_BYTES))
        env.setenv("JAXFEED_CACHE_DIR", str(tmp_path_factory.mktemp("tfr-cache")))
        yield {**store, "tfr": local, "url": url, "env": env, "sizes": sum(map(len, made.values()))}


def _opts(store) -> dict:
    return {"endpoint_url": store["endpoint"]}


def _read_in_place(source, shards) -> None:
    fields = source.dataset.arrays
    assert all(isinstance(f, RangedExamples) for f in fields.values()), fields
    assert list(fields) == ["x", "y", "ids"]
    fetched = list(Path(os.environ["JAXFEED_CACHE_DIR"]).glob("objects/*/*.tfrecord"))
    assert fetched == []  # nothing fetched whole


@pytest.mark.parametrize(
    ("backend", "shuffle"),
    [("numpy", True), ("torch", "blocks"), ("grain", "blocks")],
)
def test_a_tfrecord_split_past_the_cache_is_read_in_place(shards, backend, shuffle):
    kwargs = {"batch_size": BATCH, "shuffle": shuffle}
    local = jaxfeed.make("numpy", dataset=str(shards["tfr"]), **kwargs)
    want = _epochs(local)
    source = jaxfeed.make(backend, dataset=shards["url"], storage_options=_opts(shards), **kwargs)
    try:
        _read_in_place(source, shards)
        assert source.dataset.units == local.dataset.units == (70, 50, 80)
        assert {k: (v.dtype, v.shape) for k, v in source.dataset.arrays.items()} == {
            k: (v.dtype, v.shape) for k, v in local.dataset.arrays.items()
        }
        assert _same(_epochs(source), want)
        resumed = [dict(b) for b in source.iter_epoch(1, start=2)]
        assert _same(resumed, want[len(want) // 2 + 2 :])
        cache = source.dataset.arrays["x"]._shards.cache
        assert 0 < cache.peak_bytes <= cache.max_bytes == CACHE_BYTES // 4, cache.peak_bytes
    finally:
        if hasattr(source, "close"):
            source.close()
    test = jaxfeed.load_dataset(shards["url"], "test", storage_options=_opts(shards))
    assert np.array_equal(test["x"][:], jaxfeed.load_dataset(str(shards["tfr"]), "test")["x"])


@pytest.mark.slow  # two worker processes
def test_torch_workers_read_tfrecord_in_place(shards):
    """Two torch workers, each opening the store itself and loading the index
    by its path, read the local copy's batches, and resume at batch 2."""
    kwargs = {"batch_size": BATCH, "shuffle": True}
    want = _epochs(jaxfeed.make("numpy", dataset=str(shards["tfr"]), **kwargs))
    source = jaxfeed.make(
        "torch", dataset=shards["url"], storage_options=_opts(shards), num_workers=2, **kwargs
    )
    try:
        _read_in_place(source, shards)
        assert _same(_epochs(source), want)
        resumed = [dict(b) for b in source.iter_epoch(1, start=2)]
        assert _same(resumed, want[len(want) // 2 + 2 :])
    finally:
        source.close()


def test_the_index_is_built_once_per_object_version(shards, tmp_path):
    """From a fresh cache the first make reads every object's bytes once (the
    index); a second make reads none of them again: the listing, and row 0's
    block (each field's first row)."""
    port = int(shards["endpoint"].rsplit(":", 1)[1])
    shards["env"].setenv("JAXFEED_CACHE_DIR", str(tmp_path))
    kwargs = {"batch_size": BATCH}
    with FaultyProxy(port, faults=()) as proxy:
        options = {"client_kwargs": {"endpoint_url": proxy.url}}
        jaxfeed.make("numpy", dataset=shards["url"], storage_options=options, **kwargs)
        first = proxy.stats()
        again = jaxfeed.make("numpy", dataset=shards["url"], storage_options=options, **kwargs)
        second = proxy.stats()
    train = shards["sizes"] * 200 / 230  # the train shards' bytes, about
    assert first["sent"] >= train, first
    assert second["sent"] - first["sent"] < train / 8, (first, second)
    assert second["requests"] - first["requests"] <= 4, (first, second)  # listing, row 0
    assert isinstance(again.dataset.arrays["x"], RangedExamples)
    assert len(list((tmp_path / INDEX_DIR).iterdir())) == 4  # one per train object


def test_a_changed_object_gets_a_new_index_and_is_refused_at_the_next_epoch(shards, tmp_path):
    rng = np.random.default_rng(3)
    rows = _rows(rng, 200)
    url = _put(shards, tmp_path, "tfr-changing/", {"train-0.tfrecord": _tfrecord(rows)})
    source = jaxfeed.make("numpy", dataset=url, storage_options=_opts(shards), batch_size=BATCH)
    indexes = Path(os.environ["JAXFEED_CACHE_DIR"]) / INDEX_DIR
    before = set(indexes.iterdir())
    epoch = source.iter_epoch(0)
    next(epoch)
    changed = _tfrecord(_rows(rng, 200))
    shards["s3"].put_object(Bucket=BUCKET, Key="tfr-changing/train-0.tfrecord", Body=changed)
    with pytest.raises(
        ValueError, match=r"tfr-changing/train-0\.tfrecord changed after the source"
    ):
        next(source.iter_epoch(1))
    again = jaxfeed.make("numpy", dataset=url, storage_options=_opts(shards), batch_size=BATCH)
    assert len(set(indexes.iterdir()) - before) == 1  # its identity differs: a new index
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "train-0.tfrecord").write_bytes(changed)
    want = _epochs(jaxfeed.make("numpy", dataset=str(tmp_path / "new"), batch_size=BATCH))
    assert _same(_epochs(again), want)


def test_a_damaged_length_names_the_object_and_its_byte(shards, tmp_path):
    data = bytearray(_tfrecord(_rows(np.random.default_rng(4), 400)))
    length = struct.unpack_from("<Q", data)[0]
    at = 5 * (length + 16)  # record 5's frame (the records are of one length)
    data[at + 8] ^= 0xFF  # its length's CRC
    url = _put(shards, tmp_path, "tfr-damaged/", {"train-0.tfrecord": bytes(data)})
    shards["env"].setenv("JAXFEED_READ", "ranges")
    try:
        with pytest.raises(
            ValueError,
            match=rf"tfr-damaged/train-0\.tfrecord, record 5: its length header is damaged "
            rf"\(at byte {at}\)",
        ):
            jaxfeed.load_dataset(url, storage_options=_opts(shards))
    finally:
        shards["env"].delenv("JAXFEED_READ")


@pytest.mark.parametrize("kind", ["gzip", "bytes"])
def test_what_is_not_read_in_place_is_named_under_ranges_and_fetched_under_auto(
    shards, tmp_path, kind
):
    rows = _rows(np.random.default_rng(5), 400)
    data = _tfrecord(rows)
    if kind == "gzip":
        data, why = gzip.compress(data), "it is gzip-compressed"
    else:
        data = _tfrecord([serialize_example({"png": b"\x89PNG" * i}) for i in range(1, 400)])
        why = "its feature 'png' holds bytes"
    url = _put(shards, tmp_path, f"tfr-{kind}/", {"train-0.tfrecord": data})
    shards["env"].setenv("JAXFEED_READ", "ranges")
    try:
        with pytest.raises(ValueError, match=rf"train-0\.tfrecord: {why}.*JAXFEED_READ=whole"):
            jaxfeed.load_dataset(url, storage_options=_opts(shards))
    finally:
        shards["env"].delenv("JAXFEED_READ")
    with pytest.raises(ValueError, match=r"more than its bound"):  # auto: the whole fetch
        jaxfeed.load_dataset(url, storage_options=_opts(shards))
    shards["env"].setenv("JAXFEED_CACHE_BYTES", str(1 << 30))
    try:
        whole = jaxfeed.load_dataset(url, storage_options=_opts(shards))
    finally:
        shards["env"].setenv("JAXFEED_CACHE_BYTES", str(CACHE_BYTES))
    assert not any(isinstance(f, RangedExamples) for f in whole.arrays.values())

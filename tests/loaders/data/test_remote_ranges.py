"""A store's ``.npy`` split bigger than the cache, read in place by ranged
reads (loaders/data/ranged_npy.py), against the moto S3 server of
test_object_storage.py on 127.0.0.1: the local copy's batches, the block
cache within its bound, short reads retried and a changed object refused."""

from __future__ import annotations

import io
import itertools
import os
from pathlib import Path

import numpy as np
import pytest
from faulty_proxy import FaultyProxy
from jaxfeed.loaders.data.ranged_npy import RangedNpy
from test_object_storage import (
    BUCKET,
    NO_BOTOCORE_RETRIES,
    _epochs,
    _same,
    _through,
    _torch_workers_read_as,
    store,
)

import jaxfeed

__all__ = ["store"]  # the moto fixture, shared

CACHE_BYTES = 1 << 20  # the split is 3 MiB: each process holds 256 KiB of 60 KiB blocks


@pytest.fixture(scope="module")
def big(store, tmp_path_factory):
    """A 3 MiB ``.npy`` split in the store and on local disk; the cache bound at 1 MiB."""
    local = tmp_path_factory.mktemp("big")
    rng = np.random.default_rng(1)
    arrays = {
        "x": rng.normal(size=(256, 3072)).astype(np.float32),
        "y": rng.integers(0, 10, 256),
    }
    for name, array in arrays.items():
        np.save(local / f"{name}.npy", array)
        store["s3"].upload_file(str(local / f"{name}.npy"), BUCKET, f"big/train/{name}.npy")
    with store["env"].context() as env:
        env.setenv("JAXFEED_CACHE_BYTES", str(CACHE_BYTES))
        yield {**store, "big": local, "url": f"s3://{BUCKET}/big/", "env": env}


def _opts(store) -> dict:
    return {"endpoint_url": store["endpoint"]}


@pytest.mark.parametrize("shuffle", ["blocks", True])
def test_a_split_past_the_cache_is_read_in_place(big, shuffle):
    kwargs = {"batch_size": 64, "shuffle": shuffle}
    want = _epochs(jaxfeed.make("numpy", dataset=str(big["big"]), **kwargs))
    source = jaxfeed.make("numpy", dataset=big["url"], storage_options=_opts(big), **kwargs)
    fields = source.dataset.arrays
    assert all(isinstance(f, RangedNpy) for f in fields.values()), fields
    assert _same(_epochs(source), want)
    resumed = [dict(b) for b in source.iter_epoch(1, start=3)]
    assert _same(resumed, want[len(want) // 2 + 3 :])
    cache = fields["x"]._cache
    assert 0 < cache.peak_bytes <= cache.max_bytes == CACHE_BYTES // 4, cache.peak_bytes
    fetched = list(Path(os.environ["JAXFEED_CACHE_DIR"]).glob("objects/*/x.npy"))
    assert fetched == []  # nothing fetched whole


@pytest.mark.slow  # two worker processes
@pytest.mark.parametrize("shuffle", ["blocks", True])
def test_workers_read_in_place_too(big, shuffle):
    """Two torch workers, each opening the store itself (credentials from the
    environment), read the local copy's batches, and resume at batch 3."""
    _torch_workers_read_as(
        big["big"], big["url"], _opts(big), 3, lambda source: None, batch_size=64, shuffle=shuffle
    )


def test_a_range_read_cut_short_is_retried_never_served(big):
    """One in two of the first reads of blocks has its body cut short: each is
    retried by jaxfeed (botocore's retries off), and the batches are the local copy's."""
    port = int(big["endpoint"].rsplit(":", 1)[1])
    ranges = itertools.count()
    reads = lambda method, path, headers: "Range" in headers and next(ranges) < 16  # noqa: E731
    want = _epochs(jaxfeed.make("numpy", dataset=str(big["big"]), batch_size=128), epochs=1)
    with FaultyProxy(port, every=2, faults=("truncate",), only=reads) as proxy:
        source = jaxfeed.make(
            "numpy",
            dataset=big["url"],
            storage_options={**_through(proxy), **NO_BOTOCORE_RETRIES},
            batch_size=128,
        )
        assert _same(_epochs(source, epochs=1), want)
    assert proxy.counts["truncate"] >= 4, proxy.counts


def test_a_permutation_keeps_more_reads_in_flight_than_four(big):
    """A full shuffle's first batch of scattered rows, through a proxy that delays
    each request by 500 ms: its reads slide and deepen past the floor of 4 (and
    the old bound: four blocks fit the cache) as the latency is measured, and
    the batches are the local copy's."""
    port = int(big["endpoint"].rsplit(":", 1)[1])
    kwargs = {"batch_size": 64, "shuffle": True}
    want = list(
        itertools.islice(jaxfeed.make("numpy", dataset=str(big["big"]), **kwargs).iter_epoch(0), 1)
    )
    with FaultyProxy(port, faults=(), latency_s=0.5) as proxy:
        source = jaxfeed.make(
            "numpy", dataset=big["url"], storage_options=_through(proxy), **kwargs
        )
        got = [dict(b) for b in itertools.islice(source.iter_epoch(0), 1)]
    assert _same(got, [dict(b) for b in want])
    assert proxy.stats()["peak_in_flight"] > 4, proxy.stats()
    depth = source.dataset.arrays["x"]._cache.depths["small"].depth
    assert depth > 4, depth


@pytest.mark.parametrize("start", [0, 2])
def test_the_next_batch_is_asked_for_while_this_one_is_used(big, start):
    """Once a batch is handed out (of an epoch, or one resumed at batch 2),
    every block of the next batch in the sampler's order is held or being
    read (before: none of them, each asked for when its batch was), the
    batches are the local copy's, and the epoch's end lets the pins go."""
    kwargs = {"batch_size": 64, "shuffle": True}
    want = [dict(b) for b in jaxfeed.make("numpy", dataset=str(big["big"]), **kwargs).iter_epoch(0)]
    source = jaxfeed.make("numpy", dataset=big["url"], storage_options=_opts(big), **kwargs)
    x = source.dataset.arrays["x"]
    plan = [rows for rows, _ in source.sampler.epoch_plan(0, start)]
    epoch = source.iter_epoch(0, start=start)
    got = [dict(next(epoch))]
    blocks = x._blocks_of(plan[1])  # one a row: a row of x is 12 KiB, past a small block
    assert len(blocks) == 64 and all(x.cache.holds(block.key) for block in blocks)
    got += [dict(b) for b in epoch]
    assert _same(got, want[start:])
    assert x.cache.pinned == 0


def test_an_object_changed_mid_training_is_refused_at_the_next_epoch(big):
    s3, key = big["s3"], "big-changing/train/x.npy"
    x = np.load(big["big"] / "x.npy")
    s3.put_object(Bucket=BUCKET, Key=key, Body=_npy(x))
    source = jaxfeed.make(
        "numpy", dataset=f"s3://{BUCKET}/big-changing/", storage_options=_opts(big), batch_size=64
    )
    epoch = source.iter_epoch(0)
    next(epoch)
    s3.put_object(Bucket=BUCKET, Key=key, Body=_npy(x + 1))  # same size, new version
    list(epoch)
    with pytest.raises(ValueError, match=r"big-changing/train/x\.npy changed after the source"):
        next(source.iter_epoch(1))


def _npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()

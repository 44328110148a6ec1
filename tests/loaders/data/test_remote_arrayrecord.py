"""A store's ArrayRecord split bigger than the cache, read in place by ranged
reads of runs of chunks (loaders/data/ranged_arrayrecord.py), against the moto
S3 server of test_object_storage.py on 127.0.0.1: the local copy's batches
(files of several group sizes and compressions, records across 64 KiB block
headers), the block cache within its bound, the index built once, nothing
fetched whole, a changed object refused, and what cannot be read in place
named."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
from faulty_proxy import FaultyProxy
from jaxfeed.loaders.data.formats.example import serialize_example
from jaxfeed.loaders.data.ranged_arrayrecord import INDEX_DIR, RangedArrayRecords
from test_object_storage import (
    BUCKET,
    _epochs,
    _fetched_whole,
    _reads_as_the_local_copy,
    _refused_under_ranges,
    _same,
    _torch_workers_read_as,
    store,
)

import jaxfeed

__all__ = ["store"]  # the moto fixture, shared

CACHE_BYTES = 64 << 10  # the objects are ~0.6 MB: each process holds 16 KiB of ~4 KiB blocks
BATCH = 40
# name -> (rows, writer options): jaxfeed's own writer's default (zstd,
# one record a chunk), uncompressed groups, an empty file, and brotli groups
# whose 300 records cross two 64 KiB block headers.
FILES = {
    "train-00000-of-00004": (70, "group_size:1"),
    "train-00001-of-00004": (50, "group_size:8,uncompressed"),
    "train-00002-of-00004": (0, "group_size:1"),
    "train-00003-of-00004": (300, "group_size:16,brotli"),
    "test-00000-of-00001": (30, "group_size:4,snappy"),
}


def _rows(rng: np.random.Generator, count: int, start: int = 0) -> list[bytes]:
    return [
        serialize_example(
            {
                "x": rng.normal(size=16).astype(np.float32),
                "w": rng.normal(size=60).astype(np.float32),
                "y": np.array([(start + i) % 10]),
                "ids": rng.integers(-(1 << 30), 1 << 20, 3),
            }
        )
        for i in range(count)
    ]


def _arrayrecord(path: Path, rows: list[bytes], options: str) -> bytes:
    from array_record.python.array_record_module import ArrayRecordWriter

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = ArrayRecordWriter(str(path), options)
    for row in rows:
        writer.write(row)
    writer.close()
    return path.read_bytes()


def _put(store, prefix: str, files: dict[str, bytes]) -> str:
    for name, data in files.items():
        store["s3"].put_object(Bucket=BUCKET, Key=f"{prefix}{name}", Body=data)
    return f"s3://{BUCKET}/{prefix}"


@pytest.fixture(scope="module")
def files(store, tmp_path_factory):
    """`FILES` in the store and on local disk, with the cache bound below their size."""
    local = tmp_path_factory.mktemp("ar")
    rng = np.random.default_rng(2)
    made = {
        f"{name}.array_record": _arrayrecord(local / f"{name}.array_record", _rows(rng, n), o)
        for name, (n, o) in FILES.items()
    }
    url = _put(store, "ar-big/", made)
    with store["env"].context() as env:
        env.setenv("JAXFEED_CACHE_BYTES", str(CACHE_BYTES))
        env.setenv("JAXFEED_CACHE_DIR", str(tmp_path_factory.mktemp("ar-cache")))
        yield {**store, "ar": local, "url": url, "env": env, "sizes": made}


def _opts(store) -> dict:
    return {"endpoint_url": store["endpoint"]}


def _read_in_place(source) -> None:
    fields = source.dataset.arrays
    assert all(isinstance(f, RangedArrayRecords) for f in fields.values()), fields
    assert list(fields) == ["x", "w", "y", "ids"]
    fetched = list(Path(os.environ["JAXFEED_CACHE_DIR"]).glob("objects/*/train-0000*"))
    assert fetched == []  # nothing fetched whole


@pytest.mark.parametrize(
    ("backend", "shuffle"),
    [("numpy", True), ("numpy", "blocks"), ("torch", "blocks"), ("grain", "blocks")],
)
def test_an_arrayrecord_split_past_the_cache_is_read_in_place(files, backend, shuffle):
    kwargs = {"batch_size": BATCH, "shuffle": shuffle}
    local = jaxfeed.make("numpy", dataset=str(files["ar"]), **kwargs)
    source = jaxfeed.make(backend, dataset=files["url"], storage_options=_opts(files), **kwargs)
    try:
        _read_in_place(source)
        assert local.dataset.units == (70, 50, 300)
        _reads_as_the_local_copy(source, local, CACHE_BYTES // 4)
    finally:
        if hasattr(source, "close"):
            source.close()
    test = jaxfeed.load_dataset(files["url"], "test", storage_options=_opts(files))
    assert isinstance(test["x"], RangedArrayRecords)
    assert np.array_equal(test["w"][:], jaxfeed.load_dataset(str(files["ar"]), "test")["w"][:])


@pytest.mark.slow  # two worker processes
def test_torch_workers_read_arrayrecord_in_place(files):
    """Two torch workers, each opening the store itself and loading the index
    by its path, read the local copy's batches, and resume at batch 2."""
    _torch_workers_read_as(
        files["ar"], files["url"], _opts(files), 2, _read_in_place, batch_size=BATCH, shuffle=True
    )


def test_the_index_is_built_once_and_an_epoch_reads_the_chunks_not_the_files(files, tmp_path):
    """From a fresh cache the first make reads each train object's chunks once
    (the index) and its tail; a second make reads none of them again; an
    epoch in order reads each chunk once, never the objects' padding, footer
    and postscript: fewer bytes than fetching them whole."""
    port = int(files["endpoint"].rsplit(":", 1)[1])
    files["env"].setenv("JAXFEED_CACHE_DIR", str(tmp_path))
    kwargs = {"batch_size": BATCH, "shuffle": False}
    train = sum(len(d) for n, d in files["sizes"].items() if n.startswith("train"))
    with FaultyProxy(port, faults=()) as proxy:
        options = {"client_kwargs": {"endpoint_url": proxy.url}}
        jaxfeed.make("numpy", dataset=files["url"], storage_options=options, **kwargs)
        first = proxy.stats()
        again = jaxfeed.make("numpy", dataset=files["url"], storage_options=options, **kwargs)
        second = proxy.stats()
        list(again.iter_epoch(0))
        epoch = proxy.stats()
    data = sum(n * len(_rows(np.random.default_rng(0), 1)[0]) for n, _ in FILES.values())
    assert first["sent"] >= data * 0.5, first  # the chunks (compressed, some)
    assert second["sent"] - first["sent"] < 8 << 10, (first, second)
    assert second["requests"] - first["requests"] <= 4, (first, second)  # listing, row 0
    read = {"requests": epoch["requests"] - second["requests"]}
    read["bytes"] = epoch["sent"] - second["sent"]  # with each response's headers
    print(f"one epoch: {read['requests']} ranged requests, {read['bytes']} bytes; whole: {train}")
    assert read["bytes"] < train / 2, (read, train)
    assert isinstance(again.dataset.arrays["x"], RangedArrayRecords)
    assert len(list((tmp_path / INDEX_DIR).iterdir())) == 4  # one per train object
    assert list(tmp_path.glob("objects/*/*")) == []


def test_a_changed_object_gets_a_new_index_and_is_refused_at_the_next_epoch(files, tmp_path):
    rng = np.random.default_rng(3)
    data = _arrayrecord(tmp_path / "old" / "train-0.array_record", _rows(rng, 200), "group_size:4")
    url = _put(files, "ar-changing/", {"train-0.array_record": data})
    source = jaxfeed.make("numpy", dataset=url, storage_options=_opts(files), batch_size=BATCH)
    indexes = Path(os.environ["JAXFEED_CACHE_DIR"]) / INDEX_DIR
    before = set(indexes.iterdir())
    epoch = source.iter_epoch(0)
    next(epoch)
    changed = _arrayrecord(tmp_path / "new" / "train-0.array_record", _rows(rng, 200), "")
    files["s3"].put_object(Bucket=BUCKET, Key="ar-changing/train-0.array_record", Body=changed)
    with pytest.raises(
        ValueError, match=r"ar-changing/train-0\.array_record changed after the source"
    ):
        next(source.iter_epoch(1))
    again = jaxfeed.make("numpy", dataset=url, storage_options=_opts(files), batch_size=BATCH)
    assert len(set(indexes.iterdir()) - before) == 1  # its identity differs: a new index
    want = _epochs(jaxfeed.make("numpy", dataset=str(tmp_path / "new"), batch_size=BATCH))
    assert _same(_epochs(again), want)


def test_an_object_rewritten_within_an_epoch_is_refused_at_its_next_block(files, tmp_path):
    # Same writer, same record sizes, other values: the same chunk layout, so
    # only the CRC kept in the index (the HighwayHash is not computed again
    # at a block read) tells the new bytes from the indexed ones.
    rows = _rows(np.random.default_rng(6), 200)
    other = _rows(np.random.default_rng(7), 200)
    assert [len(r) for r in rows] == [len(r) for r in other] and rows != other
    old = _arrayrecord(tmp_path / "old.array_record", rows, "group_size:4,uncompressed")
    new = _arrayrecord(tmp_path / "new.array_record", other, "group_size:4,uncompressed")
    assert len(old) == len(new)
    url = _put(files, "ar-rewritten/", {"train-0.array_record": old})
    source = jaxfeed.make(
        "numpy", dataset=url, storage_options=_opts(files), batch_size=BATCH, shuffle=False
    )
    epoch = source.iter_epoch(0)
    next(epoch)
    files["s3"].put_object(Bucket=BUCKET, Key="ar-rewritten/train-0.array_record", Body=new)
    with pytest.raises(ValueError, match=r"no longer hold the chunks it was indexed with"):
        list(epoch)


def test_a_damaged_chunk_names_the_object_and_its_byte(files, tmp_path):
    from jaxfeed.loaders.data.formats.riegeli import footer, postscript_footer_offset

    data = bytearray(
        _arrayrecord(
            tmp_path / "d.array_record", _rows(np.random.default_rng(4), 50), "group_size:1"
        )
    )
    size = len(data)
    at = postscript_footer_offset(bytes(data[-(1 << 16) :]), size, "d")
    fifth = footer(bytes(data[at : size - (1 << 16)]), at, "d").offsets[5]
    data[fifth + 40 + 3] ^= 0xFF  # chunk 5's data
    url = _put(files, "ar-damaged/", {"train-0.array_record": bytes(data)})
    damaged = (
        rf"ar-damaged/train-0\.array_record: the chunk at byte {fifth} fails its data "
        r"hash: the ArrayRecord file is damaged"
    )
    _refused_under_ranges(files["env"], url, _opts(files), damaged)


@pytest.mark.parametrize("kind", ["transposed", "no-pyarrow", "raw", "bytes", "big-chunk"])
def test_what_is_not_read_in_place_is_named_under_ranges_and_fetched_under_auto(
    files, tmp_path, kind, monkeypatch
):
    rows = _rows(np.random.default_rng(5), 400)
    options = "group_size:8,uncompressed"
    if kind == "transposed":
        options, why = "group_size:8,transpose:true", "its chunks are transposed"
    elif kind == "no-pyarrow":
        options, why = "group_size:8,zstd", "its chunks are zstd-compressed and pyarrow"
    elif kind == "big-chunk":  # 400 rows of 336 bytes parsed: past the 16 KiB block cache
        options = "group_size:400,uncompressed"
        why = r"a chunk of 400 records parses to 134,400 bytes, more than the block cache's bound"
    elif kind == "raw":
        rows, why = [bytes([i % 7]) * 300 for i in range(400)], r"its records are not tf\.train"
    else:
        rows = [serialize_example({"png": b"\x89PNG" * i}) for i in range(1, 400)]
        why = "its feature 'png' holds bytes"
    data = _arrayrecord(tmp_path / "x.array_record", rows, options)
    url = _put(files, f"ar-{kind}/", {"train-0.array_record": data})
    if kind == "no-pyarrow":
        monkeypatch.setitem(sys.modules, "pyarrow", None)  # its import fails: no decoder
    refusal = rf"train-0\.array_record: {why}.*JAXFEED_READ=whole"
    _refused_under_ranges(files["env"], url, _opts(files), refusal)
    with pytest.raises(ValueError, match=r"more than its bound"):  # auto: the whole fetch
        jaxfeed.load_dataset(url, storage_options=_opts(files))
    monkeypatch.undo()  # pyarrow back
    whole = _fetched_whole(files["env"], url, _opts(files), CACHE_BYTES)
    assert not any(isinstance(f, RangedArrayRecords) for f in whole.arrays.values())
    assert len(whole) == len(rows)

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
    source = jaxfeed.make(backend, dataset=shards["url"], storage_options=_opts(shards), **kwargs)
    try:
        _read_in_place(source, shards)
        assert local.dataset.units == (70, 50, 80)
        _reads_as_the_local_copy(source, local, CACHE_BYTES // 4)
    finally:
        if hasattr(source, "close"):
            source.close()
    test = jaxfeed.load_dataset(shards["url"], "test", storage_options=_opts(shards))
    assert np.array_equal(test["x"][:], jaxfeed.load_dataset(str(shards["tfr"]), "test")["x"])


@pytest.mark.slow  # two worker processes
def test_torch_workers_read_tfrecord_in_place(shards):
    """Two torch workers, each opening the store itself and loading the index
    by its path, read the local copy's batches, and resume at batch 2."""
    _torch_workers_read_as(
        shards["tfr"],
        shards["url"],
        _opts(shards),
        2,
        lambda source: _read_in_place(source, shards),
        batch_size=BATCH,
        shuffle=True,
    )


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
    damaged = (
        rf"tfr-damaged/train-0\.tfrecord, record 5: its length header is damaged "
        rf"\(at byte {at}\)"
    )
    _refused_under_ranges(shards["env"], url, _opts(shards), damaged)


def test_gzip_shards_are_named_under_ranges_and_fetched_under_auto(shards, tmp_path):
    """A gzip stream has no random access: such a shard is fetched whole."""
    data = gzip.compress(_tfrecord(_rows(np.random.default_rng(5), 400)))
    url = _put(shards, tmp_path, "tfr-gzip/", {"train-0.tfrecord": data})
    refusal = r"train-0\.tfrecord: it is gzip-compressed.*JAXFEED_READ=whole"
    _refused_under_ranges(shards["env"], url, _opts(shards), refusal)
    with pytest.raises(ValueError, match=r"more than its bound"):  # auto: the whole fetch
        jaxfeed.load_dataset(url, storage_options=_opts(shards))
    whole = _fetched_whole(shards["env"], url, _opts(shards), CACHE_BYTES)
    assert not any(isinstance(f, RangedExamples) for f in whole.arrays.values())


def test_a_record_past_a_block_is_refused_by_name(shards, tmp_path):
    data = _tfrecord([serialize_example({"png": b"\x89PNG" * i}) for i in range(1, 400)])
    url = _put(shards, tmp_path, "tfr-bytes/", {"train-0.tfrecord": data})
    with pytest.raises(
        ValueError,
        match=r"tfr-bytes/train-0\.tfrecord, record 254 takes 1028 bytes parsed, past the "
        r"1024 bytes of a block read in place .*JAXFEED_CACHE_BYTES to at least 16448",
    ):
        jaxfeed.load_dataset(url, storage_options=_opts(shards))


VAR_CACHE = 64_000  # below each split's shards; blocks of 4,000 bytes parsed, 16,000 held


@pytest.fixture(scope="module")
def varshards(store, tmp_path_factory):
    """TFRecord shards of variable-length features, in the store and on local
    disk: ``tfr-img/`` PNG bytes of small images, a label and a text bytes
    feature (three shards); ``tfr-tok/`` a token corpus: int64 ids (negative
    too) and floats, of one length per record that differs between records
    (three shards)."""
    from jaxfeed.loaders.data.encoded import encode_png

    local = tmp_path_factory.mktemp("tfrvar")
    rng = np.random.default_rng(12)
    img, tok = {}, {}
    for part in range(3):
        images = rng.integers(0, 256, (80, 8, 8, 3), dtype=np.uint8)
        pngs, labels = encode_png(images), rng.integers(0, 10, 80)
        texts = [("é" * int(n)).encode() for n in rng.integers(0, 9, 80)]
        img[f"train-{part:05d}-of-00003.tfrecord"] = _tfrecord(
            [
                serialize_example({"png": p, "label": np.array([y]), "s": t})
                for p, y, t in zip(pngs, labels, texts, strict=True)
            ]
        )
        rows = []
        for n in rng.integers(1, 41, 200):
            ids = rng.integers(-(1 << 20), 1 << 30, n)
            rows.append(serialize_example({"tokens": ids, "w": rng.normal(size=n).astype("f4")}))
        tok[f"train-{part:05d}-of-00003.tfrecord"] = _tfrecord(rows)
    made = {}
    for prefix, shards in (("tfr-img/", img), ("tfr-tok/", tok)):
        assert sum(map(len, shards.values())) > VAR_CACHE, prefix
        made[prefix] = _put(store, local / prefix, prefix, shards)
    with store["env"].context() as env:
        env.setenv("JAXFEED_CACHE_BYTES", str(VAR_CACHE))
        env.setenv("JAXFEED_CACHE_DIR", str(tmp_path_factory.mktemp("tfrvar-cache")))
        yield {**store, "local": local, "urls": made, "env": env}


def _sequence_epochs(source) -> list[list[dict]]:
    return [[dict(b) for b in source.iter_epoch(e)] for e in range(2)]


def _nothing_fetched_whole() -> None:
    assert list(Path(os.environ["JAXFEED_CACHE_DIR"]).glob("objects/*/*.tfrecord")) == []


def _close(source) -> None:
    if hasattr(source, "close"):
        source.close()


def test_bytes_features_are_read_in_place_as_the_local_bytes_fields(varshards):
    from jaxfeed.loaders.bytes_field import BytesField
    from jaxfeed.loaders.data.ranged_values import RangedBytes

    local = jaxfeed.load_dataset(str(varshards["local"] / "tfr-img"))
    remote = jaxfeed.load_dataset(varshards["urls"]["tfr-img/"], storage_options=_opts(varshards))
    assert remote.units == local.units == (80, 80, 80)
    assert remote.bytes_fields() == local.bytes_fields() == ["png", "s"]
    every = np.arange(len(local))
    for name in ("png", "s"):
        field = remote.arrays[name]
        assert isinstance(field, RangedBytes) and field.shape == local[name].shape, field
        assert list(field[every]) == list(local[name][every]), name  # every row, byte for byte
        part = field[37:181]
        assert isinstance(part, BytesField) and isinstance(remote.head[name], BytesField)
        assert np.array_equal(part.offsets, local[name][37:181].offsets)
        assert part.data.tobytes() == local[name][37:181].data.tobytes()
        assert field[-1] == local[name][-1]
    assert isinstance(remote.arrays["label"], RangedExamples)
    assert np.array_equal(remote["label"][:], local["label"])
    _nothing_fetched_whole()


@pytest.mark.parametrize("backend", ["numpy", "torch", "grain"])
def test_png_features_decode_into_the_local_copys_batches(varshards, backend):
    """The local path's image decoding (``digits-png``'s ``augment``) over
    bytes read in place, the text feature riding along as a host field: the
    local copy's batches over two epochs and a resume, within the bound."""
    from jaxfeed.loaders.data.encoded import augment

    kwargs = {"batch_size": 32, "shuffle": True, "transform": augment, "host_fields": ("s",)}
    want = _epochs(jaxfeed.make("numpy", dataset=str(varshards["local"] / "tfr-img"), **kwargs))
    url = varshards["urls"]["tfr-img/"]
    source = jaxfeed.make(backend, dataset=url, storage_options=_opts(varshards), **kwargs)
    try:
        assert sorted(want[0]) == ["image", "label", "mask", "s"]
        assert _same(_epochs(source), want), backend
        resumed = [dict(b) for b in source.iter_epoch(1, start=3)]
        assert _same(resumed, want[len(want) // 2 + 3 :]), backend
    finally:
        _close(source)
    _nothing_fetched_whole()


@pytest.mark.parametrize("backend", ["numpy", "torch", "grain"])
def test_a_token_corpus_packs_and_pads_from_features_read_in_place(varshards, backend):
    """``make(backend, dataset=URL, pack=L)`` and ``pad=L`` over variable-length
    features read in place: the local copy's offsets, values and batches over
    two epochs and a resume, within the block cache's bound."""
    from jaxfeed.loaders.data.ranged_values import RangedValues
    from jaxfeed.loaders.ragged_field import RaggedField

    opts, url = _opts(varshards), varshards["urls"]["tfr-tok/"]
    local_data = jaxfeed.load_dataset(str(varshards["local"] / "tfr-tok"))
    remote = jaxfeed.load_dataset(url, storage_options=opts)
    assert remote.ragged_fields() == local_data.ragged_fields() == ["tokens", "w"]
    for name in ("tokens", "w"):
        field, want = remote.arrays[name], local_data[name]
        assert isinstance(field, RaggedField) and isinstance(field.values, RangedValues)
        assert np.array_equal(field.offsets, want.offsets) and field.offsets.dtype == np.int64
        assert field.values.dtype == want.values.dtype and field.values.shape == want.values.shape
        assert np.asarray(field.values[:]).tobytes() == np.asarray(want.values).tobytes(), name
    for layout in ({"pack": 64}, {"pad": 40}):
        kwargs = {"batch_size": 8, "shuffle": True, **layout}
        want = _sequence_epochs(
            jaxfeed.make("numpy", dataset=str(varshards["local"] / "tfr-tok"), **kwargs)
        )
        source = jaxfeed.make(backend, dataset=url, storage_options=opts, **kwargs)
        try:
            got = _sequence_epochs(source)
            assert all(_same(g, w) for g, w in zip(got, want, strict=True)), (backend, layout)
            resumed = [dict(b) for b in source.iter_epoch(1, start=2)]
            assert _same(resumed, want[1][2:]), (backend, layout)
            cache = source.dataset.arrays["tokens"].values._reader.cache
            assert 0 < cache.peak_bytes <= cache.max_bytes == VAR_CACHE // 4, cache.peak_bytes
        finally:
            _close(source)
    _nothing_fetched_whole()


@pytest.mark.slow  # two worker processes
def test_torch_workers_read_variable_length_features_in_place(varshards):
    from jaxfeed.loaders.data.encoded import augment

    for prefix, kwargs in (
        ("tfr-img", {"batch_size": 32, "transform": augment}),
        ("tfr-tok", {"batch_size": 8, "pack": 64}),
    ):
        kwargs = {"shuffle": True, **kwargs}
        want = _sequence_epochs(
            jaxfeed.make("numpy", dataset=str(varshards["local"] / prefix), **kwargs)
        )
        source = jaxfeed.make(
            "torch",
            dataset=varshards["urls"][f"{prefix}/"],
            storage_options=_opts(varshards),
            num_workers=2,
            **kwargs,
        )
        try:
            got = _sequence_epochs(source)
            assert all(_same(g, w) for g, w in zip(got, want, strict=True)), prefix
            resumed = [dict(b) for b in source.iter_epoch(1, start=2)]
            assert _same(resumed, want[1][2:]), prefix
        finally:
            source.close()
    _nothing_fetched_whole()

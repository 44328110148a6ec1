"""Where jaxfeed keeps downloaded and converted data.

Every on-disk cache (MNIST downloads, TFDS and Arrow conversions) lives under
:func:`cache_root` and is created through :func:`writable_dir`, so all of them
fail the same, explainable way on a read-only home directory. Converted
datasets are named by :func:`cache_entry` and written by :func:`build_once`,
which stores a manifest (every file's size and CRC-32) in each entry and
checks it on every open (:func:`check_entry`). Opening a built entry writes
nothing, so a read-only cache works as is. The cache also memoises the
content digests of on-disk fields (:func:`fingerprint`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import stat
import tempfile
import zlib
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path

import numpy as np
from jaxfeed.loaders._io.owner_lock import hold, owner_gone
from jaxfeed.loaders.data.on_disk import HASH, content_digest, digest_of_bytes

__all__ = [
    "CACHE_ENV",
    "MANIFEST",
    "build_once",
    "cache_entry",
    "cache_root",
    "check_entry",
    "fingerprint",
    "writable_dir",
    "writer_version",
]

CACHE_ENV = "JAXFEED_CACHE_DIR"
MANIFEST = "jaxfeed-manifest.json"
"""Written last into every built entry: its files' sizes and CRC-32s."""
CONTENT_MEMO = "content"
"""The cache's folder of on-disk fields' content digests, by file identity."""
_MANIFEST_FORMAT = 2  # 2: files over _WHOLE_CRC_BYTES have a sampled CRC-32
_READ_CHUNK = 1 << 20
# A file up to this size is checksummed whole; a larger one (a dataset bigger
# than memory) over _SAMPLED_CHUNKS evenly spaced chunks and its last one, so
# opening it costs milliseconds, not a read of every byte. Its size is always
# checked, and build_once never exposes a half-written entry.
_WHOLE_CRC_BYTES = 64 << 20
_SAMPLED_CHUNKS = 64


def cache_root() -> Path:
    """Returns jaxfeed's cache directory (not created).

    Resolution order: ``$JAXFEED_CACHE_DIR``; else ``$XDG_CACHE_HOME/jaxfeed``;
    else ``~/.cache/jaxfeed``. Empty variables count as unset. When other
    users may write that directory, this user's ``user-<uid>`` inside it.

    Returns:
      The cache root, with ``~`` expanded.

    Raises:
      ValueError: the directory belongs to another user (see `_own_part`).
    """
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        root = Path(explicit).expanduser()
    elif xdg := os.environ.get("XDG_CACHE_HOME"):
        root = Path(xdg).expanduser() / "jaxfeed"
    else:
        root = Path.home() / ".cache" / "jaxfeed"
    return _own_part(root)


def _own_part(root: Path) -> Path:
    """``root``, or this user's own directory in it when others may write
    ``root`` (a team's shared scratch): an entry another user could have
    planted is never read, so each user keeps ``root/user-<uid>``, made by
    and writable only by that user.

    Raises:
      ValueError: ``root/user-<uid>`` exists but is not this user's own
        directory, or others may write it; or only another user may write
        ``root``. The message says what to do.
    """
    try:
        status = root.stat()
    except OSError:
        return root  # not there yet (writable_dir makes it, as this user), or unusable: it says so
    if not status.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        _check_owner(root, status)
        return root
    own = root / f"user-{os.getuid()}"
    with contextlib.suppress(FileExistsError, PermissionError):
        own.mkdir(mode=0o755)  # (PermissionError: a read-only root; checked below if there)
    try:
        status = os.lstat(own)
    except FileNotFoundError:
        return own  # a read-only root without an entry of ours: writable_dir says so
    if (
        not stat.S_ISDIR(status.st_mode)
        or status.st_uid != os.getuid()
        or status.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    ):
        raise ValueError(
            f"the cache directory {root} may be written by other users, so jaxfeed keeps "
            f"yours in {own}, but that is not a directory of yours that only you can write "
            f"(someone else may have made it); remove it, or set {CACHE_ENV} to a directory "
            "of your own"
        )
    return own


def _check_owner(path: Path, status: os.stat_result) -> None:
    """Refuses ``path`` unless it is this user's, or root's and writable by
    root alone (as ``/usr`` is): another user who owns a cache directory or
    entry could swap its files, manifest and all, for rows of their choosing.

    Raises:
      ValueError: ``path`` belongs to another user; the message names the
        owner and the fix.
    """
    mine = status.st_uid == os.getuid()
    if mine or (status.st_uid == 0 and not status.st_mode & (stat.S_IWGRP | stat.S_IWOTH)):
        return
    raise ValueError(
        f"the cache path {path} belongs to uid {status.st_uid}, not to you (uid {os.getuid()}), "
        f"so that user could change what jaxfeed reads from it; set {CACHE_ENV} to a "
        "directory of your own"
    )


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
    """A short content key over the arrays' dtypes, shapes and every byte:
    equal for byte-identical data wherever it lies (in memory, or in files at
    any path), different after any edit.

    Native-format caches (TFDS, Arrow) are keyed by it, so a cache built from
    other data is never reused; the processes of a job and a resumed run
    compare it. An array in memory is hashed whole (~0.1 s for full MNIST);
    an on-disk field once per version of its file, memoised in the cache by
    the file's cheap identity (`jaxfeed.loaders.data.on_disk.content_digest`).
    """
    memo = cache_root() / CONTENT_MEMO
    digest = hashlib.new(HASH)
    for array in arrays:
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(content_digest(array, memo) or digest_of_bytes(array))
    return digest.hexdigest()[:16]


def writer_version(distribution: str) -> str:
    """The installed version of the package that writes a native-format entry
    (``"datasets"``, ``"tensorflow-datasets"``), read from its metadata, so the
    package need not be imported to name its cache entry."""
    return metadata.version(distribution)


def cache_entry(kind: str, name: str, version: str, *arrays: np.ndarray, writer: str) -> Path:
    """Where a converted copy of ``arrays`` lives:
    ``cache_root()/kind/<slug>-<version>-<writer>-<writer version>-<key>``.

    Args:
      kind: the format's folder, e.g. ``"tfds"`` or ``"hf"``.
      name: a readable name (the dataset's), turned into a file-name slug.
      version: the stored layout's version; bumping it stops old copies
        from being reused.
      *arrays: the content; see :func:`fingerprint`.
      writer: the distribution that writes (and later reads) the format, e.g.
        ``"datasets"``. Its installed version is part of the key: a copy written
        by one version may not open in another (an Arrow file's features
        written by ``datasets`` 5 fail in ``datasets`` 3), so each version
        builds its own.
    """
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[-40:].strip("-") or "data"
    written_by = re.sub(r"[^A-Za-z0-9.]+", "-", f"{writer}-{writer_version(writer)}")
    return cache_root() / kind / f"{slug}-{version}-{written_by}-{fingerprint(*arrays)}"


def build_once(path: Path, build: Callable[[Path], None]) -> Path:
    """Returns ``path``, first building it with ``build(scratch)`` unless built.

    ``build`` fills a fresh scratch directory beside ``path``; a manifest of
    its files is added and the directory is renamed into place: readers never
    see a half-built copy, a crash leaves only scratch behind, and processes
    racing to build the same entry all succeed (the first rename wins, the
    others discard their copy). A built entry is checked against its manifest
    (:func:`check_entry`) and otherwise only read, so a read-only cache holding
    the entry works.

    Raises:
      ValueError: the entry must be built but the cache directory is not writable.
      RuntimeError: ``path`` exists but has no manifest (incomplete, or built
        by another jaxfeed version), or fails its manifest; the message names
        the directory to delete.
    """
    with contextlib.suppress(FileNotFoundError):  # (the root above it: cache_root checks it)
        _check_owner(path.parent, path.parent.stat())  # the format's folder, e.g. formats/
    if (path / MANIFEST).is_file():
        check_entry(path)
        return path
    if path.exists():
        raise _damaged(path, f"it has no {MANIFEST} (an incomplete or foreign copy)")
    try:
        root = writable_dir(path.parent)
    except ValueError as err:  # say why a read-only cache needs writing at all
        raise ValueError(f"{err}; it must be writable to build {path.name}, not there yet") from err
    _remove_dead_builds(root, path.name)
    with _owned_scratch(root, path.name) as scratch:
        build(scratch)
        _write_manifest(scratch)
        try:
            scratch.rename(path)
        except OSError:
            if not (path / MANIFEST).is_file():  # not a lost race: something is in the way
                raise _damaged(path, "it appeared while being built, incomplete") from None
    check_entry(path)  # ours: fills the memo below, so the next open is cheap
    return path


@contextlib.contextmanager
def _owned_scratch(root: Path, name: str) -> Iterator[Path]:
    """A scratch directory for a build of ``name``, owned by this process for
    as long as the build runs (`owner_lock`: a lock file beside it), so the
    next build removes it only once its process is gone. Everything is
    removed at the end (nothing is left after a rename into place)."""
    token = secrets.token_hex(8)
    scratch = root / f".{name}.build-{token}"
    lock = Path(f"{scratch}.lock")
    pending = root / f".{name}.starting-{token}"  # not a lock anyone looks for yet
    handle = hold(pending)
    try:
        os.rename(pending, lock)  # found by others only once it is held
        scratch.mkdir(mode=0o755)
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        for leftover in (pending, lock):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()
        os.close(handle)


def _remove_dead_builds(root: Path, name: str) -> None:
    """Deletes the scratch of builds of ``name`` whose process is gone: a
    killed conversion of a large dataset must not keep its partial copy on
    the disk for good, and a live one, wherever it runs, is never touched."""
    for lock in root.glob(f".{name}.build-*.lock"):
        if owner_gone(lock):
            shutil.rmtree(lock.with_suffix(""), ignore_errors=True)
            with contextlib.suppress(FileNotFoundError):
                lock.unlink()


def check_entry(path: Path) -> None:
    """Checks a built cache entry against its manifest.

    Sizes are checked on every call (one ``stat`` per file). The CRC-32 of
    every byte (of a sample of 1 MiB chunks for files over 64 MiB) is checked
    the first time a process opens the entry, and again whenever a file's
    size, mtime or inode changed since.

    Raises:
      RuntimeError: a file is missing, has the wrong size or the wrong
        checksum, or the manifest is unreadable. The message names the
        directory to delete so that it is rebuilt.
      ValueError: the entry, a folder in it or a file belongs to another user.
    """
    with contextlib.suppress(FileNotFoundError):  # (reading the manifest says so)
        _check_owner(path, path.stat())
        _check_owner(path / MANIFEST, os.lstat(path / MANIFEST))
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        files, whole = manifest["files"], manifest.get("format", 1) < 2  # 1: CRCs of every byte
        expected = {
            name: (int(entry["size"]), str(entry["crc32"])) for name, entry in files.items()
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        problem = f"its {MANIFEST} is unreadable ({type(err).__name__}: {err})"
        raise _damaged(path, problem) from err
    stamps = []
    for name, (size, _) in expected.items():
        try:
            status = _regular_file_inside(path, name)
        except FileNotFoundError:
            raise _damaged(path, f"{name} is missing") from None
        if status.st_size != size:
            raise _damaged(
                path, f"{name} has {status.st_size} bytes, its manifest says {size} (truncated?)"
            )
        stamps.append((name, status.st_size, status.st_mtime_ns, status.st_ino))
    key = str(path.resolve())
    if _checked.get(key) == stamps:
        return
    for name, (_, want) in expected.items():
        crc = _crc32(path / name, whole=whole)
        if crc != want:
            raise _damaged(path, f"{name} fails its checksum (crc32 {crc}, manifest {want})")
    _checked[key] = stamps


def _regular_file_inside(entry: Path, name: str) -> os.stat_result:
    """The stat of ``name``, a regular file of ``entry`` itself: a manifest is
    data, and one naming ``../..``, ``/dev/zero``, a FIFO or a link to them
    (a planted entry) must not make jaxfeed read, or hang on, another file.

    Raises:
      FileNotFoundError: no such file.
      RuntimeError: anything but a regular file inside the entry.
    """
    parts = Path(name).parts
    if Path(name).is_absolute() or not parts or ".." in parts:
        raise _damaged(entry, f"{name} is not a regular file inside the entry")
    status = os.lstat(entry / name)  # a link is not followed: it is refused
    if not stat.S_ISREG(status.st_mode):
        raise _damaged(entry, f"{name} is not a regular file inside the entry")
    for folder in [*Path(name).parents][:-1]:  # (the last is ".", the entry: checked)
        _check_owner(entry / folder, (entry / folder).stat())
    _check_owner(entry / name, status)
    return status


# Entries whose checksums this process verified, with the file stamps seen then.
_checked: dict[str, list[tuple]] = {}


def _damaged(path: Path, problem: str) -> RuntimeError:
    return RuntimeError(
        f"cache entry {path} is damaged: {problem}. Delete that directory "
        f"(rm -r '{path}') and run again to rebuild it"
    )


def _crc32(file: Path, whole: bool = False) -> str:
    crc, size = 0, file.stat().st_size
    with open(file, "rb") as f:
        if whole or size <= _WHOLE_CRC_BYTES:
            while chunk := f.read(_READ_CHUNK):
                crc = zlib.crc32(chunk, crc)
            return f"{crc:08x}"
        last = size - _READ_CHUNK
        for offset in [*range(0, last, max(1, last // _SAMPLED_CHUNKS)), last]:
            f.seek(offset)
            crc = zlib.crc32(f.read(_READ_CHUNK), crc)
    return f"{crc:08x}"


def _write_manifest(directory: Path) -> None:
    """Records every file under ``directory`` (size and CRC-32) in its manifest."""
    files = {
        file.relative_to(directory).as_posix(): {
            "size": file.stat().st_size,
            "crc32": _crc32(file),
        }
        for file in sorted(directory.rglob("*"))
        if file.is_file()
    }
    manifest = {"format": _MANIFEST_FORMAT, "files": files}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")

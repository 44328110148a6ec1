"""Objects of a remote store, kept in a bounded local cache.

Each object is one entry, ``<key>/<its name>``, keyed by its URL and its
identity (ETag or generation, and size), so a changed object is a new entry
and an entry never changes once written. Entries are written as ``*.part``
beside the others and renamed into place once whole (a reader never sees half
an object). The cache keeps to ``max_bytes``: before an object is admitted,
the least recently used entries are removed until it fits, counting the
space objects in flight have reserved. Processes sharing the cache agree
through ``flock``s: one on ``.lock`` while the cache makes room, one per key
while its object is fetched (a second process waits, then finds it), and a
shared one on each entry a process has in use, which eviction skips (a live
run's files are never removed under it).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

__all__ = ["ObjectCache", "entry_key"]

_PINS: dict[str, int] = {}
"""Entries this process uses: path -> a descriptor holding a shared flock on
it, kept until the process ends (a source's workers reopen its files by path)."""


def entry_key(url: str, size: int, identity: str | None) -> str:
    """The cache key of one version of an object."""
    return hashlib.sha256(repr((url, size, identity)).encode()).hexdigest()[:32]


class ObjectCache:
    """A directory of whole objects, at most ``max_bytes`` of them (see the module)."""

    def __init__(self, root: Path, max_bytes: int):
        self.root, self.max_bytes = root, max_bytes
        root.mkdir(parents=True, exist_ok=True)

    def entry(
        self, key: str, name: str, size: int, fetch: Callable[[BinaryIO], None], keep: set[str]
    ) -> Path:
        """The path of the entry ``key`` (an object of ``size`` bytes named
        ``name``), fetched first when it is not there; pinned for this process.

        Args:
          fetch: writes the object's bytes into the file it is given.
          keep: keys that may not be evicted to make room (the same dataset's).

        Raises:
          ValueError: the object, with ``keep``'s entries, does not fit in
            ``max_bytes`` (naming both sizes and the setting).
        """
        path = self.root / key / name
        with _flock(self.root / f"{key}.lock", fcntl.LOCK_EX):
            if not _whole(path, size):
                self._make_room(key, size, keep)
                part = self.root / f"{key}.part"
                shutil.rmtree(part, ignore_errors=True)  # a dead fetch's, under our lock
                part.mkdir()
                try:
                    with open(part / name, "wb") as file:
                        if size:
                            os.posix_fallocate(file.fileno(), 0, size)  # reserved: others count it
                        fetch(file)
                        if file.tell() != size:  # never an entry shorter or longer than listed
                            raise ConnectionError(f"fetched {file.tell()} bytes of {size}")
                        file.flush()
                        os.fsync(file.fileno())
                except BaseException:
                    shutil.rmtree(part, ignore_errors=True)
                    raise
                shutil.rmtree(self.root / key, ignore_errors=True)
                os.rename(part, self.root / key)
            self._pin(path)
        os.utime(self.root / key)  # used now: the last to be evicted
        return path

    def _pin(self, path: Path) -> None:
        if str(path) in _PINS:
            return
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        fcntl.flock(fd, fcntl.LOCK_SH)
        _PINS[str(path)] = fd

    def _make_room(self, key: str, size: int, keep: set[str]) -> None:
        """Evicts least recently used entries until ``size`` more bytes fit."""
        if size > self.max_bytes:
            raise ValueError(_too_big(size, self.max_bytes, "this object"))
        with _flock(self.root / ".lock", fcntl.LOCK_EX):
            entries = []
            for path in self.root.iterdir():
                if path.name.startswith(".") or path.suffix == ".lock":
                    continue
                entries.append((path.stat().st_mtime_ns, path, _bytes(path)))
            total = sum(nbytes for *_, nbytes in entries)
            for _, path, nbytes in sorted(entries):
                if total + size <= self.max_bytes:
                    return
                name = path.name.removesuffix(".part")
                if name in keep or name == key or not _evictable(self.root, path):
                    continue
                shutil.rmtree(path, ignore_errors=True)
                total -= nbytes
            if total + size > self.max_bytes:
                raise ValueError(_too_big(total + size, self.max_bytes, "the objects in use"))


def _evictable(root: Path, path: Path) -> bool:
    """Whether no process holds ``path``: neither fetching it (its key's lock)
    nor using one of its files (a shared flock on it)."""
    key = path.name.removesuffix(".part")
    try:
        with _flock(root / f"{key}.lock", fcntl.LOCK_EX | fcntl.LOCK_NB):
            for file in path.iterdir():
                with _flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB, create=False):
                    pass
    except BlockingIOError:
        return False
    except FileNotFoundError:
        return True
    return True


@contextlib.contextmanager
def _flock(path: Path, how: int, create: bool = True) -> Iterator[None]:
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW if create else os.O_RDONLY | os.O_NOFOLLOW
    fd = os.open(path, flags, 0o600)
    try:
        fcntl.flock(fd, how)
        yield
    finally:
        os.close(fd)


def _whole(path: Path, size: int) -> bool:
    try:
        return path.stat().st_size == size
    except FileNotFoundError:
        return False


def _bytes(path: Path) -> int:
    with contextlib.suppress(FileNotFoundError):
        return sum(f.stat().st_size for f in path.iterdir())
    return 0


def _too_big(needed: int, limit: int, what: str) -> str:
    return (
        f"{what}: {needed:,} bytes of object cache, more than its bound of {limit:,} bytes; "
        "raise the bound with JAXFEED_CACHE_BYTES, or read fewer objects at once (one split's "
        "prefix)"
    )

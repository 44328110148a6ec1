"""Batches handed from worker processes to the reader as files in shared
memory (``/dev/shm``). The record pool's workers stack their records straight
into a mapped file, and its reader copies the batch out of its own mapping
of the file and hands the file back for a next batch (`Recycler`,
`reuse_or_allocate`): a few files go back and forth, each mapped once per
process, since a new file costs the kernel a zeroed page and a fault per 4
KiB on both sides, more than the copy a fresh mapping saves. Torch's workers
write a new file per batch (`write`), which the reader copies (`collect`).

An augmented batch is megabytes (128 x 56 x 56 x 3 float32 is 4.8 MB), and
pickled through a pipe it cost the reader more than the batch's own
transform in one worker: on digits-png with 2 cores, 2 workers gave 4,579
rows/s through the pipe and 8,864 through files (1 worker in this process:
6,361). Files in a directory of their own need no resource tracker, and
whatever a cancelled read or a killed worker leaves there goes with it. The
directory's owner holds a lock in it (`owner_lock`). A run killed outright
(SIGKILL, out of memory) removes nothing itself: its workers remove its
directory as they end with it (`removed_with_owner`), and the next run
removes what a run killed with its workers left in ``/dev/shm``.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import functools
import mmap
import os
import shutil
import tempfile
import uuid
from collections.abc import Mapping
from typing import NamedTuple, NoReturn

import numpy as np
from jaxfeed.loaders._io.owner_lock import owned_directory, remove_if_owner_gone
from jaxfeed.loaders._workers.spawn import at_parent_exit

__all__ = [
    "Handed",
    "Layout",
    "Recycler",
    "allocate",
    "collect",
    "forget",
    "layout_bytes",
    "make_directory",
    "remove_all",
    "removed_with_owner",
    "remove_directory",
    "reuse_or_allocate",
    "views",
    "write",
]

Layout = list[tuple[str, str, tuple[int, ...]]]
"""A batch file's fields in order: name, dtype, shape."""


class Handed(NamedTuple):
    """A batch a worker wrote to a file (`write`): what it hands back."""

    path: str
    layout: Layout


_PREFIX = "jaxfeed-batches-"
_HELD: dict[str, int] = {}  # directory -> the open lock file that says its owner lives


def make_directory(base: str | None = None) -> str:
    """A fresh directory in memory (``/dev/shm``), else in the temporary
    directory (or in ``base``), owned by this process through an ``flock`` on
    a file in it. Directories left by a run that died (even by SIGKILL) are
    removed first: the kernel freed their lock with their owner, whatever PID
    namespace it ran in."""
    shm = "/dev/shm"
    if base is None:
        base = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else tempfile.gettempdir()
    directory, handle = owned_directory(base, _PREFIX)
    _HELD[directory] = handle
    return directory


def remove_directory(directory: str) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    handle = _HELD.pop(directory, None)
    if handle is not None:
        os.close(handle)


def removed_with_owner(directory: str) -> None:
    """In a worker: ``directory``, its parent's, is removed when the worker
    ends with its parent (`spawn.exit_with_parent`) and the directory's owner
    is gone, so a parent killed outright does not leave its batches holding
    memory until the next run. Once per directory."""
    if directory not in _REMOVED_WITH_OWNER:
        _REMOVED_WITH_OWNER.add(directory)
        at_parent_exit(functools.partial(remove_if_owner_gone, directory))


_REMOVED_WITH_OWNER: set[str] = set()


def write(batch: Mapping[str, np.ndarray], directory: str) -> Handed:
    """In a worker: ``batch`` as a new file in ``directory``; the file and its layout.

    Raises:
      OSError: ENOSPC, naming the full file system, its size and the fixes
        (a container's default /dev/shm is 64 MiB).
    """
    path = os.path.join(directory, uuid.uuid4().hex)
    try:
        with open(path, "wb") as file:
            for array in batch.values():
                file.write(np.ascontiguousarray(array).data)
    except OSError as error:
        nbytes = sum(np.asarray(array).nbytes for array in batch.values())
        _unwritten(error, path, directory, nbytes)
    return Handed(path, [(key, array.dtype.str, array.shape) for key, array in batch.items()])


def allocate(directory: str, layout: Layout) -> tuple[Handed, dict[str, np.ndarray]]:
    """In a worker: a new file in ``directory`` of ``layout``'s size, mapped;
    what to hand back, and the arrays (one per field) to fill in place. The caller
    deletes the file if it fails to fill them.

    Raises:
      OSError: ENOSPC, as `write` does. The file's pages are reserved here,
        so a full file system is this error, never a SIGBUS at a store.
    """
    path = os.path.join(directory, uuid.uuid4().hex)
    nbytes = layout_bytes(layout)
    handle = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        if not nbytes:
            return Handed(path, layout), views(bytearray(0), layout)
        os.posix_fallocate(handle, 0, nbytes)
        data = _WRITING[path] = mmap.mmap(handle, nbytes, flags=mmap.MAP_SHARED | _POPULATE)
    except OSError as error:
        _unwritten(error, path, directory, nbytes)
    finally:
        os.close(handle)
    return Handed(path, layout), views(data, layout)


def collect(path: str, layout: Layout) -> dict[str, np.ndarray]:
    """The batch written to ``path`` (one copy, views of it per field); the file deleted."""
    data = np.fromfile(path, np.uint8)
    os.unlink(path)
    return views(data, layout)


class Recycler:
    """A reader's side of batch files that go back and forth: each batch is
    copied out of the file's mapping (made once per file), and the file is
    offered (`offer`) to the worker that writes a next batch, which maps it
    once too (`reuse_or_allocate`). A fresh file costs more than the copy it
    saves: the kernel zeroes and maps each new page, on both sides."""

    def __init__(self) -> None:
        self._forget()

    def _forget(self) -> None:
        self._pid = os.getpid()
        self._mapped: dict[str, mmap.mmap] = {}
        self._free: collections.deque[str] = collections.deque()

    def _own(self) -> None:
        """In a forked child: the parent's files are the parent's to offer and delete."""
        if self._pid != os.getpid():
            self._forget()

    def offer(self) -> str | None:
        """A file done with, for the next batch to be written into (or None)."""
        self._own()
        return self._free.popleft() if self._free else None

    def collect(self, handed: Handed, offered: str | None) -> dict[str, np.ndarray]:
        """The batch in ``handed`` (one copy), its file kept for another;
        ``offered``: the file its task was offered, dropped if not used."""
        self._own()
        if offered is not None and offered != handed.path:
            self.drop(offered)
        nbytes = layout_bytes(handed.layout)
        if not nbytes:  # nothing to map
            self.drop(handed.path)
            return views(bytearray(0), handed.layout)
        data = self._mapped.get(handed.path)
        if data is None:
            handle = os.open(handed.path, os.O_RDONLY)
            try:
                size = os.fstat(handle).st_size
                data = self._mapped[handed.path] = mmap.mmap(
                    handle, size, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ
                )
            finally:
                os.close(handle)
        copy = np.empty(nbytes, np.uint8)
        copy[:] = np.frombuffer(data, np.uint8, nbytes)
        self._free.append(handed.path)
        return views(copy, handed.layout)

    def drop(self, path: str) -> None:
        """Deletes ``path`` (a file this reader will not read again)."""
        self._mapped.pop(path, None)  # unmapped with its last view, not closed under one
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

    def close(self) -> None:
        """Deletes every file this reader keeps."""
        self._own()
        for path in [*self._mapped, *self._free]:
            self.drop(path)
        self._free.clear()


# In a worker: the batch files it writes into, each mapped once.
_WRITING: dict[str, mmap.mmap] = {}


def reuse_or_allocate(
    directory: str, offered: str | None, layout: Layout
) -> tuple[Handed, dict[str, np.ndarray]]:
    """In a worker: the ``offered`` file (a `Recycler`'s) to write a batch
    of ``layout`` into, if it is that size, else a new one (`allocate`); what
    to hand back and the arrays to fill. Files deleted since are forgotten."""
    for gone in [path for path in _WRITING if not os.path.exists(path)]:
        del _WRITING[gone]
    nbytes = layout_bytes(layout)
    if offered is not None and nbytes:
        data = _WRITING.get(offered)
        if data is None:
            with contextlib.suppress(FileNotFoundError):
                handle = os.open(offered, os.O_RDWR)
                try:
                    if os.fstat(handle).st_size == nbytes:
                        data = mmap.mmap(handle, nbytes, flags=mmap.MAP_SHARED | _POPULATE)
                        _WRITING[offered] = data
                finally:
                    os.close(handle)
        if data is not None and len(data) == nbytes:
            return Handed(offered, layout), views(data, layout)
    return allocate(directory, layout)


def forget(path: str) -> None:
    """In a worker: ``path`` deleted (a batch that failed), its mapping dropped."""
    _WRITING.pop(path, None)  # unmapped with its last view (a traceback may hold one)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


# Page tables filled at the map: one call, not a fault per 4 KiB page touched.
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


def layout_bytes(layout: Layout) -> int:
    """The bytes a batch of ``layout`` takes."""
    return sum(int(np.prod(shape)) * np.dtype(dtype).itemsize for _, dtype, shape in layout)


def views(data: mmap.mmap | bytearray | np.ndarray, layout: Layout) -> dict[str, np.ndarray]:
    """Each field of ``layout`` as an array over its bytes of ``data``, in order."""
    buffer = np.frombuffer(data, np.uint8)
    out, at = {}, 0
    for key, dtype, shape in layout:
        size = int(np.prod(shape)) * np.dtype(dtype).itemsize
        out[key] = buffer[at : at + size].view(dtype).reshape(shape)
        at += size
    return out


def _unwritten(error: OSError, path: str, directory: str, nbytes: int) -> NoReturn:
    """Raises ``error`` of a batch file not written, the file deleted; ENOSPC
    as an error that names the full file system, its size and the fixes (a
    container's default /dev/shm is 64 MiB)."""
    with contextlib.suppress(OSError):
        os.unlink(path)
    if error.errno != errno.ENOSPC:
        raise error
    total = shutil.disk_usage(directory).total
    raise OSError(
        errno.ENOSPC,
        f"no space left in {os.path.dirname(directory)} ({total / 2**20:.0f} MiB in all) "
        f"for a batch of {nbytes / 2**20:.1f} MiB from a worker: workers hand batches "
        "back through it. Give it more room (docker run --shm-size=2g, or a larger "
        "tmpfs), or use fewer workers or smaller batches",
    ) from error


def remove_all() -> None:
    """Removes every batch directory this process made (before a hard exit)."""
    for directory in list(_HELD):
        remove_directory(directory)

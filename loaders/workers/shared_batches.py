"""Batches handed from worker processes to the reader as files in shared
memory (``/dev/shm``): the worker writes the arrays once, the reader copies
them once and deletes the file.

An augmented batch is megabytes (128 x 56 x 56 x 3 float32 is 4.8 MB), and
pickled through a pipe it cost the reader more than the batch's own
transform in one worker: on digits-png with 2 cores, 2 workers gave 4,579
rows/s through the pipe and 8,864 through files (1 worker in this process:
6,361). Files in a directory of their own need no resource tracker, and
whatever a cancelled read or a killed worker leaves there goes with it. The
directory's owner holds a lock in it (`owner_lock`), so the next run removes what a run
that was killed outright (SIGKILL, out of memory) left in ``/dev/shm``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
import uuid
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np
from jaxfeed.loaders.workers.owner_lock import owned_directory

__all__ = [
    "Handed",
    "Layout",
    "collect",
    "make_directory",
    "remove_all",
    "remove_directory",
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
        if error.errno != errno.ENOSPC:
            raise
        with contextlib.suppress(OSError):
            os.unlink(path)
        nbytes = sum(np.asarray(array).nbytes for array in batch.values())
        total = shutil.disk_usage(directory).total
        raise OSError(
            errno.ENOSPC,
            f"no space left in {os.path.dirname(directory)} ({total / 2**20:.0f} MiB in all) "
            f"for a batch of {nbytes / 2**20:.1f} MiB from a worker: workers hand batches "
            "back through it. Give it more room (docker run --shm-size=2g, or a larger "
            "tmpfs), or use fewer workers or smaller batches",
        ) from error
    return Handed(path, [(key, array.dtype.str, array.shape) for key, array in batch.items()])


def collect(path: str, layout: Layout) -> dict[str, np.ndarray]:
    """The batch written to ``path`` (one copy, views of it per field); the file deleted."""
    data = np.fromfile(path, np.uint8)
    os.unlink(path)
    out, at = {}, 0
    for key, dtype, shape in layout:
        size = int(np.prod(shape)) * np.dtype(dtype).itemsize
        out[key] = data[at : at + size].view(dtype).reshape(shape)
        at += size
    return out


def remove_all() -> None:
    """Removes every batch directory this process made (before a hard exit)."""
    for directory in list(_HELD):
        remove_directory(directory)

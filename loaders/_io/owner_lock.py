"""Ownership by lock: a process owns something on the file system (a cache
build's scratch, a directory of handed batches) for as long as it holds an
exclusive ``flock`` on a lock file that goes with it. The kernel drops the lock
when the process dies, however it dies, so whether an owner lives is read from
its lock, on any host or in any PID namespace sharing the file system, never
guessed from a process id.

Names others look for are predictable, so anyone on the machine can plant
something there (a FIFO, whose open blocks for good; a symlink): a lock is
opened without following links or blocking, and only a regular file of this
user's counts as one; anything else is left alone."""

from __future__ import annotations

import fcntl
import glob
import os
import shutil
import stat
import tempfile
from collections.abc import Callable

__all__ = [
    "hold",
    "owned_directory",
    "owner_gone",
    "remove_dead_directories",
    "remove_if_owner_gone",
]


def hold(path: str | os.PathLike) -> int:
    """Creates the lock file ``path`` (it must not exist) and holds its lock;
    returns the open descriptor: closing it, or dying, lets go."""
    handle = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    fcntl.flock(handle, fcntl.LOCK_EX)
    return handle


def owner_gone(path: str | os.PathLike) -> bool:
    """Whether nobody holds the lock of ``path``: its owner died. False when it
    is held, and when there is no such file (gone already, or not a lock): a
    symlink, a FIFO or anything else not a regular file of this user's."""
    try:
        handle = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        if not _mine(os.fstat(handle), stat.S_ISREG):
            return False
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    finally:
        os.close(handle)
    return True


def _mine(status: os.stat_result, kind: Callable[[int], bool]) -> bool:
    """Whether ``status`` is of ``kind`` (``stat.S_ISREG``...) and this user's."""
    return kind(status.st_mode) and status.st_uid == os.geteuid()


_OWNER = ".owner.lock"  # in an owned directory: held by its owner for its life


def owned_directory(base: str | os.PathLike, prefix: str) -> tuple[str, int]:
    """A fresh directory ``base/<prefix><random>`` owned by this process: its
    lock file (in it) is held through the returned descriptor. Directories of
    ``prefix`` whose owner died (even by SIGKILL, in any PID namespace) are
    removed first."""
    remove_dead_directories(base, prefix)
    directory = tempfile.mkdtemp(prefix=prefix, dir=base)
    pending = os.path.join(directory, _OWNER + ".starting")  # not the lock anyone looks for
    handle = hold(pending)
    os.rename(pending, os.path.join(directory, _OWNER))  # found by others only once held
    return directory, handle


def remove_dead_directories(base: str | os.PathLike, prefix: str) -> list[str]:
    """Removes the directories ``base/<prefix>*`` whose owner is gone (their
    lock is free); a live one's, one without a lock file, and anything not a
    directory of this user's (a symlink, another user's) are left alone."""
    pattern = os.path.join(glob.escape(os.fspath(base)), glob.escape(prefix) + "*")
    return [directory for directory in glob.glob(pattern) if remove_if_owner_gone(directory)]


def remove_if_owner_gone(directory: str | os.PathLike) -> bool:
    """Removes ``directory`` (an `owned_directory`) if its owner is gone;
    whether it did. A live owner's, one without a lock file, and anything
    not a directory of this user's are left alone."""
    try:
        if not _mine(os.lstat(directory), stat.S_ISDIR):
            return False
    except OSError:
        return False
    if not owner_gone(os.path.join(directory, _OWNER)):
        return False
    # Again if need be: a dead owner's worker may add a file while it goes.
    for _ in range(3):
        shutil.rmtree(directory, ignore_errors=True)
        if not os.path.lexists(directory):
            break
    return True

"""Ownership by lock: a process owns something on the file system (a cache
build's scratch, a directory of handed batches) for as long as it holds an
exclusive ``flock`` on a lock file that goes with it. The kernel drops the lock
when the process dies, however it dies, so whether an owner lives is read from
its lock, on any host or in any PID namespace sharing the file system, never
guessed from a process id."""

from __future__ import annotations

import fcntl
import os

__all__ = ["hold", "owner_gone"]


def hold(path: str | os.PathLike) -> int:
    """Creates the lock file ``path`` (it must not exist) and holds its lock;
    returns the open descriptor: closing it, or dying, lets go."""
    handle = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    fcntl.flock(handle, fcntl.LOCK_EX)
    return handle


def owner_gone(path: str | os.PathLike) -> bool:
    """Whether nobody holds the lock of ``path``: its owner died. False when it
    is held, and when there is no such file (gone already, or not a lock)."""
    try:
        handle = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    finally:
        os.close(handle)
    return True

"""Shared-memory segments that carry their owner's name, for worker processes
a library starts itself (Grain's): a run killed outright leaves nothing the
next run cannot prove dead and remove.

Grain's workers hand batches back in ``multiprocessing.shared_memory``
segments (``/dev/shm/psm_<random>``), which nothing ties to a run. In the
workers this module starts (`worker_init`) every new segment is named
``psm_jaxfeed-<tag>-<random>``, where ``<tag>`` is this process's: it holds an
``flock`` on ``/dev/shm/jaxfeed-segments-<tag>.lock`` for its life
(`owner_lock`). The kernel drops that lock when the process dies, however it
dies, so the next run removes the segments of a tag whose lock is free, and
never another live run's, nor any segment named otherwise. The workers also
end with their parent (`spawn.exit_with_parent`), so a killed run's segments
stop growing, and the resource tracker, which then sees every holder gone,
unlinks those it knows of; the sweep covers a tracker killed with the run
(a whole process group or container killed at once).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import secrets
from collections.abc import Callable

from jaxfeed.loaders._io.owner_lock import hold, owner_gone
from jaxfeed.loaders._workers.spawn import exit_with_parent

__all__ = ["SEGMENT_PREFIX", "owner_tag", "remove_dead_segments", "worker_init"]

SHM = "/dev/shm"
SEGMENT_PREFIX = "psm_jaxfeed-"  # then "<tag>-<random>"
_LOCK_PREFIX = "jaxfeed-segments-"  # then "<tag>.lock"
_TAG_BYTES = 6
# Only a name this module writes: a planted "jaxfeed-segments-*.lock" must not
# read as a tag that every run's segments match.
_LOCK_NAME = re.compile(rf"{re.escape(_LOCK_PREFIX)}([0-9a-f]{{{2 * _TAG_BYTES}}})\.lock")
_tag: str | None = None
_held: int | None = None  # the open lock file that says this process's tag lives


def _lock_path(tag: str) -> str:
    return os.path.join(SHM, f"{_LOCK_PREFIX}{tag}.lock")


def owner_tag() -> str | None:
    """This process's tag, held for its life; made (after removing what dead
    runs left) the first time. None where there is no writable ``/dev/shm``."""
    global _tag, _held
    if _tag is not None:
        return _tag
    if not (os.path.isdir(SHM) and os.access(SHM, os.W_OK)):
        return None
    remove_dead_segments()
    tag = secrets.token_hex(_TAG_BYTES)
    pending = os.path.join(SHM, f".{_LOCK_PREFIX}{tag}.starting")  # nobody looks for it
    _held = hold(pending)
    os.rename(pending, _lock_path(tag))  # found by others only once it is held
    _tag = tag
    return tag


def remove_dead_segments() -> list[str]:
    """Unlinks the segments of every tag whose owner is gone (its lock is
    free), then the lock; returns the segments removed. A live owner's
    segments, and segments not named by this module, are left alone."""
    removed = []
    names = os.listdir(SHM)
    for name in names:
        found = _LOCK_NAME.fullmatch(name)
        lock = os.path.join(SHM, name)
        if found is None or not owner_gone(lock):
            continue
        ours = f"{SEGMENT_PREFIX}{found[1]}-"
        for segment in [os.path.join(SHM, n) for n in names if n.startswith(ours)]:
            # Another user's, planted under a dead tag of ours: not ours to remove.
            with contextlib.suppress(FileNotFoundError, PermissionError):
                os.unlink(segment)
                removed.append(segment)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock)
    return removed


def _init_worker(tag: str | None, parent: int, *_worker: int) -> None:
    """In a worker (Grain calls it with its index and count): ends it with
    ``parent``, and names its segments after ``tag``."""
    exit_with_parent(parent)
    if tag is not None:
        from jaxfeed.loaders._doors.multiprocessing import name_shared_memory

        name_shared_memory(f"{SEGMENT_PREFIX}{tag}-")


def worker_init() -> Callable[..., None]:
    """A picklable worker init function for workers this process starts
    through a library (Grain's ``mp_prefetch(worker_init_fn=...)``)."""
    return functools.partial(_init_worker, owner_tag(), os.getpid())

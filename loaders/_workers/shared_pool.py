"""One set of transform worker processes per job, shared by every `RecordPool`
of this process with the same worker count and start context.

Spawned workers take seconds to start (each imports the reader, the
transform and their libraries; 1.8 s for two on a quiet 2-core machine, 8-11
s loaded, see docs/data.md), so a train and a validation loader with
``num_workers=2`` start one pair, not two. Each source's work (its reader and
transform) is pickled once to a file in the pool's batch directory; a worker
loads it at that source's first batch it runs and keeps it until the file is
gone (the source closed). Every task names its source's file, so a worker
serving two sources never applies one's work to the other's rows.

The pool ends (workers gone, batch directory removed) when its last user
leaves: `Member.close`, garbage collection or exit. A pool whose worker
died is an error for the batches in flight (`RecordPool` checks) and is
replaced for the next user.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import os
import pickle
import tempfile
import threading
import uuid
from typing import Any

import numpy as np
from jaxfeed.loaders._doors.multiprocessing import pool_broken, pool_processes
from jaxfeed.loaders._workers import shared_batches
from jaxfeed.loaders._workers.spawn import SPAWN, SPAWN_WITHOUT_MAIN

__all__ = ["Member", "join", "live_pools"]

_LOCK = threading.Lock()
_POOLS: dict[tuple[int, bool], _Pool] = {}  # (workers, with the main script) -> pool


class _Pool:
    """A process pool, its batch directory and how many members use it."""

    def __init__(self, num_workers: int, with_main: bool):
        self.directory = shared_batches.make_directory()
        self.executor = concurrent.futures.ProcessPoolExecutor(
            num_workers,
            mp_context=SPAWN if with_main else SPAWN_WITHOUT_MAIN,
            initializer=_start,
            initargs=(self.directory,),
        )
        self.members = 0
        self.spill: str | None = None  # for work that shared memory has no room for

    def write_work(self, work: tuple[Any, ...]) -> str:
        """``work`` pickled to a new file of the batch directory; one in the
        temporary directory if shared memory is full (a container's default
        /dev/shm is 64 MiB, and an in-memory dataset travels in its reader)."""
        data = pickle.dumps(work, protocol=pickle.HIGHEST_PROTOCOL)
        name = f"work-{uuid.uuid4().hex}"
        path = os.path.join(self.directory, name)
        try:
            _write(path, data)
        except OSError as error:
            if error.errno != errno.ENOSPC:
                raise
            with _LOCK:
                if self.spill is None:
                    self.spill = shared_batches.make_directory(tempfile.gettempdir())
            path = os.path.join(self.spill, name)
            _write(path, data)
        return path

    def dead(self) -> bool:
        """Whether a worker ended (none does while the pool serves)."""
        return pool_broken(self.executor) or any(
            process.exitcode is not None for process in pool_processes(self.executor)
        )

    def stop(self) -> None:
        self.executor.shutdown(cancel_futures=True)
        shared_batches.remove_directory(self.directory)
        if self.spill is not None:
            shared_batches.remove_directory(self.spill)


class Member:
    """One source's use of a shared pool: its work file and its place in the count."""

    def __init__(self, pool: _Pool, key: tuple[int, bool], work: tuple[Any, ...]):
        self._pool, self._key = pool, key
        self.executor = pool.executor
        self.work = ""
        try:
            self.work = pool.write_work(work)
        except BaseException:
            self.close()
            raise
        self._closed = False

    def dead(self) -> bool:
        return self._pool.dead()

    def submit(
        self, indices: np.ndarray, epoch: int, offered: str | None = None
    ) -> concurrent.futures.Future:
        """The future of one batch, written into ``offered`` (a batch file
        read and done with) when it fits."""
        return self.executor.submit(_batch, self.work, indices, epoch, offered)

    def close(self) -> None:
        """Leaves the pool (its workers drop this work); the last member stops it."""
        if getattr(self, "_closed", False):
            return
        self._closed = True
        if self.work:
            with contextlib.suppress(OSError):
                os.unlink(self.work)
        with _LOCK:
            self._pool.members -= 1
            last = self._pool.members == 0
            if last and _POOLS.get(self._key) is self._pool:
                del _POOLS[self._key]
        if last:
            self._pool.stop()


def join(work: tuple[Any, ...], num_workers: int, with_main: bool) -> Member:
    """A member of this process's pool of ``num_workers`` workers (started with
    the main script if ``with_main``), made if there is none or its worker died,
    serving ``work`` (a reader and a transform, pickled here once)."""
    key = (num_workers, with_main)
    with _LOCK:
        pool = _POOLS.get(key)
        if pool is None or pool.dead():
            pool = _POOLS[key] = _Pool(num_workers, with_main)
        pool.members += 1
    return Member(pool, key, work)


def _write(path: str, data: bytes) -> None:
    try:
        with open(path, "wb") as file:
            file.write(data)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise


def live_pools() -> int:
    """How many shared pools this process holds now."""
    with _LOCK:
        return len(_POOLS)


def _forget_in_child() -> None:
    """In a forked child: the parent's pools are not its own (their manager
    threads did not come along); its loaders start pools of their own."""
    global _LOCK
    _LOCK = threading.Lock()
    _POOLS.clear()


os.register_at_fork(after_in_child=_forget_in_child)


# In a worker: the batch directory, and each source's work by its file.
_DIRECTORY: str | None = None
_WORKS: dict[str, tuple[Any, ...]] = {}


def _start(directory: str) -> None:
    global _DIRECTORY
    _DIRECTORY = directory
    shared_batches.removed_with_owner(directory)


def _batch(
    work: str, indices: np.ndarray, epoch: int, offered: str | None
) -> shared_batches.Handed:
    """In a worker: one batch of the source whose work is in the file
    ``work``, stacked straight into a batch file (``offered``, one the reader
    is done with, when it fits) and handed back (`shared_batches`)."""
    for closed in [path for path in _WORKS if path != work and not os.path.exists(path)]:
        del _WORKS[closed]  # its source closed: bounded by the sources open
    if work not in _WORKS:
        shared_batches.removed_with_owner(os.path.dirname(work))  # (the spill directory's too)
        with open(work, "rb") as file:
            _WORKS[work] = pickle.load(file)
    read, transform = _WORKS[work]
    rows = read(indices)
    n = len(indices)
    layout = [(key, dtype.str, (n, *shape)) for key, (shape, dtype) in transform.spec.items()]
    handed, arrays = shared_batches.reuse_or_allocate(_DIRECTORY, offered, layout)
    try:
        transform.batch(rows, indices, epoch, out=arrays)
    except BaseException:
        shared_batches.forget(handed.path)
        raise
    return handed

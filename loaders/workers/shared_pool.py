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
import os
import pickle
import threading
import uuid
from typing import Any

import numpy as np
from jaxfeed.loaders.frameworks.multiprocessing import pool_broken, pool_processes
from jaxfeed.loaders.workers import shared_batches
from jaxfeed.loaders.workers.spawn import SPAWN, SPAWN_WITHOUT_MAIN

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

    def dead(self) -> bool:
        """Whether a worker ended (none does while the pool serves)."""
        return pool_broken(self.executor) or any(
            process.exitcode is not None for process in pool_processes(self.executor)
        )

    def stop(self) -> None:
        self.executor.shutdown(cancel_futures=True)
        shared_batches.remove_directory(self.directory)


class Member:
    """One source's use of a shared pool: its work file and its place in the count."""

    def __init__(self, pool: _Pool, key: tuple[int, bool], work: tuple[Any, ...]):
        self._pool, self._key = pool, key
        self.executor = pool.executor
        self.work = os.path.join(pool.directory, f"work-{uuid.uuid4().hex}")
        try:
            with open(self.work, "wb") as file:
                pickle.dump(work, file, protocol=pickle.HIGHEST_PROTOCOL)
        except BaseException:
            self.close()
            raise
        self._closed = False

    def dead(self) -> bool:
        return self._pool.dead()

    def submit(self, indices: np.ndarray, epoch: int) -> concurrent.futures.Future:
        return self.executor.submit(_batch, self.work, indices, epoch)

    def close(self) -> None:
        """Leaves the pool (its workers drop this work); the last member stops it."""
        if getattr(self, "_closed", False):
            return
        self._closed = True
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


def live_pools() -> int:
    """How many shared pools this process holds now."""
    with _LOCK:
        return len(_POOLS)


# In a worker: the batch directory, and each source's work by its file.
_DIRECTORY: str | None = None
_WORKS: dict[str, tuple[Any, ...]] = {}


def _start(directory: str) -> None:
    global _DIRECTORY
    _DIRECTORY = directory


def _batch(work: str, indices: np.ndarray, epoch: int) -> shared_batches.Handed:
    """In a worker: one batch of the source whose work is in the file
    ``work``, handed back as a file (`shared_batches`)."""
    for closed in [path for path in _WORKS if path != work and not os.path.exists(path)]:
        del _WORKS[closed]  # its source closed: bounded by the sources open
    if work not in _WORKS:
        with open(work, "rb") as file:
            _WORKS[work] = pickle.load(file)
    read, transform = _WORKS[work]
    return shared_batches.write(transform.batch(read(indices), indices, epoch), _DIRECTORY)

"""Worker processes that read and transform batches, in order: the numpy and
hf backends' ``num_workers`` (torch, Grain and tf.data bring their own).

Processes, not threads: a per-record transform is Python (decode calls,
crops, flips) and holds the GIL for much of each record (measured on
digits-png, see docs/data.md). A finished batch comes back as a file in
shared memory (`jaxfeed.loaders._workers.shared_batches`), not through a pipe.
The processes are this process's shared pool for that worker count
(`jaxfeed.loaders._workers.shared_pool`): a train and a validation loader
start one set, not two.
"""

from __future__ import annotations

import collections
import concurrent.futures
import concurrent.futures.process
import signal
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from jaxfeed.loaders._doors.multiprocessing import pool_processes
from jaxfeed.loaders._workers import shared_batches, shared_pool
from jaxfeed.loaders._workers.main_script import from_main
from jaxfeed.loaders._workers.spawn import raise_if_dead
from jaxfeed.loaders.transform import RecordTransform

__all__ = ["RecordPool", "RowReader"]

# How often a reader waiting for a batch checks that the workers still run.
_POLL_SECONDS = 0.1
# How long a broken pool's workers are given to end, to name the one that died.
_SETTLE_SECONDS = 5.0

RowReader = Callable[[np.ndarray], Mapping[str, Any]]
"""Index array -> each field's values of those rows (picklable into workers)."""


class RecordPool:
    """``num_workers`` spawned processes, started at the first batch and kept
    for every epoch after, each reading and transforming whole batches; the
    same processes serve every other pool of this process with that many
    workers (`shared_pool`), each batch with its own pool's reader and transform.

    Batches come back in order, with ``2 * num_workers`` in flight. A worker
    that dies (also while it starts) is an error within a fraction of a
    second; one that raises passes its error (a `TransformError` naming the
    row) through. The workers skip the main script (its JAX imports) unless
    the transform comes from it.
    """

    def __init__(self, read: RowReader, transform: RecordTransform, num_workers: int):
        transform.check_picklable(f"num_workers={num_workers}")
        self._work = (read, transform)
        self.num_workers = num_workers
        self._member: shared_pool.Member | None = None
        self._stop: weakref.finalize | None = None
        self._files = shared_batches.Recycler()  # batch files kept for the next batches

    def batches(self, index_batches: Sequence[np.ndarray], epoch: int) -> Iterator[dict]:
        if self._member is not None and self._member.dead():
            self.close()  # told as an error to the epoch it killed: new workers now
        if self._member is None:
            self._member = shared_pool.join(self._work, self.num_workers, from_main(*self._work))
            # Also at garbage collection and exit: the last member stops the workers.
            self._stop = weakref.finalize(self, _leave, self._member, self._files)
        pending: collections.deque = collections.deque()  # (future, the file it was offered)
        try:
            for indices in index_batches:
                offered = self._files.offer()
                try:
                    pending.append((self._member.submit(indices, epoch, offered), offered))
                except concurrent.futures.process.BrokenProcessPool:
                    self._raise_if_dead(settle=True)  # a worker died since: name it
                    raise
                if len(pending) >= 2 * self.num_workers:
                    yield self._collect(*pending.popleft())
            while pending:
                yield self._collect(*pending.popleft())
        finally:
            for future, offered in pending:  # closed early: drop what no one will read
                if not future.cancel() and not future.exception():
                    self._files.drop(future.result().path)
                if offered is not None:
                    self._files.drop(offered)

    def _collect(self, future: concurrent.futures.Future, offered: str | None) -> dict:
        try:
            handed = self._result(future)
        except BaseException:
            if offered is not None:
                self._files.drop(offered)  # the worker deleted it, or will not use it
            raise
        return self._files.collect(handed, offered)

    @property
    def _pool(self) -> concurrent.futures.ProcessPoolExecutor | None:
        """The shared executor this pool's batches run on, while it has one."""
        return None if self._member is None else self._member.executor

    def _result(self, future: concurrent.futures.Future) -> Any:
        """The future's result, the workers checked with every one: a worker
        that died while it started leaves the executor waiting for good
        (Python 3.11), and one killed while idle left the others to finish the
        epoch without a word (seen under load), so a death is an error here."""
        while True:
            try:
                result = future.result(timeout=_POLL_SECONDS)
            except concurrent.futures.TimeoutError:
                result = None
            except concurrent.futures.process.BrokenProcessPool:
                self._raise_if_dead(settle=True)  # every loader on the pool: name the worker
                raise
            self._raise_if_dead()
            if result is not None:
                return result

    def _raise_if_dead(self, settle: bool = False) -> None:
        """Raises naming a worker that died. ``settle``: the pool broke, so all
        its workers are ending; each is waited for (bounded), as the executor
        fails the futures the moment it sees one gone, maybe before the dead
        one can be reaped (seen under load)."""
        processes = pool_processes(self._pool)
        if settle:
            deadline = time.monotonic() + _SETTLE_SECONDS
            # The executor's thread reaps them too: a waitpid that loses that race
            # reads "running" for an instant, so each is asked until it answers.
            while any(p.exitcode is None for p in processes) and time.monotonic() < deadline:
                for process in processes:
                    process.join(min(0.05, max(0.0, deadline - time.monotonic())))
            # The executor ends the others with SIGTERM once one died: name that one.
            processes.sort(key=lambda process: process.exitcode == -signal.SIGTERM)
        raise_if_dead(processes, "transform worker", "smaller batches")

    def close(self) -> None:
        """Leaves the shared workers (stopped if no other pool uses them); the
        next batch joins them again, or starts new ones."""
        self._member = None
        if self._stop is not None:
            self._stop()


def _leave(member: shared_pool.Member, files: shared_batches.Recycler) -> None:
    """Deletes the batch files kept for reuse, then leaves the shared pool."""
    files.close()
    member.close()

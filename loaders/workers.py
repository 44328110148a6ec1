"""Worker processes that leave Ctrl-C to the process that started them.

A terminal sends Ctrl-C (SIGINT) to its whole process group, loader workers
included. A worker killed by it while it starts or between batches leaves the
main process waiting for a batch that never comes (or failing on a "worker
exited unexpectedly"), where the main process had stopped at a step, saved a
checkpoint and was about to close its workers in order. Workers started
through `SPAWN`, or by a library inside `children_ignore_sigint()`, ignore
SIGINT for life: the signal is ignored in the parent only for the instant
the child is forked and executed (an ignored disposition survives both, and
Python then installs no handler of its own), so the parent still sees the
user's Ctrl-C.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import threading
from collections.abc import Iterator
from multiprocessing import util
from multiprocessing.context import SpawnContext, SpawnProcess
from typing import Any


class _Sigaction(ctypes.Structure):
    """glibc's ``struct sigaction`` (Linux; x86-64 and arm64 lay it out alike)."""

    _fields_ = (
        ("handler", ctypes.c_void_p),
        ("mask", ctypes.c_ulong * (1024 // (8 * ctypes.sizeof(ctypes.c_ulong)))),
        ("flags", ctypes.c_int),
        ("restorer", ctypes.c_void_p),
    )


def _libc_sigaction() -> Any:
    try:
        return ctypes.CDLL(None, use_errno=True).sigaction
    except (OSError, AttributeError):
        return None


_SIGACTION = _libc_sigaction()
_LAUNCHING = threading.Lock()


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """SIGINT ignored, process-wide, from any thread: through libc, since
    Python's `signal.signal` works in the main thread only (Grain starts its
    workers from a thread of its own). Python's own handler is put back
    exactly as it was, flags included."""
    if _SIGACTION is None:  # not glibc: nothing to protect the workers with
        yield
        return
    ignore, previous = _Sigaction(), _Sigaction()
    ignore.handler = 1  # SIG_IGN
    # One at a time: two threads' interleaved save/restore would leave it ignored.
    with _LAUNCHING:
        if _SIGACTION(signal.SIGINT, ctypes.byref(ignore), ctypes.byref(previous)) != 0:
            yield
            return
        try:
            yield
        finally:
            _SIGACTION(signal.SIGINT, ctypes.byref(previous), None)


@contextlib.contextmanager
def children_ignore_sigint() -> Iterator[None]:
    """Processes spawned inside (by any library and thread, with Python's spawn
    start method) ignore SIGINT for life; this process ignores it only while
    each child is forked and executed, milliseconds.

    Python 3.11-3.13's spawn starts the child with multiprocessing.util's
    ``spawnv_passfds``, then sends it the pickled process object, which can
    take seconds (the child imports what it unpickles): only the first is
    wrapped, while this context is open.
    """
    launch = util.spawnv_passfds

    def launch_ignoring_sigint(*args: Any) -> int:
        with _sigint_ignored():
            return launch(*args)

    util.spawnv_passfds = launch_ignoring_sigint
    try:
        yield
    finally:
        util.spawnv_passfds = launch


class _SigintIgnoringProcess(SpawnProcess):
    def start(self) -> None:
        with children_ignore_sigint():
            super().start()


class _SigintIgnoringSpawn(SpawnContext):
    Process = _SigintIgnoringProcess


SPAWN = _SigintIgnoringSpawn()
"""A spawn ``multiprocessing`` context whose processes ignore the terminal's Ctrl-C."""

"""Worker processes that leave Ctrl-C and SIGTERM to the process that started them.

A terminal sends Ctrl-C (SIGINT) to its whole process group, loader workers
included, and a machine that shuts down (preemption) sends SIGTERM to every
process. A worker killed by either while it starts or between batches leaves
the main process waiting for a batch that never comes (spawn's parent blocks
for good writing the new worker's pickled state into a pipe nobody reads), or
failing on a "worker exited unexpectedly", where the main process had
stopped at a step, saved a checkpoint and was about to close its workers in
order. Workers started through `SPAWN`, or by a library inside
`children_ignore_stop_signals()`, ignore both for life: the signals are
ignored in the parent only for the instant the child is forked and executed
(an ignored disposition survives both, and Python then installs no handler
of its own), so the parent still sees them. `SPAWN`'s processes (torch's
workers) then take SIGTERM from their parent only, so a loader's
``terminate()`` still ends them. The main process closes its workers itself;
past its timeout Grain kills its workers (SIGKILL).

Their children leave as forked ones do (``os._exit`` once their work and
atexit hooks are done): spawn's own exit finalizes the interpreter, which
aborts a child whose daemon thread is still in C++ code.

`SPAWN_WITHOUT_MAIN`'s processes also skip what spawn does first in every
child: run the parent's main script again (its imports: JAX, a model
library, seconds per worker). Only for workers whose every input is known
not to come from that script (`jaxfeed.loaders.workers.main_script` tells).
`reported_start` says once what starting
spawned workers cost.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Generator, Iterable, Iterator
from multiprocessing import spawn, util
from multiprocessing.context import SpawnContext, SpawnProcess
from typing import Any, TypeVar

from jaxfeed.loaders.frameworks.multiprocessing import run_exit_hooks

T = TypeVar("T")


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
# What the workers leave to their parent.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def _stop_signals_ignored() -> Iterator[None]:
    """SIGINT and SIGTERM ignored, process-wide, from any thread: through libc,
    since Python's `signal.signal` works in the main thread only (Grain starts
    its workers from a thread of its own). Python's own handlers are put back
    exactly as they were, flags included."""
    if _SIGACTION is None:  # not glibc: nothing to protect the workers with
        yield
        return
    ignore = _Sigaction()
    ignore.handler = 1  # SIG_IGN
    # One at a time: two threads' interleaved save/restore would leave them ignored.
    with _LAUNCHING:
        previous = {}
        try:
            for signum in STOP_SIGNALS:
                action = _Sigaction()
                if _SIGACTION(signum, ctypes.byref(ignore), ctypes.byref(action)) == 0:
                    previous[signum] = action
            yield
        finally:
            for signum, action in previous.items():
                _SIGACTION(signum, ctypes.byref(action), None)


@contextlib.contextmanager
def children_ignore_stop_signals() -> Iterator[None]:
    """Processes spawned inside (by any library and thread, with Python's spawn
    start method) ignore SIGINT and SIGTERM for life; this process ignores them
    only while each child is forked and executed, milliseconds.

    Python 3.11-3.13's spawn starts the child with multiprocessing.util's
    ``spawnv_passfds``, then sends it the pickled process object, which can
    take seconds (the child imports what it unpickles): only the first is
    wrapped, while this context is open.
    """
    launch = util.spawnv_passfds

    def launch_ignoring_stop_signals(*args: Any) -> int:
        # Blocked too in the launching thread, so in the child's every thread:
        # a thread started before `_sigterm_only_from_parent` runs (an import's)
        # must not take a SIGTERM once the child stops ignoring it.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            with _stop_signals_ignored():
                return launch(*args)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    util.spawnv_passfds = launch_ignoring_stop_signals
    try:
        yield
    finally:
        util.spawnv_passfds = launch


def _sigterm_only_from_parent() -> None:
    """In a child's main thread: SIGTERM ends it when its parent sends it (a
    loader's shutdown calls ``terminate()``), and not when the whole group or
    machine gets it. A signal's sender is only known to ``sigwaitinfo``: the
    signal is blocked in every thread (from the launch on) and a waiting
    thread takes it. (Left ignored, a terminated worker would live on, and
    the parent's exit would wait for it in multiprocessing's join.)"""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # an ignored signal is discarded, even blocked

    def wait() -> None:
        while True:
            sender = signal.sigwaitinfo({signal.SIGTERM}).si_pid
            if sender == os.getppid():
                os._exit(0)  # as torch's own worker handler does for its parent's SIGTERM

    threading.Thread(target=wait, name="jaxfeed-sigterm-from-parent", daemon=True).start()


def exit_with_parent(parent: int | None = None) -> None:
    """In a child: ends it once its parent (``parent``, a pid; default: the
    parent it has now) is gone, however the parent died (SIGKILL, out of
    memory), instead of living on with its batches. A thread that watches who
    the parent is, not ``PR_SET_PDEATHSIG``: that signal follows the *thread*
    that started the child, and a loader's workers are started by whichever
    thread reads first."""
    if parent is None:
        parent = os.getppid()  # (1, or a subreaper, if the parent is already gone)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_PARENT_POLL_SECONDS)
        os._exit(0)

    threading.Thread(target=watch, name="jaxfeed-parent-watch", daemon=True).start()


_PARENT_POLL_SECONDS = 0.5


class _StopSignalsIgnoringProcess(SpawnProcess):
    def start(self) -> None:
        # Sent with the process: a child still starting when its parent is
        # killed would otherwise take its new parent (init) for the one to watch.
        self._jaxfeed_parent = os.getpid()
        with children_ignore_stop_signals():
            super().start()

    def run(self) -> None:  # in the child
        _sigterm_only_from_parent()
        exit_with_parent(self._jaxfeed_parent)
        super().run()

    def _bootstrap(self, *args: Any, **kwargs: Any) -> int:  # in the child
        code = super()._bootstrap(*args, **kwargs)  # (joins threads, runs finalizers, flushes)
        # Then leave as a forked child does: with os._exit, after the atexit hooks.
        # Spawn's own exit finalizes the interpreter, which stops a daemon thread
        # still at work (a queue's feeder pickling a torch tensor) by unwinding
        # it out of C++ code that must not throw: SIGABRT, "terminate called
        # without an active exception", and a worker its parent reports killed.
        run_exit_hooks()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


class _StopSignalsIgnoringSpawn(SpawnContext):
    Process = _StopSignalsIgnoringProcess


SPAWN = _StopSignalsIgnoringSpawn()
"""A spawn ``multiprocessing`` context whose processes leave SIGINT and SIGTERM to their parent."""


_STARTING = threading.local()  # .without_main: this thread starts a `SPAWN_WITHOUT_MAIN` child
_PREPARATION_DATA = spawn.get_preparation_data


def _preparation_data(name: str) -> dict[str, Any]:
    """What a spawned child sets up before it unpickles its process object;
    without the parent's main module (``init_main_from_*``) for a child
    started by this thread through `SPAWN_WITHOUT_MAIN`."""
    data = _PREPARATION_DATA(name)
    if getattr(_STARTING, "without_main", False):
        data.pop("init_main_from_name", None)
        data.pop("init_main_from_path", None)
    return data


class _MainlessProcess(_StopSignalsIgnoringProcess):
    def start(self) -> None:
        # Python 3.11-3.13's spawn Popen asks spawn.get_preparation_data, in the
        # starting thread, what the child prepares. Installed once and left in
        # place: it changes nothing for a child this flag (this thread's) is not set for.
        spawn.get_preparation_data = _preparation_data
        _STARTING.without_main = True
        try:
            super().start()
        finally:
            _STARTING.without_main = False


class _MainlessSpawn(_StopSignalsIgnoringSpawn):
    Process = _MainlessProcess


SPAWN_WITHOUT_MAIN = _MainlessSpawn()
"""`SPAWN`, its processes not running the parent's main script first.

For workers whose inputs (process arguments, and all that reaches them later
through queues) unpickle without it: nothing defined in the main script, and
no side effect of running it needed (a codec it registers belongs in the
dataset's module or a ``worker_init_fn``)."""


def start_method(context: Any) -> str:
    """The start method of a ``multiprocessing`` context; for None, of
    multiprocessing's default (left unset if it is)."""
    if context is not None:
        return context.get_start_method()
    method = multiprocessing.get_start_method(allow_none=True)
    return method or multiprocessing.get_all_start_methods()[0]


def reported_start(
    batches: Generator[T, None, None],
    what: str,
    context: Any,
    persistent: bool,
    since: float | None = None,
) -> Iterator[T]:
    """``batches``, the first of which waits for ``what`` ("2 torch workers")
    to start with ``context``; when they are spawned (not forked), that wait
    is printed to stderr: seconds, paid once by ``persistent`` workers, else
    by every epoch (so the line says so).

    Args:
      since: when the workers began to start (`time.perf_counter`); default:
        when the first batch is asked for.
    """
    method = start_method(context)
    if method == "fork":  # milliseconds: nothing to say
        yield from batches
        return
    with contextlib.closing(batches):  # closed early: closes ``batches`` now
        began = time.perf_counter() if since is None else since
        for batch in batches:
            if began is not None:
                seconds, began = time.perf_counter() - began, None
                again = "once: they serve every epoch" if persistent else "again every epoch"
                print(
                    f"jaxfeed: starting {what} ({method}): {seconds:.1f} s ({again})",
                    file=sys.stderr,
                    flush=True,
                )
            yield batch


def raise_if_dead(processes: Iterable[multiprocessing.Process], what: str, lighter: str) -> None:
    """Raises if one of ``processes`` (``what``: "DataLoader worker") has died;
    exit code 0 is its owner stopping it. ``lighter`` names a second way to
    use less memory, for a SIGKILL.

    Raises:
      RuntimeError: naming the process, how it ended and what to try.
    """
    for process in processes:
        code = process.exitcode  # a waitpid(WNOHANG), which also reaps a dead one
        if not code:
            continue
        hint = "see the worker's output above"
        if code > 0:
            how = f"exited with code {code}"
        elif code == -signal.SIGKILL:
            how = "was killed by signal SIGKILL"
            hint = (
                "SIGKILL often means the system ran out of memory (see `dmesg`): "
                f"try fewer num_workers or {lighter}"
            )
        else:
            try:
                how = f"was killed by signal {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        raise RuntimeError(
            f"{what} (pid {process.pid}) {how} while batches were being read, "
            f"so this epoch cannot complete; {hint}"
        )


def kill_children() -> None:
    """Kills (SIGKILL) and reaps every worker process this process started
    through ``multiprocessing`` (jaxfeed's, torch's and Grain's), for a process
    about to leave through ``os._exit``, which runs no ``close()`` and no exit
    hook: its workers would live on, with their shared memory and its output
    pipe. At once, not SIGTERM first: Grain's ignore it, and a process that
    leaves after a lost peer has moments before JAX aborts it."""
    children = multiprocessing.active_children()
    for child in children:
        with contextlib.suppress(OSError):
            child.kill()
    for child in children:
        child.join(1)

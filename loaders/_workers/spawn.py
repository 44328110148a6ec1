"""Worker processes that leave Ctrl-C and SIGTERM to the process that started them.

A terminal sends Ctrl-C (SIGINT) to its whole process group, loader workers
included, and a machine that shuts down (preemption) sends SIGTERM to every
process. A worker killed by either while it starts or between batches leaves
the main process waiting for a batch that never comes (spawn's parent blocks
for good writing the new worker's pickled state into a pipe nobody reads), or
failing on a "worker exited unexpectedly", where the main process had
stopped at a step, saved a checkpoint and was about to close its workers in
order. Workers started through `SPAWN`, or by a library inside
`children_ignore_stop_signals`, ignore both for life: the thread that forks
one blocks them for that instant, so the child starts with them blocked, and
ignores them before it unblocks them. The parent, its other threads and the
processes they start still see them. `SPAWN`'s processes (torch's
workers) then take SIGTERM from their parent only, so a loader's
``terminate()`` still ends them. The main process closes its workers itself;
past its timeout Grain kills its workers (SIGKILL).

Their children leave as forked ones do (``os._exit`` once their work and
atexit hooks are done): spawn's own exit finalizes the interpreter, which
aborts a child whose daemon thread is still in C++ code.

`SPAWN_WITHOUT_MAIN`'s processes also skip what spawn does first in every
child: run the parent's main script again (its imports: JAX, a model
library, seconds per worker). Only for workers whose every input is known
not to come from that script (`jaxfeed.loaders._workers.main_script` tells).
`reported_start` says once what starting
spawned workers cost.
"""

from __future__ import annotations

import collections
import contextlib
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator
from multiprocessing.context import SpawnContext, SpawnProcess
from typing import Any, TypeVar

from jaxfeed.loaders._doors import multiprocessing as multiprocessing_door
from jaxfeed.loaders._doors.multiprocessing import AroundBootstrap, run_exit_hooks

T = TypeVar("T")


# What the workers leave to their parent.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _Launching(threading.local):
    process: Any = None  # the process object this thread is launching


_LAUNCHING = _Launching()
# Open `children_ignore_stop_signals` contexts, by library.
_IGNORING_LIBRARIES: collections.Counter[str] = collections.Counter()
_HOOKS = threading.Lock()
_HOOKED = False


def _ignores_stop_signals(process: Any) -> bool:
    """Whether ``process`` (being launched) is to ignore SIGINT and SIGTERM:
    jaxfeed's own, or one whose target is code of a library a
    `children_ignore_stop_signals` context is open for."""
    if isinstance(process, _StopSignalsIgnoringProcess):
        return True
    module = getattr(multiprocessing_door.process_target(process), "__module__", None) or ""
    return _IGNORING_LIBRARIES[module.partition(".")[0]] > 0  # (a Counter: 0 if absent)


def _forking(fork: Callable[[], int]) -> int:
    """multiprocessing's fork and exec of a spawned child. For one that is to
    ignore the stop signals, they are blocked in this thread only (a signal
    mask is a thread's, and a child starts with the mask of the thread that
    forked it): from its first instruction they wait, pending, until the child
    ignores them, which discards them. Not ignored process-wide: a subprocess
    another thread starts at that instant would inherit the ignore, and be a
    command Ctrl-C cannot stop."""
    if not _ignores_stop_signals(_LAUNCHING.process):
        return fork()
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        return fork()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _launching(process: Any, launch: Callable[[], None]) -> None:
    """spawn's launch of ``process``, which this thread's hooks here see."""
    _LAUNCHING.process = process
    try:
        launch()
    finally:
        _LAUNCHING.process = None


def _launching_without_main() -> bool:
    """Whether this thread launches a `SPAWN_WITHOUT_MAIN` child, which then
    sets up without the parent's main module."""
    return isinstance(_LAUNCHING.process, _MainlessProcess)


def _hook_spawn() -> None:
    """Installs the hooks above into Python 3.11-3.13's spawn, once: they
    change nothing for a process that is not jaxfeed's or an open context's."""
    global _HOOKED
    if _HOOKED:  # (every batch a Grain reader reads opens a context)
        return
    with _HOOKS:
        if not _HOOKED:
            multiprocessing_door.around_spawn_launch(_launching)
            multiprocessing_door.around_spawn_fork(_forking)
            multiprocessing_door.spawn_without_main_when(_launching_without_main)
            _HOOKED = True


@contextlib.contextmanager
def children_ignore_stop_signals(library: str) -> Iterator[None]:
    """Processes that ``library`` ("grain": the top-level package of their
    target function) spawns while this is open, from any thread, ignore
    SIGINT and SIGTERM for life: they start with both blocked (see
    `_forking`), and nothing in them unblocks them. Other processes,
    and this one, are not affected."""
    _hook_spawn()
    with _HOOKS:
        _IGNORING_LIBRARIES[library] += 1
    try:
        yield
    finally:
        with _HOOKS:
            _IGNORING_LIBRARIES[library] -= 1


def _ignore_stop_signals() -> None:
    """In a jaxfeed child's main thread, first: SIGINT and SIGTERM ignored
    (which discards any that came while it started, blocked), and SIGINT
    unblocked again."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


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
        for hook in _AT_PARENT_EXIT:
            with contextlib.suppress(Exception):  # the next hook, and the exit, still come
                hook()
        os._exit(0)

    threading.Thread(target=watch, name="jaxfeed-parent-watch", daemon=True).start()


_PARENT_POLL_SECONDS = 0.5
_AT_PARENT_EXIT: list[Callable[[], None]] = []


def at_parent_exit(hook: Callable[[], None]) -> None:
    """In a child: runs ``hook`` when `exit_with_parent` sees the parent gone,
    before the child ends: to undo what a parent killed outright could not."""
    _AT_PARENT_EXIT.append(hook)


class _StopSignalsIgnoringProcess(AroundBootstrap, SpawnProcess):
    def start(self) -> None:
        # Sent with the process: a child still starting when its parent is
        # killed would otherwise take its new parent (init) for the one to watch.
        self._jaxfeed_parent = os.getpid()
        _hook_spawn()
        super().start()

    def run(self) -> None:  # in the child
        _sigterm_only_from_parent()
        exit_with_parent(self._jaxfeed_parent)
        super().run()

    def around_bootstrap(self, bootstrap: Callable[[], int]) -> int:  # in the child
        _ignore_stop_signals()
        code = bootstrap()  # (joins threads, runs finalizers, flushes)
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


class _MainlessProcess(_StopSignalsIgnoringProcess):
    """Launched without the parent's main module (see `_launching_without_main`)."""


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
    by every epoch (so the line says so, and names ``persistent_workers=True``).

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
                again = "once: they serve every epoch"
                if not persistent:  # the start is paid again each epoch: name the fix
                    again = "again every epoch; persistent_workers=True starts them once"
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

"""Joining a multi-process (multi-host) JAX job, also on CPUs over loopback."""

from __future__ import annotations

import contextlib
import math
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator
from typing import NoReturn

import jax
from jaxfeed.loaders._doors.jax import distributed_state
from jaxfeed.loaders._workers.hard_exit import end_workers_and_batches
from jaxfeed.sharding.job.roll_call import (
    OnSilent,
    RollCall,
    claim_id,
    left_processes,
    roll_call_port,
    say_bye,
)

# Our own names first, then the ones JAX's launcher documentation uses.
_ENV = {
    "coordinator": ("JAXFEED_COORDINATOR", "JAX_COORDINATOR_ADDRESS"),
    "num_processes": ("JAXFEED_NUM_PROCESSES", "JAX_NUM_PROCESSES"),
    "process_id": ("JAXFEED_PROCESS_ID", "JAX_PROCESS_ID"),
}
PEER_TIMEOUT_ENV = "JAXFEED_PEER_TIMEOUT"
DEFAULT_PEER_TIMEOUT_S = 60.0
# JAX's connect deadline runs this much longer than ours, so that our message,
# which names the processes to check, comes before JAX aborts with "another task died".
_JAX_GRACE_S = 10
# The job's peer timeout, set by initialize(); check_agreement() waits as long.
_job_timeout_s: float | None = None
# How often the pause watch wakes, and the longest time it saw this process not run.
_PAUSE_TICK_S = 0.5
_longest_pause_s = 0.0
# Process 0's roll call, where the others hold their ids.
_roll_call: RollCall | None = None
# How long process 0, leaving a broken job, waits for the others to leave first.
_STOP_WAIT_S = 10.0
# Taken by the first thread that leaves the job: one line per process.
_leaving = threading.Lock()


def _from_env(name: str) -> str | None:
    for variable in _ENV[name]:
        if os.environ.get(variable):
            return os.environ[variable]
    return None


def peer_timeout(timeout_s: float | str | None = None) -> float:
    """Seconds to wait for another process: ``timeout_s``, else the job's (given to
    :func:`initialize`), else ``$JAXFEED_PEER_TIMEOUT``, else 60.

    Raises:
      ValueError: not a finite number of seconds > 0.
    """
    # The job's timeout was checked when given: a bad one not passed here is the variable's.
    source = "timeout_s" if timeout_s is not None else f"${PEER_TIMEOUT_ENV}"
    if timeout_s is None:
        timeout_s = _job_timeout_s or os.environ.get(PEER_TIMEOUT_ENV) or DEFAULT_PEER_TIMEOUT_S
    try:
        value = float(timeout_s)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ValueError(
            f"peer timeout must be a finite number of seconds > 0, got {source}={timeout_s!r}"
        )
    return value


def current_job() -> tuple[object, int, int] | None:
    """JAX's coordination-service client, this process's id and the process count,
    or None when no job was joined.

    JAX (0.10.2) has no public handle on the client; its multihost_utils reads the
    same fields. The ids come from here, not jax.process_index(): that would start
    the backends, which wait for every process's devices, a dead one's too.
    """
    state = distributed_state()
    if state.client is None:
        return None
    return state.client, state.process_id, state.num_processes


def _reachable(coordinator: str) -> bool:
    host, _, port = coordinator.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=2):
            return True
    except OSError:
        return False


def _join_failure(coordinator: str, num_processes: int, process_id: int, waited: float) -> str:
    """What to tell a process that could not join: who is missing and what to check."""
    same = (
        f"that every process 0..{num_processes - 1} was started, each with its own "
        f"process_id, and with num_processes={num_processes} and coordinator={coordinator}"
    )
    if process_id == 0:
        others = list(range(1, num_processes))
        who = (
            f"process {others[0]}"
            if len(others) == 1
            else f"one or more of processes {', '.join(map(str, others))}"
        )
        return (
            f"process 0 waited {waited:g} s at {coordinator} for the other processes; "
            f"{who} did not join. Check {same}, and that this address is "
            f"reachable from their hosts"
        )
    if not _reachable(coordinator):
        return (
            f"process {process_id} waited {waited:g} s for process 0, the coordinator at "
            f"{coordinator}, which does not answer. Check that process 0 was started, "
            f"with this address, and that its host and port are reachable from here"
        )
    return (
        f"process {process_id} reached the coordinator at {coordinator}, but not all "
        f"{num_processes} processes joined within {waited:g} s; check {same}"
    )


def exit_now(status: int) -> NoReturn:
    """Ends this process at once, skipping JAX's shutdown barrier at exit.

    Once a peer is gone or silent, that barrier would wait for it until JAX's
    heartbeat timeout and then abort the interpreter. ``os._exit`` runs no
    ``close()`` and no exit hook, so the worker processes are killed first and
    this process's batch directories removed: none outlives it with its shared
    memory and its output. (Fast: JAX aborts a process whose coordinator is gone
    within moments.)
    """
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        # Leaving on purpose: the others are not to take this process for lost.
        say_bye()
        if _roll_call is not None:
            _roll_call.bye()
        end_workers_and_batches()
    except BaseException:  # leaving anyway (torch's SIGCHLD handler may raise here)
        pass
    finally:
        os._exit(status)


def lost_processes(wait_s: float = 0.0) -> dict[int, str]:
    """The processes lost to this job, gone without a word (id -> "pid P on HOST"): as process 0's
    roll call saw their connections close, or as it told this process; waits up
    to ``wait_s`` for a first one."""
    if _roll_call is not None:
        return _roll_call.left(wait_s)
    return left_processes(wait_s)


def leave_job(message: str, lost: Collection[int] = ()) -> NoReturn:
    """Prints ``jaxfeed: error: {message}`` (nothing for "") and ends this process
    with status 2 through :func:`exit_now`.

    Process 0 first tells the others, but the ``lost`` processes, to leave with
    the same message, and waits (up to 10 s) until they have: its coordination
    service goes with it, and JAX aborts a process that polls it then, with a
    C++ stack in place of this message."""
    if not _leaving.acquire(blocking=False):  # another thread is leaving: it says why
        threading.Event().wait()
    if message:
        print(f"jaxfeed: error: {message}", file=sys.stderr, flush=True)
    if _roll_call is not None and message:  # "": process 0 was paused; the others left
        _roll_call.stop(message, lost, _STOP_WAIT_S)
    exit_now(2)


@contextlib.contextmanager
def _join_deadline(message: Callable[[], str], timeout_s: float) -> Iterator[None]:
    """Ends the process with ``message()`` if the block is still running after ``timeout_s``.

    JAX's connect blocks in C++ and cannot be interrupted from Python; when its own
    deadline passes it aborts the interpreter with a message that blames a dead
    task. So a timer thread reports first and exits with status 2.
    """

    def give_up() -> None:
        print(f"jaxfeed: error: {message()}", file=sys.stderr)
        exit_now(2)

    timer = threading.Timer(timeout_s, give_up)
    timer.name, timer.daemon = "jaxfeed-join-deadline", True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _check_port_free(host: str, port: int) -> None:
    """Refuses a coordinator address that something already answers on. JAX's
    service binds with SO_REUSEPORT, so a second job's coordinator would share
    the port with a running job's and take over its connections."""
    try:
        with socket.create_connection((host, port), timeout=2):
            pass
    except OSError:
        return  # nothing answers: free
    raise ValueError(
        f"the coordinator address {host}:{port} is in use (something answers there: "
        f"another job?); start this job on a free port, all its processes alike"
    )


def initialize(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    timeout_s: float | None = None,
) -> bool:
    """Joins a multi-process job, or does nothing for a single process.

    Call it before anything else touches jax devices. Unset arguments are
    read from ``JAXFEED_COORDINATOR`` / ``JAXFEED_NUM_PROCESSES`` /
    ``JAXFEED_PROCESS_ID`` (or JAX's ``JAX_COORDINATOR_ADDRESS`` /
    ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID``). CPU collectives use gloo, so
    the same command runs on several CPU processes on one machine.

    If not every process joins within ``timeout_s``, this process prints which
    processes are missing and what to check, and exits with status 2 (JAX's
    connect cannot be interrupted). A process silent for 3/4 of the timeout
    (stopped, hung, its host gone) is named by the others, which then exit
    with status 2 (the roll call's heartbeat); JAX's own heartbeat timeout,
    after which it aborts every process, is twice the timeout. The timeout
    also bounds the shutdown barrier at exit.

    Args:
      coordinator: ``HOST:PORT`` of process 0's coordinator service.
      num_processes: processes in the job.
      process_id: this process, in ``[0, num_processes)``.
      timeout_s: seconds to wait for the other processes; None:
        ``$JAXFEED_PEER_TIMEOUT``, else 60.

    Returns:
      True if a multi-process job was joined, False for a single process.

    Raises:
      ValueError: some but not all of the three are given, they are
        inconsistent, or the timeout is not a positive number.

    Example:
      >>> # on each of 2 hosts, with process_id 0 and 1:
      >>> sharding.initialize("10.0.0.1:1234", num_processes=2, process_id=0)
    """
    global _job_timeout_s, _roll_call
    coordinator = coordinator or _from_env("coordinator")
    num_processes = num_processes if num_processes is not None else _from_env("num_processes")
    process_id = process_id if process_id is not None else _from_env("process_id")
    given = {"coordinator": coordinator, "num_processes": num_processes, "process_id": process_id}
    if all(v is None for v in given.values()):
        return False
    missing = [k for k, v in given.items() if v is None]
    if missing:
        raise ValueError(
            f"multi-process run needs coordinator, num_processes and process_id; missing "
            f"{missing} (got {given}). Pass coordinator=HOST:PORT, num_processes=N and "
            f"process_id=I, or set JAXFEED_COORDINATOR etc."
        )
    num_processes, process_id = int(num_processes), int(process_id)
    coordinator = str(coordinator)
    host, _, port = coordinator.rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(
            f"coordinator={coordinator!r} is not HOST:PORT with a port in [1, 65535]; "
            f"give process 0's address, e.g. 10.0.0.1:1234"
        )
    if num_processes < 1 or not 0 <= process_id < num_processes:
        raise ValueError(
            f"process_id={process_id} is not in [0, {num_processes}) for "
            f"num_processes={num_processes}; "
            f"number the processes 0..{max(num_processes, 1) - 1}"
        )
    timeout = peer_timeout(timeout_s)
    if process_id == 0:
        _check_port_free(host, int(port))
        _roll_call = RollCall(
            roll_call_port(int(port)),
            num_processes,
            silent_after_s=_silent_after(timeout),
            on_silent=_peer_silent(process_id, timeout),
        )
    # Cross-process collectives on CPU need an implementation; gloo ships with jaxlib.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    seconds = math.ceil(timeout)
    with _join_deadline(
        lambda: _join_failure(coordinator, num_processes, process_id, timeout), timeout
    ):
        if process_id != 0:  # before JAX registers this process with the coordinator
            roll_call = (host.strip("[]"), roll_call_port(int(port)))
            claim_id(
                *roll_call,
                process_id,
                num_processes,
                time.monotonic() + timeout,
                silent_after_s=_silent_after(timeout),
                on_silent=_peer_silent(process_id, timeout),
                on_stop=_stopped(timeout),
            )
        jax.distributed.initialize(
            coordinator_address=coordinator,
            num_processes=num_processes,
            process_id=process_id,
            initialization_timeout=seconds + _JAX_GRACE_S,
            # A process that stops answering (hung, or its host gone) aborts the job
            # after this (JAX's default is 100 s, and 300 s at shutdown). JAX may
            # count from a heartbeat half its timeout old, and then aborts every
            # process naming none: twice ours, so the roll call's watch names the
            # silent process first (at 3/4 of ours).
            heartbeat_timeout_seconds=2 * seconds,
            shutdown_timeout_seconds=seconds,
        )
    _job_timeout_s = timeout
    threading.Thread(target=_watch_pauses, name="jaxfeed-pause-watch", daemon=True).start()
    return True


def _silent_after(timeout: float) -> float:
    """When the roll call's watch gives up on a silent process: before JAX's
    heartbeat timeout (``timeout``) runs out and JAX aborts every process."""
    return 0.75 * timeout


def _peer_silent(me: int, timeout: float) -> OnSilent:
    def report(process_id: int, holder: str, seconds: float, closed: bool) -> None:
        if _longest_pause_s >= _silent_after(timeout):
            return  # this process itself was stopped: the pause watch says so
        ago = f" {seconds:.0f} s ago" if seconds >= 1 else ""
        why = (
            f"is gone: its connection to process {me} closed{ago} without a goodbye, so "
            f"it was killed, ran out of memory or crashed"
            if closed
            else f"has not answered process {me} for {seconds:.0f} s: it is stopped "
            f"(SIGSTOP or Ctrl-Z), hung, or its host is suspended or unreachable"
        )
        leave_job(
            f"process {process_id} ({holder}) {why}. The job cannot go on without it (JAX "
            f"would abort every process after the peer timeout of {timeout:g} s); check "
            f"that process, then restart every process (resuming from the last checkpoint)",
            lost=[process_id],
        )

    return report


def _stopped(timeout: float) -> Callable[[str], None]:
    """What a process does when process 0 ends the job: says process 0's reason and leaves."""

    def stop(message: str) -> None:
        if _longest_pause_s >= _silent_after(timeout):
            message = ""  # this process itself was stopped: the pause watch says so
        leave_job(message)

    return stop


def _watch_pauses() -> None:
    """Records the longest stretch this process did not run: stopped (SIGSTOP,
    Ctrl-Z), its VM suspended, or starved of CPU. The monotonic clock runs on
    meanwhile, so a thread that wakes every tick sees the gap.

    A pause past the peer timeout is reported the moment the process runs again:
    the others have given up on it, and JAX may abort this process (its
    coordination service reports "stopped sending heartbeats") before any Python
    error could say which process is to blame."""
    global _longest_pause_s
    last = time.monotonic()
    while True:
        time.sleep(_PAUSE_TICK_S)
        now = time.monotonic()
        pause, timeout = now - last - _PAUSE_TICK_S, peer_timeout()
        if pause >= timeout > _longest_pause_s:  # the first such pause
            sys.stderr.write(
                f"jaxfeed: error: process {jax.process_index()} itself was paused for "
                f"{pause:.0f} s (stopped with SIGSTOP or Ctrl-Z, its machine suspended, or "
                f"starved of CPU), longer than the peer timeout of {timeout:g} s, so "
                f"the other processes gave up on it and the job stopped. Restart every "
                f"process (resuming from the last checkpoint)\n"
            )
            sys.stderr.flush()
        _longest_pause_s = max(_longest_pause_s, pause)
        last = now


def paused_too_long() -> bool:
    """Whether this process of a joined job was once paused for longer than the
    peer timeout (and said so on stderr). The other processes hear no heartbeat
    from a paused one and give up on it: then this process is to blame."""
    return _longest_pause_s >= peer_timeout()

"""Process 0's roll call: each process claims its id before it meets JAX's coordinator.

A second job started on a running job's ``--coordinator`` would otherwise harm the
first: its process 1 registers with the running job's coordination service as a
new incarnation of that job's process 1, and the service aborts every process of
the running job. JAX's connect offers no check before that registration, so
process 0 also listens on the coordinator's port + 1, where every other process
claims its id first. An id is held while its process lives (its connection stays
open), so a second claim is refused by name and the running job never sees it.

The held connections also carry a heartbeat both ways (a byte every
`BEAT_S`), so each process knows when another has gone silent: a stopped
(SIGSTOP, Ctrl-Z) or hung process, or an unreachable host. JAX's own
heartbeats find it too, but then abort every process with a C++ stack that
names no process; the roll call's watch names it (process id, pid, host)
first, through ``on_silent``.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable

# How often each side of a held claim says it is alive.
BEAT_S = 0.5

OnSilent = Callable[[int, str, float], None]
"""Called once with a silent process's id, its holder ("pid P on HOST") and
the seconds it has been silent."""


class _Silence:
    """Who was last heard when; calls ``on_silent`` for the first process not
    heard for ``after_s`` seconds while this process ran. A gap in this
    process's own running (it was stopped, or starved of CPU) blames nobody:
    everyone counts as just heard."""

    def __init__(self, after_s: float, on_silent: OnSilent) -> None:
        self._after_s, self._on_silent = after_s, on_silent
        self._heard: dict[int, tuple[float, str]] = {}  # process id -> (when, holder)
        self._lock = threading.Lock()
        threading.Thread(target=self._watch, name="jaxfeed-peer-watch", daemon=True).start()

    def heard(self, process_id: int, holder: str) -> None:
        with self._lock:
            self._heard[process_id] = (time.monotonic(), holder)

    def gone(self, process_id: int) -> None:
        """``process_id`` closed its connection: it exited, which is no silence."""
        with self._lock:
            self._heard.pop(process_id, None)

    def _watch(self) -> None:
        last = time.monotonic()
        while True:
            time.sleep(BEAT_S)
            now = time.monotonic()
            with self._lock:
                if now - last > 4 * BEAT_S:  # this process did not run meanwhile
                    self._heard = {k: (now, holder) for k, (_, holder) in self._heard.items()}
                silent = [
                    (process_id, holder, now - when)
                    for process_id, (when, holder) in sorted(self._heard.items())
                    if now - when > self._after_s
                ]
            last = now
            if silent:
                self._on_silent(*silent[0])
                return


# Claims and answers are one JSON line each.
_MAX_LINE = 4096


def roll_call_port(coordinator_port: int) -> int:
    """Where process 0 takes the roll call: the port after the coordinator's."""
    return coordinator_port + 1


class RollCall:
    """Process 0's side: a daemon thread that answers claims until the process exits."""

    def __init__(
        self,
        port: int,
        num_processes: int,
        *,
        silent_after_s: float | None = None,
        on_silent: OnSilent | None = None,
    ) -> None:
        """Takes the roll call on ``port``; with ``on_silent``, calls it when a
        process that holds its id is silent for ``silent_after_s`` seconds."""
        self._num_processes = num_processes
        self._silence = None
        if on_silent is not None and silent_after_s is not None:
            self._silence = _Silence(silent_after_s, on_silent)
        self._holders: dict[int, str] = {}  # process id -> "pid P on HOST"
        self._lock = threading.Lock()
        try:
            family = socket.AF_INET6 if socket.has_dualstack_ipv6() else socket.AF_INET
            self._server = socket.create_server(
                ("", port), family=family, dualstack_ipv6=family == socket.AF_INET6
            )
        except OSError as err:
            raise ValueError(
                f"port {port} (the coordinator's port + 1, where process 0 takes the job's "
                f"roll call) is in use: {err.strerror}. Start the job with another port "
                f"in coordinator=HOST:PORT, all its processes alike"
            ) from None
        threading.Thread(target=self._serve, name="jaxfeed-roll-call", daemon=True).start()

    def _serve(self) -> None:
        while True:
            connection, _ = self._server.accept()
            threading.Thread(
                target=self._answer, args=(connection,), name="jaxfeed-roll-call-claim", daemon=True
            ).start()

    def _answer(self, connection: socket.socket) -> None:
        with connection:
            try:
                claim = json.loads(connection.makefile("rb").readline(_MAX_LINE))
                me, count, holder = claim["process_id"], claim["num_processes"], claim["holder"]
            except (OSError, ValueError, KeyError, TypeError):
                return  # not one of ours (a port scan, a health check): nothing to hold
            error = self._claim(me, count, holder)
            try:
                answer = {"error": error, "holder": _holder()}
                connection.sendall(json.dumps(answer).encode() + b"\n")
                if error is None:
                    self._hold(connection, me, holder)  # until the claimant exits (EOF)
            except OSError:
                pass
            finally:
                if error is None:
                    with self._lock:
                        del self._holders[me]
                    if self._silence is not None:
                        self._silence.gone(me)

    def _hold(self, connection: socket.socket, me: int, holder: str) -> None:
        """Answers the claimant's heartbeats, noting each, until it closes."""
        while True:
            if self._silence is not None:
                self._silence.heard(me, holder)
            if not connection.recv(64):
                return
            connection.sendall(b".")

    def _claim(self, me: int, count: int, holder: str) -> str | None:
        if count != self._num_processes:
            return (
                f"the job at this coordinator has {self._num_processes} processes, this "
                f"process was started with num_processes={count}: another job? Start each "
                f"job on its own port in coordinator=HOST:PORT"
            )
        with self._lock:
            if me in self._holders:
                return (
                    f"process {me} of the job at this coordinator is already running "
                    f"({self._holders[me]}): is this a second job on the same "
                    f"coordinator=HOST:PORT? "
                    f"Start it on a free port, all its processes alike"
                )
            self._holders[me] = holder
        return None


# A granted claim's connection, kept open for the life of this process.
_held: socket.socket | None = None


def _holder() -> str:
    return f"pid {os.getpid()} on {socket.gethostname()}"


def claim_id(
    host: str,
    port: int,
    process_id: int,
    num_processes: int,
    deadline: float,
    *,
    silent_after_s: float | None = None,
    on_silent: OnSilent | None = None,
) -> socket.socket | None:
    """Claims ``process_id`` at process 0's roll call, retrying until process 0
    answers or ``time.monotonic()`` passes ``deadline`` (then the caller's join
    deadline reports who is missing).

    Once granted, the connection carries this process's heartbeat, and with
    ``on_silent``, process 0's is watched: it is called when process 0 is
    silent for ``silent_after_s`` seconds.

    Returns:
      The connection that holds the claim (kept open until this process exits;
      closing it frees the id), or None if process 0 never answered.

    Raises:
      ValueError: process 0 refused the claim (the id is taken, or another
        process count): this process belongs to no job there.
    """
    global _held
    claim = {
        "process_id": process_id,
        "num_processes": num_processes,
        "holder": _holder(),
    }
    while True:
        try:
            connection = socket.create_connection((host, port), timeout=5)
        except OSError:
            if time.monotonic() > deadline:
                return None
            time.sleep(0.2)  # process 0 is not up yet
            continue
        try:
            connection.sendall(json.dumps(claim).encode() + b"\n")
            answer = json.loads(connection.makefile("rb").readline(_MAX_LINE))
        except (OSError, ValueError):
            connection.close()
            time.sleep(0.2)  # process 0 went away mid-answer: try again until the deadline
            continue
        if answer.get("error"):
            connection.close()
            raise ValueError(f"process {process_id} cannot join: {answer['error']}")
        # Bounded waits, so the heartbeat threads see a close by the caller.
        connection.settimeout(1.0)
        _held = connection
        silence = None
        if on_silent is not None and silent_after_s is not None:
            silence = _Silence(silent_after_s, on_silent)
            silence.heard(0, str(answer.get("holder", "unknown")))
        threading.Thread(
            target=_beat, args=(connection,), name="jaxfeed-heartbeat", daemon=True
        ).start()
        threading.Thread(
            target=_listen,
            args=(connection, silence, str(answer.get("holder"))),
            name="jaxfeed-heartbeat-listen",
            daemon=True,
        ).start()
        return connection


def _beat(connection: socket.socket) -> None:
    """Says this process is alive, every `BEAT_S`, until the connection closes."""
    while True:
        try:
            connection.sendall(b".")
        except OSError:
            return
        time.sleep(BEAT_S)


def _listen(connection: socket.socket, silence: _Silence | None, holder: str) -> None:
    """Notes process 0's answers to the heartbeat, until it closes (exits)."""
    while True:
        try:
            if not connection.recv(64):
                break
        except TimeoutError:
            continue
        except OSError:  # closed here, or reset
            break
        if silence is not None:
            silence.heard(0, holder)
    if silence is not None:
        silence.gone(0)

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

Process 0 also tells the others, on the same connections, which process left
(its connection closed: killed, crashed, or done), and that the job is over
(`RollCall.stop`): its leaving would end JAX's coordination service, and JAX
aborts every other process that polls it, with a C++ stack that names no one.
So process 0 leaves last, and each process can name the one that was lost.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Collection

# How often each side of a held claim says it is alive.
BEAT_S = 0.5

OnSilent = Callable[[int, str, float, bool], None]
"""Called once with a silent process's id, its holder ("pid P on HOST"), the
seconds it has been silent, and whether its connection closed (it is gone:
killed or crashed) rather than went quiet (stopped or hung)."""

OnStop = Callable[[str], None]
"""Called once, in a claimant, with process 0's message when it ends the job."""


class _Silence:
    """Who was last heard when; calls ``on_silent`` for the first process not
    heard for ``after_s`` seconds while this process ran. A gap in this
    process's own running (it was stopped, or starved of CPU) blames nobody:
    everyone counts as just heard.

    A process whose connection closed without a goodbye (`BYE`) is never heard
    again: it too is reported after ``after_s``, not at once, so that an error
    its loss raises in this process (a collective that fails, a timeout of
    `check_agreement`) can say so first."""

    def __init__(self, after_s: float, on_silent: OnSilent) -> None:
        self._after_s, self._on_silent = after_s, on_silent
        self._heard: dict[int, tuple[float, str]] = {}  # process id -> (when, holder)
        self._closed: set[int] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._watch, name="jaxfeed-peer-watch", daemon=True).start()

    def heard(self, process_id: int, holder: str) -> None:
        with self._lock:
            self._heard[process_id] = (time.monotonic(), holder)

    def gone(self, process_id: int) -> None:
        """``process_id`` said goodbye and closed its connection: it exited, which
        is no silence."""
        with self._lock:
            self._heard.pop(process_id, None)

    def closed(self, process_id: int, at_once: bool = False) -> None:
        """``process_id`` closed its connection without a goodbye: it is silent from
        now on, or, ``at_once``, reported now."""
        with self._lock:
            self._closed.add(process_id)
            when, holder = self._heard.get(process_id, (time.monotonic(), "unknown"))
        if at_once:
            self._on_silent(process_id, holder, time.monotonic() - when, True)

    def _watch(self) -> None:
        last = time.monotonic()
        while True:
            time.sleep(BEAT_S)
            now = time.monotonic()
            with self._lock:
                if now - last > 4 * BEAT_S:  # this process did not run meanwhile
                    self._heard = {k: (now, holder) for k, (_, holder) in self._heard.items()}
                silent = [
                    (process_id, holder, now - when, process_id in self._closed)
                    for process_id, (when, holder) in sorted(self._heard.items())
                    if now - when > self._after_s
                ]
            last = now
            if silent:
                self._on_silent(*silent[0])
                return


# Claims and answers are one JSON line each.
_MAX_LINE = 4096
# What a claimant sends before it closes its connection on a deliberate exit
# (process 0 sends {"bye": true}): any other close is a process lost.
BYE = b"!"


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
        self._lines: dict[int, _Line] = {}  # process id -> its held connection
        self._left: dict[int, str] = {}  # process id -> holder, once its connection closed
        self._lock = threading.Condition()
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
        atexit.register(self.bye)

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
            line = _Line(connection)
            error = self._claim(me, count, holder, line)
            try:
                line.send({"error": error, "holder": _holder()})
                if error is None:
                    self._hold(line, me, holder)  # until the claimant exits (EOF)
            except OSError:
                pass
            finally:
                if error is None:
                    self._leave(me, holder, line.said_bye)

    def _hold(self, line: _Line, me: int, holder: str) -> None:
        """Answers the claimant's heartbeats, noting each, until it closes."""
        while True:
            if self._silence is not None:
                self._silence.heard(me, holder)
            data = line.connection.recv(64)
            if not data:
                return
            line.said_bye |= BYE in data
            line.send_beat()

    def _leave(self, me: int, holder: str, said_bye: bool) -> None:
        """``me`` closed its connection: frees its id, and tells the others when it
        was lost (they name it when their collectives fail)."""
        with self._lock:
            del self._holders[me], self._lines[me]
            if not said_bye:
                self._left[me] = holder
            others = list(self._lines.values())
            self._lock.notify_all()
        if self._silence is not None:
            (self._silence.gone if said_bye else self._silence.closed)(me)
        if not said_bye:
            for line in others:
                line.notify({"left": me, "holder": holder})

    def bye(self) -> None:
        """Tells the others that this process leaves on purpose (at its exit): they
        are not to count it as lost."""
        with self._lock:
            lines = list(self._lines.values())
        for line in lines:
            line.notify({"bye": True})

    def left(self, wait_s: float = 0.0) -> dict[int, str]:
        """The processes whose connection closed without a goodbye (killed or
        crashed), with their holders; waits up to ``wait_s`` for a first one."""
        with self._lock:
            self._lock.wait_for(lambda: self._left, wait_s)
            return dict(self._left)

    def stop(self, message: str, lost: Collection[int], wait_s: float) -> None:
        """Tells every process still here, but the ``lost`` ones, that the job is over
        (each prints ``message`` and exits), and waits up to ``wait_s`` for them to
        close: process 0's leaving would end JAX's coordination service under them."""
        deadline = time.monotonic() + wait_s
        with self._lock:
            told = [line for me, line in self._lines.items() if me not in lost]
        for line in told:
            line.notify({"stop": message})
        with self._lock:
            self._lock.wait_for(
                lambda: set(self._lines) <= set(lost), max(0.0, deadline - time.monotonic())
            )

    def _claim(self, me: int, count: int, holder: str, line: _Line) -> str | None:
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
            self._holders[me], self._lines[me] = holder, line
            self._left.pop(me, None)
        return None


class _Line:
    """A held connection of process 0. Heartbeats and notices are sent from
    different threads: a lock keeps one from splitting the other."""

    def __init__(self, connection: socket.socket) -> None:
        self.connection = connection
        self.said_bye = False
        self._lock = threading.Lock()

    def send(self, message: dict) -> None:
        with self._lock:
            self.connection.sendall(json.dumps(message).encode() + b"\n")

    def send_beat(self) -> None:
        with self._lock:
            self.connection.sendall(b".")

    def notify(self, message: dict) -> None:
        """Sends ``message`` if the claimant is still there (else it is gone anyway)."""
        with contextlib.suppress(OSError):
            self.send(message)


# A granted claim's connection, kept open for the life of this process.
_held: socket.socket | None = None
# The processes process 0 said left (or process 0 itself, when its connection
# closed), with their holders; notified on each change.
_left: dict[int, str] = {}
_left_changed = threading.Condition()


def left_processes(wait_s: float = 0.0) -> dict[int, str]:
    """The processes of this claimant's job that left (their id -> holder), as
    process 0 said; waits up to ``wait_s`` for a first one."""
    with _left_changed:
        _left_changed.wait_for(lambda: _left, wait_s)
        return dict(_left)


def _note_left(process_id: int, holder: str) -> None:
    with _left_changed:
        _left[process_id] = holder
        _left_changed.notify_all()


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
    on_stop: OnStop | None = None,
) -> socket.socket | None:
    """Claims ``process_id`` at process 0's roll call, retrying until process 0
    answers or ``time.monotonic()`` passes ``deadline`` (then the caller's join
    deadline reports who is missing).

    Once granted, the connection carries this process's heartbeat, and with
    ``on_silent``, process 0's is watched: it is called when process 0 is
    silent for ``silent_after_s`` seconds. ``on_stop`` is called when process 0
    ends the job (`RollCall.stop`).

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
            # Unbuffered: what process 0 sends next is the listener's to read.
            answer = json.loads(connection.makefile("rb", buffering=0).readline(_MAX_LINE))
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
        atexit.register(say_bye)
        silence = None
        if on_silent is not None and silent_after_s is not None:
            silence = _Silence(silent_after_s, on_silent)
            silence.heard(0, str(answer.get("holder", "unknown")))
        threading.Thread(
            target=_beat, args=(connection,), name="jaxfeed-heartbeat", daemon=True
        ).start()
        threading.Thread(
            target=_listen,
            args=(connection, silence, str(answer.get("holder")), on_stop),
            name="jaxfeed-heartbeat-listen",
            daemon=True,
        ).start()
        return connection


def say_bye() -> None:
    """Tells process 0 that this process leaves on purpose (at its exit): it is
    not to count it as lost. Nothing without a claim held."""
    if _held is not None:
        with contextlib.suppress(OSError):
            _held.sendall(BYE)


def _beat(connection: socket.socket) -> None:
    """Says this process is alive, every `BEAT_S`, until the connection closes."""
    while True:
        try:
            connection.sendall(b".")
        except OSError:
            return
        time.sleep(BEAT_S)


def _listen(
    connection: socket.socket, silence: _Silence | None, holder: str, on_stop: OnStop | None
) -> None:
    """Notes process 0's answers to the heartbeat and its notices (one JSON line
    each, between the heartbeats' dots), until it closes (exits)."""
    pending, said_bye = b"", False
    while True:
        try:
            data = connection.recv(4096)
            if not data:
                break
        except TimeoutError:
            continue
        except OSError:  # closed here, or reset
            break
        if silence is not None:
            silence.heard(0, holder)
        pending = (pending + data).lstrip(b".")
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            pending = pending.lstrip(b".")
            notice = json.loads(line)
            said_bye |= "bye" in notice
            if "left" in notice:
                _note_left(notice["left"], notice["holder"])
            elif "stop" in notice and on_stop is not None:
                on_stop(notice["stop"])
    if said_bye:
        if silence is not None:
            silence.gone(0)
        return
    _note_left(0, holder)
    if silence is not None:
        # Process 0's coordination service went with it: JAX aborts this process
        # within moments, so there is nothing to wait for.
        silence.closed(0, at_once=True)

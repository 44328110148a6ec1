"""Process 0's roll call: each process claims its id before it meets JAX's coordinator.

A second job started on a running job's ``--coordinator`` would otherwise harm the
first: its process 1 registers with the running job's coordination service as a
new incarnation of that job's process 1, and the service aborts every process of
the running job. JAX's connect offers no check before that registration, so
process 0 also listens on the coordinator's port + 1, where every other process
claims its id first. An id is held while its process lives (its connection stays
open), so a second claim is refused by name and the running job never sees it.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time

# Claims and answers are one JSON line each.
_MAX_LINE = 4096


def roll_call_port(coordinator_port: int) -> int:
    """Where process 0 takes the roll call: the port after the coordinator's."""
    return coordinator_port + 1


class RollCall:
    """Process 0's side: a daemon thread that answers claims until the process exits."""

    def __init__(self, port: int, num_processes: int) -> None:
        self._num_processes = num_processes
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
                f"roll call) is in use: {err.strerror}. Start the job on another "
                f"--coordinator port, all its processes alike"
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
                connection.sendall(json.dumps({"error": error}).encode() + b"\n")
                if error is None:
                    connection.recv(1)  # held until the claimant exits (EOF)
            except OSError:
                pass
            finally:
                if error is None:
                    with self._lock:
                        del self._holders[me]

    def _claim(self, me: int, count: int, holder: str) -> str | None:
        if count != self._num_processes:
            return (
                f"the job at this coordinator has {self._num_processes} processes, this "
                f"process was started with --num-processes {count}: another job? Start each "
                f"job on its own --coordinator port"
            )
        with self._lock:
            if me in self._holders:
                return (
                    f"process {me} of the job at this coordinator is already running "
                    f"({self._holders[me]}): is this a second job on the same --coordinator? "
                    f"Start it on a free port, all its processes alike"
                )
            self._holders[me] = holder
        return None


# A granted claim's connection, kept open for the life of this process.
_held: socket.socket | None = None


def claim_id(
    host: str, port: int, process_id: int, num_processes: int, deadline: float
) -> socket.socket | None:
    """Claims ``process_id`` at process 0's roll call, retrying until process 0
    answers or ``time.monotonic()`` passes ``deadline`` (then the caller's join
    deadline reports who is missing).

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
        "holder": f"pid {os.getpid()} on {socket.gethostname()}",
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
        connection.settimeout(None)
        _held = connection
        return connection

"""Ray's processes of a local instance die with the process that started it,
also when that process is killed with SIGKILL.

Ray ties its GCS and raylet to the driver, but its dashboard and runtime-env
agents, children of the raylet, hang on their way out once the raylet is gone
(Ray 2.60: "Raylet is dead! Exiting" in their logs, and they live on for about
a minute, measured here). This
module runs as a small script of its own (by path: it imports no jaxfeed, no
Ray), in its own session, so a kill of the driver's process group spares it.
It reads the instance's processes from its stdin, then waits for end of file:
the driver closed the pipe or died. It gives Ray's own shutdown `GRACE_SECONDS`
and kills what is left of those processes (each checked by its start time, so
a reused pid is never hit).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys

__all__ = ["watch"]

# Ray's own shutdown has ended its processes before a driver exits normally;
# after a SIGKILL the raylet is gone at once and its agents hang.
GRACE_SECONDS = 2.0


def watch(pids: list[int]) -> subprocess.Popen:
    """Starts the reaper of ``pids`` (and their children); it acts once the
    returned process's stdin is closed, by this process or by its death.
    Keep the returned object: dropping it closes the pipe."""
    import psutil

    processes = []
    for pid in pids:
        try:
            process = psutil.Process(pid)
            processes += [process, *process.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
    alive = [(p.pid, p.create_time()) for p in processes if p.is_running()]
    reaper = subprocess.Popen(
        [sys.executable, __file__],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    reaper.stdin.write(json.dumps(alive).encode() + b"\n")
    reaper.stdin.flush()
    return reaper


def _reap() -> None:
    import psutil

    watched = json.loads(sys.stdin.readline() or "[]")
    sys.stdin.read()  # returns at end of file: the driver is gone or done
    processes = []
    for pid, created in watched:
        try:
            process = psutil.Process(pid)
        except psutil.NoSuchProcess:
            continue
        if process.create_time() == created:
            processes.append(process)
    _, alive = psutil.wait_procs(processes, timeout=GRACE_SECONDS)
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(alive, timeout=GRACE_SECONDS)  # this process ends after they do


if __name__ == "__main__":
    _reap()

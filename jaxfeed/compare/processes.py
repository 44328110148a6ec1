"""CPU time and peak memory of this process, alone or with its worker processes.

Pipelines that decode in worker processes (torch ``DataLoader`` workers,
Grain's ``mp_prefetch``, jaxfeed's record pool) spend their CPU and memory
outside this process, in children that live as long as the pipeline.
``getrusage(RUSAGE_CHILDREN)`` counts only children already waited for, so
live descendants are read from ``/proc`` (Linux; elsewhere the figures cover
this process and its finished children only).
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import threading
from collections.abc import Iterator
from pathlib import Path

_PROC = Path("/proc")
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
SAMPLE_S = 0.25  # how often live workers' memory is read while work runs


def _stat(pid: int) -> tuple[int, float] | None:
    """``(parent pid, CPU seconds)`` of a live process (its own user and system
    time plus that of its finished children), or None once it is gone."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the name may hold spaces and ')'
    # After the name: state ppid ... utime(11) stime(12) cutime(13) cstime(14), in ticks.
    return int(fields[1]), sum(int(f) for f in fields[11:15]) / _TICKS


def descendants() -> dict[int, float]:
    """Every live descendant of this process: pid -> its CPU seconds so far."""
    if not _PROC.is_dir():
        return {}
    stats: dict[int, tuple[int, float]] = {}
    for entry in _PROC.iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            stats[int(entry.name)] = stat
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in stats.items():
        children.setdefault(parent, []).append(pid)
    found, todo = {}, list(children.get(os.getpid(), []))
    while todo:
        pid = todo.pop()
        found[pid] = stats[pid][1]
        todo += children.get(pid, [])
    return found


def cpu_seconds() -> float:
    """CPU seconds (user + system) used so far by this process, its finished
    children, and its live descendants. A difference of two readings over a
    stretch of work, divided by its wall time, is the cores that work kept busy."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    done = resource.getrusage(resource.RUSAGE_CHILDREN)
    finished = own.ru_utime + own.ru_stime + done.ru_utime + done.ru_stime
    return finished + sum(descendants().values())


def status_kb(pid: int | str, field: str) -> int | None:
    """A ``kB`` field of ``/proc/<pid>/status`` (``VmRSS``, ``VmHWM``), or None."""
    try:
        text = (_PROC / str(pid) / "status").read_text()
    except OSError:
        return None
    match = re.search(rf"^{field}:\s+(\d+) kB", text, re.M)
    return int(match.group(1)) if match else None


class PeakMemory:
    """Peak resident memory of a stretch of work, workers included.

    This process's peak is its ``VmHWM``, reset at the start through
    ``/proc/self/clear_refs``. The workers' peak is the largest sum, over the
    workers alive at one reading, of each one's own peak so far (``VmHWM``),
    read every `SAMPLE_S` seconds by a daemon thread and at `sample` (call it
    before the work closes its workers): workers that replace one another do
    not add up, workers that run together do. It is an upper bound (their
    peaks need not coincide, and pages they share, such as libraries, count
    once per process). Processes already running at the start
    (multiprocessing's resource tracker, an earlier pipeline's workers still
    exiting) are not the work's, and are left out.

    Use as a context manager; read ``self_mb``, ``children_mb``, ``total_mb``
    (the two added), ``added_mb`` (``total_mb`` less this process's resident
    memory at the start: what the work added at its worst) and ``workers``
    (how many processes the work started) after it exits.
    """

    def __init__(self) -> None:
        self.supported = _clear_refs("self")
        self.self_mb = self.children_mb = self.total_mb = self.added_mb = 0.0
        self.workers = 0
        self._children_kb = 0
        self._seen: set[int] = set()
        self._before: set[int] = set()
        self._start_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="jaxfeed-peak-memory", daemon=True)

    def __enter__(self) -> PeakMemory:
        if self.supported:
            self._before = set(descendants())
            self._start_kb = status_kb("self", "VmRSS") or 0
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.supported:
            return
        self._stop.set()
        self._thread.join()
        self.sample()
        self.self_mb = (status_kb("self", "VmHWM") or 0) / 1024
        self.children_mb = self._children_kb / 1024
        self.total_mb = self.self_mb + self.children_mb
        self.added_mb = self.total_mb - self._start_kb / 1024

    def sample(self) -> None:
        """Reads the live workers' peaks now."""
        live = [pid for pid in descendants() if pid not in self._before]
        peaks = [status_kb(pid, "VmHWM") or 0 for pid in live]  # 0: gone meanwhile
        self._children_kb = max(self._children_kb, sum(peaks))
        self._seen.update(live)
        self.workers = len(self._seen)

    def _poll(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.sample()


class SelfPeak:
    """Peak resident memory of this process alone, per piece of work: its
    ``VmHWM``, reset through ``/proc/self/clear_refs`` before each piece
    (Linux; ``supported`` is False elsewhere)."""

    def __init__(self) -> None:
        self.supported = _clear_refs("self")

    @contextlib.contextmanager
    def track(self, figures: dict[str, float]) -> Iterator[None]:
        """Records the work inside into ``figures``, keeping earlier maxima:
        ``peak_rss_mb`` and ``peak_increase_mb`` (the peak less the resident
        memory when the work began)."""
        if not self.supported:
            yield
            return
        _clear_refs("self")  # VmHWM := VmRSS
        start = status_kb("self", "VmRSS") or 0
        yield
        peak = status_kb("self", "VmHWM") or 0
        figures["peak_rss_mb"] = max(figures.get("peak_rss_mb", 0), peak / 1024)
        increase = max(figures.get("peak_increase_mb", 0), (peak - start) / 1024)
        figures["peak_increase_mb"] = increase


def _clear_refs(pid: int | str) -> bool:
    """Resets a process's ``VmHWM`` to its current RSS; False where Linux does not let us."""
    try:
        (_PROC / str(pid) / "clear_refs").write_text("5")
    except OSError:
        return False
    return True

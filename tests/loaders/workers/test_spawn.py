"""The spawn policy's checks on worker processes, and how its workers end."""

import _posixsubprocess
import atexit
import functools
import multiprocessing
import os
import re
import signal
import subprocess
import threading

import pytest
from jaxfeed.loaders._workers import spawn
from jaxfeed.loaders._workers.spawn import (
    SPAWN,
    children_ignore_stop_signals,
    raise_if_dead,
    reported_start,
)


@pytest.mark.parametrize(
    "target, args, how",
    [
        (os._exit, (3,), "exited with code 3"),
        (signal.raise_signal, (signal.SIGTERM,), "was killed by signal SIGTERM"),
    ],
    ids=["exit-code", "signal"],
)
def test_a_dead_worker_is_named_with_how_it_ended(target, args, how):
    worker = multiprocessing.get_context("spawn").Process(target=target, args=args)
    worker.start()
    worker.join()
    with pytest.raises(RuntimeError, match=re.escape(f"worker (pid {worker.pid}) {how} while")):
        raise_if_dead([worker], "DataLoader worker", "a smaller prefetch_factor")


@pytest.mark.parametrize(
    ("persistent", "again"),
    [
        (True, "(once: they serve every epoch)"),
        # e.g. a DataLoader over an IterableDataset, built without persistent_workers
        (False, "(again every epoch; persistent_workers=True starts them once)"),
    ],
)
def test_a_spawned_start_paid_every_epoch_names_persistent_workers(capsys, persistent, again):
    batches = (batch for batch in [1, 2])
    context = multiprocessing.get_context("spawn")
    assert list(reported_start(batches, "2 torch workers", context, persistent)) == [1, 2]
    said = capsys.readouterr().err
    assert re.fullmatch(r"jaxfeed: starting 2 torch workers \(spawn\): \d+\.\d s (.*)\n", said)
    assert said.endswith(f" {again}\n"), said


def _multiply_forever(started: threading.Event) -> None:
    import torch

    a = torch.ones(300, 300)
    while True:
        a @ a  # torch's C++, the GIL released
        started.set()


def _return_with_a_thread_in_torch(note: str) -> None:
    atexit.register(lambda: open(note, "w").close())
    started = threading.Event()
    threading.Thread(target=_multiply_forever, args=(started,), daemon=True).start()
    started.wait()


def test_a_worker_leaves_cleanly_while_a_daemon_thread_is_in_torch(tmp_path):
    # Spawn's own exit (interpreter finalization) aborted such a worker with
    # SIGABRT, "terminate called without an active exception" (exit code -6,
    # every time here): the way a DataLoader worker whose queue feeder was
    # still pickling a tensor died now and then. It now leaves as a forked
    # child does, its atexit hooks run.
    note = tmp_path / "atexit-ran"
    worker = SPAWN.Process(target=_return_with_a_thread_in_torch, args=(str(note),))
    worker.start()
    worker.join(timeout=120)
    assert worker.exitcode == 0
    assert note.exists()


def _stop_signals(status: str) -> dict[str, set[str]]:
    """Which of SIGINT and SIGTERM a /proc/<pid>/status text has ignored
    ("SigIgn"), blocked in its main thread ("SigBlk") and caught ("SigCgt")."""
    found = {}
    for line in status.splitlines():
        field, _, mask = line.partition(":")
        if field in ("SigIgn", "SigBlk", "SigCgt"):
            bits = int(mask, 16)
            found[field] = {s.name for s in spawn.STOP_SIGNALS if bits >> (s - 1) & 1}
    return found


def _write_status(path: str) -> None:
    with open("/proc/self/status") as status, open(path, "w") as out:
        out.write(status.read())


def _status_of_a_subprocess() -> str:
    return subprocess.run(
        ["cat", "/proc/self/status"], capture_output=True, text=True, check=True, timeout=60
    ).stdout


def test_a_subprocess_started_while_a_worker_launches_keeps_ctrl_c(tmp_path, monkeypatch):
    # The worker's fork once ran with SIGINT and SIGTERM ignored process-wide:
    # a subprocess another thread started at that instant inherited the ignore
    # and could not be stopped with Ctrl-C. Here the other thread starts one
    # inside the fork's window, every time. Compared with one started before:
    # pytest may itself run with SIGINT ignored (a script's `&`, `nohup`).
    before, handler = _stop_signals(_status_of_a_subprocess()), signal.getsignal(signal.SIGINT)
    fork = _posixsubprocess.fork_exec
    beside, in_window = {}, threading.Event()

    def start_a_subprocess_in_the_window() -> None:
        if in_window.wait(timeout=120):
            beside["status"] = _status_of_a_subprocess()

    def fork_with_a_subprocess_beside(*args):
        if threading.current_thread() is not other:  # the worker's launch
            in_window.set()
            other.join()
        return fork(*args)

    other = threading.Thread(target=start_a_subprocess_in_the_window)  # (before the window)
    other.start()
    # The fork itself, below spawn's multiprocessing.util.spawnv_passfds and
    # the door's hook there (CPython 3.11-3.13).
    monkeypatch.setattr(_posixsubprocess, "fork_exec", fork_with_a_subprocess_beside)
    worker = SPAWN.Process(target=_write_status, args=(str(tmp_path / "worker"),))
    worker.start()
    worker.join(timeout=120)
    assert worker.exitcode == 0
    assert _stop_signals(beside["status"]) == before
    # The worker ignores SIGINT; SIGTERM it leaves blocked, for a thread that
    # takes its parent's alone (see spawn).
    worker_signals = _stop_signals((tmp_path / "worker").read_text())
    assert "SIGINT" in worker_signals["SigIgn"] and "SIGTERM" not in worker_signals["SigIgn"]
    assert worker_signals["SigBlk"] == {"SIGTERM"}
    # And this process's handling is as it was.
    assert signal.getsignal(signal.SIGINT) is handler


def test_a_librarys_children_start_with_the_stop_signals_blocked_and_no_other(tmp_path):
    library = _write_status.__module__.partition(".")[0]  # this test's package, as Grain's
    context = multiprocessing.get_context("spawn")
    subprocess_before = _stop_signals(_status_of_a_subprocess())
    processes = {
        name: context.Process(target=target, args=(str(tmp_path / name),))
        for name, target in [("before", _write_status), ("library", _write_status),
                             ("other", functools.partial(_write_status)), ("after", _write_status)]
    }  # fmt: skip
    processes["before"].start()
    with children_ignore_stop_signals(library):
        # From another thread, as Grain starts its workers; "other" runs code of
        # another package (a partial's module is functools).
        for name in ("library", "other"):
            starter = threading.Thread(target=processes[name].start)
            starter.start()
            starter.join()
        subprocess_inside = _stop_signals(_status_of_a_subprocess())
    processes["after"].start()
    status = {}
    for name, process in processes.items():
        process.join(timeout=120)
        assert process.exitcode == 0, name
        status[name] = _stop_signals((tmp_path / name).read_text())

    # The library's: blocked from the start, so never delivered; Python's
    # handler, if it installed one, is never run.
    assert status["library"]["SigBlk"] == {"SIGINT", "SIGTERM"}
    assert status["library"]["SigIgn"] == status["before"]["SigIgn"]
    # Every other process is as before the context.
    assert status["other"] == status["after"] == status["before"]
    assert subprocess_inside == subprocess_before

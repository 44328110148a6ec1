"""The spawn policy's checks on worker processes, and how its workers end."""

import atexit
import multiprocessing
import os
import re
import signal
import threading

import pytest
from jaxfeed.loaders.workers.spawn import SPAWN, raise_if_dead


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

"""The spawn policy's checks on worker processes."""

import multiprocessing
import os
import re
import signal

import pytest
from jaxfeed.loaders.workers.spawn import raise_if_dead


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

"""The record pool: a transform worker killed mid-epoch is an error, not a hang."""

import faulthandler
import os
import signal
import time

import pytest
from transform_helpers import encoded_digits, random_augment

from jaxfeed import loaders


@pytest.fixture(scope="module")
def digits():
    return encoded_digits(96)


@pytest.mark.parametrize("backend", ["numpy", "hf"])
def test_a_killed_pool_worker_is_an_error_not_a_hang(backend, digits):
    faulthandler.dump_traceback_later(120, exit=True)  # a hang fails loudly, never stalls CI
    try:
        source = loaders.make(backend, dataset=digits, batch_size=4, transform=random_augment,
                              num_workers=2)  # fmt: skip
        batches = source.iter_epoch(0)
        next(batches)
        workers = list(source._pool._pool._processes.values())
        os.kill(workers[0].pid, signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(Exception, match=r"(SIGKILL|terminated abruptly)"):
            for _ in batches:
                pass
        assert time.monotonic() - started < 30
        source.close()
    finally:
        faulthandler.cancel_dump_traceback_later()

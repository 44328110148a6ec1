"""The record pool: a transform worker killed mid-epoch is an error, not a
hang; batches come back through a few batch files written again and again,
byte for byte what this process makes, and none is left."""

import faulthandler
import os
import signal
import time

import numpy as np
import pytest
from backend_helpers import assert_same_batches
from jaxfeed.loaders._workers import shared_batches
from jaxfeed.loaders.transform import RecordTransform
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


def test_batch_files_are_written_again_not_made_for_every_batch(digits, monkeypatch):
    # 96 rows in batches of 7: 13 full batches and a short one, each epoch.
    plain = loaders.make("numpy", dataset=digits, batch_size=7, transform=random_augment)
    want = [list(plain.iter_epoch(epoch)) for epoch in (0, 1)]
    files = []
    collect = shared_batches.Recycler.collect

    def spy(self, handed, offered):  # every batch's file, as the reader gets it
        files.append(handed.path)
        return collect(self, handed, offered)

    monkeypatch.setattr(shared_batches.Recycler, "collect", spy)
    source = loaders.make("numpy", dataset=digits, batch_size=7, transform=random_augment,
                          num_workers=1)  # fmt: skip
    try:
        got = [list(source.iter_epoch(epoch)) for epoch in (0, 1)]
        early = source.iter_epoch(0)
        next(early)
        early.close()  # closed with batches in flight: their files go
        directory = os.path.dirname(source._pool._member.work)
        kept = [os.path.join(directory, name) for name in os.listdir(directory)
                if not name.startswith(("work-", "."))]  # fmt: skip
        assert len(kept) <= 2, kept  # those kept for the next batches; none in flight
    finally:
        source.close()
    assert not [path for path in kept if os.path.exists(path)]
    assert_same_batches(got[0], want[0])
    assert_same_batches(got[1], want[1])
    assert len(files) == 29
    # Two in flight, written again; a new one for each short batch and where it was offered one.
    assert len(set(files)) <= 6, sorted(set(files))
    assert not [path for path in set(files) if os.path.exists(path)]


def test_a_batch_stacked_into_given_arrays_is_the_same_batch(digits):
    transform = RecordTransform(random_augment, seed=3, dataset=digits)
    rows = {key: array[np.arange(10, 16)] for key, array in digits.arrays.items()}
    want = transform.batch(rows, np.arange(10, 16), 2)
    out = {key: np.empty((6, *shape), dtype) for key, (shape, dtype) in transform.spec.items()}
    got = transform.batch(rows, np.arange(10, 16), 2, out=out)
    assert_same_batches([got], [want])
    # The exact dtypes stack in place; "row" (int64 records, int32 batch) is cast into it.
    assert all(got[key] is out[key] for key in out)

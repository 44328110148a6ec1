"""Worker processes started once per job: a train and a validation loader with
the same ``num_workers`` share one pool of processes, each batch transformed
by its own loader's reader and transform, byte for byte what separate workers
give; closing one leaves the other's workers running, and nothing (process,
batch file, work file) outlives the last. A worker killed mid-epoch is still
an error, and the next epoch gets a new pool."""

import errno
import faulthandler
import gc
import glob
import os
import signal
import tempfile

import numpy as np
import pytest
from backend_helpers import assert_same_batches, process_alive
from jaxfeed.loaders._workers import shared_pool
from transform_helpers import augment_where_it_runs, encoded_digits, noise_where_it_runs

from jaxfeed import loaders


@pytest.fixture(scope="module")
def digits():
    return encoded_digits(96)


@pytest.fixture(autouse=True)
def no_pool_left_by_earlier_tests(monkeypatch):
    """Each test starts with this process's registry empty: a source another
    test left open (or that its traceback still holds) keeps its pool, which
    these loaders would join (seen running after test_transform.py)."""
    gc.collect()  # a source another test dropped leaves its pool when collected
    monkeypatch.setattr(shared_pool, "_POOLS", {})


# Two loaders unlike in data, batch size and transform: a batch read with the
# other's reader or transform would differ in shape or bytes.
def _train(digits, num_workers):
    return loaders.make("numpy", dataset=digits, batch_size=20, seed=5,
                        transform=augment_where_it_runs, num_workers=num_workers)  # fmt: skip


def _validation(num_workers):
    data = {"row": np.arange(1000, 1042)}
    return loaders.make("numpy", dataset=data, batch_size=8, seed=9,
                        transform=noise_where_it_runs, num_workers=num_workers)  # fmt: skip


def _where(batches: list[dict]) -> tuple[list[dict], set[int]]:
    """The batches without their "pid" field, and the processes it names."""
    pids = {int(pid) for batch in batches for pid in batch["pid"][batch["mask"]]}
    return [{k: v for k, v in batch.items() if k != "pid"} for batch in batches], pids


def _batch_dirs() -> set[str]:
    return {*glob.glob("/dev/shm/jaxfeed-batches-*"),
            *glob.glob(os.path.join(tempfile.gettempdir(), "jaxfeed-batches-*"))}  # fmt: skip


def _interleaved(*epochs) -> list[list[dict]]:
    """Each iterator's batches, read one from each in turn (as a validation
    pass read while the next train epoch's first batches load)."""
    got = [[] for _ in epochs]
    live = list(enumerate(epochs))
    while live:
        for entry in list(live):
            batch = next(entry[1], None)
            if batch is None:
                live.remove(entry)
            else:
                got[entry[0]].append(batch)
    return got


def test_two_loaders_share_one_pool_and_each_gets_its_own_batches(digits):
    # What each loader gives on its own, in this process (the same bytes as in workers).
    want_train = [_where(list(_train(digits, 0).iter_epoch(e)))[0] for e in (0, 1)]
    want_val = _where(list(_validation(0).iter_epoch(0)))[0]
    train, validation = _train(digits, 2), _validation(2)
    # Train epoch 0, then validation epoch 0 beside train epoch 1, all interleaved.
    got_train0, got_val = _interleaved(train.iter_epoch(0), validation.iter_epoch(0))
    got_train1, got_val1 = _interleaved(train.iter_epoch(1), validation.iter_epoch(0))
    assert train._pool._pool is validation._pool._pool  # one executor
    (train0, pids0), (train1, pids1) = _where(got_train0), _where(got_train1)
    (val, val_pids), (val1, _) = _where(got_val), _where(got_val1)
    assert_same_batches(train0, want_train[0])
    assert_same_batches(train1, want_train[1])
    assert_same_batches(val, want_val)
    assert_same_batches(val1, want_val)
    workers = {process.pid for process in train._pool._pool._processes.values()}
    assert len(workers) == 2 and (pids0 | pids1 | val_pids) <= workers, (workers, val_pids)
    assert os.getpid() not in workers
    directory = os.path.dirname(train._pool._member.work)  # one batch directory, for both
    assert directory in _batch_dirs()
    assert os.path.dirname(validation._pool._member.work) == directory
    assert len(glob.glob(os.path.join(directory, "work-*"))) == 2  # each loader's work, once

    train.close()  # the validation loader keeps the workers; train's work goes
    assert glob.glob(os.path.join(directory, "work-*")) == [validation._pool._member.work]
    val2, val2_pids = _where(list(validation.iter_epoch(0)))
    assert_same_batches(val2, want_val)
    assert val2_pids <= workers and all(process_alive(pid) for pid in workers)

    train1_again, _ = _where(list(train.iter_epoch(1)))  # closed, then read again: rejoins
    assert_same_batches(train1_again, want_train[1])
    assert train._pool._pool is validation._pool._pool

    train.close()
    validation.close()
    assert not [pid for pid in workers if process_alive(pid)], "workers outlived their loaders"
    assert not os.path.exists(directory)


def test_a_killed_worker_fails_every_loader_in_flight_and_the_next_epoch_gets_new_ones(digits):
    faulthandler.dump_traceback_later(120, exit=True)  # a hang fails loudly, never stalls CI
    train, validation = _train(digits, 2), _validation(2)
    try:
        train_epoch, val_epoch = train.iter_epoch(0), validation.iter_epoch(0)
        next(train_epoch), next(val_epoch)
        workers = list(train._pool._pool._processes.values())
        os.kill(workers[0].pid, signal.SIGKILL)
        for epoch in (train_epoch, val_epoch):
            with pytest.raises(Exception, match=rf"worker \(pid {workers[0].pid}\).*SIGKILL"):
                for _ in epoch:
                    pass
        # The next epoch of either starts a new pool, again shared.
        _, pids = _where(list(validation.iter_epoch(0)))
        assert train._pool._pool is not validation._pool._pool  # train still holds the dead one
        _, train_pids = _where(list(train.iter_epoch(0)))
        assert train._pool._pool is validation._pool._pool
        assert not pids & {process.pid for process in workers}, pids
        assert train_pids <= {process.pid for process in train._pool._pool._processes.values()}
    finally:
        train.close()
        validation.close()
        faulthandler.cancel_dump_traceback_later()


def test_work_that_shared_memory_has_no_room_for_goes_to_the_temporary_directory(monkeypatch):
    want = _where(list(_validation(0).iter_epoch(0)))[0]
    write = shared_pool._write

    def full(path, data):  # as a container's 64 MiB /dev/shm does for a big in-memory dataset
        if os.path.dirname(path).startswith("/dev/shm"):
            raise OSError(errno.ENOSPC, "No space left on device")
        write(path, data)

    monkeypatch.setattr(shared_pool, "_write", full)
    source = _validation(1)
    try:
        assert_same_batches(_where(list(source.iter_epoch(0)))[0], want)
        work = source._pool._member.work
        assert work.startswith(tempfile.gettempdir()) and os.path.isfile(work)
    finally:
        source.close()
    assert not os.path.exists(os.path.dirname(work))

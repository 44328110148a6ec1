"""The tf backend's transform in worker processes (``num_workers=k``): a
tf.data pipeline over a `RecordPool`'s finished batches, with the contract of
every backend: numpy's batches byte for byte, exact resume, errors that name
the row and epoch, and no worker left however its parent ends."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from backend_helpers import assert_same_batches, process_alive
from jaxfeed.loaders.backends import tf as tf_backend
from jaxfeed.loaders.transform import TransformError
from transform_helpers import augment_where_it_runs, encoded_digits, fail_on_row_7

from jaxfeed import loaders

TESTS = Path(__file__).resolve().parents[2]
# 96 rows: the last batch padded. The transform's "pid" says which process ran it.
OPTIONS = dict(batch_size=20, seed=5, transform=augment_where_it_runs)


@pytest.fixture(scope="module")
def digits():
    return encoded_digits(96)


@pytest.fixture(scope="module")
def reference(digits) -> list[list[dict]]:
    """Epochs 0 and 1 of numpy in this process: what tf must give."""
    source = loaders.make("numpy", dataset=digits, **OPTIONS)
    return [list(source.iter_epoch(epoch)) for epoch in (0, 1)]


@pytest.fixture(scope="module")
def with_workers(digits):
    """One tf source with 2 workers for the module: they start once."""
    source = loaders.make("tf", dataset=digits, num_workers=2, **OPTIONS)
    yield source
    source.close()


def _where(batches: list[dict]) -> tuple[list[dict], set[int]]:
    """The batches without their "pid" field, and the processes it names."""
    pids = {int(pid) for batch in batches for pid in batch["pid"][batch["mask"]]}
    return [{k: v for k, v in batch.items() if k != "pid"} for batch in batches], pids


@pytest.mark.parametrize("workers", [0, 2])
def test_two_epochs_are_numpys_batches_byte_for_byte(workers, digits, reference, with_workers):
    source = with_workers if workers else loaders.make("tf", dataset=digits, **OPTIONS)
    for epoch in (0, 1):
        got, pids = _where(list(source.iter_epoch(epoch)))
        assert_same_batches(got, _where(reference[epoch])[0])
        # Without workers, in this process; with them, in theirs only.
        if workers:
            assert os.getpid() not in pids and len(pids) <= workers, pids
        else:
            assert pids == {os.getpid()}, pids


def test_an_epoch_resumes_exactly_where_it_stopped(reference, with_workers):
    epoch = with_workers.iter_epoch(1)
    first = [next(epoch), next(epoch)]
    epoch.close()  # stopped with batches in flight: they are dropped
    rest = list(with_workers.iter_epoch(1, start=2))
    assert_same_batches(_where(first + rest)[0], _where(reference[1])[0])
    assert list(with_workers.iter_epoch(1, start=with_workers.num_batches)) == []


def test_each_epochs_pipeline_runs_without_tf_datas_autotuning(with_workers, monkeypatch):
    # Its optimisation thread made deleting an epoch's iterator wait for the
    # thread's next wake-up, up to ~1 s at random (benchmarks/README.md); nothing is tuned.
    built, make = [], tf_backend._from_generator
    monkeypatch.setattr(
        tf_backend, "_from_generator", lambda *args: built.append(make(*args)) or built[-1]
    )
    assert len(list(with_workers.iter_epoch(0))) == with_workers.num_batches
    assert len(built) == 1 and built[0].options().autotune.enabled is False


def test_a_transform_error_names_the_row_and_the_epoch():
    data = {"label_row": np.arange(40), "other": np.zeros(40)}
    source = loaders.make("tf", dataset=data, batch_size=10, shuffle=False,
                          transform=fail_on_row_7, num_workers=2)  # fmt: skip
    try:
        with pytest.raises(TransformError, match=r"failed on row 7 \(epoch 1\).*KeyError"):
            list(source.iter_epoch(1))
    finally:
        source.close()


# Reads a batch through 2 workers, says who they are, then waits for its end.
_RUN = r"""
import json, os, signal, sys
# Ctrl-C and SIGTERM as a terminal's shell gives them to a command: pytest may
# itself run with SIGINT ignored (started by a script with `&`, or `nohup`),
# and a child inherits that, with no KeyboardInterrupt.
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGTERM, signal.SIG_DFL)
sys.path.insert(0, sys.argv[1])
from jaxfeed import loaders
from transform_helpers import encoded_digits, random_augment

source = loaders.make("tf", dataset=encoded_digits(32), batch_size=4, transform=random_augment,
                      num_workers=2)
next(source.iter_epoch(0))
children = set()
for task in os.listdir(f"/proc/{os.getpid()}/task"):
    with open(f"/proc/{os.getpid()}/task/{task}/children") as file:
        children |= {int(pid) for pid in file.read().split()}
print(json.dumps(sorted(children)), flush=True)
sys.stdin.read()
"""


@pytest.mark.slow
def test_no_worker_outlives_a_parent_stopped_by_ctrl_c_sigterm_or_sigkill():
    # Ctrl-C reaches a terminal's whole process group; SIGTERM and SIGKILL the
    # parent only. Three runs at once: each waits mostly on its imports.
    ends = {signal.SIGINT: True, signal.SIGTERM: False, signal.SIGKILL: False}
    runs = {signum: subprocess.Popen([sys.executable, "-c", _RUN, str(TESTS)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     start_new_session=True)
            for signum in ends}  # fmt: skip
    workers = {}
    try:
        for signum, run in runs.items():
            workers[signum] = json.loads(run.stdout.readline())  # a batch read: workers up
    finally:
        for signum, run in runs.items():
            if ends[signum]:
                os.killpg(run.pid, signum)
            else:
                run.send_signal(signum)
        for run in runs.values():
            run.wait(timeout=60)
            run.stdin.close()  # closed now: left to the collector, they warn in a later test
            run.stdout.close()
    deadline = time.monotonic() + 60
    for signum, pids in workers.items():
        assert len(pids) >= 2 and runs[signum].returncode != 0, (signum, pids)
        while any(process_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in pids if process_alive(pid)], f"outlived a {signum!r} parent"

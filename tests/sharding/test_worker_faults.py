"""A loader worker process that dies mid-epoch is an error in the consumer, never a hang.

Each case runs in a subprocess with a hard timeout: a regression fails the
test instead of hanging CI. The child kills one worker with SIGKILL (what the
out-of-memory killer sends) while a `DeviceFeed` iterates the source on a
thread other than the main one, where torch's own dead-worker handler
cannot run.
"""

import json
import os
import signal
import subprocess
import sys

import pytest

# Subprocesses, kills and whole training runs: the full suite (CI) runs it, the
# quick tier (-m "not slow") does not.
pytestmark = pytest.mark.slow

# Far above the seconds a passing case needs; only a hang reaches it.
HARD_TIMEOUT_SECONDS = 90

# Reads a DeviceFeed over the source that argv[1] describes on a thread that
# is not the main thread, SIGKILLs one worker after the second batch, keeps
# consuming slowly (a slow consumer made the hang likelier), and prints what
# happened as JSON.
_CHILD = r"""
import json, multiprocessing, os, signal, sys, threading, time

from jaxfeed import loaders
from jaxfeed.sharding import DeviceFeed

case = json.loads(sys.argv[1])
before = {p.pid for p in multiprocessing.active_children()}
report = {"batches": 0}


def make_source():
    if case["kind"] != "wrap":
        return loaders.make(
            case["kind"], dataset=case["dataset"], split="test", batch_size=128, **case["options"]
        )
    import torch
    from jaxfeed.loaders.backends import torch as torch_backend
    from jaxfeed.loaders._workers.torch_epochs import keep_batch

    data = loaders.load_dataset(case["dataset"], "test")
    loader = torch.utils.data.DataLoader(
        torch_backend.ArrayTorchDataset(data.arrays),
        batch_size=128,
        num_workers=2,
        multiprocessing_context="spawn",
        collate_fn=keep_batch,  # numpy batches, pickled through a pipe
    )
    return loaders.wrap(loader)  # reads the first batch: its workers start on this thread


def consume():
    killed_at = None
    source = make_source()
    report["num_batches"] = source.num_batches
    feed = DeviceFeed(source)
    try:
        for batch in feed:
            report["batches"] += 1
            if report["batches"] == 2:
                workers = sorted({p.pid for p in multiprocessing.active_children()} - before)
                report["workers"] = workers
                os.kill(workers[0], signal.SIGKILL)
                report["killed"] = workers[0]
                killed_at = time.perf_counter()
            time.sleep(0.05)
    except Exception as error:
        report["error"] = f"{type(error).__name__}: {error}"
        if killed_at is not None:
            report["seconds_to_error"] = round(time.perf_counter() - killed_at, 2)
    finally:
        feed.close()


# Not the main thread, where torch's own SIGCHLD handler would report the death.
thread = threading.Thread(target=consume)
thread.start()
thread.join()
print(json.dumps(report))
"""


def _run_and_kill_a_worker(kind: str, dataset, **options) -> dict:
    case = json.dumps({"kind": kind, "dataset": str(dataset), "options": options})
    # A session of its own, so a hung child's workers can be killed with it.
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, case],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = child.communicate(timeout=HARD_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        _, stderr = child.communicate()
        pytest.fail(f"a killed {kind} worker hung the feed for {HARD_TIMEOUT_SECONDS} s:\n{stderr}")
    assert child.returncode == 0, stderr
    report = json.loads(stdout.strip().splitlines()[-1])
    print(report)  # with -rP: the measured seconds from SIGKILL to the error
    assert len(report["workers"]) == 2, report
    # The error must come before the epoch ends: no silently short epoch.
    assert report["batches"] < report["num_batches"], report
    return report


@pytest.mark.parametrize(
    "options",
    [{"num_workers": 2}, {"num_workers": 2, "persistent_workers": True}],
    ids=["workers", "persistent-workers"],
)
def test_killed_torch_worker_is_an_error_naming_it(mnist_dir, options):
    report = _run_and_kill_a_worker("torch", mnist_dir, **options)
    assert report["error"].startswith(
        f"RuntimeError: DataLoader worker (pid {report['killed']}) was killed by signal SIGKILL"
    ), report


def test_killed_worker_of_a_wrapped_torch_loader_is_an_error(mnist_dir):
    report = _run_and_kill_a_worker("wrap", mnist_dir)
    assert f"worker (pid {report['killed']}) was killed by signal SIGKILL" in report["error"]


def test_killed_grain_worker_is_an_error(mnist_dir):
    report = _run_and_kill_a_worker("grain", mnist_dir, num_workers=2)
    assert report["error"].startswith("RuntimeError: "), report
    assert "terminated unexpectedly with exit code -9" in report["error"], report

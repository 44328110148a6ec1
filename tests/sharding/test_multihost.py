"""Multi-host on loopback: 2 and 3 real JAX processes (2 CPU devices each), gloo.

Also the faults of a job: processes that disagree, a peer that never starts,
fails early, or dies before or during training. Every child has a hard
timeout, so a regression fails, never hangs.
"""

import contextlib
import glob
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import jax
import numpy as np
import pytest
from backend_helpers import free_port, process_alive
from conftest import sample_digits
from jaxfeed.loaders.data.idx import read_idx, write_idx
from jaxfeed.loaders.data.mnist import T10K_LABELS
from jaxfeed.sharding import data_mesh
from jaxfeed.sharding.job.agreement import disagreements

from jaxfeed import loaders, sharding
from jaxfeed.mnist import TrainConfig, train

# Subprocesses, kills and whole training runs: the full suite (CI) runs it, the
# quick tier (-m "not slow") does not.
pytestmark = pytest.mark.slow

WORKER = Path(__file__).resolve().parents[2] / "tests" / "multihost_worker.py"
REPO = WORKER.parents[1]
BACKENDS = "numpy,torch,tf,grain,hf"
TIMEOUT_SECONDS = 300


def _run_job(processes: int, out_dir: Path) -> list[dict]:
    coordinator = f"127.0.0.1:{free_port()}"
    logs = [out_dir / f"process{i}.log" for i in range(processes)]
    children = []
    try:
        for i, log in enumerate(logs):
            with log.open("w") as out:  # a file, not a pipe: a full pipe would block a child
                children.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            str(WORKER),
                            coordinator,
                            str(processes),
                            str(i),
                            str(out_dir),
                            BACKENDS,
                        ],
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        # This checkout's code, whichever copy is pip-installed.
                        env={**os.environ, "PYTHONPATH": str(REPO)},
                    )
                )
        for child in children:
            child.wait(timeout=TIMEOUT_SECONDS)
    finally:
        for child in children:  # never leave a child behind, also on failure
            if child.poll() is None:
                child.kill()
                child.wait()
    for i, child in enumerate(children):
        assert child.returncode == 0, f"process {i} failed:\n{logs[i].read_text()[-4000:]}"
    return [json.loads((out_dir / f"process{i}.json").read_text()) for i in range(processes)]


@pytest.mark.slow
@pytest.mark.parametrize("processes", [2, 3])
def test_multihost_epoch_and_training(processes, tmp_path):
    results = _run_job(processes, tmp_path)
    test = loaders.load_dataset("mnist-sample", "test")
    every_image = sorted(hashlib.sha1(img.tobytes()).hexdigest() for img in test["image"])

    for r in results:
        assert r["devices"] == 2 * processes and r["local_devices"] == 2
    for backend in BACKENDS.split(","):
        per_process = [r["backends"][backend] for r in results]
        # Each process checked every global batch against the single-process order.
        assert all(p["identical_to_single_process"] for p in per_process), backend
        # Same number of steps everywhere; the uneven end is padded, not dropped.
        assert len({p["steps"] for p in per_process}) == 1
        assert all(p["padded_steps"] == 2 for p in per_process)  # one per epoch
        # The union of what the processes saw is the split, each sample exactly once.
        seen = [digest for p in per_process for digest in p["seen"]]
        assert sorted(seen) == every_image, backend

    # Training: the replicated parameters are identical on every process...
    assert len({r["params"] for r in results}) == 1
    # ...and match a single-process run over as many devices with the same global batch.
    common = dict(dataset="mnist-sample", batch_size=24 * processes, seed=5)
    mesh = data_mesh(jax.devices()[: 2 * processes])
    _, single = train(
        loaders.make("grain", split="train", **common),
        loaders.make("grain", split="test", shuffle=False, **common),
        TrainConfig(epochs=1, seed=5),
        sharding=mesh,
        progress=False,
    )
    for r in results:
        (multi,) = r["history"]
        assert f"{multi['test_accuracy']:.4f}" == f"{single[0]['test_accuracy']:.4f}"
        assert multi["loss"] == pytest.approx(single[0]["loss"], rel=1e-5)
    assert np.isfinite(single[0]["loss"])


# Faults. A short peer timeout keeps them quick (it is also JAX's heartbeat timeout, so
# not too short on a busy machine); HARD_TIMEOUT only turns a hang into a failure.
PEER_TIMEOUT, HARD_TIMEOUT = "10", 120


def _start(args: list[str], log: Path, session: bool = False, **env: str) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(REPO), "XLA_FLAGS": "", **env},
            start_new_session=session,  # a session of its own: what it leaves can be found
        )


def _cli(coordinator: str, processes: int, me: int, *args: str) -> list[str]:
    job = ["--coordinator", coordinator, "--num-processes", str(processes)]
    return ["-m", "jaxfeed", "train", "--quiet", *job, "--process-id", str(me), *args]


def _finish(children: list[subprocess.Popen], logs: list[Path]) -> list[tuple[int, str]]:
    """Each child's exit status and output; kills them all if one outlives HARD_TIMEOUT."""
    try:
        for child in children:
            child.wait(timeout=HARD_TIMEOUT)
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    return [(c.returncode, log.read_text()) for c, log in zip(children, logs, strict=True)]


def _cli_job(tmp_path: Path, *per_process: list[str] | None) -> list[tuple[int, str]]:
    """``jaxfeed train`` as process i with ``per_process[i]`` (None: never started)."""
    coordinator, n = f"127.0.0.1:{free_port()}", len(per_process)
    started = [(i, args) for i, args in enumerate(per_process) if args is not None]
    logs = [tmp_path / f"process{i}.log" for i, _ in started]
    children = [
        _start(_cli(coordinator, n, i, "--peer-timeout", PEER_TIMEOUT, *args), log)
        for (i, args), log in zip(started, logs, strict=True)
    ]
    return _finish(children, logs)


@pytest.mark.slow
def test_processes_that_disagree_refuse_to_train(tmp_path):
    # Three settings differ in one job (one job's start-up, not three): each is named,
    # and nothing else.
    flags = {"--batch-size": ("64", "32"), "--seed": ("0", "1"), "--learning-rate": ("0.05", "0.1")}
    expected = {
        "batch_size: process 0 has 64, process 1 has 32",
        "seed: process 0 has 0, process 1 has 1",
        "learning_rate: process 0 has 0.05, process 1 has 0.1",
    }
    per_process = [
        ["--epochs", "1", *(part for flag, values in flags.items() for part in (flag, values[i]))]
        for i in range(2)
    ]
    for status, output in _cli_job(tmp_path, *per_process):
        assert status == 2, output
        said = re.search(r"^jaxfeed: error: processes disagree on (.*)\. Start every", output, re.M)
        assert said and set(said[1].split("; on ")) == expected, output
        assert "epoch 1/1" not in output  # refused before the first step


@pytest.mark.slow
def test_processes_with_different_data_refuse_to_train(tmp_path, mnist_dir):
    # The same dataset name and size on both, but one host's copy has other labels.
    other = tmp_path / "other-copy"
    shutil.copytree(mnist_dir, other)
    write_idx(other / T10K_LABELS, (read_idx(other / T10K_LABELS) + 1) % 10)
    common = ["--epochs", "1", "--dataset", "mnist-10k", "--data-dir"]
    for status, output in _cli_job(tmp_path, [*common, str(mnist_dir)], [*common, str(other)]):
        assert status == 2, output
        assert re.search(
            r"processes disagree on train_fingerprint: process 0 has \"\w+\", process 1 has "
            r"\"\w+\"; on test_fingerprint: ",
            output,
        ), output
        assert "train_examples" not in output  # what matches is not listed


def test_processes_reading_local_copies_at_other_paths_train_together(tmp_path):
    # Each host reads its own byte-identical copy of the data, at its own path:
    # the job compares the content, not the path (issue 29, item 11).
    images, digits = sample_digits()
    first = tmp_path / "host0" / "digits"
    for split, rows in (("train", slice(0, 512)), ("test", slice(512, 768))):
        (first / split).mkdir(parents=True)
        np.save(first / split / "image.npy", images[rows, :, :, None])
        np.save(first / split / "label.npy", digits[rows].astype(np.int32))
    copy = shutil.copytree(first, tmp_path / "host1" / "local-copy")
    common = ["--epochs", "1", "--batch-size", "64", "--dataset"]
    for status, output in _cli_job(tmp_path, [*common, str(first)], [*common, str(copy)]):
        assert status == 0, output
        assert "epoch 1/1" in output and "disagree" not in output


def test_disagreements_name_every_process_value():
    settings = {0: {"seed": "0", "lr": "1"}, 1: {"seed": "7", "lr": "1"}, 2: {"seed": "0"}}
    assert disagreements(settings) == [
        "seed: processes 0, 2 have 0, process 1 has 7",
        "lr: processes 0, 1 have 1, process 2 has nothing",
    ]


def test_one_process_agrees_with_itself():
    assert sharding.check_agreement({"seed": 1}) is None  # no job joined: nothing to compare


@pytest.mark.slow
@pytest.mark.parametrize(
    ("started", "expected"),
    [
        (0, r"process 0 waited 10 s at 127\.0\.0\.1:\d+ for the other processes; process 1 did "),
        (1, r"process 1 waited 10 s for process 0, the coordinator at 127\.0\.0\.1:\d+, which "),
    ],
)
def test_a_peer_that_never_starts_is_named(tmp_path, started, expected):
    per_process = [None, None]
    per_process[started] = ["--epochs", "1"]
    ((status, output),) = _cli_job(tmp_path, *per_process)
    assert status == 2, output
    assert re.search("jaxfeed: error: " + expected, output), output
    assert "another task died" not in output  # JAX's own, misleading abort did not come first


@pytest.mark.slow
def test_a_peer_that_fails_early_is_reported_by_the_others(tmp_path):
    (status0, output0), (status1, output1) = _cli_job(
        tmp_path, ["--epochs", "1"], ["--epochs", "1", "--loader", "nope"]
    )
    assert status1 == 2 and "jaxfeed: error: unknown backend 'nope'" in output1
    assert status0 == 2, output0
    assert "process 1 failed before training: ValueError: unknown backend 'nope'" in output0


@pytest.mark.slow
def test_a_peer_killed_during_the_agreement_is_named(tmp_path):
    coordinator, settings = f"127.0.0.1:{free_port()}", json.dumps({"seed": 0})
    logs = [tmp_path / "process0.log", tmp_path / "process1.log"]
    children = [
        _start(
            [str(WORKER), "agree", coordinator, "2", str(i), settings, *(["die"] * i)],
            log,
            JAXFEED_PEER_TIMEOUT=PEER_TIMEOUT,
        )
        for i, log in enumerate(logs)
    ]
    (status0, output0), (status1, _) = _finish(children, logs)
    assert status1 == -signal.SIGKILL
    assert status0 == 3, output0
    assert "TimeoutError: process 0 waited 3 s for the settings of process 1" in output0


@contextlib.contextmanager
def _training_job(
    tmp_path: Path,
    *args: str,
    name: str = "process",
    processes: int = 2,
    started: str = "epoch 1/1000",
    **env: str,
) -> Iterator[tuple]:
    """A ``jaxfeed train --epochs 1000`` of ``processes`` processes (each in a session
    of its own), once process 0's log shows ``started`` (it is the one that prints
    progress lines) and every log the first epoch's start: (coordinator, children,
    logs). Whatever is still running at the end is killed."""
    coordinator = f"127.0.0.1:{free_port()}"
    logs = [tmp_path / f"{name}{i}.log" for i in range(processes)]
    args = ("--epochs", "1000", "--batch-size", "32", *args)
    children = [
        _start(_cli(coordinator, processes, i, *args), log, session=True, **env)
        for i, log in enumerate(logs)
    ]
    try:
        deadline = time.monotonic() + HARD_TIMEOUT
        while not (
            started in logs[0].read_text()
            and all("jaxfeed train:" in log.read_text() for log in logs)
        ):
            assert time.monotonic() < deadline, "training did not start"
            assert all(c.poll() is None for c in children), [log.read_text() for log in logs]
            time.sleep(0.2)
        yield coordinator, children, logs
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
            child.wait()


@pytest.mark.slow
@pytest.mark.parametrize("killed", [0, 1])
def test_a_peer_killed_during_training_stops_the_job(tmp_path, killed):
    # The survivor leaves through os._exit (JAX's shutdown barrier would wait for
    # the dead peer): its Grain workers (which ignore SIGTERM) lived on, with
    # their shared memory, holding its output open. Now it ends them first, fast
    # enough that JAX does not abort it when its coordinator (process 0) is gone.
    grain = ("--loader", "grain", "--loader-option", "num_workers=2") if killed == 0 else ()
    with _training_job(tmp_path, *grain, "--peer-timeout", PEER_TIMEOUT) as (_, children, logs):
        workers = _workers(children[1 - killed].pid) if grain else set()
        children[killed].kill()
        results = _finish(children, logs)
    status, output = results[1 - killed]
    assert status == 2, output
    # Named at the failed collective, or when the roll call's connection closed.
    victim = rf"process {killed} \(pid {children[killed].pid} on .+\)"
    assert re.search(
        rf"jaxfeed: error: (process {1 - killed} lost its connection to {victim} during "
        rf"training|{victim} is gone: its connection to process {1 - killed} closed)",
        output,
    ), output
    assert not [pid for pid in workers if process_alive(pid)], "workers outlived the survivor"


def _in_sessions(sessions: set[int]) -> list[int]:
    """The processes still running in any of ``sessions``."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):  # gone meanwhile
            if os.getsid(int(entry)) in sessions:
                found.append(int(entry))
    return found


def _shared_memory() -> set[str]:
    """jaxfeed's batch directories and its workers' segments in /dev/shm (each
    process's segment lock stays until the next run's sweep, as after any run)."""
    return {*glob.glob("/dev/shm/jaxfeed-batches-*"), *glob.glob("/dev/shm/psm_jaxfeed-*")}


@pytest.mark.slow
@pytest.mark.parametrize("fault", [signal.SIGKILL, signal.SIGSTOP], ids=lambda s: s.name)
def test_a_lost_process_of_four_is_named_by_every_other(tmp_path, fault):
    # With 4 processes, process 0 left as soon as it found process 3 gone, and its
    # coordination service with it: JAX aborted processes 1 and 2 (a C++ "Check
    # failure stack trace", PollForError "Socket closed"), or, with nothing in
    # flight to fail, aborted all three when process 3's heartbeats stopped.
    shm = _shared_memory()
    job = ("--loader", "grain", "--loader-option", "num_workers=1", "--log-every", "1")
    with _training_job(
        tmp_path,
        *job,
        "--peer-timeout",
        PEER_TIMEOUT,
        processes=4,
        started="  step 2  ",
        XLA_FLAGS="--xla_force_host_platform_device_count=2",
    ) as (_, children, logs):
        victim = children[3].pid
        sent = time.monotonic()
        children[3].send_signal(fault)
        results = _finish(children[:3], logs[:3])
        took = time.monotonic() - sent
        children[3].kill()  # a stopped one cannot wake now
        children[3].wait()
    print(f"the others left {took:.1f} s after {fault.name}")  # with -rP
    named = (
        rf"process 3 \(pid {victim} on .+\) has not answered process 0 for \d+ s: it is stopped"
        if fault == signal.SIGSTOP
        else rf"(process 3 \(pid {victim} on .+\) is gone: its connection to process 0 closed"
        rf"|process \d lost its connection to process 3 \(pid {victim} on .+\) during training)"
    )
    for status, output in results:
        assert status == 2, output
        assert output.count("jaxfeed: error:") == 1, output
        assert re.search("jaxfeed: error: " + named, output), output
        assert "Terminating process" not in output and "Check failure" not in output, output
    sessions = {child.pid for child in children}
    deadline = time.monotonic() + 30  # the victim's worker sees its parent gone
    while _in_sessions(sessions):
        assert time.monotonic() < deadline, _in_sessions(sessions)
        time.sleep(0.1)
    assert _shared_memory() <= shm


def _children(pid: int) -> set[int]:
    children = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as file:
            children |= {int(child) for child in file.read().split()}
    return children


def _workers(pid: int) -> set[int]:
    """The worker processes of ``pid`` (its children but multiprocessing's resource tracker)."""
    workers = set()
    for child in _children(pid):
        with open(f"/proc/{child}/cmdline") as cmdline:
            if "resource_tracker" not in cmdline.read():
                workers.add(child)
    assert len(workers) >= 2, workers
    return workers


@pytest.mark.slow
def test_a_second_job_on_a_running_jobs_coordinator_is_refused_unharmed(tmp_path):
    # Job B's process 1 would register with job A's coordination service, which
    # then aborted both of A's processes (134) about 2 s later.
    with _training_job(tmp_path, "--peer-timeout", PEER_TIMEOUT) as (coordinator, job_a, logs):
        port = coordinator.rpartition(":")[2]
        logs_b = [tmp_path / f"second{i}.log" for i in range(2)]
        job_b = [_start(_cli(coordinator, 2, i, "--epochs", "1"), logs_b[i]) for i in range(2)]
        (status0, output0), (status1, output1) = _finish(job_b, logs_b)
        assert status0 == 2 and f"127.0.0.1:{port} is in use" in output0, output0
        assert status1 == 2, output1
        assert re.search(
            r"jaxfeed: error: process 1 cannot join: process 1 of the job at this coordinator "
            r"is already running \(pid \d+ on .+\): is this a second job",
            output1,
        ), output1
        time.sleep(5)  # longer than A took to abort before
        assert all(child.poll() is None for child in job_a), [log.read_text() for log in logs]
        # A is healthy: a SIGTERM to one process stops both together.
        job_a[1].send_signal(signal.SIGTERM)
        results = _finish(job_a, logs)
    assert [status for status, _ in results] == [143, 143], results


@pytest.mark.slow
def test_a_paused_process_blames_itself(tmp_path):
    # The others stop hearing from a stopped process; when it runs again, its
    # own message must not blame them. It says so the moment it runs: JAX's
    # coordination client may abort it (SIGABRT) before a Python error is raised.
    with _training_job(tmp_path, "--peer-timeout", "4") as (_, children, logs):
        children[1].send_signal(signal.SIGSTOP)
        time.sleep(12)
        children[1].send_signal(signal.SIGCONT)
        (status0, output0), (status1, output1) = _finish(children, logs)
    assert status1 in (2, -signal.SIGABRT), output1
    assert output1.count("jaxfeed: error:") == 1, output1
    assert re.search(
        r"jaxfeed: error: process 1 itself was paused for 1\d s \(stopped with SIGSTOP or "
        r"Ctrl-Z, .*longer than the peer timeout of 4 s",
        output1,
    ), output1
    assert "lost its connection" not in output1
    assert status0 == 2, output0  # the healthy one names process 1 before JAX aborts it
    assert re.search(r"jaxfeed: error: process 1 \(pid \d+ on .+\) has not answered", output0)


@pytest.mark.slow
def test_a_frozen_peer_is_named_before_jax_aborts(tmp_path):
    # JAX's heartbeat timeout aborted the healthy process (SIGABRT, a C++ stack,
    # "stopped sending heartbeats") with no jaxfeed line naming the peer.
    with _training_job(tmp_path, "--peer-timeout", PEER_TIMEOUT) as (_, children, logs):
        children[1].send_signal(signal.SIGSTOP)
        children[0].wait(timeout=HARD_TIMEOUT)
        children[1].kill()  # still stopped: nothing can wake it now
        (status, output), _ = _finish(children, logs)
    assert status == 2, output
    assert re.search(
        rf"jaxfeed: error: process 1 \(pid {children[1].pid} on .+\) has not answered "
        r"process 0 for \d+ s: it is stopped \(SIGSTOP or Ctrl-Z\), hung",
        output,
    ), output
    assert "stopped sending heartbeats" not in output  # JAX's abort did not come first

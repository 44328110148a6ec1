"""Exact resume: ``kill -9`` a ``jaxfeed train`` mid-epoch (or mid-save), resume it, and
get parameters bit-identical to a run that was never interrupted. Also Ctrl-C, and a
2-process job killed and resumed.

A killed run is a subprocess; the reference and the resumed runs train in this
process (the same 8 simulated devices, `--devices` picks how many are used), which
keeps the suite fast. Children run in short slices, stopped (SIGSTOP) between them,
so a busy machine cannot let one race past the step it is to be killed at. Every
wait has a hard timeout.
"""

import os
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from backend_helpers import free_port
from resume_worker import train_in_process

from jaxfeed.training.checkpoint import (
    CheckpointFallbackWarning,
    TopologyChangedWarning,
    latest,
)

# Subprocesses, kills and whole training runs: the full suite (CI) runs it, the
# quick tier (-m "not slow") does not.
pytestmark = pytest.mark.slow

WORKER = Path(__file__).resolve().parents[2] / "tests" / "resume_worker.py"
REPO = WORKER.parents[1]
# 4,000 digits in batches of 256: 16 steps per epoch, the last one padded.
RUN = ("--epochs", "2", "--batch-size", "256")
STEPS_PER_EPOCH, STEPS = 16, 32
MID_EPOCH = [*range(3, STEPS_PER_EPOCH - 2), *range(STEPS_PER_EPOCH + 3, STEPS - 2)]
HARD_TIMEOUT = 120
SLICE_SECONDS = 0.02


def _params(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


def _assert_bit_identical(
    got: dict[str, np.ndarray], expected: dict[str, np.ndarray], context: str
) -> None:
    assert got.keys() == expected.keys()
    for key in expected:
        # Bits, not values: -0.0 == 0.0 and nan != nan would hide a difference.
        same = np.array_equal(got[key].view(np.uint32), expected[key].view(np.uint32))
        assert same, f"{key} differs from the uninterrupted run's ({context})"


def _steps(directory: Path) -> list[int]:
    """Steps of the complete checkpoints (Orbax renames a checkpoint to its step when done)."""
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def _start(args: list[str], log: Path, devices_per_process: int = 8) -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices_per_process}",
    }
    with log.open("w") as out:  # a file, not a pipe: a full pipe would block the child
        return subprocess.Popen(
            [sys.executable, *args], stdout=out, stderr=subprocess.STDOUT, env=env
        )


def _train(*args: str) -> list[str]:
    return ["-m", "jaxfeed", "train", "--quiet", *args]


def _stop_at_checkpoint(children: list[subprocess.Popen], directory: Path, step: int) -> int:
    """Runs ``children`` in slices until a complete checkpoint of ``step`` or later
    exists; returns that step with the children stopped (SIGSTOP)."""
    deadline = time.monotonic() + HARD_TIMEOUT
    while True:
        time.sleep(SLICE_SECONDS)
        for child in children:
            child.send_signal(signal.SIGSTOP)
        ended = [child.args for child in children if child.poll() is not None]
        assert not ended, f"ended before a checkpoint of step {step} (see its log): {ended}"
        done = [s for s in _steps(directory) if s >= step]
        if done:
            return done[0]
        assert time.monotonic() < deadline, f"no checkpoint of step {step} in {HARD_TIMEOUT} s"
        for child in children:
            child.send_signal(signal.SIGCONT)


def _end(children: list[subprocess.Popen]) -> None:
    """Kills whatever still runs (also when a test fails), and reaps it."""
    for child in children:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=HARD_TIMEOUT)


def _log(path: Path) -> str:
    return path.read_text()[-3000:]


# What an uninterrupted run does without these flags: a reference run with them is
# the run without them, trained once.
DEFAULTS = {"--loader": "numpy", "--devices": "8", "--steps-per-transfer": "1"}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Final parameters of uninterrupted runs, by their extra flags and values (cached)."""
    cache: dict[tuple[tuple[str, str], ...], dict[str, np.ndarray]] = {}

    def get(*args: str) -> dict[str, np.ndarray]:
        pairs = list(zip(args[::2], args[1::2], strict=True))
        key = tuple((flag, value) for flag, value in pairs if DEFAULTS.get(flag) != value)
        if key not in cache:
            path = tmp_path_factory.mktemp("reference") / "params.npz"
            flags = [part for pair in key for part in pair]
            status, _, err = train_in_process(*RUN, *flags, "--save-params", str(path))
            assert status == 0, err
            cache[key] = _params(path)
        return cache[key]

    return get


def _resume(directory: Path, *args: str) -> tuple[int, dict[str, np.ndarray], str]:
    """Resumes in this process; the step it resumed from, the final parameters, and
    what it printed (the warnings of a fallback or of another layout shown, not raised)."""
    path = directory.parent / "resumed.npz"
    argv = [*RUN, *args, "--checkpoint-dir", str(directory), "--resume", "--save-params", path]
    with warnings.catch_warnings():
        warnings.simplefilter("default", CheckpointFallbackWarning)
        warnings.simplefilter("default", TopologyChangedWarning)
        status, out, err = train_in_process(*map(str, argv))
    assert status == 0, err
    resumed = re.search(r"resuming from step (\d+) ", out)
    assert resumed, out
    return int(resumed[1]), _params(path), out + err


# A covering design, not the full cross product (each case is a killed run, a
# reference run and a resumed run): every backend is killed once, and each other
# option rides on one of them: 8 devices (numpy, grain), several steps per
# transfer (grain), the block order (hf), encoded records augmented in workers
# (torch). Each case kills at a random mid-epoch step of either epoch. The
# default options on one device are killed by the tests below (numpy), torch
# and grain with workers by the SIGTERM test.
@pytest.mark.parametrize(
    ("loader", "devices", "steps_per_transfer", "order"),
    [
        ("numpy", 8, 1, ()),
        ("tf", 1, 1, ()),
        ("grain", 8, 3, ()),
        ("hf", 1, 1, ("--block-shuffle", "300")),  # the block order resumes exactly too
        # Encoded records, augmented per record in 2 torch workers: the draws resume too.
        ("torch", 1, 1, ("--dataset", "digits-png", "--loader-option", "num_workers=2")),
    ],
)
def test_kill_9_mid_epoch_then_resume_is_bit_identical(
    tmp_path, reference, loader, devices, steps_per_transfer, order
):
    args = ["--loader", loader, "--devices", str(devices), *order]
    args += ["--steps-per-transfer", str(steps_per_transfer)]
    directory = tmp_path / "checkpoints"
    target = random.choice(MID_EPOCH)
    log = tmp_path / "killed.log"
    # Every 3 steps: a random kill lands between saves, or in one.
    child = _start(
        _train(*RUN, *args, "--checkpoint-dir", str(directory), "--checkpoint-every", "3"), log
    )
    try:
        _stop_at_checkpoint([child], directory, target)
        child.kill()  # SIGKILL, maybe in the middle of writing the next checkpoint
    finally:
        _end([child])
    assert child.returncode == -signal.SIGKILL, _log(log)

    resumed_from, params, _ = _resume(directory, *args)
    context = f"killed after step {target}, resumed from step {resumed_from}"
    assert target <= resumed_from < STEPS, context
    _assert_bit_identical(params, reference(*args), context)


def test_kill_during_a_save_resumes_from_the_last_complete_checkpoint(tmp_path, reference):
    directory, marker, log = tmp_path / "checkpoints", tmp_path / "saving", tmp_path / "run.log"
    blocked = random.choice([8, 12, 20, 24])  # saves every 4 steps; 16 ends epoch 1
    args = [*RUN, "--devices", "1", "--checkpoint-dir", str(directory), "--checkpoint-every", "4"]
    child = _start([str(WORKER), str(blocked), str(marker), "--quiet", *args], log)
    try:
        deadline = time.monotonic() + HARD_TIMEOUT
        while not marker.exists():
            assert child.poll() is None, _log(log)
            assert time.monotonic() < deadline, "the save never started"
            time.sleep(0.05)
        # The save is under way, blocked: Orbax's temporary directory, partly
        # written, is there or about to be (its name appears on its own
        # thread's time: waited for, not assumed, on a loaded machine).
        partial = []
        while not partial:
            partial = list(directory.glob(f"{blocked}.orbax-checkpoint-tmp*"))
            assert child.poll() is None, _log(log)
            assert time.monotonic() < deadline, f"no temporary dir: {list(directory.iterdir())}"
            time.sleep(0.05)
        (partial,) = partial
        child.kill()
    finally:
        _end([child])
    assert _steps(directory)[-1] == blocked - 4

    resumed_from, params, _ = _resume(directory, "--devices", "1")
    assert resumed_from == blocked - 4
    assert not partial.exists()  # cleaned up by the resumed run
    _assert_bit_identical(params, reference("--devices", "1"), f"save of step {blocked} killed")


@pytest.mark.parametrize(
    ("signum", "status", "said"),
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, r"preempted \(SIGTERM\)")],
    ids=["ctrl-c", "sigterm"],
)
def test_a_signal_saves_a_checkpoint_of_its_step_exits_and_resumes(
    tmp_path, reference, signum, status, said
):
    directory, log = tmp_path / "checkpoints", tmp_path / "run.log"
    args = [*RUN, "--devices", "1", "--checkpoint-dir", str(directory), "--checkpoint-every", "5"]
    child = _start(_train(*args), log)
    try:
        _stop_at_checkpoint([child], directory, random.choice([5, 10, 20]))
        child.send_signal(signum)
        signalled = time.monotonic()
        child.send_signal(signal.SIGCONT)
        child.wait(timeout=HARD_TIMEOUT)  # no thread may keep it alive
        seconds = time.monotonic() - signalled
    finally:
        _end([child])
    output = _log(log)
    assert child.returncode == status, output
    assert seconds < 10, f"took {seconds:.1f} s to stop"
    stopped = re.search(
        rf"^jaxfeed: {said}: stopped at epoch \d, batch \d+ \(step (\d+)\); checkpoint of "
        rf"step \1 in {re.escape(str(directory))}$",
        output,
        re.MULTILINE,
    )
    assert stopped, output
    assert latest(directory)["step"] == int(stopped[1])

    resumed_from, params, _ = _resume(directory, "--devices", "1")
    assert resumed_from == int(stopped[1])
    _assert_bit_identical(params, reference("--devices", "1"), stopped[0])


def test_a_checkpoint_that_cannot_be_written_stops_the_run_at_once(tmp_path):
    # A full disk, simulated with a file-size limit (no root needed): every write
    # past 100 kB fails with EFBIG, as one past the free space fails with ENOSPC.
    # Once, Orbax's failed save threads printed a 155-line traceback, and a
    # read-only directory left the run waiting for good.
    def limit_file_size() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failed write, not a killed process
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))

    directory = tmp_path / "checkpoints"
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, *_train(*RUN, "--checkpoint-dir", str(directory),
                                 "--checkpoint-every", "5")],
        capture_output=True, text=True, env=env, preexec_fn=limit_file_size,
        timeout=HARD_TIMEOUT,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert time.monotonic() - started < 60  # no thread left waiting
    assert run.stderr.strip().splitlines()[-1] == (
        f"jaxfeed: error: could not write the checkpoint of step 5 in {directory}: File too "
        f"large (errno 27). Free space there or pick a writable --checkpoint-dir; no "
        f"checkpoint was completed"
    ), run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    assert _steps(directory) == []  # nothing that looks complete


def _job(tmp_path: Path, name: str, *args: str) -> tuple[list[subprocess.Popen], list[Path]]:
    """2 processes of ``jaxfeed train`` on loopback, 2 CPU devices each."""
    coordinator = f"127.0.0.1:{free_port()}"
    logs = [tmp_path / f"{name}{i}.log" for i in range(2)]
    job = ["--coordinator", coordinator, "--num-processes", "2"]
    children = [
        _start(_train(*job, "--process-id", str(i), *args), log, devices_per_process=2)
        for i, log in enumerate(logs)
    ]
    return children, logs


def _finish(children: list[subprocess.Popen], logs: list[Path]) -> list[str]:
    try:
        for child in children:
            child.wait(timeout=HARD_TIMEOUT)
    finally:
        _end(children)
    for child, log in zip(children, logs, strict=True):
        assert child.returncode == 0, _log(log)
    return [log.read_text() for log in logs]


def _flip_bytes(path: Path) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.fixture(scope="module")
def one_epoch_checkpoints(tmp_path_factory) -> Path:
    """Checkpoints of a one-epoch run on one process (steps 6, 12, 16): trained once,
    each test resumes (or damages) a copy."""
    directory = tmp_path_factory.mktemp("one-epoch") / "checkpoints"
    status, _, err = train_in_process(
        "--epochs", "1", *RUN[2:], "--checkpoint-dir", str(directory), "--checkpoint-every", "6"
    )
    assert status == 0, err
    assert _steps(directory) == [6, 12, 16]
    return directory


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory) -> Path:
    """A one-epoch run of 2 processes x 128 rows (16 steps, as RUN's), trained once: its
    directory holds its checkpoints (the epoch's end) and its final parameters."""
    parent = tmp_path_factory.mktemp("two-processes")
    _finish(*_job(parent, "two", "--epochs", "1", "--batch-size", "128",
                  "--checkpoint-dir", str(parent / "checkpoints"),
                  "--save-params", str(parent / "params.npz")))  # fmt: skip
    return parent


@pytest.mark.parametrize("damage", [_flip_bytes, _truncate], ids=["flipped", "truncated"])
def test_a_damaged_newest_checkpoint_falls_back_and_ends_bit_identical(
    tmp_path, reference, damage, one_epoch_checkpoints
):
    directory = tmp_path / "checkpoints"
    shutil.copytree(one_epoch_checkpoints, directory)
    for file in (directory / "16" / "state").rglob("*"):
        if file.is_file() and file.parent.name == "d":  # the OCDBT files holding the values
            damage(file)
    _, params, output = _resume(directory)
    assert re.search(
        r"jaxfeed: warning: step 16: .*/16/state (is unreadable|does not match).*; resuming "
        r"from step 12 instead",
        output,
    ), output
    _assert_bit_identical(params, reference(), f"resumed from step 12 ({damage.__name__})")


def test_a_two_process_checkpoint_resumes_on_one_process(tmp_path, reference, two_process_run):
    # Elastic: 2 processes x 128 rows, then 1 x 256: the same global batches go on.
    directory = tmp_path / "checkpoints"
    shutil.copytree(two_process_run / "checkpoints", directory)
    resumed_from, params, output = _resume(directory)
    assert resumed_from == STEPS_PER_EPOCH
    _assert_topology_said(output, now=(1, 8), written=(2, 4))
    _assert_within_rounding(params, reference())


def _assert_topology_said(output: str, now: tuple[int, int], written: tuple[int, int]) -> None:
    said = (
        rf"warning: resuming on {now[0]} process\(es\), {now[1]} device\(s\) .* written on "
        rf"{written[0]} process\(es\), {written[1]} device\(s\)"
    )
    assert re.search(said, output), output


def _assert_within_rounding(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    """Equal up to the rounding of sums added in another order (measured: ~2e-7)."""
    for key in want:
        assert np.max(np.abs(got[key] - want[key])) <= 1e-5 * np.max(np.abs(want[key])), key


def test_a_one_process_checkpoint_resumes_on_two_processes(
    tmp_path, reference, one_epoch_checkpoints
):
    # Elastic the other way: 1 process x 256 rows, then 2 x 128.
    directory, params = tmp_path / "checkpoints", tmp_path / "resumed.npz"
    shutil.copytree(one_epoch_checkpoints, directory)  # resumed from its newest: step 16
    outputs = _finish(*_job(tmp_path, "two", "--epochs", "2", "--batch-size", "128",
                            "--checkpoint-dir", str(directory), "--resume",
                            "--save-params", str(params)))  # fmt: skip
    for i, output in enumerate(outputs):
        assert re.search(rf"\[process {i}\] resuming from step {STEPS_PER_EPOCH} ", output), output
        _assert_topology_said(output, now=(2, 4), written=(1, 8))
    _assert_within_rounding(_params(params), reference())


@pytest.mark.slow
def test_two_processes_killed_mid_epoch_resume_to_the_same_parameters(tmp_path, two_process_run):
    # Global batch 256 = 128 per process: 16 steps per epoch, as above.
    run = ["--epochs", "1", "--batch-size", "128"]
    directory = tmp_path / "checkpoints"
    checkpoints = ["--checkpoint-dir", str(directory), "--checkpoint-every", "2"]

    target = random.choice(range(3, STEPS_PER_EPOCH - 2))
    children, _ = _job(tmp_path, "killed", *run, *checkpoints)
    try:
        _stop_at_checkpoint(children, directory, target)
        for child in children:
            child.kill()
    finally:
        _end(children)

    resumed = tmp_path / "resumed.npz"
    outputs = _finish(
        *_job(tmp_path, "resumed", *run, *checkpoints, "--resume", "--save-params", str(resumed))
    )
    for i, output in enumerate(outputs):
        found = re.search(rf"\[process {i}\] resuming from step (\d+) ", output)
        assert found and target <= int(found[1]) < STEPS_PER_EPOCH, output
    context = f"both killed after step {target}"
    _assert_bit_identical(_params(resumed), _params(two_process_run / "params.npz"), context)

    # One process with the same per-process batch has another global batch: refused.
    status, _, err = train_in_process(*run, "--checkpoint-dir", str(directory), "--resume")
    assert status == 2 and "global_batch 256, this run has 128" in err, err


@pytest.mark.parametrize("loader", ["torch", "grain"])
def test_a_terminals_ctrl_c_to_the_whole_group_stops_a_run_with_workers(tmp_path, loader):
    # A terminal's Ctrl-C reaches the loader's workers too; they must leave it to the
    # main process, which stops at a step, saves, closes them and exits. Once hung for
    # minutes when it landed while workers were starting (epoch ends, evaluation).
    directory, log = tmp_path / "checkpoints", tmp_path / "run.log"
    args = ["--loader", loader, "--loader-option", "num_workers=2", "--epochs", "20",
            "--batch-size", "16", "--checkpoint-dir", str(directory),
            "--checkpoint-every", "100"]  # fmt: skip
    child = _start_own_group(_train(*args), log)
    try:
        deadline = time.monotonic() + HARD_TIMEOUT
        while not _steps(directory) and time.monotonic() < deadline:  # the first save: step 100
            time.sleep(0.05)
        time.sleep(random.uniform(0.0, 3.0))  # then anywhere in the next epochs
        seconds = _seconds_to_exit(child, signal.SIGINT)
    finally:
        _end([child])
    output = _log(log)
    assert child.returncode == 130, output
    assert re.search(r"jaxfeed: interrupted: stopped at .* checkpoint of step \d+ in", output), (
        output
    )
    # 2-8 s on a 2-core machine (spawned workers finish starting first); 20 s leaves room.
    assert seconds < 20, f"took {seconds:.1f} s to stop"
    _assert_group_gone(child.pid)


@pytest.mark.parametrize("loader", ["torch", "grain"])
def test_sigterm_to_a_run_with_workers_resumes_bit_identical_and_leaves_no_process(
    tmp_path, reference, loader
):
    # Preemption: a machine that shuts down sends SIGTERM to every process, the
    # workers too. Once a worker killed while it started left torch's spawn
    # blocked for good, and killed Grain workers leaked their shared memory.
    directory, log = tmp_path / "checkpoints", tmp_path / "run.log"
    args = ["--loader", loader, "--loader-option", "num_workers=2", "--devices", "1"]
    checkpoints = ["--checkpoint-dir", str(directory), "--checkpoint-every", "5"]
    child = _start_own_group(_train(*RUN, *args, *checkpoints), log)
    try:
        _stop_at_checkpoint([child], directory, random.choice([5, 10, 15, 20]))
        seconds = _seconds_to_exit(child, signal.SIGTERM)  # the workers get it too
    finally:
        _end([child])
    output = _log(log)
    assert child.returncode == 143, output
    assert seconds < 20, f"took {seconds:.1f} s to stop"  # torch's next-epoch workers: ~4 s
    stopped = re.search(r"preempted \(SIGTERM\): stopped at .* \(step (\d+)\); checkpoint", output)
    assert stopped, output
    assert _left_behind(output) == 0, output  # no semaphore or shared memory left
    _assert_group_gone(child.pid)

    resumed_from, params, _ = _resume(directory, *args)
    assert resumed_from == int(stopped[1])
    _assert_bit_identical(params, reference(*args), stopped[0])


def _left_behind(output: str) -> int:
    """How many semaphores or shared memory blocks multiprocessing's resource
    tracker still found at shutdown: those it calls leaked, less those already
    gone when it tried to remove them ("[Errno 2]": their owner removed them,
    and the tracker missed the owner's word; seen once in about 20 runs)."""
    reported = sum(int(n) for n in re.findall(r"There appear to be (\d+) leaked", output))
    return reported - len(re.findall(r"resource_tracker: '[^']+': \[Errno 2\]", output))


def _start_own_group(args: list[str], log: Path) -> subprocess.Popen:
    """A child in a process group of its own, as a terminal's job: a signal to
    the group reaches its loader workers too."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    with log.open("w") as out:
        return subprocess.Popen([sys.executable, *args], stdout=out, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)  # fmt: skip


def _seconds_to_exit(child: subprocess.Popen, signum: int) -> float:
    """Sends ``signum`` to the child's whole group (resuming it if stopped) and
    times its exit."""
    os.killpg(child.pid, signum)
    signalled = time.monotonic()
    os.killpg(child.pid, signal.SIGCONT)
    child.wait(timeout=HARD_TIMEOUT)
    return time.monotonic() - signalled


def _assert_group_gone(pgid: int) -> None:
    """No worker left behind (multiprocessing's resource tracker goes within a second)."""
    for _ in range(100):
        left = _group(pgid)
        if not left:
            return
        time.sleep(0.1)
    raise AssertionError(f"processes left in the group: {left}")


def _group(pgid: int) -> list[int]:
    """The live processes of process group ``pgid`` (from /proc: field 5 of stat)."""
    members = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # not a process, or gone
        if entry.name.isdigit() and fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def test_sigterm_to_one_process_stops_the_whole_job_at_one_step(tmp_path):
    # Preemption may reach one process of a job: the others learn it at the next
    # due checkpoint (where they agree), and every process saves the same step.
    directory = tmp_path / "checkpoints"
    args = ["--epochs", "20", "--batch-size", "16", "--checkpoint-dir", str(directory),
            "--checkpoint-every", "20"]  # fmt: skip
    children, logs = _job(tmp_path, "job", *args)
    try:
        deadline = time.monotonic() + HARD_TIMEOUT
        while not _steps(directory) and time.monotonic() < deadline:
            time.sleep(0.05)
        children[1].send_signal(signal.SIGTERM)
        for child in children:
            child.wait(timeout=HARD_TIMEOUT)
    finally:
        _end(children)
    outputs = [log.read_text() for log in logs]
    assert [child.returncode for child in children] == [143, 143], outputs
    steps = {
        re.search(r"preempted \(SIGTERM\): stopped at .*\(step (\d+)\); checkpoint of", out)[1]
        for out in outputs
    }
    assert len(steps) == 1 and int(steps.pop()) % 20 == 0, outputs  # one step, a due checkpoint

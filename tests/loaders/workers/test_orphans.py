"""Shared memory and workers on a shared machine: nothing outlives a run killed
outright (its workers end when they see their parent gone, removing the batch
directory in /dev/shm as they go, the owner's lock having died with it;
Grain's workers, which Grain starts itself, alike, their shared-memory
segments named after their run), and a full /dev/shm is named with the fix."""

import contextlib
import glob
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from backend_helpers import process_alive
from jaxfeed.loaders._io import owner_lock
from jaxfeed.loaders._workers import owned_segments, shared_batches

TESTS = Path(__file__).resolve().parents[2]

# Reads a batch through two workers, says who they are, then waits to be killed.
_RUN = r"""
import glob, json, os, sys, tempfile
sys.path.insert(0, sys.argv[2])
from jaxfeed import loaders
from transform_helpers import encoded_digits, random_augment

def batch_dirs():  # in /dev/shm, or the temporary directory where there is none
    return {*glob.glob("/dev/shm/jaxfeed-batches-*"),
            *glob.glob(os.path.join(tempfile.gettempdir(), "jaxfeed-batches-*"))}

before = batch_dirs()
source = loaders.make(sys.argv[1], dataset=encoded_digits(32), batch_size=4,
                      transform=random_augment, num_workers=2)
batches = source.iter_epoch(0)
next(batches)
if sys.argv[1] == "numpy":  # a second loader (validation's): the same two workers
    validation = loaders.make("numpy", dataset=encoded_digits(8), batch_size=4,
                              transform=random_augment, num_workers=2)
    next(validation.iter_epoch(0))
me = os.getpid()
children = set()
for task in os.listdir(f"/proc/{me}/task"):
    with open(f"/proc/{me}/task/{task}/children") as file:
        children |= {int(pid) for pid in file.read().split()}
def owned(pid):  # the directories whose owner's lock ``pid`` holds open
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.endswith("/.owner.lock"):
            found.add(os.path.dirname(target))
    return found

# This run's, not those another run on the machine made meanwhile.
mine = set().union(*(owned(pid) for pid in (me, *children)))
made = sorted((batch_dirs() - before) & mine)
print(json.dumps({"children": sorted(children), "made": made}), flush=True)
sys.stdin.read()
"""


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_a_run_killed_outright_leaves_no_worker_and_no_batch_directory(backend):
    with subprocess.Popen(
        [sys.executable, "-c", _RUN, backend, str(TESTS)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as run:
        try:
            said = json.loads(run.stdout.readline())  # the workers are up and a batch was read
        finally:
            run.send_signal(signal.SIGKILL)
            run.wait(timeout=60)
    workers = said["children"]
    assert len(workers) >= 2, said
    if backend == "numpy":  # one pair for both loaders, and multiprocessing's resource tracker
        assert len(workers) <= 3, said
    assert said["made"], said
    # The workers end, and remove the batch directory as they go: not left
    # holding memory in /dev/shm until a next run.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (
        any(process_alive(pid) for pid in workers) or any(map(os.path.exists, said["made"]))
    ):
        time.sleep(0.1)
    assert not [pid for pid in workers if process_alive(pid)], (
        "workers outlived their killed parent"
    )
    assert not [d for d in said["made"] if os.path.exists(d)], "the batch directory outlived it"


# Starts a spawned worker that is still starting when this process is killed.
_LATE = r"""
import sys
sys.path.insert(0, sys.argv[2])
from backend_helpers import StartsAfter
from jaxfeed.loaders._workers.spawn import SPAWN

child = SPAWN.Process(target=StartsAfter(sys.argv[1]))
child.start()
print(child.pid, flush=True)
sys.stdin.read()
"""


def test_a_worker_still_starting_when_its_parent_is_killed_ends_too(tmp_path):
    # Under load a worker may still be importing when its parent is killed;
    # it must not take its new parent (init) for the one whose death it awaits.
    go = tmp_path / "parent-killed"
    with subprocess.Popen(
        [sys.executable, "-c", _LATE, str(go), str(TESTS)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as run:
        try:
            child = int(run.stdout.readline())
        finally:
            run.send_signal(signal.SIGKILL)
            run.wait(timeout=60)
    go.touch()  # the child finishes starting only now, its parent gone
    deadline = time.monotonic() + 60
    while process_alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = process_alive(child)
    if alive:
        os.kill(child, signal.SIGKILL)
    assert not alive, "a worker that started after its parent was killed lived on"


def test_a_full_dev_shm_is_named_with_its_size_and_the_fix(monkeypatch):
    import builtins
    import errno

    import numpy as np

    directory = shared_batches.make_directory()
    real_open = builtins.open

    def full(path, *args, **kwargs):
        if str(path).startswith(directory):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", full)  # as a 64 MiB /dev/shm does, batch after batch
    try:
        with pytest.raises(OSError, match=r"no space left in .* MiB in all\) .*--shm-size"):
            shared_batches.write({"x": np.zeros((128, 1024), np.float32)}, directory)
    finally:
        monkeypatch.undo()
        shared_batches.remove_directory(directory)


# Reads a batch through two Grain workers, says who they are and the tag their
# shared-memory segments carry, then waits to be killed.
_GRAIN_RUN = r"""
import glob, json, os, sys
sys.path.insert(0, sys.argv[1])
from jaxfeed import loaders
from jaxfeed.loaders._workers import owned_segments
from transform_helpers import encoded_digits, random_augment

source = loaders.make("grain", dataset=encoded_digits(64), batch_size=4,
                      transform=random_augment, num_workers=2)
batches = source.iter_epoch(0)
next(batches)
children = set()
for task in os.listdir(f"/proc/{os.getpid()}/task"):
    with open(f"/proc/{os.getpid()}/task/{task}/children") as file:
        children |= {int(pid) for pid in file.read().split()}
tag = owned_segments.owner_tag()
segments = glob.glob(f"/dev/shm/{owned_segments.SEGMENT_PREFIX}{tag}-*")
semaphores = set()  # the run's own (mapped by it or its children): the test removes them
for pid in [os.getpid(), *children]:
    with open(f"/proc/{pid}/maps") as file:
        semaphores |= {line.split()[-1] for line in file if "/dev/shm/sem.mp-" in line}
print(json.dumps({"children": sorted(children), "tag": tag, "segments": segments,
                  "semaphores": sorted(semaphores)}), flush=True)
sys.stdin.read()
"""


def _killed_grain_run(whole_group: bool) -> dict:
    """A Grain run with 2 workers, SIGKILLed (with its workers and resource
    tracker when ``whole_group``, as a container's end kills them all) once a
    batch was read; what it said. Returns when every process it started is gone."""
    with subprocess.Popen(
        [sys.executable, "-c", _GRAIN_RUN, str(TESTS)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as run:
        try:
            said = json.loads(run.stdout.readline())
        finally:
            if whole_group:
                os.killpg(run.pid, signal.SIGKILL)
            else:
                run.send_signal(signal.SIGKILL)
            run.wait(timeout=60)
    assert len(said["children"]) >= 3 and said["tag"], said  # 2 workers and the tracker
    assert said["segments"], said  # the workers' segments carry the run's tag
    deadline = time.monotonic() + 60
    while any(process_alive(pid) for pid in said["children"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in said["children"] if process_alive(pid)], (
        "outlived their killed parent"
    )
    return said


def _segments(tag: str) -> list[str]:
    return glob.glob(f"/dev/shm/{owned_segments.SEGMENT_PREFIX}{tag}-*")


@pytest.mark.slow
def test_grain_workers_and_their_tracker_end_with_a_parent_killed_outright():
    said = _killed_grain_run(whole_group=False)
    owned_segments.remove_dead_segments()  # what the next run does first
    assert not _segments(said["tag"])
    assert not glob.glob(f"/dev/shm/*{said['tag']}*")


@pytest.mark.slow
def test_segments_of_a_run_killed_with_its_tracker_go_with_the_next_run():
    said = _killed_grain_run(whole_group=True)
    left = _segments(said["tag"])
    assert left  # nothing alive could unlink them
    # A live run's segment (this test holds its tag's lock) is never touched.
    live_tag = "0123456789ab"
    lock = f"/dev/shm/jaxfeed-segments-{live_tag}.lock"
    live = f"/dev/shm/{owned_segments.SEGMENT_PREFIX}{live_tag}-00"
    handle = owner_lock.hold(lock)
    try:
        Path(live).write_bytes(b"x")
        removed = owned_segments.remove_dead_segments()
        assert set(left) <= set(removed) and not _segments(said["tag"])
        assert os.path.exists(live) and os.path.exists(lock)
    finally:
        os.close(handle)
        # Named semaphores carry no owner and the killed tracker cannot unlink
        # them (docs/data.md); the ones this run mapped are provably its own.
        for path in (live, lock, *said["semaphores"]):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


# Reads a batch through tf.data with a transform (autograph converts its map),
# says which autograph files it made, then waits to be killed.
_TF_RUN = r"""
import glob, json, os, sys, tempfile
sys.path.insert(0, sys.argv[1])
from jaxfeed import loaders
from transform_helpers import encoded_digits, random_augment

source = loaders.make("tf", dataset=encoded_digits(32), batch_size=4, transform=random_augment)
next(iter(source.iter_epoch(0)))
made = glob.glob(os.path.join(tempfile.gettempdir(), "**", "__autograph_generated_file*"),
                 recursive=True)
print(json.dumps(made), flush=True)
sys.stdin.read()
"""


@pytest.mark.slow
def test_a_killed_tf_run_leaves_no_autograph_file(tmp_path):
    from jaxfeed.loaders._doors.tf import AUTOGRAPH_PREFIX

    with subprocess.Popen(
        [sys.executable, "-c", _TF_RUN, str(TESTS)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    ) as run:
        try:
            made = json.loads(run.stdout.readline())
        finally:
            run.send_signal(signal.SIGKILL)
            run.wait(timeout=60)
    assert made, "autograph wrote no file: nothing was tested"
    # In a directory the run owned, not loose in $TMPDIR...
    assert all(Path(path).parent.name.startswith(AUTOGRAPH_PREFIX) for path in made), made
    # ...which the next run removes, its owner's lock having died with it.
    owner_lock.remove_dead_directories(tmp_path, AUTOGRAPH_PREFIX)
    assert not list(tmp_path.rglob("__autograph_generated_file*"))


# A wrapped Grain pipeline whose workers hand batches over in shared memory,
# read to its end and held to the exit, as a training script holds its loader.
# Outside absl.app.run, as most scripts are: wrap marks absl's flags parsed.
_WRAPPED_MP_PREFETCH = r"""
import grain
import numpy as np
from jaxfeed import loaders

rows = [{"x": np.full((8, 8), i, np.float32), "label": np.int32(i)} for i in range(64)]
dataset = (grain.MapDataset.source(rows).batch(16).to_iter_dataset()
           .mp_prefetch(grain.MultiprocessingOptions(num_workers=2)))
source = loaders.wrap(dataset)
labels = np.concatenate([batch["label"] for batch in source.iter_epoch(0)])
assert sorted(labels) == list(range(64)), labels
print("read", flush=True)
"""


@pytest.mark.slow
def test_a_wrapped_grain_mp_prefetch_leaves_no_shared_memory_at_exit():
    # Grain's iterator keeps its last batches in reference cycles; their
    # segments were unlinked only if a garbage collection came before the exit.
    run = subprocess.run(
        [sys.executable, "-c", _WRAPPED_MP_PREFETCH],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0 and run.stdout == "read\n", run.stderr[-3000:]
    assert "leaked shared_memory" not in run.stderr, run.stderr[-3000:]

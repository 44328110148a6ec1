"""The ray backend on a simulated 2-node Ray cluster (one per module): its
batches are the numpy backend's, byte for byte, also after a worker dies.

Each Ray start costs seconds, so the whole module shares one cluster, and the
quick tier runs none of it.
"""

import contextlib
import functools
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from backend_helpers import assert_same_batches, free_port, indexed_dataset
from jaxfeed.loaders import TransformError
from ray_helpers import (
    dies_on_row_20,
    ray_processes,
    shifted,
    shifted_or_stalled,
    worker_env,
)
from transform_helpers import encoded_digits, random_augment

from jaxfeed import loaders

pytestmark = pytest.mark.slow

TIMEOUT_SECONDS = 120


@pytest.fixture(scope="module")
def cluster():
    """Two simulated nodes of 2 CPUs each; make("ray") runs its tasks on them.
    (Two CPUs a node: the two-process job's drivers each keep their own workers,
    which Ray would otherwise stop and start in turn.)"""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    cluster.add_node(num_cpus=2)
    ray.init(
        address=cluster.address,
        logging_level="ERROR",
        log_to_driver=False,
        runtime_env=worker_env(),
    )
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def _both(dataset, **options):
    """The ray and the numpy backend over ``dataset`` with the same options."""
    return loaders.make("ray", dataset=dataset, **options), loaders.make(
        "numpy", dataset=dataset, **options
    )


def _epochs(source, epochs=(0, 1), start=0):
    return [b for e in epochs for b in source.iter_epoch(e, start=start)]


def test_two_nodes_give_the_numpy_batches_over_two_epochs(cluster):
    import ray

    assert sum(node["Alive"] for node in ray.nodes()) == 2
    # 300 rows in batches of 32: the last batch is padded and masked.
    ray_source, numpy_source = _both(indexed_dataset(), batch_size=32, seed=3)
    got = _epochs(ray_source)
    assert_same_batches(got, _epochs(numpy_source))
    assert not np.array_equal(got[0]["label"], got[10]["label"])  # a new order per epoch
    assert got[9]["mask"].sum() == 300 - 9 * 32


def test_transform_draws_are_the_numpy_ones(cluster):
    ray_source, numpy_source = _both(
        encoded_digits(64), batch_size=16, seed=5, transform=random_augment
    )
    assert_same_batches(_epochs(ray_source), _epochs(numpy_source))


def test_sources_taking_turns_on_the_same_workers_keep_their_own_rows(cluster):
    # Each Ray worker keeps the rows and transform of the last source it served:
    # a batch of the other source must bring that source's own.
    small = {"image": indexed_dataset().arrays["image"][:64] + 1, "label": np.arange(64)}
    pairs = [
        _both(data, batch_size=16, seed=4, transform=shifted) for data in (indexed_dataset(), small)
    ]
    for epoch in (0, 1):
        for ray_source, numpy_source in pairs:
            assert_same_batches(
                list(ray_source.iter_epoch(epoch)), list(numpy_source.iter_epoch(epoch))
            )


def test_start_resumes_mid_epoch_exactly(cluster):
    ray_source, numpy_source = _both(indexed_dataset(), batch_size=32, seed=3, transform=shifted)
    assert_same_batches(list(ray_source.iter_epoch(1, start=4)), _epochs(numpy_source)[14:])


@pytest.mark.parametrize("transform", [None, shifted], ids=["gathered here", "ray tasks"])
def test_process_slices_and_on_disk_fields(cluster, tmp_path, transform):
    data = indexed_dataset()
    for key, array in data.arrays.items():
        np.save(tmp_path / f"{key}.npy", array)
    mapped = {key: np.load(tmp_path / f"{key}.npy", mmap_mode="r") for key in data.arrays}
    for index in range(2):
        options = dict(
            batch_size=16, seed=1, process_index=index, process_count=2, transform=transform
        )
        ray_source, numpy_source = _both(mapped, **options)
        assert_same_batches(_epochs(ray_source, (0,)), _epochs(numpy_source, (0,)))


def test_a_killed_worker_costs_time_not_data(cluster, tmp_path):
    numpy_source = loaders.make(
        "numpy", dataset=indexed_dataset(), batch_size=32, seed=2, transform=shifted
    )
    # A row of epoch 1's second batch: its task is in flight while the first is read.
    row = int(list(numpy_source.iter_epoch(1))[1]["label"][5])
    stalled = functools.partial(shifted_or_stalled, str(tmp_path), row)
    ray_source = loaders.make(
        "ray", dataset=indexed_dataset(), batch_size=32, seed=2, transform=stalled
    )
    assert_same_batches(list(ray_source.iter_epoch(0)), list(numpy_source.iter_epoch(0)))
    (tmp_path / "epoch1").touch()
    batches = ray_source.iter_epoch(1)
    got = [next(batches)]  # tasks are in flight: the row's stalls in its worker
    deadline = time.monotonic() + TIMEOUT_SECONDS
    while not (tmp_path / "stalled").exists():
        assert time.monotonic() < deadline, f"row {row}'s task never started"
        time.sleep(0.01)
    worker = int((tmp_path / "stalled").read_text())
    os.kill(worker, signal.SIGKILL)
    (tmp_path / "go").touch()
    got.extend(batches)
    assert_same_batches(got, list(numpy_source.iter_epoch(1)))


def test_a_task_ray_gives_up_on_is_one_error_naming_its_rows(cluster, monkeypatch):
    from jaxfeed.loaders.backends import ray as ray_backend

    monkeypatch.setattr(ray_backend, "MAX_RETRIES", 0)  # one worker death, not four
    source = loaders.make(
        "ray",
        dataset=indexed_dataset(64),
        batch_size=32,
        seed=0,
        shuffle=False,
        transform=dies_on_row_20,
    )
    with pytest.raises(
        RuntimeError, match=r"Ray gave up on the batch of rows \[0, 1, .* of epoch 0"
    ):
        list(source.iter_epoch(0))


def test_a_transform_error_names_its_row(cluster):
    data = {"label_row": np.arange(16)}
    from transform_helpers import fail_on_row_7

    source = loaders.make("ray", dataset=data, batch_size=8, shuffle=False, transform=fail_on_row_7)
    with pytest.raises(TransformError, match=r"row 7 \(epoch 0\): KeyError"):
        list(source.iter_epoch(0))


_UNREACHABLE_CLUSTER = """
import sys
import numpy as np
from jaxfeed import loaders

data = {"image": np.arange(300 * 12, dtype=np.uint8).reshape(300, 12), "label": np.arange(300)}
options = dict(dataset=data, batch_size=32, seed=3)
# Nothing listens at this address: a source that asked Ray for anything fails.
ray_source = loaders.make("ray", ray_address="127.0.0.1:9", **options)
numpy_source = loaders.make("numpy", **options)
for epoch in (0, 1):
    for got, want in zip(ray_source.iter_epoch(epoch), numpy_source.iter_epoch(epoch), strict=True):
        assert got.keys() == want.keys()
        assert all(np.array_equal(got[k], want[k]) and got[k].dtype == want[k].dtype for k in got)
print("ray imported" if "ray" in sys.modules else "ray untouched")
"""


def test_without_a_transform_the_rows_are_gathered_here_not_in_ray_tasks():
    # No per-record work to send out: the batches are read in this process, so a
    # source whose cluster is unreachable still gives the numpy backend's batches.
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run(
        [sys.executable, "-c", _UNREACHABLE_CLUSTER],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,  # a source that waits for the cluster never comes back
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.splitlines()[-1] == "ray untouched"


_NO_CLUSTER = """
import json, os, sys, time
import numpy as np
from jaxfeed import loaders

def same(record, rng):
    return record

data = {"image": np.zeros((64, 4), np.uint8), "label": np.arange(64)}
for case in json.loads(sys.argv[1]):
    os.environ.update(case.pop("env"))
    source = loaders.make("ray", dataset=data, batch_size=32, transform=same, **case)
    began = time.monotonic()
    try:
        next(iter(source.iter_epoch(0)))
        said = "connected"
    except ConnectionError as err:
        said = str(err)
    print(json.dumps({"error": said, "seconds": time.monotonic() - began}), flush=True)
"""


def test_an_address_where_no_ray_answers_fails_in_bounded_time():
    # Ray waited for a cluster there without end, printing reconnection warnings.
    # A port where nothing listens, and a server that accepts and says nothing.
    with socket.create_server(("127.0.0.1", 0)) as silent:  # never accepts: the kernel does
        nothing = free_port()
        cases = [
            {"env": {"RAY_ADDRESS": f"127.0.0.1:{nothing}", "JAXFEED_RAY_CONNECT_TIMEOUT": "3"}},
            {
                "env": {"RAY_ADDRESS": ""},
                "ray_address": f"127.0.0.1:{silent.getsockname()[1]}",
                "connect_timeout_s": 3,
            },
            {"env": {"RAY_ADDRESS": f"ray://127.0.0.1:{nothing}"}},
        ]
        done = subprocess.run(
            [sys.executable, "-c", _NO_CLUSTER, json.dumps(cases)],
            capture_output=True,
            text=True,
            timeout=60,  # Ray's own wait has no end
        )
    assert done.returncode == 0, done.stderr[-4000:]
    closed, mute, client = (json.loads(line) for line in done.stdout.splitlines())
    start = r"Start one there \(`ray start --head` on that host\), or "
    assert re.fullmatch(
        rf"no Ray cluster at '127\.0\.0\.1:{nothing}' \(from the RAY_ADDRESS environment "
        rf"variable\): nothing answers there \(Connection refused\)\. {start}unset RAY_ADDRESS "
        r"to start a local instance here \(connect_timeout_s= or \$JAXFEED_RAY_CONNECT_TIMEOUT "
        r"sets how long a cluster has to answer\)",
        closed["error"],
    ), closed
    assert re.match(
        rf"no Ray cluster at '127\.0\.0\.1:\d+' \(from ray_address\): something listens there, "
        rf"but it did not answer as Ray does \(gRPC\) within 3 s\. {start}pass no ray_address",
        mute["error"],
    ), mute
    assert 3 <= mute["seconds"] < 15, mute
    client_error = rf"no Ray cluster at 'ray://127\.0\.0\.1:{nothing}' .*: nothing answers there"
    assert re.match(client_error, client["error"]), client
    assert closed["seconds"] < 10 and client["seconds"] < 10, (closed, client)


def test_a_connect_timeout_must_be_seconds():
    data = {"image": np.zeros((64, 4), np.uint8), "label": np.arange(64)}
    for bad in (0, -1, float("inf"), "soon"):
        with pytest.raises(ValueError, match=rf"got connect_timeout_s={bad!r}"):
            loaders.make("ray", dataset=data, batch_size=32, connect_timeout_s=bad)


WORKER = Path(__file__).resolve().parents[2] / "multihost_worker.py"


def test_a_two_process_jax_job_on_one_cluster_equals_one_process(cluster, tmp_path):
    # Each process joins the module's cluster (RAY_ADDRESS), submits its slice of
    # every global batch, and checks each placed global batch against one process's.
    coordinator = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "PYTHONPATH": str(WORKER.parents[1]), "RAY_ADDRESS": cluster.address}
    logs = [tmp_path / f"process{i}.log" for i in range(2)]
    children = []
    try:
        for i, log in enumerate(logs):
            with log.open("w") as out:  # a file, not a pipe: a full pipe would block a child
                args = [coordinator, "2", str(i), str(tmp_path), "ray", "check-only"]
                children.append(
                    subprocess.Popen(
                        [sys.executable, str(WORKER), *args],
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )
                )
        for child in children:
            child.wait(TIMEOUT_SECONDS)
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    for i, child in enumerate(children):
        assert child.returncode == 0, f"process {i} failed:\n{logs[i].read_text()[-4000:]}"
    results = [json.loads((tmp_path / f"process{i}.json").read_text()) for i in range(2)]
    per_process = [r["backends"]["ray"] for r in results]
    assert all(p["identical_to_single_process"] for p in per_process)
    seen = sorted(d for p in per_process for d in p["seen"])
    test = loaders.load_dataset("mnist-sample", "test")
    assert seen == sorted(hashlib.sha1(image.tobytes()).hexdigest() for image in test["image"])


_STARTS_AN_INSTANCE = """
import sys, threading
from jaxfeed import loaders
def doubled(record, rng):  # a transform: the rows go to Ray tasks, so Ray starts
    return {"x": record["x"] * 2}
source = loaders.make(
    "ray", dataset={"x": __import__("numpy").arange(64)}, batch_size=8, transform=doubled
)
next(source.iter_epoch(0))
print("ready", flush=True)
threading.Event().wait()
"""


@contextlib.contextmanager
def _an_instance():
    """A process that starts a local instance (no ``RAY_ADDRESS``), prints
    ``ready`` once its first batch is read, and then waits to be stopped;
    killed at the end if still running, its pipe closed."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    child = subprocess.Popen(
        [sys.executable, "-c", _STARTS_AN_INSTANCE],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    with child:  # closes the pipe: left to the collector, it warns in a later test
        try:
            yield child
        finally:
            if child.poll() is None:
                child.kill()


def test_no_ray_process_outlives_a_sigterm():
    # (Ctrl-C takes the same way out, through exit and atexit; one start is enough.)
    with _an_instance() as child:
        assert child.stdout.readline() == "ready\n"  # the local instance runs
        started = ray_processes(child.pid)
        assert any("raylet" in " ".join(p.cmdline()) for p in started)
        child.send_signal(signal.SIGTERM)
        child.wait(TIMEOUT_SECONDS)
        import psutil

        _, alive = psutil.wait_procs(started, timeout=TIMEOUT_SECONDS)
        assert alive == []


def test_no_ray_process_outlives_a_sigkill():
    # Ray ties its GCS and raylet to the driver, but its dashboard and runtime-env
    # agents outlive a killed one (by about a minute): jaxfeed's reaper ends them,
    # and ends itself only after they are gone.
    import psutil

    started = []
    with _an_instance() as child, _killed_at_the_end(started):
        assert child.stdout.readline() == "ready\n"
        started += ray_processes(child.pid)
        commands = {p: " ".join(p.cmdline()) for p in started}
        agents = [p for p, line in commands.items() if "Agent" in line]
        reapers = [p for p, line in commands.items() if "ray_reaper" in line]
        assert len(agents) == 2 and len(reapers) == 1, commands
        child.kill()
        child.wait(TIMEOUT_SECONDS)
        _, alive = psutil.wait_procs(reapers, timeout=TIMEOUT_SECONDS)
        assert alive == []
        # The reaper is gone, so is what it watched (the instance as it started:
        # GCS, raylet, agents, monitors), at most as zombies not yet collected.
        workers = [
            p for p, line in commands.items() if line.startswith("ray::") and p not in agents
        ]
        watched = [p for p in started if p not in workers and p not in reapers]
        assert [commands[p] for p in watched if _running(p)] == []
        _, alive = psutil.wait_procs(workers, timeout=TIMEOUT_SECONDS)  # they end themselves
        assert alive == []


@contextlib.contextmanager
def _killed_at_the_end(processes: list):
    """Kills what is still running of ``processes`` (a list filled later) at
    the end: nothing left behind by a failed run either."""
    try:
        yield
    finally:
        for process in processes:
            if _running(process):
                process.kill()


def _running(process) -> bool:
    import psutil

    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


_CLOSES_EPOCHS_EARLY = """
import numpy as np, ray
from jaxfeed import loaders
def plus_one(record, rng):
    return {"x": record["x"] + 1}
ray.init(logging_level="ERROR", log_to_driver=False)
source = loaders.make("ray", dataset={"x": np.arange(4000)}, batch_size=8, transform=plus_one)
for n in range(400):
    epoch = source.iter_epoch(n % 5)
    for _ in zip(range(1 + n % 3), epoch):
        pass
    epoch.close()
print("closed", n + 1, flush=True)
"""


def test_epochs_closed_early_while_tasks_finish_do_not_end_the_process(cluster):
    # A mixture closes its components' epochs at every mixture epoch's end.
    # ray.cancel on a task finishing at that moment aborted the process (a Ray
    # check failure, within ~100 closes here); tasks in flight are let finish.
    env = {**os.environ, "RAY_ADDRESS": cluster.address}
    child = subprocess.run(
        [sys.executable, "-c", _CLOSES_EPOCHS_EARLY],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_SECONDS,
    )
    assert child.returncode == 0 and "closed 400" in child.stdout, child.stderr[-3000:]


def test_packed_and_bucketed_batches_are_the_numpy_ones(cluster):
    rng = np.random.default_rng(7)
    rows = [rng.integers(1, 30000, n).astype(np.uint16) for n in rng.integers(1, 61, 300)]
    for layout in ({"pack": 96}, {"bucket": (16, 32, 64)}):
        ray_source, numpy_source = _both({"input_ids": rows}, batch_size=8, seed=11, **layout)
        assert_same_batches(_epochs(ray_source), _epochs(numpy_source))
        assert_same_batches(
            list(ray_source.iter_epoch(1, start=3)), list(numpy_source.iter_epoch(1))[3:]
        )


def test_a_mixtures_batches_are_the_numpy_ones(cluster):
    import jaxfeed

    small = {"image": indexed_dataset().arrays["image"][:40] + 1, "label": np.arange(40)}
    mixture = jaxfeed.Mixture(
        {"big": indexed_dataset(), "small": small}, weights={"big": 0.6, "small": 0.4}, until="big"
    )
    ray_source, numpy_source = _both(mixture, batch_size=16, seed=2, transform=shifted)
    assert_same_batches(_epochs(ray_source), _epochs(numpy_source))  # small wraps ~6 times
    assert_same_batches(
        list(ray_source.iter_epoch(1, start=5)), list(numpy_source.iter_epoch(1))[5:]
    )

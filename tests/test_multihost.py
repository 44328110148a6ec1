"""Multi-host on loopback: 2 and 3 real JAX processes (2 CPU devices each), gloo."""

import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import loaders
from jaxfeed import TrainConfig, train
from sharding import data_mesh

WORKER = Path(__file__).with_name("multihost_worker.py")
REPO = WORKER.parents[1]
BACKENDS = "numpy,torch,tf,grain,hf"
TIMEOUT_SECONDS = 300


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_job(processes: int, out_dir: Path) -> list[dict]:
    coordinator = f"127.0.0.1:{_free_port()}"
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
    every_image = sorted(hashlib.sha1(img.tobytes()).hexdigest() for img in test.images)

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

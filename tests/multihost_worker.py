"""One process of a multi-process test job (started by test_multihost.py).

Usage: python multihost_worker.py COORDINATOR NUM_PROCESSES PROCESS_ID OUT_DIR BACKENDS [check-only]
Each process checks every global batch against the single-process order,
records which samples it saw, trains one epoch (not with ``check-only``), and
writes OUT_DIR/process{I}.json.

Or: python multihost_worker.py agree COORDINATOR NUM_PROCESSES PROCESS_ID SETTINGS [die]
joins the job and runs sharding.check_agreement(SETTINGS, a JSON object), waiting
AGREE_TIMEOUT s; with ``die`` this process kills itself (SIGKILL) instead, 1 s
later, while the others wait in the check. Prints "agreed", or the error and exits 3.
"""

import hashlib
import json
import os
import signal
import sys
import time

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import jax
import numpy as np
from jax.experimental import multihost_utils
from jaxfeed.sharding.job.distributed import exit_now

from jaxfeed import loaders, sharding
from jaxfeed.mnist import TrainConfig, train

DATASET, LOCAL_BATCH, SEED = "mnist-sample", 24, 5
# Well below the job's peer timeout, JAX's heartbeat timeout: the check reports a
# dead peer before JAX's heartbeat does.
AGREE_TIMEOUT = 3


def digest(array: np.ndarray) -> str:
    return hashlib.sha1(np.ascontiguousarray(array).tobytes()).hexdigest()


def local_rows(array: jax.Array) -> np.ndarray:
    """This process's rows of a batch-sharded global array, in row order."""
    shards = sorted(array.addressable_shards, key=lambda s: s.index[0].start)
    return np.concatenate([np.asarray(s.data) for s in shards])


def as_read(record: dict, rng: np.random.Generator) -> dict:
    """The record unchanged: per-record work that sends the ray backend's rows
    through Ray tasks (without a transform it gathers them in its own process)."""
    return record


def check_backend(backend: str, mesh) -> dict:
    processes, me = jax.process_count(), jax.process_index()
    kwargs = dict(dataset=DATASET, split="test", seed=SEED)
    ray_tasks = {"transform": as_read} if backend == "ray" else {}
    source = loaders.make(
        backend,
        batch_size=LOCAL_BATCH,
        process_index=me,
        process_count=processes,
        **kwargs,
        **ray_tasks,
    )
    single = loaders.make("numpy", batch_size=LOCAL_BATCH * processes, **kwargs)
    seen, steps, identical, padded_steps = [], 0, True, 0
    for epoch in (0, 1):
        expected = list(single.iter_epoch(epoch))
        with sharding.DeviceFeed(source, mesh, epoch=epoch) as feed:
            for step, batch in enumerate(feed):
                assert batch["image"].shape[0] == LOCAL_BATCH * processes
                assert batch["image"].sharding.spec == jax.sharding.PartitionSpec("data")
                full = {
                    k: np.asarray(multihost_utils.process_allgather(v, tiled=True))
                    for k, v in batch.items()
                }
                for key in ("image", "label", "mask"):
                    identical &= bool(np.array_equal(full[key], expected[step][key]))
                padded_steps += int(not full["mask"].all())
                if epoch == 0:
                    images, mask = local_rows(batch["image"]), local_rows(batch["mask"])
                    assert len(images) == LOCAL_BATCH
                    seen += [digest(image) for image in images[mask]]
                steps += 1
        identical &= step + 1 == len(expected)
    return {
        "seen": seen,
        "steps": steps,
        "identical_to_single_process": identical,
        "padded_steps": padded_steps,
    }


def agree(coordinator: str, processes: str, me: str, settings: str, fault: str = "") -> None:
    sharding.initialize(coordinator, int(processes), int(me))
    if fault == "die":
        time.sleep(1)  # the others are in check_agreement by now
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        sharding.check_agreement(json.loads(settings), timeout_s=AGREE_TIMEOUT)
    except (ValueError, ConnectionError, TimeoutError) as err:
        print(f"{type(err).__name__}: {err}", file=sys.stderr)
        if isinstance(err, TimeoutError):
            exit_now(3)  # like the CLI: a lost peer would hold up JAX's shutdown barrier
        sys.exit(3)
    print("agreed", flush=True)
    jax.distributed.shutdown()


def main() -> None:
    if sys.argv[1] == "agree":
        agree(*sys.argv[2:])
        return
    coordinator, processes, me, out_dir, backends = sys.argv[1:6]
    sharding.initialize(coordinator, int(processes), int(me))
    mesh = sharding.data_mesh()
    result = {
        "process": jax.process_index(),
        "devices": jax.device_count(),
        "local_devices": jax.local_device_count(),
        "backends": {},
    }
    for backend in backends.split(","):
        result["backends"][backend] = check_backend(backend, mesh)
    if sys.argv[6:] == ["check-only"]:
        with open(os.path.join(out_dir, f"process{me}.json"), "w") as f:
            json.dump(result, f)
        jax.distributed.shutdown()
        return
    common = dict(
        dataset=DATASET,
        batch_size=LOCAL_BATCH,
        seed=SEED,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
    )
    params, history = train(
        loaders.make("grain", split="train", **common),
        loaders.make("grain", split="test", shuffle=False, **common),
        TrainConfig(epochs=1, seed=SEED),
        sharding=mesh,
        progress=False,
    )
    result["history"] = history
    result["params"] = digest(
        np.concatenate(
            [np.asarray(leaf.addressable_data(0)).ravel() for leaf in jax.tree.leaves(params)]
        )
    )
    with open(os.path.join(out_dir, f"process{me}.json"), "w") as f:
        json.dump(result, f)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()

"""What a checkpoint of the MNIST MLP costs: size, save time, restore time.

The state is the trainer's (parameters plus optax SGD momentum), filled with
random values so that nothing compresses better than a trained state would.
From the repository root::

    python3 benchmarks/checkpoint_cost.py
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

import common  # noqa: F401  (puts the repository on sys.path)
import jax
import jax.numpy as jnp

from jaxfeed.mnist.train import TrainConfig, init_state
from jaxfeed.training.checkpoint import Checkpointer, Checkpointing, latest

SAVES = 11


def main() -> None:
    state = init_state(TrainConfig())
    leaves, tree = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    leaves = [
        jax.random.normal(k, x.shape, x.dtype) if x.ndim else x
        for k, x in zip(keys, leaves, strict=True)
    ]
    state = jax.device_put(jax.tree.unflatten(tree, leaves))
    totals = {k: jnp.zeros(()) for k in ("accuracy", "count", "loss")}
    settings = {"dataset": "mnist-sample"}
    topology = {"processes": 1, "devices": 1}
    with tempfile.TemporaryDirectory() as directory:
        saver = Checkpointer(Checkpointing(directory, keep=3), settings, topology)
        blocking, written = [], []
        for step in range(1, SAVES + 1):
            started = time.perf_counter()
            saver.save(step, state, totals, epoch=0, next_batch=step, history=[], data_state=None)
            returned = time.perf_counter()
            saver.wait()
            if step > 1:  # the first save pays one-off set-up
                blocking.append(returned - started)
                written.append(time.perf_counter() - started)
        saver.close()
        last = os.path.join(directory, str(SAVES))
        size = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(last) for f in fs)
        restores = []
        for _ in range(5):
            started = time.perf_counter()
            latest(directory)
            reader = Checkpointer(Checkpointing(directory, keep=3), settings, topology)
            jax.block_until_ready(reader.restore(state, totals).state)
            restores.append(time.perf_counter() - started)
            reader.close()
    arrays = sum(x.nbytes for x in jax.tree.leaves(state))
    print(f"state arrays {arrays / 1e6:.2f} MB; checkpoint on disk {size / 1e6:.2f} MB")
    print(
        f"save, the part the step waits for (median of {SAVES - 1}): "
        f"{1e3 * statistics.median(blocking):.1f} ms"
    )
    print(f"save, until written (median of {SAVES - 1}): {1e3 * statistics.median(written):.1f} ms")
    print(f"restore, newest checkpoint (median of 5): {1e3 * statistics.median(restores):.1f} ms")


if __name__ == "__main__":
    main()

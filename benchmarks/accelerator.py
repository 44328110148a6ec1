"""One run on an accelerator machine: the feed, the step and every backend.

Run once on a GPU (or TPU) machine, through ``benchmarks/accelerator.sh``;
it takes a few minutes. On one device, from the MNIST digits (``mnist-10k``,
or the bundled sample when the data directory is missing):

* ``train_step``: `benchmarks/train_step.py`'s figures per batch size (the
  MLP step alone, host overhead per step, the MLP trained with
  ``steps_per_transfer`` k = 1 and k = 8, each with its data-wait fraction),
  plus the step through the feed (a k = 1 epoch over its steps) beside the
  step alone: ``feed_step_over_step``;
* ``bandwidth``: host-to-device bytes/s of `DeviceFeed` over the numpy
  backend, of a bare ``jax.device_put`` loop over the same batches, and of
  one ``--copy-mib`` MiB ``device_put`` (the device's copy bandwidth), with
  the feed's ratio to each;
* ``backends``: each backend's end-to-end epoch: `DeviceFeed` alone
  (seconds) and `jaxfeed.mnist.train` (median epoch after the first, data wait).

Writes ``<out-dir>/accelerator-<device>.json`` (``benchmarks/results/`` by
default; the device's name, e.g. ``nvidia-h200``). ``--quick`` is a smoke run
at tiny sizes (what the tests run on the CPU)::

    bash benchmarks/accelerator.sh                      # on the GPU machine
    python3 benchmarks/accelerator.py --quick --out-dir /tmp/acc
"""

from __future__ import annotations

import argparse
import os
import re
import time
from pathlib import Path

import jax
import numpy as np
from common import RESULTS, SHARED_MNIST, write_record  # also puts the repo on sys.path
from jaxfeed.sharding import batch_sharding, data_mesh
from train_step import _median_seconds, _mlp, feed_epoch, measure

from jaxfeed import loaders

BACKENDS = "numpy,torch,tf,grain,hf"
QUICK = {"batch_sizes": "128", "repeats": 1, "epochs": 2, "steps": 16, "copy_mib": 4}
QUICK_BACKENDS = "numpy"  # unless --backends is given
# (the bundled sample digits: no data directory needed)
QUICK_DATASET = "mnist-sample"


def _bandwidth(source, sharding, copy_mib: int, repeats: int, feed_bytes_per_s: int) -> dict:
    """Host-to-device bytes/s: the feed (measured by `measure`), a bare
    ``device_put`` loop, and one large ``device_put``."""
    batches = list(source.iter_epoch(0))
    nbytes = sum(v.nbytes for b in batches for v in b.values())

    def bare():
        out = None
        for batch in batches:
            out = jax.device_put(batch, sharding)
        return out

    block = np.ones(copy_mib << 20, np.uint8)
    device = sharding.mesh.devices.flat[0]
    bare_rate = nbytes / _median_seconds(bare, repeats)
    copy_rate = block.nbytes / _median_seconds(lambda: jax.device_put(block, device), repeats)
    return {
        "feed_bytes_per_s": feed_bytes_per_s,
        "bare_device_put_bytes_per_s": round(bare_rate),
        "copy_bytes_per_s": round(copy_rate),
        "copy_mib": copy_mib,
        "feed_over_bare": round(feed_bytes_per_s / bare_rate, 3),
        "feed_over_copy": round(feed_bytes_per_s / copy_rate, 3),
    }


def _backend(name: str, args, batch_size: int, sharding) -> dict:
    """One backend's epoch through `DeviceFeed` alone and through training."""
    source = loaders.make(name, dataset=args.dataset, data_dir=args.data_dir, batch_size=batch_size)
    return {
        "backend": name,
        "feed_epoch_s": round(
            _median_seconds(lambda: feed_epoch(source, sharding), args.repeats), 4
        ),
        "train": _mlp(source, sharding, 1, args.epochs),
    }


def _device_name() -> str:
    kind = jax.devices()[0].device_kind
    return re.sub(r"[^a-z0-9]+", "-", kind.lower()).strip("-") or jax.devices()[0].platform


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=str(SHARED_MNIST))
    parser.add_argument("--dataset", default="mnist-10k", help="falls back to mnist-sample")
    parser.add_argument("--batch-sizes", default="128,1024")
    parser.add_argument("--backends", default=None, help=f"default: {BACKENDS}")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=512, help="steps in the overhead loops")
    parser.add_argument("--copy-mib", type=int, default=256, help="the copy-bandwidth buffer")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    parser.add_argument("--tag", default=None, help="default: the device's name")
    args = parser.parse_args()
    if args.quick:
        vars(args).update(QUICK)
    args.backends = args.backends or (QUICK_BACKENDS if args.quick else BACKENDS)
    args.tag = args.tag or _device_name()
    if args.quick or not Path(args.data_dir).is_dir():
        args.dataset = QUICK_DATASET
    args.out_dir.mkdir(parents=True, exist_ok=True)
    started, load = time.perf_counter(), [os.getloadavg()[0]]
    sharding = batch_sharding(data_mesh(jax.devices()[:1]))
    sizes = [int(size) for size in args.batch_sizes.split(",")]
    steps = []
    bandwidth = []
    for size in sizes:
        row = measure(
            args.dataset, args.data_dir, size, sharding, args.repeats, args.epochs, args.steps
        )
        k1 = row["mlp"]["k=1"]
        row["feed_step_ms"] = round(1e3 * k1["epoch_seconds"] / row["steps_per_epoch"], 4)
        row["feed_step_over_step"] = round(row["feed_step_ms"] / row["step_ms"], 3)
        steps.append(row)
        source = loaders.make(
            "numpy", dataset=args.dataset, data_dir=args.data_dir, batch_size=size
        )
        feed = row["feed"]["h2d_bytes_per_s"]
        rates = _bandwidth(source, sharding, args.copy_mib, args.repeats, feed)
        bandwidth.append({"batch_size": size, **rates})
        gb = {key: value / 1e9 for key, value in rates.items() if key.endswith("bytes_per_s")}
        print(
            f"B={size}: step {row['step_ms']} ms alone, {row['feed_step_ms']} ms through the "
            f"feed (data wait {k1['data_wait_fraction']:.1%}); H2D GB/s: feed "
            f"{gb['feed_bytes_per_s']:.2f}, "
            f"bare device_put {gb['bare_device_put_bytes_per_s']:.2f}, "
            f"copy {gb['copy_bytes_per_s']:.2f}",
            flush=True,
        )
    backends = [_backend(name, args, sizes[0], sharding) for name in args.backends.split(",")]
    for row in backends:
        train = row["train"]
        print(
            f"{row['backend']:6s} feed epoch {row['feed_epoch_s']:.4f} s, train epoch "
            f"{train['epoch_seconds']:.4f} s (wait {train['data_wait_fraction']:.1%})",
            flush=True,
        )
    load.append(os.getloadavg()[0])
    results = {"train_step": steps, "bandwidth": bandwidth, "backends": backends}
    write_record(
        "accelerator", args, [results], out_dir=args.out_dir,
        device=str(jax.devices()[0].device_kind), platform=jax.devices()[0].platform,
        jax=jax.__version__, dataset=args.dataset, cpus=os.cpu_count(), load_average=load,
        seconds=round(time.perf_counter() - started, 1),
    )  # fmt: skip


if __name__ == "__main__":
    main()

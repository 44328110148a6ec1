"""CPU per batch of the record pool (numpy, hf and tf with ``num_workers``): the
reader's and the workers', each checkout's rows interleaved in one run.

Each row reads digits-png (the decode workload's data and augmentation,
batch 128) through one backend at one worker count in a fresh process:
``--batches`` batches after 8 unmeasured, for two epochs. It reports the
reading process's CPU milliseconds per batch (``time.process_time``: the
batch hand-back and the framework's pipeline), the workers' (``/proc``:
the transform and the hand-back's writing), the cores kept busy and the
samples/s. The CPU figures hold under load; samples/s and cores do not.
``--python`` names interpreters to compare, each importing its own jaxfeed
(e.g. one whose editable install is main, and a branch's venv): every repeat
runs each in turn. From the repository root::

    python3 benchmarks/pool_cpu.py
    python3 benchmarks/pool_cpu.py --python python3,.venv/bin/python --backends numpy
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import HERE, SHARED_MNIST, write_record  # also puts the repo on sys.path

_TICK = os.sysconf("SC_CLK_TCK")


def _children_cpu() -> float:
    """CPU seconds of this process's live children (the pool's workers)."""
    me, total = os.getpid(), 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as file:
                fields = file.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me:
            total += int(fields[11]) + int(fields[12])
    return total / _TICK


def _one(backend: str, workers: int, batches: int, data_dir: str) -> list[dict]:
    """One row's two epochs, measured in this process (a child of `main`)."""
    from jaxfeed.loaders.data.encoded import augment, digits_png

    from jaxfeed import loaders

    data = digits_png("train", data_dir)
    source = loaders.make(backend, dataset=data, batch_size=128, transform=augment,
                          num_workers=workers)  # fmt: skip
    out = []
    for epoch in range(2):
        epoch_batches = source.iter_epoch(epoch)
        for _ in range(8):  # the workers started, the pipeline warm
            next(epoch_batches)
        wall, cpu, children = time.perf_counter(), time.process_time(), _children_cpu()
        for _ in range(batches):
            next(epoch_batches)
        wall = time.perf_counter() - wall
        cpu, children = time.process_time() - cpu, _children_cpu() - children
        epoch_batches.close()
        out.append({"reader_ms": cpu / batches * 1e3, "workers_ms": children / batches * 1e3,
                    "cores": (cpu + children) / wall, "samples_s": batches * 128 / wall,
                    "code": str(Path(loaders.__file__).parents[1])})  # fmt: skip
    source.close()
    return out


def _row(python: str, backend: str, workers: int, args: argparse.Namespace):
    """One row, run by ``python`` in a fresh process: the checkout it read, its epochs."""
    command = [python, str(HERE / "pool_cpu.py"), "--one", backend, str(workers),
               "--batches", str(args.batches), "--data-dir", args.data_dir]  # fmt: skip
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    epochs = json.loads(done.stdout.splitlines()[-1])
    codes = {epoch.pop("code") for epoch in epochs}
    return codes.pop(), epochs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=str(SHARED_MNIST))
    parser.add_argument("--backends", default="numpy,hf,tf")
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--batches", type=int, default=50, help="per epoch (62 in digits-png)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--python", default=sys.executable, help="interpreters, comma-separated")
    parser.add_argument("--tag", default="quiet")
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # BACKEND WORKERS, in a child
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(_one(args.one[0], int(args.one[1]), args.batches, args.data_dir)))
        return 0
    rows: dict[tuple[str, int, str], list[dict]] = {}
    for _ in range(args.repeats):
        for backend in args.backends.split(","):
            for workers in map(int, args.workers.split(",")):
                for python in args.python.split(","):
                    code, epochs = _row(python, backend, workers, args)
                    rows.setdefault((backend, workers, code), []).extend(epochs)
    print(f"load average at the end: {os.getloadavg()}; medians of {2 * args.repeats} epochs")
    print(f"{'backend':8}{'workers':>8}  {'code':24}{'reader ms':>10}{'workers ms':>11}"
          f"{'cores':>7}{'samples/s':>10}")  # fmt: skip
    results = []
    for (backend, workers, code), epochs in rows.items():
        median = {key: statistics.median(e[key] for e in epochs) for key in epochs[0]}
        print(f"{backend:8}{workers:>8}  {code[-24:]:24}{median['reader_ms']:>10.2f}"
              f"{median['workers_ms']:>11.2f}{median['cores']:>7.2f}"
              f"{median['samples_s']:>10,.0f}")  # fmt: skip
        results.append({"backend": backend, "workers": workers, "code": code, **median})
    del args.one
    write_record("pool-cpu", args, results, load=os.getloadavg())
    return 0


if __name__ == "__main__":
    sys.exit(main())

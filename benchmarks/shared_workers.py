"""A train and a validation loader with workers: what the second one's start costs.

Two numpy sources with ``num_workers=2`` and a per-record transform, as a
training script holds them (the train source, and a validation source read
between its epochs), each run in a fresh process, rows interleaved:

- ``shared``: the validation loader is made while the train loader is open:
  it joins the train loader's worker pool (`jaxfeed.loaders._workers.shared_pool`).
- ``own workers``: the train loader is closed first, so the validation loader
  starts workers of its own: what every loader paid before the pool was shared
  (one pool per loader; here the train pool is gone, which spares the cores).

Per row: seconds to the train loader's first batch (its workers start), to
the validation loader's first batch, to the end of its epoch; how many worker
processes the two loaders started; and the CPU seconds of every worker
process of the run, start-up included (``RUSAGE_CHILDREN`` once they are
reaped): a figure that holds under load, unlike the wall seconds. From the
repository root::

    python3 benchmarks/shared_workers.py
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np
from common import HERE, RESULTS, write_record  # also puts the repo on sys.path

ROWS = ("shared", "own workers")


def noisy_scale(record: dict, rng: np.random.Generator) -> dict:
    """A light per-record transform."""
    return {"x": record["x"] * rng.uniform(0.5, 1.5)}


def measure(case: dict[str, Any]) -> dict[str, Any]:
    """One row in this process: seconds to each first batch and the
    validation epoch, worker processes started, and the workers' CPU seconds."""
    from jaxfeed.loaders._doors.multiprocessing import pool_processes

    from jaxfeed import loaders

    def started(source) -> set[int]:  # the processes of the source's record pool
        return {process.pid for process in pool_processes(source._pool._pool)}

    def source(rows: int, seed: int):
        data = {"x": np.ones((rows, case["features"]), np.float32)}
        return loaders.make("numpy", dataset=data, batch_size=case["batch_size"], seed=seed,
                            transform=noisy_scale, num_workers=case["workers"])  # fmt: skip

    began = time.perf_counter()
    train = source(case["rows"], 0)
    epoch = train.iter_epoch(0)
    next(epoch)
    train_first = time.perf_counter() - began
    for _ in epoch:
        pass
    workers = started(train)
    if case["row"] == "own workers":
        train.close()
    began = time.perf_counter()
    validation = source(case["rows"] // 4, 1)
    epoch = validation.iter_epoch(0)
    next(epoch)
    val_first = time.perf_counter() - began
    for _ in epoch:
        pass
    val_epoch = time.perf_counter() - began
    workers |= started(validation)
    train.close()
    validation.close()
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "train_first_batch_s": train_first,
        "validation_first_batch_s": val_first,
        "validation_epoch_s": val_epoch,
        "worker_processes": len(workers),
        "worker_cpu_s": used.ru_utime + used.ru_stime,
    }


_CHILD = "import json, sys; sys.path.insert(0, {here!r}); import shared_workers; " \
    "print(json.dumps(shared_workers.measure(json.loads(sys.argv[1]))))"  # fmt: skip


def _run(case: dict[str, Any]) -> dict[str, Any]:
    """``case`` in a fresh process (its own imports and workers)."""
    command = [sys.executable, "-c", _CHILD.format(here=str(HERE)), json.dumps(case)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise RuntimeError(f"{case['row']} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tag", default="cpu")
    args = parser.parse_args()
    case = {k: getattr(args, k) for k in ("rows", "features", "batch_size", "workers")}
    runs: dict[str, list[dict[str, Any]]] = {row: [] for row in ROWS}
    load = [os.getloadavg()]
    for _ in range(args.repeats):
        for row in ROWS:
            runs[row].append(_run({**case, "row": row}))
    load.append(os.getloadavg())
    lines = [
        f"shared_workers: a train ({args.rows} rows) and a validation loader "
        f"({args.rows // 4} rows), numpy, {args.features} float32 per row, batch "
        f"{args.batch_size}, num_workers={args.workers} each, a light transform; each row in "
        f"a fresh process; medians of {args.repeats} interleaved repeats",
        f"machine: {os.cpu_count()} CPUs; Python {sys.version.split()[0]}; load average "
        f"(1 min) {load[0][0]:.1f} at the start, {load[1][0]:.1f} at the end",
        "",
        f"{'row':12s}  train 1st batch s  validation 1st batch s  validation epoch s  "
        f"worker processes  workers' CPU s",
    ]
    keys = ("train_first_batch_s", "validation_first_batch_s", "validation_epoch_s",
            "worker_processes", "worker_cpu_s")  # fmt: skip
    results = []
    for row, row_runs in runs.items():
        median = {key: statistics.median(r[key] for r in row_runs) for key in keys}
        lines.append(
            f"{row:12s}  {median['train_first_batch_s']:17.2f}  "
            f"{median['validation_first_batch_s']:22.3f}  {median['validation_epoch_s']:18.3f}  "
            f"{median['worker_processes']:16.0f}  {median['worker_cpu_s']:14.2f}"
        )
        rounded = {key: round(value, 4) for key, value in median.items()}
        results.append({"row": row, **rounded, "runs": row_runs})
    text = "\n".join(lines)
    print(text)
    (RESULTS / f"shared-workers-{args.tag}.txt").write_text(text + "\n")
    write_record("shared-workers", args, results, load_average=load)


if __name__ == "__main__":
    main()

"""What spawned torch workers cost a wrapped DataLoader: its first epoch, and each one after.

A user's ``DataLoader(Rows, batch_size, shuffle=True, num_workers=2)`` read
for ``--epochs`` epochs, loader only, each row in a fresh process (so each
pays its own imports and worker starts), repeats interleaved:

- ``torch-fork``: the DataLoader iterated bare with torch's default (fork)
  workers, in a process that never imports JAX: what the loader costs a
  PyTorch user, and the reference for the target.
- ``wrap-spawn``: ``jaxfeed.wrap`` of the loader built with
  ``multiprocessing_context="spawn"``, in a script that imports JAX (and
  Flax) and initialises JAX first, as a training script does; the dataset
  class comes from an importable module.
- ``wrap-default``: the same with the DataLoader's default context (fork),
  which wrap switches to spawn under JAX.
- ``wrap-spawn-script-dataset``: ``wrap-spawn`` with the dataset class
  defined in the script itself, which spawned workers must run again (its
  imports, JAX's included) to unpickle it.

"first epoch" is building the loader, ``wrap`` (it reads the first batch)
and the whole first epoch: it includes starting the workers. "later epochs"
is the median of epochs 2.. . Target (issue 23): every wrap row's later
epochs within 1.2x of ``torch-fork``'s. From the repository root::

    python3 benchmarks/spawn_workers.py
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import HERE, RESULTS, write_record  # also puts the repo on sys.path

ROWS = ("torch-fork", "wrap-spawn", "wrap-default", "wrap-spawn-script-dataset")
TARGET = 1.2  # later epochs of a wrap row / torch-fork's

# Each row runs as a user's script: a training script imports JAX and Flax at
# the top; its dataset class comes from a module, or is defined in the script
# (a subclass of `Rows`, so the same reads).
_SCRIPT = """
import json, sys
{imports}
sys.path.insert(0, {benchmarks!r})
import spawn_workers
{dataset}

if __name__ == "__main__":
    print(json.dumps(spawn_workers.measure(json.loads(sys.argv[1]), Rows)))
"""
_JAX = "import jax\ntry:\n    import flax\nexcept ImportError:\n    pass"
_IMPORTED, _DEFINED = "Rows = spawn_workers.Rows", "class Rows(spawn_workers.Rows):\n    pass"


class Rows:
    """``rows`` rows of ``features`` float32 as a map-style dataset (any
    object with ``__len__`` and ``__getitem__`` is one to torch)."""

    def __init__(self, rows: int, features: int):
        self.x = np.arange(rows * features, dtype=np.float32).reshape(rows, features)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        return {"x": self.x[index]}


def note_imports(directory: str, worker_id: int) -> None:
    """A ``worker_init_fn``: whether the worker imported JAX, in a file of ``directory``."""
    with open(os.path.join(directory, f"worker-{os.getpid()}"), "w") as file:
        file.write("jax" if "jax" in sys.modules else "")


def measure(case: dict[str, Any], dataset: type) -> dict[str, Any]:
    """One row (``case["row"]``) in this process: seconds of the first epoch
    (loader built, wrapped, read) and of each later one; how many workers
    started, and how many imported JAX."""
    row = case["row"]
    if row != "torch-fork":  # a training script's process: JAX's threads run
        import jax

        jax.devices()
    from torch.utils.data import DataLoader

    notes = tempfile.mkdtemp(prefix="jaxfeed-workers-")
    began = time.perf_counter()
    context = "spawn" if row in ("wrap-spawn", "wrap-spawn-script-dataset") else None
    loader = DataLoader(
        dataset(case["rows"], case["features"]),
        batch_size=case["batch_size"],
        shuffle=True,
        num_workers=case["workers"],
        multiprocessing_context=context,
        worker_init_fn=functools.partial(note_imports, notes),
    )
    if row == "torch-fork":
        epochs = [lambda: iter(loader)] * case["epochs"]
    else:
        import jaxfeed

        source = jaxfeed.wrap(loader)
        epochs = [lambda e=e: source.iter_epoch(e) for e in range(case["epochs"])]
    seconds, batches = [], 0
    for epoch in epochs:
        for _ in epoch():
            batches += 1
        seconds.append(time.perf_counter() - began)
        began = time.perf_counter()
    started = [Path(notes, name).read_text() for name in os.listdir(notes)]
    shutil.rmtree(notes)
    return {
        "epoch_s": seconds,
        "batches": batches,
        "workers_started": len(started),
        "workers_importing_jax": started.count("jax"),
    }


def _script(directory: str, row: str) -> Path:
    """The user's script that runs ``row``."""
    imports = "" if row == "torch-fork" else _JAX
    dataset = _DEFINED if row == "wrap-spawn-script-dataset" else _IMPORTED
    path = Path(directory) / f"{row}.py"
    path.write_text(_SCRIPT.format(imports=imports, benchmarks=str(HERE), dataset=dataset))
    return path


def _run(case: dict[str, Any], script: Path) -> dict[str, Any]:
    """``case`` in a fresh process; its result and what it printed to stderr."""
    command = [sys.executable, str(script), json.dumps(case)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise RuntimeError(f"{case['row']} failed:\n{done.stderr}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    started = [line for line in done.stderr.splitlines() if line.startswith("jaxfeed: starting")]
    return {**result, "reported": started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tag", default="cpu")
    args = parser.parse_args()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    case = {k: getattr(args, k) for k in ("rows", "features", "batch_size", "workers", "epochs")}
    runs: dict[str, list[dict[str, Any]]] = {row: [] for row in ROWS}
    load = [os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="jaxfeed-spawn-") as directory:
        scripts = {row: _script(directory, row) for row in ROWS}
        for _ in range(args.repeats):
            for row in ROWS:
                runs[row].append(_run({**case, "row": row}, scripts[row]))
    load.append(os.getloadavg())
    results, lines = [], _header(args, load)
    reference = statistics.median(s for r in runs["torch-fork"] for s in r["epoch_s"][1:])
    lines.append(
        f"{'row':26s}  first epoch s  later epochs s  vs torch-fork  target  "
        f"workers started / importing JAX"
    )
    for row, row_runs in runs.items():
        first = statistics.median(r["epoch_s"][0] for r in row_runs)
        later = statistics.median(s for r in row_runs for s in r["epoch_s"][1:])
        ratio = later / reference
        met = "-" if row == "torch-fork" else "met" if ratio <= TARGET else "MISSED"
        started = row_runs[0]["workers_started"], row_runs[0]["workers_importing_jax"]
        lines.append(
            f"{row:26s}  {first:13.2f}  {later:14.3f}  {ratio:12.2f}x  {met:6s}  "
            f"{started[0]} / {started[1]}"
        )
        results.append(
            {
                "row": row,
                "first_epoch_s": round(first, 3),
                "later_epoch_s": round(later, 4),
                "later_vs_torch_fork": round(ratio, 3),
                "runs": row_runs,
            }
        )
    reported = {line for r in runs["wrap-spawn"] for line in r["reported"]}
    lines.append("")
    lines.append("what wrap-spawn printed once per run: " + " | ".join(sorted(reported)))
    text = "\n".join(lines)
    print(text)
    (RESULTS / f"spawn-workers-{args.tag}.txt").write_text(text + "\n")
    write_record("spawn-workers", args, results, target=TARGET, load_average=load)


def _header(args: argparse.Namespace, load: list[tuple[float, ...]]) -> list[str]:
    import torch

    return [
        f"spawn_workers: {args.rows} rows of {args.features} float32, batch {args.batch_size}, "
        f"{args.workers} workers, {args.epochs} epochs per run, each row in a fresh process; "
        f"medians of {args.repeats} interleaved repeats",
        f"machine: {os.cpu_count()} CPUs; torch {torch.__version__}; Python "
        f"{sys.version.split()[0]}; load average (1 min) {load[0][0]:.1f} at the start, "
        f"{load[1][0]:.1f} at the end",
        "",
    ]


if __name__ == "__main__":
    main()

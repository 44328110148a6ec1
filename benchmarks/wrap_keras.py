"""A wrapped per-sample torch ``DataLoader`` trained by jaxfeed vs Keras 3 ``fit``.

The ``wrap-torch`` and ``keras-fit-torch`` rows of ``compare.py`` alone, with
more repeats: the tutorial ``DataLoader`` (per-sample ``__getitem__``,
``shuffle=True``) trained by ``jaxfeed.mnist.train(wrap(loader))`` and by
Keras 3 ``model.fit(loader)`` (JAX backend, the same MLP), each run in a fresh
process (`jaxfeed.compare.workloads.copy.fresh`), the two sides interleaved
(jaxfeed, keras, jaxfeed, keras, ...) so a slow spell hits both; with
``--baseline-root DIR``, a third side trains with another checkout's jaxfeed
(the code before a change; its ``.venv`` holds an editable install of it),
in the same rotation. A run's
epoch is the median of its epochs 2..; the figure is the median over runs
of jaxfeed's epoch over Keras's, and of their process CPU seconds per epoch
(all threads), which other work on a shared machine sways less.

Then, in this process, reading the loader: one epoch bare and through
``wrap`` (interleaved; ``wrap`` collates its numpy rows in numpy, not a
tensor per row), the same pair with a ``collate_fn`` of the user's own
(which ``wrap`` runs as it is: ``wrap``'s own cost over the same reads), and
the µs per batch of `seeded_globals` beside `GlobalDraws.read` on a dataset
that never draws.

    python3 benchmarks/wrap_keras.py --data-dir ../shared/data/mnist --repeats 5
    python3 benchmarks/wrap_keras.py --baseline-root /tmp/main-checkout   # before vs after
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
from common import SHARED_MNIST, write_record  # also puts the repo on sys.path

from jaxfeed import loaders
from jaxfeed.compare.workloads.copy import baselines, fresh


def _measure_in(root: str, what: dict) -> dict:
    """`fresh.measure` in another checkout ``root``: its ``.venv``'s Python (an
    editable install of it, which maps ``jaxfeed.loaders`` to its ``loaders/``)."""
    env = fresh.child_env() | {"PYTHONPATH": root}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "figures.json"
        python = str(Path(root) / ".venv" / "bin" / "python")
        command = [python, "-m", fresh.__name__, json.dumps(what), str(out)]
        subprocess.run(command, env=env, check=True, capture_output=True, timeout=fresh.TIMEOUT_S)
        return json.loads(out.read_text())


def _fits(args) -> dict:
    """Interleaved runs: [jaxfeed of --baseline-root,] jaxfeed, keras; each
    jaxfeed run's ratio to the Keras run of its repeat."""
    sides = ["jaxfeed", "keras"] + (["baseline"] if args.baseline_root else [])
    runs: dict[str, list[float]] = {side: [] for side in sides}
    cpu: dict[str, list[float]] = {side: [] for side in sides}
    for repeat in range(args.repeats):
        for side in sides:
            what = fresh.spec(
                "keras" if side == "keras" else "jaxfeed", args.framework, dataset=args.dataset,
                data_dir=args.data_dir, batch_size=args.batch_size, seed=0, epochs=args.epochs,
                max_batches=None,
            )  # fmt: skip
            figures = (
                _measure_in(args.baseline_root, what) if side == "baseline" else fresh.measure(what)
            )
            runs[side].append(figures["epoch_s"])
            cpu[side].append(figures["epoch_cpu_s"])
            print(f"repeat {repeat}: {side:8s} epoch {figures['epoch_s']:.3f} s", flush=True)
    out = {}
    for side in sides:
        ratios = [j / k for j, k in zip(runs[side], runs["keras"], strict=True)]
        cpu_ratios = [j / k for j, k in zip(cpu[side], cpu["keras"], strict=True)]
        out[side] = {"epoch_s": runs[side], "epoch_cpu_s": cpu[side]}
        if side != "keras":
            out[side] |= {
                "ratios": [round(r, 3) for r in ratios],
                "median_ratio": round(statistics.median(ratios), 3),
                "cpu_median_ratio": round(statistics.median(cpu_ratios), 3),
            }
    return out


def _reading(args) -> dict:
    """Loader-only epochs, bare vs wrapped, and the seeding's cost per batch."""
    data = loaders.load_dataset(args.dataset, "train", data_dir=args.data_dir)
    (loop,) = [
        b
        for b in baselines.tutorials(["torch"], data["image"], data["label"], args.batch_size, 0)
        if b.name == fresh.BARE["torch"]
    ]
    own = _with_own_collate(loop.obj)
    sides = {
        "bare": lambda e: iter(loop.obj),
        "wrap": loop.wrap(args.batch_size).iter_epoch,
        # A collate_fn of the user's own (here default_collate behind a lambda):
        # wrap runs it, so this pair is wrap's own cost over the same reads.
        "bare_own_collate": lambda e: iter(own),
        "wrap_own_collate": loaders.wrap(own).iter_epoch,
    }
    times = {name: [] for name in sides}
    for epoch in range(args.reading_repeats):
        for name, epochs in sides.items():
            started = time.perf_counter()
            for _ in epochs(epoch):
                pass
            times[name].append(time.perf_counter() - started)
    out = {f"{name}_epoch_s": round(statistics.median(t), 5) for name, t in times.items()}
    return out | _seeding_us()


def _with_own_collate(loader):
    """``loader`` built again with ``collate_fn=lambda rows: default_collate(rows)``."""
    import torch
    from torch.utils.data import DataLoader, default_collate

    generator = torch.Generator().manual_seed(0)
    return DataLoader(
        loader.dataset, batch_size=loader.batch_size, shuffle=True, generator=generator,
        collate_fn=lambda rows: default_collate(rows),
    )  # fmt: skip


def _seeding_us(calls: int = 2000) -> dict:
    """µs per batch: `seeded_globals` around a read (every batch, as before)
    vs `GlobalDraws.read` of a read that draws nothing (the watch alone)."""
    import torch  # noqa: F401  (imported, as under a torch loader: its generator is seeded too)
    from jaxfeed.loaders.wrapping.seeded import GlobalDraws, seeded_globals

    rows = np.arange(128)
    draws = GlobalDraws(0)

    def seeded():
        with seeded_globals(0, 1, rows):
            pass

    def watched():
        draws.read(1, rows, lambda: None)

    out = {}
    for name, run in (("seeded_globals_us", seeded), ("watch_us", watched)):
        samples = []
        for _ in range(5):
            started = time.perf_counter()
            for _ in range(calls):
                run()
            samples.append((time.perf_counter() - started) / calls * 1e6)
        out[name] = round(statistics.median(samples), 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=str(SHARED_MNIST))
    parser.add_argument("--dataset", default="mnist-10k")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=4, help="timed epochs per training run")
    parser.add_argument("--repeats", type=int, default=5, help="training runs per side")
    parser.add_argument("--reading-repeats", type=int, default=15)
    parser.add_argument("--skip-fit", action="store_true", help="the reading figures only")
    parser.add_argument(
        "--framework", default="torch", choices=sorted(fresh.BARE),
        help="whose tutorial loader the fit rows train on (the reading figures: torch only)",
    )  # fmt: skip
    parser.add_argument(
        "--baseline-root", default=None, help="also train with this checkout's jaxfeed, interleaved"
    )
    parser.add_argument("--tag", default="cpu")
    args = parser.parse_args()
    load = {"start": os.getloadavg()[0]}
    reading = _reading(args) if args.framework == "torch" else None
    if reading is not None:
        ms = {
            name[:-8]: value * 1e3 for name, value in reading.items() if name.endswith("_epoch_s")
        }
        print(
            f"reading an epoch: bare DataLoader {ms['bare']:.1f} ms, wrap {ms['wrap']:.1f} ms; "
            f"with a collate_fn of its own: bare {ms['bare_own_collate']:.1f} ms, wrap "
            f"{ms['wrap_own_collate']:.1f} ms; seeded_globals {reading['seeded_globals_us']} µs "
            f"a batch, the watch {reading['watch_us']} µs",
            flush=True,
        )
    fits = None if args.skip_fit else _fits(args)
    for side, figures in (fits or {}).items():
        if side != "keras":
            print(
                f"{side} / keras epoch: median {figures['median_ratio']} of {figures['ratios']}; "
                f"CPU s per epoch: median {figures['cpu_median_ratio']}"
            )
    load["end"] = os.getloadavg()[0]
    write_record(
        "wrap-keras", args, [{"reading": reading, "fit": fits}], load_average=load,
        cpus=os.cpu_count(),
    )  # fmt: skip


if __name__ == "__main__":
    main()

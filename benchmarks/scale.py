"""Loader-only throughput of every backend vs batch size and vs dataset size.

    python benchmarks/scale.py                   # the run behind benchmarks/README.md
    python benchmarks/scale.py --sizes 10000,100000 --repeats 5

Batch-size sweep: the 10,000 real MNIST test digits. Dataset-size sweep: the
10,000 real digits, then SYNTHETIC MNIST-shaped datasets made by tiling those
digits (100k = 10 copies, 1M = 100 copies): the same bytes per sample, but
not new data. Each dataset is written as IDX files into a temporary
directory and read through ``loaders.make(backend, dataset=<that dir>)``,
with a temporary, initially empty ``JAXFEED_CACHE_DIR``, so ``make_s`` is a
cold build (TFDS / Arrow conversion included). Backends are interleaved
within every repeat; figures are medians. Writes ``results/scale[-<tag>].json``,
``.png`` and ``.txt``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from common import RESULTS, SHARED_MNIST, git_state  # also puts the repo on sys.path
from jaxfeed.loaders.data.cache import CACHE_ENV
from jaxfeed.loaders.data.idx import write_idx

from jaxfeed import loaders

REAL = 10_000


def _count(n: int) -> str:
    return f"{n // 1_000_000}M" if n % 1_000_000 == 0 else f"{n // 1000}k"


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def write_dataset(directory: Path, images: np.ndarray, labels: np.ndarray, test) -> str:
    """Writes MNIST-named IDX files; returns the directory as a dataset name."""
    directory.mkdir(parents=True, exist_ok=True)
    write_idx(directory / "train-images-idx3-ubyte", images.reshape(-1, 28, 28))
    write_idx(directory / "train-labels-idx1-ubyte", labels.astype(np.uint8))
    write_idx(directory / "t10k-images-idx3-ubyte", test["image"].reshape(-1, 28, 28))
    write_idx(directory / "t10k-labels-idx1-ubyte", test["label"].astype(np.uint8))
    return str(directory)


def epoch_throughput(source: loaders.BatchSource, epoch: int) -> dict[str, float]:
    """One epoch through the BatchSource alone: valid samples and bytes of all leaves."""
    samples = nbytes = 0
    started = time.perf_counter()
    for batch in source.iter_epoch(epoch):
        samples += int(batch["mask"].sum()) if "mask" in batch else len(batch["label"])
        nbytes += sum(leaf.nbytes for leaf in batch.values())
    seconds = time.perf_counter() - started
    return {
        "seconds": seconds,
        "samples_per_s": samples / seconds,
        "mb_per_s": nbytes / seconds / 1e6,
    }


def sweep(dataset: str, backends: list[str], batch_size: int, repeats: int) -> dict[str, dict]:
    """Builds every backend's source (timed), then reads ``repeats`` interleaved epochs."""
    sources, out = {}, {}
    for name in backends:
        started = time.perf_counter()
        sources[name] = loaders.make(name, dataset=dataset, batch_size=batch_size, seed=0)
        out[name] = {"make_s": time.perf_counter() - started, "runs": []}
    for name in backends:  # untimed warm-up: a few batches each
        for _, _ in zip(range(4), sources[name].iter_epoch(0), strict=False):
            pass
    for repeat in range(repeats):
        for name in backends:
            out[name]["runs"].append(epoch_throughput(sources[name], 1 + repeat))
    for entry in out.values():
        for key in ("samples_per_s", "mb_per_s"):
            entry[key] = statistics.median(run[key] for run in entry["runs"])
    sources.clear()
    gc.collect()
    return out


def _table(title: str, column: str, results: list[dict], backends: list[str]) -> str:
    heads = [column, *(f"{b} samples/s" for b in backends)]
    lines = [
        [str(r["label"]), *(f"{r['backends'][b]['samples_per_s']:,.0f}" for b in backends)]
        for r in results
    ]
    widths = [max(len(x) for x in col) for col in zip(heads, *lines, strict=True)]
    rows = [heads, ["-" * w for w in widths], *lines]
    text = ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join([title, *text, ""])


def _plot(by_batch: list[dict], by_size: list[dict], backends: list[str], path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)
    for name in backends:
        left.plot(
            [r["batch_size"] for r in by_batch],
            [r["backends"][name]["samples_per_s"] for r in by_batch],
            "o-",
            label=name,
        )
        right.plot(
            [r["examples"] for r in by_size],
            [r["backends"][name]["samples_per_s"] for r in by_size],
            "o-",
            label=name,
        )
    left.set(
        xscale="log",
        yscale="log",
        xlabel="batch size (10k real digits)",
        ylabel="loader-only samples/s (median)",
    )
    left.set_xticks([r["batch_size"] for r in by_batch], [str(r["batch_size"]) for r in by_batch])
    right.set(
        xscale="log",
        yscale="log",
        xlabel="examples (10k real; 100k, 1M synthetic: tiled)",
        ylabel="loader-only samples/s (median)",
    )
    left.legend()
    fig.suptitle("jaxfeed loader-only throughput vs batch size and dataset size")
    fig.savefig(path, dpi=90)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data-dir",
        default=str(SHARED_MNIST),
        help="directory with the MNIST IDX files (default: ../shared/data/mnist)",
    )
    parser.add_argument("--loaders", default=None, help="comma-separated backends (default: all)")
    parser.add_argument(
        "--batch-sizes", type=_ints, default=[32, 64, 128, 256, 512, 1024, 2048, 4096]
    )
    parser.add_argument("--batch-size", type=int, default=128, help="for the dataset-size sweep")
    parser.add_argument(
        "--sizes",
        type=_ints,
        default=[10_000, 100_000, 1_000_000],
        help="dataset sizes, multiples of 10,000 (above it: synthetic, tiled)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--large-repeats", type=int, default=1, help="repeats at >= 1M examples")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    parser.add_argument("--tag", default="", help="suffix for the result file names")
    args = parser.parse_args(argv)
    if any(size % REAL for size in args.sizes):
        parser.error(f"--sizes must be multiples of {REAL:,}, got {args.sizes}")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    usable = [n for n, s in loaders.available().items() if not s.startswith("unavailable")]
    backends = args.loaders.split(",") if args.loaders else usable
    test = loaders.load_dataset("mnist-10k", "test", data_dir=args.data_dir)
    real = loaders.load_dataset("mnist", "test", data_dir=args.data_dir)  # all 10,000 real digits
    state, load = git_state(), list(os.getloadavg())
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="jaxfeed-scale-") as tmp:
        os.environ[CACHE_ENV] = str(Path(tmp) / "cache")  # cold builds, removed afterwards
        real_dir = write_dataset(Path(tmp) / "real-10k", real["image"], real["label"], test)
        by_batch = []
        for batch_size in args.batch_sizes:
            result = sweep(real_dir, backends, batch_size, args.repeats)
            by_batch.append({"label": batch_size, "batch_size": batch_size, "backends": result})
            print(
                f"batch {batch_size}: done ({time.perf_counter() - started:.0f} s)", file=sys.stderr
            )
        by_size = []
        for size in args.sizes:
            copies = size // REAL
            name = "real-10k" if copies == 1 else f"synthetic-{_count(size)}"
            directory = (
                real_dir
                if copies == 1
                else write_dataset(
                    Path(tmp) / name,
                    np.tile(real["image"], (copies, 1, 1, 1)),
                    np.tile(real["label"], copies),
                    test,
                )
            )
            repeats = args.large_repeats if size >= 1_000_000 else args.repeats
            os.environ[CACHE_ENV] = str(Path(tmp) / f"cache-{name}")  # make_s: a cold build
            t0 = time.perf_counter()
            result = sweep(directory, backends, args.batch_size, repeats)
            by_size.append(
                {
                    "label": name,
                    "examples": size,
                    "synthetic": copies > 1,
                    "repeats": repeats,
                    "how": "the 10,000 real MNIST test digits"
                    + (f", tiled {copies}x (synthetic)" if copies > 1 else ""),
                    "seconds": time.perf_counter() - t0,
                    "backends": result,
                }
            )
            print(f"{name}: done ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    total = time.perf_counter() - started
    record = {
        "command": ["python", "benchmarks/scale.py", *(sys.argv[1:] if argv is None else argv)],
        "versions": {**loaders.available(), "numpy": np.__version__},
        "git": state,
        "cpu_count": os.cpu_count(),
        "load_average": {"start": load, "end": list(os.getloadavg())},
        "platform": sys.platform,
        "by_batch_size": by_batch,
        "by_dataset_size": by_size,
        "total_seconds": total,
    }
    text = "\n".join(
        [
            _table(
                f"Loader-only samples/s vs batch size (10,000 real digits, median of "
                f"{args.repeats})",
                "batch",
                by_batch,
                backends,
            ),
            _table(
                f"Loader-only samples/s vs dataset size (batch {args.batch_size}; every size above "
                f"10k is SYNTHETIC: the real digits tiled; median of {args.repeats} repeats, "
                f"{args.large_repeats} at 1M and above)",
                "dataset",
                by_size,
                backends,
            ),
            "Cold make() seconds (empty cache: TFDS / Arrow conversion included; the first "
            "backend's also reads the IDX files)",
            *(
                f"  {r['label']:15s} "
                + "  ".join(f"{b} {r['backends'][b]['make_s']:.2f}" for b in backends)
                for r in by_size
            ),
            f"\nbenchmarks/scale.py took {total:.0f} s",
        ]
    )
    print(text)
    stem = args.out_dir / f"scale{'-' + args.tag if args.tag else ''}"
    args.out_dir.mkdir(parents=True, exist_ok=True)
    Path(f"{stem}.json").write_text(json.dumps(record, indent=2) + "\n")
    Path(f"{stem}.txt").write_text(text + "\n")
    _plot(by_batch, by_size, backends, Path(f"{stem}.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Runs `jaxfeed compare` on the 10,000 real MNIST test digits and saves the figures.

    python benchmarks/compare.py                 # the run behind benchmarks/README.md
    python benchmarks/compare.py --tag h100      # on another machine: keep both results

Writes ``results/compare-<dataset>[-<tag>].json``, ``.png`` and ``.txt`` (the printed
tables) under ``benchmarks/``. ``mnist-10k`` is the real test set split 8,000 train /
2,000 test (the 60k training images are not available offline).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from common import RESULTS, SHARED_MNIST, run_compare  # also puts the repo on sys.path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="mnist-10k")
    parser.add_argument(
        "--data-dir",
        default=str(SHARED_MNIST),
        help="directory with the MNIST IDX files (default: ../shared/data/mnist)",
    )
    parser.add_argument("--loaders", default=None, help="comma-separated backends (default: all)")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--train-epochs", type=int, default=4)
    parser.add_argument("--devices", type=int, default=None, help="use N local devices")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    parser.add_argument("--tag", default="", help="suffix for the result file names")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    stem = args.out_dir / f"compare-{args.dataset}{'-' + args.tag if args.tag else ''}"
    command = [
        "compare",
        "--dataset",
        args.dataset,
        "--data-dir",
        args.data_dir,
        "--batch-size",
        str(args.batch_size),
        "--repeats",
        str(args.repeats),
        "--train-epochs",
        str(args.train_epochs),
        "--json",
        f"{stem}.json",
        "--plot",
        f"{stem}.png",
    ]
    if args.loaders:
        command += ["--loaders", args.loaders]
    if args.devices:
        command += ["--devices", str(args.devices)]
    return run_compare(command, stem, "compare.py")


if __name__ == "__main__":
    sys.exit(main())

"""Runs `jaxfeed compare --workload decode` on the 10,000 real MNIST digits and saves it.

    python benchmarks/decode.py                  # the run behind benchmarks/README.md
    python benchmarks/decode.py --tag h100       # on another machine: keep both results

Every backend at 0, 1 and 2 workers, each beside its framework's own pipeline,
on ``digits-png`` built from ``mnist-10k`` (8,000 train digits, PNG-encoded
64x64 RGB, decoded and augmented per record). Writes
``results/decode-digits-png[-<tag>].json`` and ``.txt`` (the printed table).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from common import RESULTS, SHARED_MNIST, run_compare  # also puts the repo on sys.path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data-dir",
        default=str(SHARED_MNIST),
        help="directory with the MNIST IDX files (default: ../shared/data/mnist)",
    )
    parser.add_argument("--loaders", default=None, help="comma-separated backends (default: all)")
    parser.add_argument("--workers", default="0,1,2", help="worker counts")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--train-epochs", type=int, default=2)
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    parser.add_argument("--tag", default="", help="suffix for the result file names")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    stem = args.out_dir / f"decode-digits-png{'-' + args.tag if args.tag else ''}"
    command = [
        "compare",
        "--workload",
        "decode",
        "--data-dir",
        args.data_dir,
        "--workers",
        args.workers,
        "--batch-size",
        str(args.batch_size),
        "--repeats",
        str(args.repeats),
        "--train-epochs",
        str(args.train_epochs),
        "--json",
        f"{stem}.json",
    ]
    if args.loaders:
        command += ["--loaders", args.loaders]
    return run_compare(command, stem, "decode.py")


if __name__ == "__main__":
    sys.exit(main())

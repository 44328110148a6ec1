"""Runs `jaxfeed compare` on the 10,000 real MNIST test digits and saves the figures.

    python benchmarks/compare.py                 # the run behind benchmarks/README.md
    python benchmarks/compare.py --tag h100      # on another machine: keep both results

Writes ``results/compare-<dataset>[-<tag>].json``, ``.png`` and ``.txt`` (the printed
tables) under ``benchmarks/``. ``mnist-10k`` is the real test set split 8,000 train /
2,000 test (the 60k training images are not available offline).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time
from pathlib import Path

from common import RESULTS, SHARED_MNIST, git_state  # also puts the repo on sys.path


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

    from jaxfeed.cli import main as jaxfeed

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
    state = git_state()  # before the run: what was imported
    started = time.perf_counter()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = jaxfeed(command)
    table = printed.getvalue()
    print(table, end="")
    Path(f"{stem}.txt").write_text(table)
    result = json.loads(Path(f"{stem}.json").read_text())
    result["git"] = state
    Path(f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"\nbenchmarks/compare.py took {time.perf_counter() - started:.0f} s; wrote "
        f"{stem}.json, .png, .txt"
    )
    return code


if __name__ == "__main__":
    sys.exit(main())

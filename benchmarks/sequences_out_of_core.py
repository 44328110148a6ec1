"""A token corpus on disk, packed through each backend cold: read MB/s against
the disk's sequential bandwidth measured in the same run, and the peak RssAnon.

The corpus: ``--tokens`` uint16 token ids in ``input_ids.values.npy`` and one
length per document in ``input_ids.lengths.npy`` (lognormal lengths, median
about ``--median``), written once under ``--dir`` (a temporary directory by
default; never committed). Each backend then runs in a fresh process: the
files' pages are dropped from the page cache (``posix_fadvise(DONTNEED)``),
``make(backend, dataset=DIR, pack=Pack(L, split=True), shuffle="blocks")``
plans an epoch (documents in blocks of about 1 MiB, as for any data bigger
than memory) and reads it for ``--seconds``. The figures: real tokens/s, the
MB/s of token values read (2 bytes a token), that as a share of the disk's
O_DIRECT sequential MB/s, the planning seconds, and the peak RssAnon
(anonymous memory: the memory-mapped file's pages are page cache, not it).

Run: ``python3 benchmarks/sequences_out_of_core.py --tokens 4e9`` (writes
results/sequences-out-of-core-cpu.json); ``--quick`` for a small run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from bigger_than_memory import disk_limits, evict
from common import write_record  # also puts the repo on sys.path
from formats_big import _peak_rss_anon

LENGTH = 2048  # tokens in a packed row


def write_corpus(directory: Path, tokens: int, median: int) -> None:
    """Documents of lognormal lengths summing to ``tokens``, values written in chunks."""
    done = directory / "done"
    if done.exists():
        return
    rng = np.random.default_rng(0)
    lengths = []
    total = 0
    while total < tokens:
        chunk = np.maximum(1, rng.lognormal(np.log(median), 1.0, 1 << 20).astype(np.int64))
        lengths.append(chunk)
        total += int(chunk.sum())
    lengths = np.concatenate(lengths)
    lengths = lengths[: int(np.searchsorted(np.cumsum(lengths), tokens)) + 1]
    lengths[-1] -= int(lengths.sum()) - tokens
    lengths = lengths[lengths > 0]
    np.save(directory / "input_ids.lengths.npy", lengths)
    values = np.lib.format.open_memmap(
        directory / "input_ids.values.npy", mode="w+", dtype=np.uint16, shape=(tokens,)
    )
    step = 1 << 26
    for at in range(0, tokens, step):
        n = min(step, tokens - at)
        values[at : at + n] = rng.integers(1, 50000, n, dtype=np.uint16)
        print(f"\rwriting {at + n:,} / {tokens:,} tokens", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    values.flush()
    del values
    os.sync()
    done.touch()


def measure(directory: Path, backend: str, seconds: float) -> dict:
    """One backend, cold, in this (fresh) process."""
    peak = _peak_rss_anon()
    import jaxfeed

    files = list(directory.glob("*.npy"))
    evict(files)
    started = time.perf_counter()
    options = {"num_workers": 2} if backend in ("torch", "grain") else {}
    pack = jaxfeed.Pack(LENGTH, split=True)
    source = jaxfeed.make(
        backend, dataset=str(directory), batch_size=8, shuffle="blocks", pack=pack, **options
    )
    make_s = time.perf_counter() - started
    evict(files)
    tokens, first_s, first_tokens = 0, 0.0, 0
    started = time.perf_counter()
    for batch in source.iter_epoch(0):
        tokens += int((batch["segment_ids"] > 0).sum())
        if not first_s:
            first_s, first_tokens = time.perf_counter() - started, tokens
        if time.perf_counter() - started > seconds:
            break
    elapsed = time.perf_counter() - started
    source.close()
    rate = (tokens - first_tokens) / max(elapsed - first_s, 1e-9)
    return {
        "backend": backend,
        "make_s": make_s,
        "first_batch_s": first_s,
        "tokens_per_s": rate,
        "MB_per_s": rate * 2 / 1e6,
        "tokens_read": tokens,
        "peak_rss_anon_MiB": peak[0] / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=float, default=4e9)
    parser.add_argument("--median", type=int, default=1500)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--backends", default="numpy,torch,grain")
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--tag", default="cpu", help="names the results file")
    parser.add_argument("--measure", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.dir, args.measure, args.seconds)))
        return
    if args.quick:
        args.tokens, args.seconds = 2e7, 2.0
    tokens = int(args.tokens)
    with tempfile.TemporaryDirectory(dir="/tmp") as scratch:
        directory = args.dir or Path(scratch)
        directory.mkdir(parents=True, exist_ok=True)
        write_corpus(directory, tokens, args.median)
        values = directory / "input_ids.values.npy"
        evict([values])
        limits = disk_limits(values, min(5.0, args.seconds))
        sequential = limits["sequential_MBps"]
        print(f"corpus {tokens:,} tokens ({values.stat().st_size / 1e9:.1f} GB); disk O_DIRECT "
              f"sequential {sequential:,.0f} MB/s")  # fmt: skip
        results = []
        for backend in args.backends.split(","):
            env = {**os.environ, "JAXFEED_CACHE_DIR": str(Path(scratch) / "cache")}
            done = subprocess.run(
                [sys.executable, __file__, "--measure", backend, "--dir", str(directory),
                 "--seconds", str(args.seconds)],
                capture_output=True, text=True, env=env, timeout=3600,
            )  # fmt: skip
            if done.returncode:
                raise SystemExit(f"{backend} failed:\n{done.stderr[-3000:]}")
            got = json.loads(done.stdout.splitlines()[-1])
            got["share_of_sequential"] = got["MB_per_s"] / sequential
            results.append(got)
            print(f"{backend:6} make {got['make_s']:6.1f} s  first {got['first_batch_s']:5.1f} s  "
                  f"{got['tokens_per_s'] / 1e6:7.1f}M tokens/s  {got['MB_per_s']:6.0f} MB/s "
                  f"({got['share_of_sequential']:.0%} of sequential)  "
                  f"RssAnon {got['peak_rss_anon_MiB']:5.0f} MiB")  # fmt: skip
        if not args.quick:
            write_record("sequences-out-of-core", args, results, disk=limits, tokens=tokens,
                         machine="2-core AMD EPYC VM, 24 GiB, CPU only")  # fmt: skip


if __name__ == "__main__":
    main()

"""The user's Parquet (or Arrow IPC) files through ``make`` at two sizes, one bigger than RAM.

    flock /tmp/jaxfeed-bigdisk.lock python3 benchmarks/formats_big.py   # both sizes
    python3 benchmarks/formats_big.py --rows 1000000 --window 10          # a quick look
    python3 benchmarks/formats_big.py --format arrow --rows 2000000 --tag arrow-in-place
    python3 benchmarks/formats_big.py --format arrayrecord --rows 2000000 --orders warm \
        --backends grain --tag arrayrecord-in-place   # then --copy --tag arrayrecord-copied

``--format arrow`` writes Arrow IPC stream files as ``datasets`` does
(record batches of 1,000 rows, 500,000 rows a file), ``image`` a binary
column of `ARROW_IMAGE_BYTES` incompressible bytes per row, ``label`` int64;
they are read in place (an index in the cache, no copy), and a read's
transform takes the first 784 bytes of each row as a 28x28 image. The
one-time step's CPU seconds (``process_time``) are reported beside its wall
time; ``--copy`` builds and reads the columnar copy instead, as before
Arrow was read in place (the same code path: a before/after on one
checkout), and ``warm`` among ``--orders`` reads the window once before
timing it. ``--format arrayrecord`` writes the same rows as serialized
Examples in ArrayRecord files (``group_size:1``, as Grain asks; 500,000 rows
a file), which grain reads in place (no copy; ``--copy``: through the copy).

For each size, writes one directory of Parquet files (``image``: 784 uint8 per
row as a fixed-size list, MNIST-shaped; ``label``: int64; row groups of 65,536
rows, zstd) under ``--dir``, then, each in a fresh process with an empty
``JAXFEED_CACHE_DIR`` under ``--dir``:

- the one-time columnar copy (``load_dataset``): source MB/s, copy MB/s (the
  bytes written), peak RssAnon;
- the disk's limits on the copy's image file, in the same run (sequential
  ``O_DIRECT`` MB/s and random 4 KiB IOPS: `bigger_than_memory.disk_limits`);
- per backend (numpy, grain: the others write a native copy of their own) and
  order (``shuffle="blocks"``, whose blocks follow the row groups; the full
  permutation for the size that fits in memory), the copy evicted from the
  page cache first: rows/s and MB/s over the first ``--window`` seconds of an
  epoch, and the peak RssAnon (anonymous memory, not the page cache).

The rows compress to almost nothing in Parquet (16 varying bytes, the rest
zeros), so the source is small and the disk figures are the copy's reads.
Deletes each size's data after measuring it unless ``--keep``. Writes
``results/formats-big-<tag>.json`` and ``.txt``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from bigger_than_memory import disk_limits, evict
from common import write_record  # also puts the repo on sys.path

SIDE = 28 * 28
GROUP_ROWS = 65_536
ARROW_IMAGE_BYTES = 1_000
ARROW_BATCH_ROWS, ARROW_FILE_ROWS = 1_000, 500_000  # datasets' writer batch, ~500 MB shards


def write_parquet(directory: Path, rows: int) -> float:
    """``rows`` rows in files of 16 row groups; returns MB/s of rows written."""
    import pyarrow as pa
    from pyarrow import parquet

    directory.mkdir(parents=True)
    started, file_rows = time.perf_counter(), 16 * GROUP_ROWS
    for first in range(0, rows, file_rows):
        schema = pa.schema([("image", pa.list_(pa.uint8(), SIDE)), ("label", pa.int64())])
        path = directory / f"train-{first // file_rows:05d}.parquet"
        with parquet.ParquetWriter(path, schema, compression="zstd") as writer:
            for start in range(first, min(rows, first + file_rows), GROUP_ROWS):
                n = min(GROUP_ROWS, rows - start)
                image = np.zeros((n, SIDE), np.uint8)
                image[:, :16] = (np.arange(start, start + n)[:, None] * 7 + np.arange(16)) % 256
                column = pa.FixedSizeListArray.from_arrays(pa.array(image.reshape(-1)), SIDE)
                label = pa.array(np.arange(start, start + n) % 10)
                writer.write_table(pa.table({"image": column, "label": label}, schema=schema))
    return rows * (SIDE + 8) / (time.perf_counter() - started) / 1e6


def write_arrow(directory: Path, rows: int) -> float:
    """``rows`` rows in Arrow IPC stream files; returns MB/s of rows written."""
    import pyarrow as pa

    directory.mkdir(parents=True)
    schema = pa.schema([("image", pa.binary()), ("label", pa.int64())])
    rng, started = np.random.default_rng(0), time.perf_counter()
    for first in range(0, rows, ARROW_FILE_ROWS):
        path = directory / f"data-{first // ARROW_FILE_ROWS:05d}.arrow"
        with pa.ipc.new_stream(path, schema) as writer:
            for start in range(first, min(rows, first + ARROW_FILE_ROWS), ARROW_BATCH_ROWS):
                n = min(ARROW_BATCH_ROWS, rows - start)
                data = rng.integers(0, 256, n * ARROW_IMAGE_BYTES, np.uint8)
                offsets = np.arange(n + 1, dtype=np.int32) * ARROW_IMAGE_BYTES
                image = pa.Array.from_buffers(
                    pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
                )
                label = pa.array(np.arange(start, start + n) % 10)
                writer.write_batch(pa.record_batch([image, label], schema=schema))
    return rows * (ARROW_IMAGE_BYTES + 8) / (time.perf_counter() - started) / 1e6


def write_arrayrecord(directory: Path, rows: int) -> float:
    """`write_arrow`'s rows as Examples in ArrayRecord files; returns MB/s of rows written."""
    from array_record.python.array_record_module import ArrayRecordWriter
    from jaxfeed.loaders.data.formats.example import serialize_examples

    directory.mkdir(parents=True)
    rng, started = np.random.default_rng(0), time.perf_counter()
    for first in range(0, rows, ARROW_FILE_ROWS):
        path = directory / f"data-{first // ARROW_FILE_ROWS:05d}.array_record"
        writer = ArrayRecordWriter(str(path), "group_size:1")
        for start in range(first, min(rows, first + ARROW_FILE_ROWS), ARROW_BATCH_ROWS):
            n = min(ARROW_BATCH_ROWS, rows - start)
            data = rng.integers(0, 256, n * ARROW_IMAGE_BYTES, np.uint8).tobytes()
            image = [data[i * ARROW_IMAGE_BYTES : (i + 1) * ARROW_IMAGE_BYTES] for i in range(n)]
            label = np.arange(start, start + n) % 10
            for record in serialize_examples({"image": image, "label": label}):
                writer.write(record)
        writer.close()
    return rows * (ARROW_IMAGE_BYTES + 8) / (time.perf_counter() - started) / 1e6


def first_pixels(record: dict, rng: np.random.Generator) -> dict:
    """An Arrow row's first 784 bytes as a 28x28 image (the read's transform)."""
    image = np.frombuffer(record["image"], np.uint8, SIDE).reshape(28, 28)
    return {"image": image, "label": record["label"]}


def _dataset(data: Path, copy: bool):
    """``data`` as ``load_dataset`` reads it, or, with ``copy``, through the
    columnar copy every format was read through before Arrow was read in place."""
    from jaxfeed.loaders.array_dataset import ArrayDataset
    from jaxfeed.loaders.data import formats

    from jaxfeed import loaders

    if not copy:
        return loaders.load_dataset(data)
    fields, description = formats._copied(formats.locate(data, "train", ["train"]), "train")
    return ArrayDataset("copied/train", fields, units=description["units"])


def _source_files(data: Path) -> list[Path]:
    return [p for p in data.iterdir() if p.suffix in (".parquet", ".arrow", ".array_record")]


def _peak_rss_anon() -> list[int]:
    """A list whose one item follows this process's peak RssAnon (bytes)."""
    peak = [0]

    def watch() -> None:
        while True:
            with open("/proc/self/status") as status:
                for line in status:
                    if line.startswith("RssAnon:"):
                        peak[0] = max(peak[0], int(line.split()[1]) * 1024)
            time.sleep(0.05)

    threading.Thread(target=watch, daemon=True).start()
    return peak


def measure_copy(data: Path, copy: bool) -> dict:
    peak = _peak_rss_anon()

    source = sum(p.stat().st_size for p in _source_files(data))
    started, cpu = time.perf_counter(), time.process_time()
    dataset = _dataset(data, copy)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    cache = Path(os.environ["JAXFEED_CACHE_DIR"])
    copied = sum(f.stat().st_size for f in cache.rglob("*") if f.is_file())
    return {
        "rows": len(dataset),
        "units": len(dataset.units),
        "source_MB": source / 1e6,
        "copy_MB": copied / 1e6,
        "copy_s": seconds,
        "copy_cpu_s": cpu,
        "copy_MB_per_s": copied / seconds / 1e6,
        "peak_rss_anon_MiB": peak[0] / 2**20,
    }


def measure_read(data: Path, backend: str, order: str, window: float, copy: bool) -> dict:
    peak = _peak_rss_anon()
    from jaxfeed import loaders

    cache = Path(os.environ["JAXFEED_CACHE_DIR"])
    arrow = any(p.suffix in (".arrow", ".array_record") for p in _source_files(data))
    if order != "warm":
        evict([f for f in cache.rglob("*") if f.is_file()] + _source_files(data))
    shuffle = "blocks" if order in ("blocks", "warm") else True
    transform = {"transform": first_pixels} if arrow else {}
    dataset = _dataset(data, copy)
    source = loaders.make(backend, dataset=dataset, batch_size=1024, shuffle=shuffle, **transform)

    def read() -> tuple[int, float, float]:
        rows, started, cpu = 0, time.perf_counter(), time.process_time()
        for batch in source.iter_epoch(0):
            rows += int(batch["mask"].sum())
            if time.perf_counter() - started > window:
                break
        return rows, time.perf_counter() - started, time.process_time() - cpu

    if order == "warm":
        read()
    rows, seconds, cpu = read()
    row_bytes = (ARROW_IMAGE_BYTES if arrow else SIDE) + 4  # an image row and an int32 label
    return {
        "backend": backend,
        "order": order,
        "rows_per_s": rows / seconds,
        "MB_per_s": rows * row_bytes / seconds / 1e6,
        "rows_read": rows,
        "seconds": seconds,
        "cpu_us_per_row": cpu / max(1, rows) * 1e6,
        "peak_rss_anon_MiB": peak[0] / 2**20,
    }


def _fresh(args: list[str], cache: Path, copy: bool = False) -> dict:
    env = {**os.environ, "JAXFEED_CACHE_DIR": str(cache)}
    args = [*args, "--copy"] if copy else args
    done = subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, env=env, timeout=7200
    )
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-3:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/tmp/big/formats2", help="where the data is written")
    parser.add_argument("--rows", default="2000000,35000000", help="sizes; 35M: 27 GB copy")
    parser.add_argument("--backends", default="numpy,grain")
    parser.add_argument("--window", type=float, default=30.0, help="seconds read per run")
    parser.add_argument("--limit-seconds", type=float, default=5.0)
    parser.add_argument("--keep", action="store_true", help="keep the data after measuring")
    parser.add_argument("--tag", default="cpu")
    parser.add_argument("--format", default="parquet", choices=("parquet", "arrow", "arrayrecord"))
    parser.add_argument("--orders", help="blocks, full, warm (default: blocks, full if it fits)")
    parser.add_argument("--copy", action="store_true", help="read Arrow/ArrayRecord via the copy")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    parser.add_argument("--order", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure == "copy":
        print(json.dumps(measure_copy(Path(args.data), args.copy)))
        return
    if args.measure == "read":
        read = measure_read(Path(args.data), args.backend, args.order, args.window, args.copy)
        print(json.dumps(read))
        return
    # A kill (timeout, Ctrl-C) still deletes the data in the finally below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with open("/proc/meminfo") as meminfo:
        ram = int(meminfo.readline().split()[1]) * 1024
    root = Path(args.dir)
    results, lines = [], []
    for rows in [int(r) for r in args.rows.split(",")]:
        root.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f"rows-{rows}-", dir=root))
        data, cache = work / args.format, work / "cache"
        try:
            writers = {"arrow": write_arrow, "arrayrecord": write_arrayrecord}
            written = writers.get(args.format, write_parquet)(data, rows)
            copy = _fresh(["--measure", "copy", "--data", str(data)], cache, args.copy)
            images = max(
                (f for f in [*cache.rglob("*"), *_source_files(data)] if f.is_file()),
                key=lambda f: f.stat().st_size,
            )
            evict([images])
            limits = disk_limits(images, args.limit_seconds)
            fits = copy.get("copy_MB", 0) * 1e6 < ram / 2
            reads = []
            for backend in args.backends.split(","):
                orders = args.orders.split(",") if args.orders else ["blocks"] + ["full"] * fits
                for order in orders:
                    options = ["--backend", backend, "--order", order, "--window", str(args.window)]
                    reads.append(
                        _fresh(
                            ["--measure", "read", "--data", str(data), *options], cache, args.copy
                        )
                    )
                    print(json.dumps(reads[-1]), flush=True)
        finally:
            if not args.keep:
                shutil.rmtree(work, ignore_errors=True)
        load = os.getloadavg()
        entry = {"rows": rows, "write_MB_per_s": written, "copy": copy, "disk": limits,
                 "reads": reads, "ram_GiB": ram / 2**30, "load_average": load}  # fmt: skip
        results.append(entry)
        print(json.dumps(entry), flush=True)
        lines.append(
            f"{rows:,} {args.format} rows{' (copied)' if args.copy else ''}, source "
            f"{copy.get('source_MB', 0) / 1e3:.1f} GB, "
            f"cache {copy.get('copy_MB', 0) / 1e3:.2f} GB (RAM {ram / 2**30:.0f} GiB), load "
            f"{load[0]:.1f}: load_dataset {copy.get('copy_s', 0):.1f} s "
            f"({copy.get('copy_cpu_s', 0):.1f} CPU s), cache "
            f"{copy.get('copy_MB_per_s', 0):.0f} MB/s "
            f"(peak RssAnon {copy.get('peak_rss_anon_MiB', 0):.0f} MiB); disk sequential "
            f"{limits['sequential_MBps']:.0f} MB/s, random 4K IOPS {limits['random_4k_iops_1']:.0f}"
            f" (1 reader) / {limits['random_4k_iops_32']:.0f} (32)"
        )
        for r in reads:
            if "error" in r:
                lines.append(f"  error: {r['error']}")
                continue
            lines.append(
                f"  {r['backend']:6s} {r['order']:6s} {r['rows_per_s']:>10,.0f} rows/s "
                f"{r['MB_per_s']:7.1f} MB/s ({r['MB_per_s'] / limits['sequential_MBps']:.0%} of "
                f"sequential), {r['cpu_us_per_row']:.1f} CPU us/row, peak RssAnon "
                f"{r['peak_rss_anon_MiB']:.0f} MiB"
            )
    text = "\n".join(lines)
    print(text)
    out = write_record("formats-big", args, results, ram_GiB=ram / 2**30, cpus=os.cpu_count())
    out.with_suffix(".txt").write_text(text + "\n")


if __name__ == "__main__":
    main()

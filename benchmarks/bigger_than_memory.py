"""Every backend reading an on-disk dataset, up to one bigger than this machine's RAM.

    python3 benchmarks/bigger_than_memory.py --dir /tmp/jaxfeed-big     # behind docs/data.md
    python3 benchmarks/bigger_than_memory.py --rows 1000000 --window 10 # a quick look

For each size, writes a directory of ``image.npy`` (uint8 [N, 28, 28, 1],
MNIST-shaped rows of 784 bytes, pseudo-random) and ``label.npy`` (int32) under
``--dir`` (kept between runs, never in the repository), then measures, each
in a fresh process with an empty ``JAXFEED_CACHE_DIR``:

- the disk's limits, in the same run: sequential ``O_DIRECT`` reads (8 MiB
  requests) and random 4 KiB ``O_DIRECT`` reads with 1 and 32 readers;
- per backend and order (``shuffle=True``, the full permutation, and
  ``shuffle="blocks"``): ``make()`` time (hf converts to Arrow: its MB/s),
  rows/s and MB/s over the first ``--window`` seconds of an epoch (or the
  whole epoch if shorter), cold (the files evicted from the page cache with
  ``posix_fadvise(DONTNEED)`` first) and, for sizes that fit in memory, warm
  (a second pass); and the peak RssAnon (anonymous memory: not the page
  cache, which the kernel reclaims) and RssFile (the file pages mapped into
  this process: page cache), and the page faults (minor; major: waited for
  the disk) and CPU seconds (user, system) the reading thread took per MB.

``--populate off,on`` measures each row twice, interleaved on the same
files: with the read-ahead's readers mapping the pages they read
(``MADV_POPULATE_READ``) and without (the default: the gather faults them in).

Then each of 2 processes (``process_index`` 0 and 1 of 2, run at once) reads
its slice of every global batch of one epoch, cold, and reports the bytes it
fetched from the disk (``read_bytes`` of ``/proc/self/io``): for rows of
256 KiB and for the 784-byte rows of the smallest size (there two processes'
rows share 4 KiB pages, so each reads most pages).

Writes ``results/bigger-than-memory-<tag>.json`` and ``.txt``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import mmap
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
from common import write_record  # also puts the repo on sys.path

ROW_BYTES = 28 * 28 + 4  # an image and its label
BACKENDS = ("numpy", "torch", "tf", "grain", "hf")
ORDERS = ("full", "blocks")


def _count(n: int) -> str:
    return f"{n / 1e6:g}M"


def _progress(done: int, total: int, what: str) -> None:
    print(f"\r{what}: {100 * done / total:5.1f}%", end="" if done < total else "\n", flush=True)


def write_dataset(directory: Path, rows: int) -> Path:
    """``image.npy`` and ``label.npy`` of ``rows`` rows, unless already there."""
    done = directory / "complete"
    if done.exists():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    images = np.lib.format.open_memmap(
        directory / "image.npy", mode="w+", dtype=np.uint8, shape=(rows, 28, 28, 1)
    )
    rng = np.random.default_rng(0)
    chunk = 1 << 18  # rows per write: ~200 MB
    noise = rng.integers(0, 256, (chunk, 28, 28, 1), dtype=np.uint8)
    for start in range(0, rows, chunk):
        stop = min(rows, start + chunk)
        images[start:stop] = noise[: stop - start] + np.uint8(start // chunk)  # rows differ
        _progress(stop, rows, f"writing {directory.name}")
    images.flush()
    del images
    np.save(directory / "label.npy", (np.arange(rows) * 7919 % 10).astype(np.int32))
    os.sync()
    done.touch()
    return directory


def evict(paths: list[Path]) -> None:
    """Drops the files' pages from the page cache (they are clean: written and synced)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def disk_limits(path: Path, seconds: float) -> dict[str, float]:
    """Sequential MB/s and random 4 KiB IOPS (1 and 32 readers), O_DIRECT, on ``path``."""
    size = path.stat().st_size
    out = {}
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        buffer = mmap.mmap(-1, 8 << 20)  # page-aligned, as O_DIRECT needs
        read, started, offset = 0, time.perf_counter(), 0
        while time.perf_counter() - started < seconds and offset + len(buffer) <= size:
            read += os.preadv(fd, [buffer], offset)
            offset += len(buffer)
        out["sequential_MBps"] = read / (time.perf_counter() - started) / 1e6
        for readers in (1, 32):
            counts = [0] * readers
            stop = time.perf_counter() + seconds
            threads = [
                threading.Thread(target=_random_reads, args=(fd, size, stop, counts, i))
                for i in range(readers)
            ]
            started = time.perf_counter()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            out[f"random_4k_iops_{readers}"] = sum(counts) / (time.perf_counter() - started)
    finally:
        os.close(fd)
    return out


def _random_reads(fd: int, size: int, stop: float, counts: list[int], i: int) -> None:
    """Reader ``i``: random 4 KiB O_DIRECT reads until ``stop``, counted in ``counts[i]``."""
    page = mmap.mmap(-1, 4096)
    rng = np.random.default_rng(i)
    while time.perf_counter() < stop:
        for block in rng.integers(0, size // 4096, 256).tolist():
            os.preadv(fd, [page], block * 4096)
        counts[i] += 256


def read_slice(args: argparse.Namespace) -> dict:
    """This process's slice of every global batch of one epoch, cold; bytes fetched."""
    from jaxfeed import loaders

    source = loaders.make("numpy", dataset=Path(args.data), batch_size=args.batch,
                          process_index=args.process, process_count=2)  # fmt: skip
    with open("/proc/self/io") as io:
        before = int(next(line for line in io if line.startswith("read_bytes")).split()[1])
    rows = sum(int(batch["mask"].sum()) for batch in source.iter_epoch(0))
    with open("/proc/self/io") as io:
        after = int(next(line for line in io if line.startswith("read_bytes")).split()[1])
    return {"rows": rows, "read_bytes": after - before}


def process_slices(data: Path, batch: int) -> dict:
    """Two processes at once, each reading its slice: the fraction of the files each fetched."""
    files = list(data.glob("*.npy"))
    evict(files)
    size = sum(f.stat().st_size for f in files)
    children = [
        subprocess.Popen([sys.executable, __file__, "--read-slice", "--data", str(data),
                          "--process", str(p), "--batch", str(batch)],
                         stdout=subprocess.PIPE, text=True)
        for p in range(2)
    ]  # fmt: skip
    outputs = [child.communicate(timeout=3600)[0] for child in children]
    reports = [json.loads(output.splitlines()[-1]) for output in outputs]
    return {
        "file_bytes": size,
        "rows": [r["rows"] for r in reports],
        "fraction_read": [r["read_bytes"] / size for r in reports],
    }


class DiskWatch:
    """The disk holding ``path``, sampled from ``/proc/diskstats`` while a run
    reads: how busy it was (the kernel's ``io_ticks``), the mean requests in
    flight, and the bytes it read (the whole disk's: other work counts too)."""

    def __init__(self, path: Path):
        device = os.stat(path).st_dev
        name = Path(f"/sys/dev/block/{os.major(device)}:{os.minor(device)}").resolve().name
        self._name = name
        self._samples: list[int] = []  # requests in flight, one per sample
        self._first = self._last = self._read()

    def _read(self) -> tuple[float, int, int]:
        """(now, sectors read, ms busy) of the disk."""
        with open("/proc/diskstats") as stats:
            for line in stats:
                fields = line.split()
                if fields[2] == self._name:
                    self._samples.append(int(fields[11]))
                    return time.perf_counter(), int(fields[5]), int(fields[12])
        return time.perf_counter(), 0, 0

    def sample(self) -> None:
        self._last = self._read()

    def summary(self) -> dict[str, float]:
        (t0, sectors0, busy0), (t1, sectors1, busy1) = self._first, self._last
        seconds = max(t1 - t0, 1e-9)
        return {
            "disk_busy": (busy1 - busy0) / 1e3 / seconds,
            "disk_in_flight": sum(self._samples) / max(1, len(self._samples)),
            "disk_read_MB": (sectors1 - sectors0) * 512 / 1e6,
        }


def cpu_seconds(processes: list) -> float:
    """User and system CPU seconds of ``processes`` (psutil), the living ones."""
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except Exception:  # ended
            continue
        total += times.user + times.system
    return total


def read_bytes(processes: list) -> int:
    """Bytes ``processes`` (psutil) caused to be read from storage, the living ones."""
    total = 0
    for process in processes:
        try:
            total += process.io_counters().read_bytes
        except Exception:  # ended
            continue
    return total


def thread_counts() -> tuple[float, ...]:
    """(minor faults, major faults, user CPU s, system CPU s) of the calling thread so far."""
    with open(f"/proc/self/task/{threading.get_native_id()}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()  # fields 3 on of proc(5)'s stat
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[7]), int(fields[9]), int(fields[11]) / tick, int(fields[12]) / tick


def measure(args: argparse.Namespace) -> dict:
    """One backend, order and temperature, in this (fresh) process."""
    import psutil
    from jaxfeed.loaders._io import disk_read_ahead

    disk_read_ahead.POPULATE = args.populate == "on"
    peak = {"RssAnon:": 0, "RssFile:": 0}
    disk = DiskWatch(Path(args.data) / "image.npy")

    def rss() -> None:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(tuple(peak)):
                    name, kib, _ = line.split()
                    peak[name] = max(peak[name], int(kib) * 1024)

    def watch() -> None:
        while True:
            rss()
            disk.sample()
            time.sleep(0.05)

    threading.Thread(target=watch, daemon=True).start()
    from jaxfeed import loaders

    directory = Path(args.data)
    shuffle = "blocks" if args.order == "blocks" else True
    options = {"num_workers": 2} if args.backend in ("torch",) else {}
    if args.temperature == "cold":
        evict(list(directory.glob("*.npy")))
    started = time.perf_counter()
    source = loaders.make(
        args.backend, dataset=directory, batch_size=1024, shuffle=shuffle, **options
    )
    make_s = time.perf_counter() - started
    if args.temperature == "cold":  # make() read the files and wrote hf's Arrow copy
        cache = Path(os.environ["JAXFEED_CACHE_DIR"])
        evict([*directory.glob("*.npy"), *(f for f in cache.rglob("*") if f.is_file())])
    rows, first_rows, first_s, children, children_before = 0, 0, 0.0, [], 0.0
    this = psutil.Process()
    disk = DiskWatch(directory / "image.npy")
    cpu_before, read_before = cpu_seconds([this]), read_bytes([this])
    counts_before = thread_counts()
    started = time.perf_counter()
    for batch in source.iter_epoch(0):
        if not rows:  # worker processes (torch, grain) run now: their start-up is not counted
            children = this.children(recursive=True)
            children_before = cpu_seconds(children)
            read_before -= read_bytes(children)
            first_s = time.perf_counter() - started
        rows += int(batch["mask"].sum())
        first_rows = first_rows or rows
        if time.perf_counter() - started > args.window:
            break
    seconds = time.perf_counter() - started
    counts = [after - before for after, before in zip(thread_counts(), counts_before, strict=True)]
    disk.sample()
    cpu = cpu_seconds([this]) - cpu_before + cpu_seconds(children) - children_before
    read_MB = (read_bytes([this, *children]) - read_before) / 1e6
    used_MB = rows * ROW_BYTES / 1e6
    return {
        "first_batch_s": first_s,
        "rows_per_s_after_first": (rows - first_rows) / max(seconds - first_s, 1e-9),
        "cpu_s": cpu,
        "cpu_s_per_GB": cpu / max(used_MB / 1e3, 1e-9),
        **disk.summary(),
        "disk_read_per_used": disk.summary()["disk_read_MB"] / max(used_MB, 1e-9),
        "own_read_per_used": read_MB / max(used_MB, 1e-9),  # this process and its workers
        "make_s": make_s,
        "rows_per_s": rows / seconds,
        "MB_per_s": rows * ROW_BYTES / seconds / 1e6,
        "rows_read": rows,
        "seconds": seconds,
        "peak_rss_anon_MiB": peak["RssAnon:"] / 2**20,
        "peak_rss_file_MiB": peak["RssFile:"] / 2**20,
        # The reading thread (this process's main thread: the gather, unless workers gather).
        "reader_minor_faults_per_MB": counts[0] / max(used_MB, 1e-9),
        "reader_major_faults_per_MB": counts[1] / max(used_MB, 1e-9),
        "reader_user_s_per_GB": counts[2] / max(used_MB / 1e3, 1e-9),
        "reader_system_s_per_GB": counts[3] / max(used_MB / 1e3, 1e-9),
    }


def _run_one(data: Path, cache: Path, backend: str, order: str, temperature: str, window: float,
             populate: str):  # fmt: skip
    command = [sys.executable, __file__, "--measure", "--data", str(data), "--backend", backend,
               "--order", order, "--temperature", temperature, "--window", str(window),
               "--populate", populate]  # fmt: skip
    env = {**os.environ, "JAXFEED_CACHE_DIR": str(cache)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _figures(got: dict) -> str:
    """One measurement's figures, on one line."""
    return (
        f"{got['rows_per_s']:>10,.0f} rows/s {got['MB_per_s']:7.0f} MB/s  "
        f"make {got['make_s']:6.1f} s  RssAnon {got['peak_rss_anon_MiB']:5.0f} MiB  "
        f"CPU {got['cpu_s_per_GB']:5.2f} s/GB  disk busy {100 * got['disk_busy']:3.0f}%, "
        f"{got['disk_in_flight']:4.1f} in flight, read/used {got['disk_read_per_used']:4.2f} "
        f"(own {got['own_read_per_used']:4.2f}), after the first batch "
        f"{got['rows_per_s_after_first']:,.0f} rows/s  RssFile {got['peak_rss_file_MiB']:5.0f} MiB"
        f"  reading thread's faults/MB {got['reader_minor_faults_per_MB']:.0f} minor "
        f"{got['reader_major_faults_per_MB']:.1f} major, CPU s/GB "
        f"{got['reader_user_s_per_GB']:.2f} user {got['reader_system_s_per_GB']:.2f} system"
    )


def _load(averages: tuple[float, ...]) -> str:
    return ", ".join(f"{a:.1f}" for a in averages)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/tmp/jaxfeed-big", help="where the datasets are written")
    parser.add_argument("--rows", default="1000000,10000000,36000000")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--orders", default=",".join(ORDERS))
    parser.add_argument("--window", type=float, default=60.0, help="seconds read per run")
    parser.add_argument("--limit-seconds", type=float, default=10.0)
    parser.add_argument("--tag", default="cpu")
    parser.add_argument(
        "--populate", default="off", help="on, off or off,on: the read-ahead maps pages it read"
    )
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    parser.add_argument("--order", help=argparse.SUPPRESS)
    parser.add_argument("--temperature", help=argparse.SUPPRESS)
    parser.add_argument("--read-slice", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--process", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args)))
        return
    if args.read_slice:
        print(json.dumps(read_slice(args)))
        return
    populating = args.populate.split(",")
    with open("/proc/meminfo") as meminfo:
        ram = int(meminfo.readline().split()[1]) * 1024
    root = Path(args.dir)
    load_before = os.getloadavg()
    results, lines = [], []
    for rows in [int(r) for r in args.rows.split(",")]:
        data = write_dataset(root / f"rows-{_count(rows)}", rows)
        size = sum(f.stat().st_size for f in data.glob("*.npy"))
        evict(list(data.glob("*.npy")))
        limits = disk_limits(data / "image.npy", args.limit_seconds)
        line = (
            f"{_count(rows)} rows, {size / 2**30:.1f} GiB (RAM {ram / 2**30:.0f} GiB); the disk's "
            f"limits, O_DIRECT: sequential {limits['sequential_MBps']:,.0f} MB/s, random 4 KiB "
            f"{limits['random_4k_iops_1']:,.0f} IOPS with 1 reader, "
            f"{limits['random_4k_iops_32']:,.0f} with 32"
        )
        print(line, flush=True)
        lines.append(line)
        temperatures = ["cold"] + (["warm"] if size < ram / 2 else [])
        for backend in args.backends.split(","):
            cache = root / "cache"
            shutil.rmtree(cache, ignore_errors=True)  # each backend converts afresh (hf)
            for order in args.orders.split(","):
                for temperature, populate in itertools.product(temperatures, populating):
                    got = _run_one(data, cache, backend, order, temperature, args.window,
                                   populate)  # fmt: skip
                    row = {"rows": rows, "GiB": size / 2**30, "backend": backend, "order": order,
                           "temperature": temperature, "populate": populate == "on", **limits,
                           **got}  # fmt: skip
                    results.append(row)
                    setting = f" populate {populate:3}" if len(populating) > 1 else ""
                    line = f"{_count(rows):>5} {backend:5} {order:6} {temperature}{setting}: "
                    line += _figures(got) if "error" not in got else f"error {got['error']}"
                    print(line, flush=True)
                    lines.append(line)
            shutil.rmtree(cache, ignore_errors=True)
    wide = root / "rows-256KiB"
    if not (wide / "complete").exists():
        wide.mkdir(parents=True, exist_ok=True)
        rows = np.lib.format.open_memmap(wide / "x.npy", "w+", np.uint8, (2000, 256 << 10))
        for start in range(0, 2000, 100):
            rows[start : start + 100] = start // 100
        rows.flush()
        del rows
        np.save(wide / "label.npy", np.arange(2000, dtype=np.int32))
        os.sync()
        (wide / "complete").touch()
    slices = {"rows of 256 KiB": process_slices(wide, 8)}
    smallest_rows = min(int(r) for r in args.rows.split(","))
    smallest = root / f"rows-{_count(smallest_rows)}"
    if smallest.exists() and smallest_rows * ROW_BYTES < ram / 2:  # else: an epoch of random reads
        slices["rows of 788 B"] = process_slices(smallest, 512)
    for what, got in slices.items():
        line = f"2 processes, {what}: each fetched {got['fraction_read']} of the files"
        print(line)
        lines.append(line)
    internal = ("measure", "data", "backend", "order", "temperature", "read_slice", "process",
                "batch")  # fmt: skip
    shown = argparse.Namespace(**{k: v for k, v in vars(args).items() if k not in internal})
    load = {"load_average_1_5_15_before": load_before, "load_average_1_5_15_after": os.getloadavg()}
    out = write_record("bigger-than-memory", shown, results, ram_bytes=ram, cpus=os.cpu_count(),
                       process_slices=slices, **load)  # fmt: skip
    header = (
        f"Load average (1, 5, 15 min) {_load(load_before)} at the start, "
        f"{_load(os.getloadavg())} at the end, on {os.cpu_count()} CPUs"
        + (": a LOADED machine, other work ran beside it" if load_before[0] > 1 else "")
    )
    out.with_suffix(".txt").write_text("\n".join([header, *lines]) + "\n")


if __name__ == "__main__":
    main()

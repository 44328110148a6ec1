"""Datasets at ``s3://`` URLs through a slow link: jaxfeed beside pyarrow's
dataset API, ``datasets`` streaming, Ray Data and MosaicML Streaming.

A moto S3 server on 127.0.0.1 holds the data; every read goes through
tests/faulty_proxy.py (imported from tests/), run in a process of its own so
that it shares no GIL with the reader: it adds a latency to every request
and caps the bytes of all responses together (a token bucket). The parts
(``--parts``):

- ``moto``: moto alone through the proxy (no latency, no cap): 8 ranged reads
  of 8 MiB at once with s3fs, one at a time, and 16 KiB reads 4 at once (the
  store's own time per small read). The cap is set clearly below.
- ``blocks``: one epoch of ``make("numpy", shuffle="blocks")`` from ``make``
  on: ``.npy`` fields read in place (``JAXFEED_READ=ranges``) and the same
  rows as Parquet shards fetched whole, MB/s against the cap, at each latency.
- ``permutation``: a full permutation (``shuffle=True``) of small records read
  in place with a block cache far smaller than the split, so each row is
  about one ranged read: rows/s against what the latency allows, ``c / L``
  reads/s (``c`` the most reads the proxy saw in flight at once, ``L`` the
  latency) times the rows each read served.
- ``peers``: the same Parquet shards read by pyarrow's dataset API (its own
  ``S3FileSystem``), ``datasets`` streaming, Ray Data's ``read_parquet`` and,
  if it is installed, MosaicML Streaming (its own MDS shards of the rows).
- ``memory``: in a fresh process, a ``.npy`` split 4x ``JAXFEED_CACHE_BYTES``
  read in place (``shuffle="blocks"``, no latency or cap): peak RssAnon and the
  cache directory's size, sampled, and the bytes read per byte of the split.
- ``faults``: the proxy injects its faults (one request in ``--every``, each
  fault in turn): the batches' digest against the local files', and the
  time against the same read without faults.

Every digest of jaxfeed's batches is checked against the same ``make`` on the
local files. Data is written under a temporary directory of ``--dir``.

Run: ``python3 benchmarks/object_storage.py`` (writes
results/object-storage-cpu.json and .md); ``--quick`` for a small run,
``--out DIR`` to write elsewhere.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import hashlib
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from common import REPO, RESULTS, git_state  # also puts the repo on sys.path

sys.path.insert(0, str(REPO / "tests"))  # the proxy: tests/faulty_proxy.py
BUCKET = "jaxfeed-bench"
KEYS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
ENV = {**KEYS, "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}
SHARDS = 8
MB = 1e6


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def moto_server() -> Iterator[int]:
    port = free_port()
    command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:  # ready when it accepts a connection
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            assert server.poll() is None and time.monotonic() < deadline, "moto did not start"
            time.sleep(0.05)
        yield port
    finally:
        server.terminate()
        server.wait(10)


class Proxy:
    """tests/faulty_proxy.py's proxy in a process of its own; `stats` asks it."""

    def __init__(self, port: int, latency_s: float, cap: float | None, every: int = 0):
        config = {"port": port, "latency_s": latency_s, "cap": cap, "every": every}
        command = [sys.executable, __file__, "--serve-proxy", json.dumps(config)]
        self._process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.url = self._process.stdout.readline().strip()
        self.options = {"client_kwargs": {"endpoint_url": self.url}}

    def stats(self) -> dict:
        self._process.stdin.write("stats\n")
        self._process.stdin.flush()
        return json.loads(self._process.stdout.readline())

    def __enter__(self) -> Proxy:
        return self

    def __exit__(self, *_: object) -> None:
        self._process.stdin.close()
        self._process.wait(30)


def serve_proxy(config: dict) -> None:
    from faulty_proxy import FAULTS, FaultyProxy

    every = config["every"]
    with FaultyProxy(
        config["port"],
        every=max(every, 1),
        faults=FAULTS if every else (),
        latency_s=config["latency_s"],
        bytes_per_s=config["cap"],
    ) as proxy:
        print(proxy.url, flush=True)
        for _ in sys.stdin:
            print(json.dumps({**proxy.stats(), "faults": dict(proxy.counts)}), flush=True)


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def write_data(root: Path, s3, args) -> dict:
    """The datasets, on local disk and in the bucket; their sizes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    rows = int(args.mb * MB) // (256 * 4 + 8)
    x = rng.normal(size=(rows, 256)).astype(np.float32)
    y = rng.integers(0, 1000, rows)
    memory_rows = 4 * args.cache_mb * 2**20 // 4096
    arrays = {
        "blocks/train/x.npy": x,
        "blocks/train/y.npy": y,
        "small/train/x.npy": rng.normal(size=(args.small_rows, 32)).astype(np.float32),
        "memory/train/x.npy": rng.integers(0, 256, (memory_rows, 4096), dtype=np.uint8),
    }
    for key, array in arrays.items():
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        np.save(root / key, array)
    (root / "pq").mkdir()
    column = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), 256)
    table = pa.table({"x": column, "y": y})
    bounds = np.linspace(0, rows, SHARDS + 1).astype(int).tolist()
    for i in range(SHARDS):
        part = table.slice(bounds[i], bounds[i + 1] - bounds[i])
        name = f"pq/train-{i:05d}-of-{SHARDS:05d}.parquet"
        pq.write_table(part, root / name, row_group_size=4096)
    s3.create_bucket(Bucket=BUCKET)
    sizes: dict[str, int] = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            key = str(path.relative_to(root))
            s3.upload_file(str(path), BUCKET, key)
            top = key.split("/")[0]
            sizes[top] = sizes.get(top, 0) + path.stat().st_size
    return {"rows": rows, "memory_rows": memory_rows, "bytes": sizes}


def digest_epoch(source, epoch: int = 0, batches: int | None = None) -> tuple[str, int, float]:
    """The digest of an epoch's batches (or its first ``batches``), its rows and seconds."""
    digest, rows, began = hashlib.sha256(), 0, time.perf_counter()
    for i, batch in enumerate(source.iter_epoch(epoch)):
        if batches is not None and i >= batches:
            break
        for name in sorted(batch):
            digest.update(np.ascontiguousarray(batch[name]).tobytes())
        rows += len(next(iter(batch.values())))
    return digest.hexdigest(), rows, time.perf_counter() - began


@contextlib.contextmanager
def environment(**values: str) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def jaxfeed_read(
    proxy: Proxy, prefix: str, root: Path, tmp: Path, *, read: str, batches=None, **kwargs
) -> dict:
    """``make`` and one epoch (or ``batches``) of ``prefix`` through ``proxy``
    from an empty cache; the digest checked against the local files'."""
    import jaxfeed

    cache = Path(tempfile.mkdtemp(dir=tmp))
    with environment(JAXFEED_CACHE_DIR=str(cache), JAXFEED_READ=read):
        local = jaxfeed.make("numpy", dataset=str(root / prefix), **kwargs)
        want = digest_epoch(local, batches=batches)[0]
        before, began = proxy.stats(), time.perf_counter()
        source = jaxfeed.make(
            "numpy", dataset=f"s3://{BUCKET}/{prefix}/", storage_options=proxy.options, **kwargs
        )
        made = time.perf_counter() - began
        got, rows, epoch_s = digest_epoch(source, batches=batches)
        after = proxy.stats()
    shutil.rmtree(cache)
    seconds = made + epoch_s
    return {
        "make_s": made,
        "epoch_s": epoch_s,
        "seconds": seconds,
        "rows": rows,
        "rows_per_s": rows / seconds,
        "identical": got == want,
        "requests": after["requests"] - before["requests"],
        "sent_MB": (after["sent"] - before["sent"]) / MB,
        "peak_in_flight": after["peak_in_flight"],
        "mean_in_flight": (after["busy_s"] - before["busy_s"]) / seconds,
        "faults": after["faults"],
    }


def part_moto(port: int) -> dict:
    """moto through the proxy with no latency and no cap: 8 MiB ranged reads
    of the blocks' ``x.npy``, 8 at once and one at a time, and 16 KiB reads
    4 at once on the small records' object (what the store adds to each
    read of the permutation)."""
    import s3fs

    out = {}
    with Proxy(port, 0.0, None) as proxy:
        fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": proxy.url}, skip_instance_cache=True)
        key = f"{BUCKET}/blocks/train/x.npy"
        size = fs.size(key)
        starts = range(0, size, 8 << 20)
        for threads in (8, 1):
            began = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(threads) as pool:
                ends = [min(size, s + (8 << 20)) for s in starts]
                read = sum(
                    map(len, pool.map(lambda s, e: fs.cat_file(key, start=s, end=e), starts, ends))
                )
            out[f"{threads}_at_once_MB_per_s"] = read / MB / (time.perf_counter() - began)
        # moto reads a whole object to serve any range of it: so time the small
        # reads on the permutation's own object.
        key = f"{BUCKET}/small/train/x.npy"
        small = [(i << 14) % (fs.size(key) - (1 << 14)) for i in range(100)]
        began = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda s: fs.cat_file(key, start=s, end=s + (1 << 14)), small))
        out["16KiB_reads_4_at_once_per_s"] = len(small) / (time.perf_counter() - began)
        out["16KiB_read_s"] = 4 / out["16KiB_reads_4_at_once_per_s"]
    out["load"] = load()
    print(f"moto through the proxy (no latency, no cap): {out}", flush=True)
    return out


def part_blocks(port: int, args, root: Path, tmp: Path, sizes: dict) -> list[dict]:
    rows = []
    for latency in args.latencies:
        for prefix, read in (("blocks", "ranges"), ("pq", "whole")):
            with Proxy(port, latency / 1e3, args.cap_mb * MB) as proxy:
                got = jaxfeed_read(
                    proxy, prefix, root, tmp, read=read, shuffle="blocks", batch_size=256
                )
            mb = sizes["bytes"][prefix] / MB
            how = "read in place" if read == "ranges" else "fetched whole"
            got.update(
                what=f"jaxfeed numpy, shuffle='blocks', {prefix} {how}",
                latency_ms=latency,
                cap_MB_per_s=args.cap_mb,
                data_MB=mb,
                MB_per_s=mb / got["seconds"],
                of_cap=mb / got["seconds"] / args.cap_mb,
                target=0.8,
                load=load(),
            )
            rows.append(got)
            print(json.dumps(got), flush=True)
    return rows


def part_permutation(port: int, args, root: Path, tmp: Path, moto: dict) -> list[dict]:
    rows = []
    for latency in args.latencies:
        with (
            environment(JAXFEED_CACHE_BYTES=str(args.small_cache_kb << 10)),
            Proxy(port, latency / 1e3, args.cap_mb * MB) as proxy,
        ):
            got = jaxfeed_read(
                proxy, "small", root, tmp, read="ranges", shuffle=True, batch_size=64,
                batches=args.small_batches,
            )  # fmt: skip
        reads = got["requests"]  # a listing and headers too: a few
        rows_per_read = got["rows"] / reads
        allowed = got["peak_in_flight"] / (latency / 1e3) * rows_per_read
        store_s = moto.get("16KiB_read_s", 0.0)  # what this store adds to each read
        with_store = got["peak_in_flight"] / (latency / 1e3 + store_s) * rows_per_read
        got.update(
            what="jaxfeed numpy, shuffle=True, 128-byte records read in place",
            latency_ms=latency,
            cap_MB_per_s=args.cap_mb,
            cache_bytes=args.small_cache_kb << 10,
            rows_per_read=rows_per_read,
            reads_per_s=reads / got["seconds"],
            allowed_rows_per_s=allowed,
            of_allowed=got["rows_per_s"] / allowed,
            store_read_s=store_s,
            allowed_with_store_rows_per_s=with_store,
            of_allowed_with_store=got["rows_per_s"] / with_store,
            target=0.7,
            load=load(),
        )
        rows.append(got)
        print(json.dumps(got), flush=True)
    return rows


def _pyarrow_fs(url: str):
    import pyarrow.fs

    return pyarrow.fs.S3FileSystem(
        access_key=KEYS["AWS_ACCESS_KEY_ID"],
        secret_key=KEYS["AWS_SECRET_ACCESS_KEY"],
        endpoint_override=url,
        scheme="http",
        region="us-east-1",
    )


def read_pyarrow(url: str) -> int:
    import pyarrow.dataset as ds

    data = ds.dataset(f"{BUCKET}/pq/", filesystem=_pyarrow_fs(url), format="parquet")
    return sum(b.num_rows for b in data.to_batches(batch_size=256))


def read_datasets(url: str) -> int:
    import datasets

    stream = datasets.load_dataset(
        "parquet",
        data_files=f"s3://{BUCKET}/pq/*.parquet",
        split="train",
        streaming=True,
        storage_options={"client_kwargs": {"endpoint_url": url}},
    ).with_format("arrow")
    return sum(len(b) for b in stream.iter(batch_size=256))


def read_ray(url: str) -> int:
    import ray

    data = ray.data.read_parquet(f"{BUCKET}/pq/", filesystem=_pyarrow_fs(url))
    return sum(len(b["y"]) for b in data.iter_batches(batch_size=256, batch_format="numpy"))


@contextlib.contextmanager
def ray_instance() -> Iterator[None]:
    """A local Ray instance, started before the time (not a data cost) and shut down."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def read_mosaic(url: str, root: Path) -> int:
    """MosaicML Streaming over MDS shards of the same rows (its own format,
    written and uploaded here, outside the time)."""
    from streaming import StreamingDataset

    os.environ["S3_ENDPOINT_URL"] = url
    data = StreamingDataset(
        remote=f"s3://{BUCKET}/mds/", local=str(root / "mds-cache"), batch_size=256, shuffle=False
    )
    return sum(1 for _ in data)


def write_mds(root: Path, s3, rows: int) -> int:
    from streaming import MDSWriter

    x = np.load(root / "blocks/train/x.npy", mmap_mode="r")
    y = np.load(root / "blocks/train/y.npy")
    columns = {"x": "ndarray:float32:256", "y": "int64"}
    with MDSWriter(out=str(root / "mds"), columns=columns, size_limit=1 << 24) as out:
        for i in range(rows):
            out.write({"x": np.asarray(x[i]), "y": int(y[i])})
    for path in (root / "mds").iterdir():
        s3.upload_file(str(path), BUCKET, f"mds/{path.name}")
    return sum(p.stat().st_size for p in (root / "mds").iterdir())


def part_peers(port: int, args, root: Path, s3, sizes: dict) -> list[dict]:
    latency = args.latencies[0]
    peers = {
        "pyarrow.dataset (its S3FileSystem)": read_pyarrow,
        "datasets streaming (s3fs)": read_datasets,
        "Ray Data read_parquet (num_cpus=2)": read_ray,
    }
    try:
        import streaming  # noqa: F401

        sizes["bytes"]["mds"] = write_mds(root, s3, sizes["rows"])
        peers["MosaicML Streaming (MDS shards)"] = lambda url: read_mosaic(url, root)
    except ImportError as error:
        print(f"MosaicML Streaming not measured: {error}", flush=True)
    rows = []
    for name, read in peers.items():
        if args.peers and not any(p in name.lower() for p in args.peers):
            continue
        ray = ray_instance() if read is read_ray else contextlib.nullcontext()
        with ray, Proxy(port, latency / 1e3, args.cap_mb * MB) as proxy:
            began = time.perf_counter()
            count = read(proxy.url)
            seconds = time.perf_counter() - began
            stats = proxy.stats()
        assert count == sizes["rows"], (name, count)
        mb = sizes["bytes"]["mds" if "Mosaic" in name else "pq"] / MB
        got = {
            "what": name,
            "latency_ms": latency,
            "cap_MB_per_s": args.cap_mb,
            "rows": count,
            "seconds": seconds,
            "rows_per_s": count / seconds,
            "data_MB": mb,
            "sent_MB": stats["sent"] / MB,
            "requests": stats["requests"],
            "peak_in_flight": stats["peak_in_flight"],
            "MB_per_s": mb / seconds,
            "of_cap": mb / seconds / args.cap_mb,
            "load": load(),
        }
        rows.append(got)
        print(json.dumps(got), flush=True)
    return rows


def part_memory(port: int, args, tmp: Path, sizes: dict) -> dict:
    """In a fresh process (its RssAnon is the reader's alone)."""
    with Proxy(port, 0.0, None) as proxy:
        cache = Path(tempfile.mkdtemp(dir=tmp))
        config = {"url": f"s3://{BUCKET}/memory/", "options": proxy.options, "cache": str(cache)}
        env = {**os.environ, "JAXFEED_CACHE_BYTES": str(args.cache_mb << 20)}
        env.update(JAXFEED_READ="auto", JAXFEED_CACHE_DIR=str(cache))
        command = [sys.executable, __file__, "--memory-child", json.dumps(config)]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise RuntimeError(f"the memory part's process ended {done.returncode}: {done.stderr}")
        got = json.loads(done.stdout.strip().splitlines()[-1])
        stats = proxy.stats()
        shutil.rmtree(cache)
    mb = sizes["bytes"]["memory"] / MB
    got.update(
        what="jaxfeed numpy, shuffle='blocks', a .npy split 4x JAXFEED_CACHE_BYTES, in place",
        cache_bytes=args.cache_mb << 20,
        data_MB=mb,
        sent_MB=stats["sent"] / MB,
        read_per_byte=stats["sent"] / MB / mb,
        rss_target_MiB=1536,
        load=load(),
    )
    print(json.dumps(got), flush=True)
    return got


def memory_child(config: dict) -> None:
    import jaxfeed

    peak = {"RssAnon": 0, "cache": 0}
    cache, stop = Path(config["cache"]), threading.Event()

    def rss_anon() -> int:
        with open("/proc/self/status") as status:
            line = next(s for s in status if s.startswith("RssAnon:"))
            return int(line.split()[1]) << 10

    def watch() -> None:
        while not stop.wait(0.02):
            peak["RssAnon"] = max(peak["RssAnon"], rss_anon())
            with contextlib.suppress(OSError):
                size = sum(p.stat().st_size for p in cache.rglob("*") if p.is_file())
                peak["cache"] = max(peak["cache"], size)

    baseline = rss_anon()
    threading.Thread(target=watch, daemon=True).start()
    began = time.perf_counter()
    source = jaxfeed.make(
        "numpy", dataset=config["url"], storage_options=config["options"], shuffle="blocks",
        batch_size=256,
    )  # fmt: skip
    _, rows, _ = digest_epoch(source)
    seconds = time.perf_counter() - began
    stop.set()
    field = source.dataset.arrays["x"]
    print(
        json.dumps(
            {
                "rows": rows,
                "seconds": seconds,
                "read_in_place": type(field).__name__ == "RangedNpy",
                "rss_anon_before_make_MiB": baseline / 2**20,
                "peak_rss_anon_MiB": max(peak["RssAnon"], rss_anon()) / 2**20,
                "peak_cache_dir_bytes": peak["cache"],
                "block_cache_peak_bytes": field._cache.peak_bytes,
                "block_cache_max_bytes": field._cache.max_bytes,
            }
        )
    )


def part_faults(port: int, args, root: Path, tmp: Path) -> list[dict]:
    rows, latency = [], args.latencies[0]
    small = {"JAXFEED_CACHE_BYTES": str(args.small_cache_kb << 10)}
    cases = [
        ("blocks", {"read": "ranges", "shuffle": "blocks", "batch_size": 256}, {}),
        ("small", {"read": "ranges", "shuffle": True, "batch_size": 64,
                   "batches": args.fault_batches}, small),
    ]  # fmt: skip
    for prefix, kwargs, env in cases:
        runs = {}
        for every in (0, args.every):
            with environment(**env), Proxy(port, latency / 1e3, args.cap_mb * MB, every) as proxy:
                runs[every] = jaxfeed_read(proxy, prefix, root, tmp, **kwargs)
        clean, faulty = runs[0], runs[args.every]
        got = {
            "what": f"jaxfeed numpy, {prefix}, shuffle={kwargs['shuffle']!r}, in place",
            "latency_ms": latency,
            "cap_MB_per_s": args.cap_mb,
            "every": args.every,
            "faults": {k: v for k, v in faulty["faults"].items() if k != "latency"},
            "identical": clean["identical"] and faulty["identical"],
            "clean_s": clean["seconds"],
            "faulty_s": faulty["seconds"],
            "slowdown": faulty["seconds"] / clean["seconds"],
            "requests": faulty["requests"],
            "load": load(),
        }
        rows.append(got)
        print(json.dumps(got), flush=True)
    return rows


def markdown(record: dict) -> str:
    a = record["args"]
    lines = [
        "# Object storage through a capped, delayed link",
        "",
        f"`{record['command']}` on {record['machine']}; load (1, 5, 15 min) "
        f"{record['load_before']} before, {record['load_after']} after; "
        f"{record['wall_s']:.0f} s. moto alone through the proxy (no latency, no cap): "
        f"{record['moto']}. Cap: {a['cap_mb']} MB/s over all connections together.",
        "",
        "| what | latency | result | target | met |",
        "|---|---|---|---|---|",
    ]
    for r in record["blocks"]:
        lines.append(
            f"| {r['what']} | {r['latency_ms']} ms | {r['MB_per_s']:.2f} MB/s = "
            f"{r['of_cap']:.0%} of the cap (make {r['make_s']:.1f} s + epoch "
            f"{r['epoch_s']:.1f} s, {r['data_MB']:.0f} MB, {r['sent_MB']:.0f} MB sent, "
            f"{r['requests']} requests, {r['peak_in_flight']} in flight; identical "
            f"{r['identical']}; load {r['load']}) | >= 80% | "
            f"{'yes' if r['of_cap'] >= 0.8 else 'no'} |"
        )
    for r in record["permutation"]:
        lines.append(
            f"| {r['what']} | {r['latency_ms']} ms | {r['rows_per_s']:.0f} rows/s = "
            f"{r['of_allowed']:.0%} of {r['allowed_rows_per_s']:.0f} allowed "
            f"({r['peak_in_flight']} in flight / {r['latency_ms']} ms x "
            f"{r['rows_per_read']:.2f} rows per read); {r['of_allowed_with_store']:.0%} of "
            f"{r['allowed_with_store_rows_per_s']:.0f} with moto's "
            f"{1e3 * r['store_read_s']:.0f} ms per read added; mean in flight "
            f"{r['mean_in_flight']:.1f}; identical {r['identical']}; load {r['load']} | >= 70% | "
            f"{'yes' if r['of_allowed'] >= 0.7 else 'no'} |"
        )
    for r in record["peers"]:
        lines.append(
            f"| {r['what']} | {r['latency_ms']} ms | {r['MB_per_s']:.2f} MB/s = "
            f"{r['of_cap']:.0%} of the cap ({r['rows_per_s']:,.0f} rows/s, {r['data_MB']:.0f} MB, "
            f"{r['requests']} requests, {r['peak_in_flight']} in flight; load {r['load']}) | "
            "peer | |"
        )
    m = record.get("memory")
    if m:
        ok = m["peak_rss_anon_MiB"] <= 1536 and m["peak_cache_dir_bytes"] <= m["cache_bytes"]
        lines.append(
            f"| {m['what']} ({m['data_MB']:.0f} MB, cache {m['cache_bytes'] >> 20} MiB) | 0 ms, "
            f"no cap | peak RssAnon {m['peak_rss_anon_MiB']:.0f} MiB "
            f"({m['rss_anon_before_make_MiB']:.0f} before make), cache dir peak "
            f"{m['peak_cache_dir_bytes']} bytes, block cache peak "
            f"{m['block_cache_peak_bytes'] / 2**20:.1f} of "
            f"{m['block_cache_max_bytes'] / 2**20:.1f} MiB; {m['read_per_byte']:.2f} bytes read "
            f"per byte, {m['seconds']:.0f} s; load "
            f"{m['load']} | <= 1.5 GiB, cache within its bound | {'yes' if ok else 'no'} |"
        )
    for r in record["faults"]:
        lines.append(
            f"| {r['what']}, a fault every {r['every']} requests ({r['faults']}) | "
            f"{r['latency_ms']} ms | identical {r['identical']}; {r['faulty_s']:.1f} s vs "
            f"{r['clean_s']:.1f} s clean: {r['slowdown']:.2f}x; load {r['load']} | identical, "
            f"slowdown reported | {'yes' if r['identical'] else 'no'} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="moto,blocks,permutation,peers,memory,faults")
    parser.add_argument("--mb", type=float, default=96, help="the blocks/Parquet data, MB")
    parser.add_argument("--cap-mb", type=float, default=8.0, help="the proxy's cap, MB/s")
    parser.add_argument("--latencies", default="20,50", help="ms per request")
    parser.add_argument("--small-rows", type=int, default=16384, help="128-byte records")
    parser.add_argument("--small-batches", type=int, default=20, help="batches of 64 read")
    parser.add_argument("--fault-batches", type=int, default=10, help="the same, with faults")
    parser.add_argument("--small-cache-kb", type=int, default=256, help="JAXFEED_CACHE_BYTES")
    parser.add_argument("--cache-mb", type=int, default=32, help="the memory part's cache")
    parser.add_argument("--every", type=int, default=4, help="one request in N faulted")
    parser.add_argument("--peers", default="", help="a subset: pyarrow,datasets,ray,mosaic")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where data is written")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one latency")
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--tag", default="cpu")
    parser.add_argument("--serve-proxy", help=argparse.SUPPRESS)
    parser.add_argument("--memory-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:  # smaller defaults; flags given still win
        parser.set_defaults(mb=2, small_rows=8192, small_batches=5, fault_batches=2, cache_mb=2)
        parser.set_defaults(latencies="20")
        args = parser.parse_args()
    if args.serve_proxy:
        return serve_proxy(json.loads(args.serve_proxy))
    if args.memory_child:
        return memory_child(json.loads(args.memory_child))
    command = "python3 benchmarks/object_storage.py " + " ".join(sys.argv[1:])
    args.latencies = [int(x) for x in str(args.latencies).split(",")]
    args.peers = [p for p in args.peers.split(",") if p]
    parts = args.parts.split(",")
    os.environ.update(ENV)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
        os.environ.pop(name, None)
    import boto3

    needed = 3 * (2 * args.mb * MB + args.small_rows * 128 + 4 * args.cache_mb * 2**20)
    free = shutil.disk_usage(args.dir).free
    assert free > needed, f"{args.dir} has {free / 1e9:.1f} GB free; needs {needed / 1e9:.1f}"
    record = {
        "command": command,
        "git": git_state(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "load_before": load(),
        "args": {k: v for k, v in vars(args).items() if k not in ("serve_proxy", "memory_child")},
    }
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=args.dir) as name, moto_server() as port:
        tmp = Path(name)
        s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}")
        sizes = record["data"] = write_data(tmp / "data", s3, args)
        print(f"data: {sizes}", flush=True)
        record["moto"] = part_moto(port) if "moto" in parts else {}
        record["blocks"] = (
            part_blocks(port, args, tmp / "data", tmp, sizes) if "blocks" in parts else []
        )
        record["permutation"] = (
            part_permutation(port, args, tmp / "data", tmp, record["moto"])
            if "permutation" in parts
            else []
        )
        record["peers"] = (
            part_peers(port, args, tmp / "data", s3, sizes) if "peers" in parts else []
        )
        record["memory"] = part_memory(port, args, tmp, sizes) if "memory" in parts else None
        record["faults"] = part_faults(port, args, tmp / "data", tmp) if "faults" in parts else []
    record["load_after"], record["wall_s"] = load(), time.perf_counter() - began
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"object-storage-{args.tag}"
    stem.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
    stem.with_suffix(".md").write_text(markdown(record))
    print(markdown(record))
    print(f"wrote {stem}.json and .md ({record['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()

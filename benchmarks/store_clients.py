"""Which client reads S3 objects fastest, measured: s3fs (fsspec, what jaxfeed
uses), pyarrow's own S3FileSystem and obstore (if installed), against one local
moto server on 127.0.0.1, in interleaved rounds so a busy machine hurts each
alike (issue 45: "choose the client library by measurement").

Two reads: large blocks (8 MiB ranged reads of a 64 MiB object, 8 at once: the
shape of a block-order epoch and of a fetch) and small ones (16 KiB at random
offsets of a 1 MiB object, 8 at once: a permutation of small records; moto reads
a whole object for each ranged read, so a small object keeps that cost low).
moto serves from Python, so the absolute figures are moto's; the ratios between
clients are the point.

    python3 benchmarks/store_clients.py --out benchmarks/results/store-clients-cpu
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time

import numpy as np

BUCKET, KEY, SMALL_KEY = "clients", "big.bin", "small.bin"
BLOCK, SMALL, AT_ONCE = 8 << 20, 16 << 10, 8


def _moto() -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return server, f"http://127.0.0.1:{port}"
        if server.poll() is not None:
            raise RuntimeError("moto did not start")
        time.sleep(0.05)


def _clients(endpoint: str, key: str) -> dict:
    """name -> read(start, end) -> bytes of object ``key``."""
    import pyarrow.fs
    import s3fs

    fs = s3fs.S3FileSystem(endpoint_url=endpoint, key="testing", secret="testing")
    arrow = pyarrow.fs.S3FileSystem(
        endpoint_override=endpoint,
        scheme="http",
        access_key="testing",
        secret_key="testing",
        region="us-east-1",
    )
    arrow_file = arrow.open_input_file(f"{BUCKET}/{key}")
    clients = {
        "s3fs": lambda a, b: fs.cat_file(f"{BUCKET}/{key}", start=a, end=b),
        "pyarrow S3FileSystem": lambda a, b: arrow_file.read_at(b - a, a),
    }
    try:
        import obstore
        from obstore.store import S3Store

        store = S3Store(
            BUCKET,
            endpoint=endpoint,
            access_key_id="testing",
            secret_access_key="testing",
            region="us-east-1",
            client_options={"allow_http": True},
        )
        clients["obstore"] = lambda a, b: bytes(obstore.get_range(store, key, start=a, end=b))
    except ImportError:
        pass
    return clients


def _rate(read, ranges: list[tuple[int, int]]) -> float:
    """Bytes per second reading ``ranges``, AT_ONCE at a time."""
    with concurrent.futures.ThreadPoolExecutor(AT_ONCE) as pool:
        start = time.perf_counter()
        got = sum(len(b) for b in pool.map(lambda r: read(*r), ranges))
        seconds = time.perf_counter() - start
    assert got == sum(b - a for a, b in ranges), "a short read"
    return got / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=int, default=64)
    parser.add_argument("--small-reads", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", help="write OUT.json and OUT.md")
    args = parser.parse_args()
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    server, endpoint = _moto()
    try:
        import boto3

        size = args.size_mb << 20
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        s3.put_object(Bucket=BUCKET, Key=KEY, Body=np.random.default_rng(0).bytes(size))
        s3.put_object(Bucket=BUCKET, Key=SMALL_KEY, Body=np.random.default_rng(0).bytes(1 << 20))
        clients, small_clients = _clients(endpoint, KEY), _clients(endpoint, SMALL_KEY)
        rng = np.random.default_rng(1)
        blocks = [(a, min(a + BLOCK, size)) for a in range(0, size, BLOCK)]
        offsets = rng.integers(0, (1 << 20) - SMALL, args.small_reads)
        small = [(int(a), int(a) + SMALL) for a in offsets]
        found: dict[str, dict[str, list[float]]] = {n: {"blocks": [], "small": []} for n in clients}
        for _ in range(args.rounds):  # interleaved: each round reads with every client
            for name, read in clients.items():
                found[name]["blocks"].append(_rate(read, blocks) / 1e6)
                found[name]["small"].append(_rate(small_clients[name], small) / SMALL)
    finally:
        server.terminate()
        server.wait()
    result = {
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "median": {
            name: {
                "blocks_MB_per_s": statistics.median(r["blocks"]),
                "small_reads_per_s": statistics.median(r["small"]),
            }
            for name, r in found.items()
        },
        "rounds": found,
    }
    lines = [
        "# S3 clients against one moto server (medians of interleaved rounds)",
        "",
        f"`{result['command']}` on {result['machine']}; load after {result['load_after']}.",
        "",
        f"| client | {BLOCK >> 20} MiB ranged reads, {AT_ONCE} at once | "
        f"{SMALL >> 10} KiB random reads of 1 MiB, {AT_ONCE} at once |",
        "|---|---|---|",
    ]
    for name, m in result["median"].items():
        lines.append(
            f"| {name} | {m['blocks_MB_per_s']:.0f} MB/s | {m['small_reads_per_s']:.0f} reads/s |"
        )
    print("\n".join(lines))
    if args.out:
        with open(f"{args.out}.json", "w") as f:
            json.dump(result, f, indent=1)
        with open(f"{args.out}.md", "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

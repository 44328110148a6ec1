"""The ray backend: one node beside the record pool and Ray Data's own idiom,
scaling on simulated nodes, and the feed beside Ray's ``iter_jax_batches``.

    python benchmarks/ray_backend.py                 # all three parts
    python benchmarks/ray_backend.py --part scaling  # one of: decode, scaling, feed

* decode: ``digits-png`` (decoded and augmented per record) through
  ``make("numpy", num_workers=k)``, ``make("ray")`` on a local instance of k
  CPUs, and Ray Data's idiom (``from_numpy`` + ``map_batches`` +
  ``iter_batches``) on the same instance, in rows/s of one epoch.
* scaling: ``ray.cluster_utils.Cluster`` with 1, 2, 4 and 8 simulated nodes of
  2 worker slots on ONE machine, a transform that waits 20 ms per record (a
  fetch from remote storage, or work done elsewhere): what grows is how many
  waits overlap, not CPU. Only a real multi-machine cluster shows CPU-bound
  scaling and the network's cost. Every size's batches are checked
  byte-identical to the numpy backend's.
* feed: rows/s of ``DeviceFeed`` over ``make("ray")`` (no transform: rows
  gathered in this process), over ``make("ray", transform=)`` (each batch a
  Ray task, returned through the object store), and of Ray's
  ``iter_jax_batches``, on the same 100k rows of 784 uint8, batch 1024, with
  the peak growth of this process's resident memory during a pass: its own
  (``RssAnon``: a copy out of the object store would show here) and the
  object store's pages it maps (``RssShmem``).

Writes ``results/ray_backend-[<part>-]<tag>.json`` (the machine's load included: numbers are
loaded when the machine is shared).
"""

from __future__ import annotations

import argparse
import functools
import os
import time

import numpy as np
from common import SHARED_MNIST, write_record  # also puts the repo on sys.path

from jaxfeed import loaders

LATENCY_S = 0.02


def latency_bound(record: dict, rng: np.random.Generator) -> dict:
    """Waits 20 ms (a remote fetch), then a random shift of the row."""
    time.sleep(LATENCY_S)
    return {"x": record["x"] + rng.integers(0, 8, dtype=np.uint8), "y": record["y"]}


def _epoch_rate(source, epoch: int) -> float:
    """Rows/s of one epoch of ``source``."""
    started = time.perf_counter()
    rows = sum(len(b["label"] if "label" in b else b["y"]) for b in source.iter_epoch(epoch))
    return rows / (time.perf_counter() - started)


def _init(ray, **options) -> None:
    ray.init(include_dashboard=False, log_to_driver=False, logging_level="ERROR", **options)
    ray.data.DataContext.get_current().enable_progress_bars = False


def decode(args) -> list[dict]:
    import statistics
    import sys

    import ray
    from jaxfeed.loaders.data.catalog import load_dataset
    from jaxfeed.loaders.data.encoded import augment

    data_dir = args.data_dir if os.path.isdir(args.data_dir) else None
    name = "digits-png" if data_dir else "mnist-sample"
    data = load_dataset("digits-png", "train", data_dir=data_dir)
    common = dict(dataset=data, batch_size=args.batch_size, seed=0, transform=augment)
    env = {"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}}
    out = []
    for k in (1, 2):
        _init(ray, num_cpus=k, runtime_env=env)
        rows = {
            "numpy record pool": loaders.make("numpy", num_workers=k, **common),
            "make('ray')": loaders.make("ray", **common),
        }
        runs = {
            **{row: functools.partial(_epoch_rate, source) for row, source in rows.items()},
            "ray.data map_batches + iter_batches": _ray_data_idiom(ray, data, args.batch_size),
        }
        rates: dict[str, list[float]] = {row: [] for row in runs}
        for repeat in range(1 + args.repeats):  # interleaved: a slow spell hits every row
            for row, run in runs.items():
                rate = run(repeat)
                if repeat:  # the first pass starts the workers
                    rates[row].append(rate)
        for row, values in rates.items():
            median = statistics.median(values)
            out.append(
                {
                    "part": "decode",
                    "row": row,
                    "workers": k,
                    "rows_per_s": median,
                    "repeats": values,
                    "dataset": name,
                }
            )
            print(out[-1])
        rows["numpy record pool"].close()
        ray.shutdown()
    return out


def _ray_data_idiom(ray, data, batch_size: int):
    """The tutorial loop: records into Ray Data, the augmentation in
    ``map_batches``, ``iter_batches`` out: ``epoch -> rows/s`` of one pass."""
    from jaxfeed.loaders.data.encoded import augment

    rows = {key: np.asarray(list(value)) for key, value in data.arrays.items()}
    rows["row"] = np.arange(len(data))

    def augment_batch(batch: dict) -> dict:
        outs = [
            augment({k: batch[k][i] for k in batch if k != "row"}, np.random.default_rng((0, 0, r)))
            for i, r in enumerate(batch["row"])
        ]
        return {key: np.stack([o[key] for o in outs]) for key in outs[0]}

    ds = ray.data.from_items([{k: v[i] for k, v in rows.items()} for i in range(len(data))])
    ds = ds.map_batches(augment_batch, batch_size=batch_size, batch_format="numpy")

    def one_pass(epoch: int) -> float:
        started = time.perf_counter()
        count = sum(len(b["label"]) for b in ds.iter_batches(batch_size=batch_size))
        return count / (time.perf_counter() - started)

    return one_pass


def scaling(args) -> list[dict]:
    import ray
    from ray.cluster_utils import Cluster

    n = args.scaling_rows
    data = {
        "x": (np.arange(n * 16) % 251).astype(np.uint8).reshape(n, 16),
        "y": np.arange(n, dtype=np.int32),
    }
    common = dict(dataset=data, batch_size=8, seed=0, transform=latency_bound)
    want = list(loaders.make("numpy", **common).iter_epoch(1))
    env = {"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in __import__("sys").path if p)}}
    out = []
    for nodes in (1, 2, 4, 8):
        cluster = Cluster(
            initialize_head=True, head_node_args={"num_cpus": 2, "object_store_memory": 80 << 20}
        )
        for _ in range(nodes - 1):
            cluster.add_node(num_cpus=2, object_store_memory=80 << 20)
        cluster.wait_for_nodes()
        _init(ray, address=cluster.address, runtime_env=env)
        try:
            source = loaders.make("ray", **common)
            list(source.iter_epoch(0))  # every slot's worker started
            started = time.perf_counter()
            got = list(source.iter_epoch(1))
            seconds = time.perf_counter() - started
            same = all(
                all(np.array_equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)
                for a, b in zip(got, want, strict=True)
            )
            row = {
                "part": "scaling",
                "nodes": nodes,
                "slots": 2 * nodes,
                "rows_per_s": n / seconds,
                "identical_to_numpy": same,
            }
            print(row)
            out.append(row)
        finally:
            ray.shutdown()
            cluster.shutdown()
    base = out[0]["rows_per_s"]
    for row in out:
        row["speedup_vs_2_slots"] = row["rows_per_s"] / base
    return out


def cast_row(record: dict, rng: np.random.Generator) -> dict:
    """The feed's per-record work, as light as it gets: the row as it is."""
    return {"image": record["image"], "label": record["label"]}


def _resident_kib() -> dict[str, int]:
    """This process's resident memory by kind (Linux): ``RssAnon``, its own
    (a copy of a batch lands here), and ``RssShmem``, shared pages it maps
    (Ray's object store: counted where touched, held by the store, not by it)."""
    with open("/proc/self/status") as status:
        fields = dict(line.split(":", 1) for line in status)
    return {kind: int(fields[kind].split()[0]) for kind in ("RssAnon", "RssShmem")}


class _PeakRss:
    """The peak growth of each kind of `_resident_kib` over a block, sampled
    every 2 ms on a thread."""

    def __enter__(self):
        import threading

        self.base = _resident_kib()
        self.peak = dict(self.base)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            now = _resident_kib()
            self.peak = {kind: max(self.peak[kind], now[kind]) for kind in now}

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def growth_mib(self) -> dict[str, float]:
        return {kind: (self.peak[kind] - self.base[kind]) / 1024 for kind in self.base}


def feed(args) -> list[dict]:
    import jax
    import ray
    from jaxfeed.sharding import DeviceFeed

    rows, batch = args.feed_rows, 1024
    images = np.random.default_rng(0).integers(0, 256, (rows, 784), dtype=np.uint8)
    data = {"image": images, "label": np.arange(rows, dtype=np.int32)}
    _init(ray, num_cpus=2)
    out = []
    try:
        common = dict(dataset=data, batch_size=batch, shuffle=False, drop_remainder=True)
        plain = loaders.make("ray", **common)
        transformed = loaders.make("ray", transform=cast_row, **common)
        ds = ray.data.from_numpy(images)
        first = next(transformed.iter_epoch(0))["image"]
        # A task's batch as Ray returns it: a read-only view of the object store.
        zero_copy = {"writeable": bool(first.flags.writeable), "owndata": bool(first.flags.owndata)}
        del first
        runs = {
            "DeviceFeed over make('ray')": lambda: DeviceFeed(plain),
            "DeviceFeed over make('ray', transform=) (Ray tasks)": lambda: DeviceFeed(transformed),
            "ray iter_jax_batches": lambda: ds.iter_jax_batches(batch_size=batch, drop_last=True),
        }
        for name, run in runs.items():
            rate, growth = 0.0, []
            for _ in range(3):  # the best of three (the first warms Ray and the compiles)
                with _PeakRss() as rss:
                    started = time.perf_counter()
                    count = 0
                    last = None
                    for placed in run():
                        last = placed
                        count += batch
                    jax.block_until_ready(last)
                    rate = max(rate, count / (time.perf_counter() - started))
                    del last
                growth.append(rss.growth_mib())
            row = {
                "part": "feed",
                "row": name,
                "batch": batch,
                "rows": rows,
                "rows_per_s": rate,
                "batch_mib": batch * (784 + 4) / 2**20,
                # First pass (cold: what a copy per batch would add shows here) and last (warm).
                "peak_growth_mib_own": [g["RssAnon"] for g in (growth[0], growth[-1])],
                "peak_growth_mib_object_store_mapped": [
                    g["RssShmem"] for g in (growth[0], growth[-1])
                ],
            }
            if "Ray tasks" in name:
                row["task_batch_flags"] = zero_copy
            print(row)
            out.append(row)
    finally:
        ray.shutdown()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("all", "decode", "scaling", "feed"), default="all")
    parser.add_argument("--data-dir", default=str(SHARED_MNIST), help="MNIST IDX files (mnist-10k)")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--scaling-rows", type=int, default=2048)
    parser.add_argument("--feed-rows", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3, help="decode: timed passes per row")
    parser.add_argument("--tag", default="cpu")
    args = parser.parse_args(argv)
    parts = ("decode", "scaling", "feed") if args.part == "all" else (args.part,)
    load = os.getloadavg()
    results = [row for part in parts for row in globals()[part](args)]
    if args.part != "all":
        args.tag = f"{args.part}-{args.tag}"
    write_record(
        "ray_backend",
        args,
        results,
        load_before=load,
        load_after=os.getloadavg(),
        cpus=os.cpu_count(),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

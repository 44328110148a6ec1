"""Where a batch's time goes between the loader and the device, in µs per batch.

For each backend and batch size, in one process, interleaved repeats (medians):

* ``loader``: ``for b in source.iter_epoch(e): pass`` (host batches only);
* ``bare``: ``for b in source.iter_epoch(e): jax.device_put(b, sharding)``, the
  serial loop a user writes, waiting for the last transfer;
* ``feed``: ``for b in DeviceFeed(source, sharding, epoch=e): pass``, waiting
  for the last batch (the default: reads on this thread, up to
  ``device_buffer=4`` batches per ``device_put``);
* ``feed_thread``: the same with ``host_buffer=4``, a background reading thread;
* ``place``: ``place_batch`` alone on batches already in memory, one per call;
* ``place_grouped``: ``jax.device_put`` of two such batches per call;
* ``handoff``: batches already in memory passed from a thread to this one
  through a ``queue.Queue`` (no JAX): the price of a thread wake-up and GIL
  switch per batch.

``feed / bare`` >= 1.0 means the feed is at least as fast as the serial loop.
Run from the repository root::

    python3 benchmarks/feed_overhead.py --data-dir ../shared/data/mnist
"""

from __future__ import annotations

import argparse
import queue
import statistics
import threading
import time

import jax
from common import SHARED_MNIST, write_record  # also puts the repo on sys.path
from jaxfeed.sharding import DeviceFeed, batch_sharding, data_mesh, place_batch

from jaxfeed import loaders


def _epoch_seconds(run, epoch: int) -> float:
    started = time.perf_counter()
    last = run(epoch)
    if last is not None:
        jax.block_until_ready(last)
    return time.perf_counter() - started


def _measurements(source, sharding) -> dict:
    held = list(source.iter_epoch(0))

    def loader(epoch):
        for _ in source.iter_epoch(epoch):
            pass

    def bare(epoch):
        out = None
        for batch in source.iter_epoch(epoch):
            out = jax.device_put(batch, sharding)
        return out

    def feed(epoch, **options):
        out = None
        with DeviceFeed(source, sharding, epoch=epoch, **options) as batches:
            for batch in batches:
                out = batch
        return out

    def place(epoch):
        out = None
        for batch in held:
            out = place_batch(batch, sharding)
        return out

    def place_grouped(epoch):
        out = None
        for i in range(0, len(held), 2):
            out = jax.device_put(held[i : i + 2], sharding)
        return out

    def handoff(epoch):
        handed: queue.Queue = queue.Queue(maxsize=4)

        def produce():
            for batch in held:
                handed.put(batch)
            handed.put(None)

        threading.Thread(target=produce, daemon=True).start()
        while handed.get() is not None:
            pass

    return {
        "loader": loader,
        "place": place,
        "place_grouped": place_grouped,
        "handoff": handoff,
        "bare": bare,
        "feed": feed,
        "feed_thread": lambda epoch: feed(epoch, host_buffer=4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=str(SHARED_MNIST))
    parser.add_argument("--dataset", default="mnist-10k")
    parser.add_argument("--loaders", default="numpy,torch,tf,grain,hf")
    parser.add_argument("--batch-sizes", default="128,1024")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--tag", default="cpu")
    args = parser.parse_args()
    sharding = batch_sharding(data_mesh(jax.devices()[:1]))
    results = []
    for batch_size in map(int, args.batch_sizes.split(",")):
        sources = {
            name: loaders.make(
                name, dataset=args.dataset, data_dir=args.data_dir, batch_size=batch_size
            )
            for name in args.loaders.split(",")
        }
        runs = {name: _measurements(s, sharding) for name, s in sources.items()}
        times: dict = {name: {m: [] for m in ms} for name, ms in runs.items()}
        for repeat in range(args.repeats + 1):  # repeat 0 warms up
            for name, measures in runs.items():
                for metric, run in measures.items():
                    seconds = _epoch_seconds(run, repeat)
                    if repeat:
                        times[name][metric].append(seconds)
        for name, source in sources.items():
            n = source.num_batches
            us = {m: 1e6 * statistics.median(t) / n for m, t in times[name].items()}
            row = {
                "backend": name,
                "batch_size": batch_size,
                "batches": n,
                **{f"{m}_us_per_batch": round(v, 1) for m, v in us.items()},
                "feed_vs_bare": round(us["bare"] / us["feed"], 3),
                "feed_samples_per_s": round(batch_size / us["feed"] * 1e6),
                "bare_samples_per_s": round(batch_size / us["bare"] * 1e6),
            }
            results.append(row)
            print(
                f"{name:6s} B={batch_size:5d} µs/batch: loader {us['loader']:6.1f}  place "
                f"{us['place']:6.1f} (grouped {us['place_grouped']:6.1f})  handoff "
                f"{us['handoff']:6.1f} | bare {us['bare']:7.1f}  feed {us['feed']:7.1f}  "
                f"feed_thread {us['feed_thread']:7.1f}  feed/bare {row['feed_vs_bare']:.2f}x",
                flush=True,
            )
    write_record("feed-overhead", args, results, devices=str(jax.devices()[0]))


if __name__ == "__main__":
    main()

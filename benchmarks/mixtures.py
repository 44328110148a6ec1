"""The cost of a `jaxfeed.Mixture`: rows/s of a mixture of two components
beside each component read alone (the slowest is the bar) and beside Grain's
`MapDataset.mix` over the same arrays, at 0 workers and with worker
processes; the time to the first batch of a resume at k = 10 and k = 100,000;
and the realized weights after 1,000 batches.

    python3 benchmarks/mixtures.py --repeats 3            # writes results/mixtures-cpu.*

Repeats are interleaved (every row of the table once, then again), and the
median is reported. Components: MNIST-shaped uint8 rows (784 bytes and a
label), 60,000 and 6,000 rows, weights 0.7 / 0.3, batch 128.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import common  # the repository on sys.path
import numpy as np

from jaxfeed import Mixture, loaders

BATCH = 128


def components() -> dict[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return {
        name: {
            "image": rng.integers(0, 256, (n, 28, 28, 1), dtype=np.uint8),
            "label": np.full(n, i, np.int32),
        }
        for i, (name, n) in enumerate((("big", 60_000), ("small", 6_000)))
    }


def flip(record, rng):
    """A per-record transform (worker runs need one): a random horizontal flip."""
    image = record["image"][:, ::-1] if rng.random() < 0.5 else record["image"]
    return {"image": np.ascontiguousarray(image), "label": record["label"]}


def rows_per_s(source, batches: int) -> float:
    it = source.iter_epoch(0)
    next(it)  # the first batch: start-up, not throughput
    start = time.perf_counter()
    for _, _ in zip(range(batches), it, strict=False):
        pass
    return batches * BATCH / (time.perf_counter() - start)


def grain_mix(comps, weights, workers: int):
    import grain
    from absl import flags

    if not flags.FLAGS.is_parsed():  # Grain's workers read its flags
        flags.FLAGS.mark_as_parsed()
    sources = [
        grain.MapDataset.source(
            [{"image": c["image"][i], "label": c["label"][i]} for i in range(len(c["label"]))]
        )
        .shuffle(seed=s)
        .repeat()
        for s, c in enumerate(comps.values())
    ]
    ds = grain.MapDataset.mix(sources, weights)
    if workers:
        ds = ds.map(lambda r: flip(r, np.random.default_rng()))
    ds = ds.batch(BATCH)
    it = ds.to_iter_dataset()
    if workers:
        it = it.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))

    class Source:
        def iter_epoch(self, epoch):
            return iter(it)

    return Source()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--backends", default="numpy,grain,torch")
    parser.add_argument("--tag", default="cpu")
    args = parser.parse_args()
    comps = components()
    weights = {"big": 0.7, "small": 0.3}
    mixture = Mixture(comps, weights=weights, epoch_rows=BATCH * 2000)
    rows: dict[tuple, list[float]] = {}
    plan = []
    for backend in args.backends.split(","):
        for workers in (0, 2):
            opts = {"num_workers": workers, "transform": flip} if workers else {}
            for name, dataset in (*comps.items(), ("mixture", mixture)):
                plan.append((backend, workers, name, dataset, opts))
    for workers in (0, 2):
        plan.append(("grain mix", workers, "mixture", None, {}))
    load = [os.getloadavg()[0]]
    for _ in range(args.repeats):
        for backend, workers, name, dataset, opts in plan:
            if backend == "grain mix":
                source = grain_mix(comps, list(weights.values()), workers)
            else:
                source = loaders.make(backend, dataset=dataset, batch_size=BATCH, seed=0, **opts)
            rows.setdefault((backend, workers, name), []).append(rows_per_s(source, args.batches))
            getattr(source, "close", lambda: None)()
    load.append(os.getloadavg()[0])
    results = []
    print(f"{'backend':10} {'workers':>7} {'read':>8} {'rows/s':>10}  vs slowest alone")
    for (backend, workers, name), got in rows.items():
        median = statistics.median(got)
        alone = [
            statistics.median(rows[b, w, n])
            for (b, w, n) in rows
            if b == backend and w == workers and n != "mixture"
        ]
        ratio = median / min(alone) if name == "mixture" and alone else None
        results.append(
            {
                "backend": backend,
                "workers": workers,
                "read": name,
                "rows_per_s": got,
                "median": median,
                "vs_slowest_alone": ratio,
            }
        )
        print(
            f"{backend:10} {workers:>7} {name:>8} {median:>10,.0f}"
            + (f"  {ratio:.3f}" if ratio else "")
        )

    # Resume: the first batch at k.
    long = Mixture(comps, weights=weights, epoch_rows=BATCH * 120_000)
    source = loaders.make("numpy", dataset=long, batch_size=BATCH, seed=0)
    resume = {}
    for k in (10, 100_000):
        times = []
        for _ in range(args.repeats):
            source.plan._cache.clear()  # a fresh process plans the epoch again
            start = time.perf_counter()
            next(source.iter_epoch(0, start=k))
            times.append(time.perf_counter() - start)
        resume[k] = statistics.median(times)
        print(f"resume at batch {k:,}: first batch in {resume[k] * 1e3:.1f} ms")
    share = source.proportions(0, range(1000))["small"]
    bound = 5 * np.sqrt(0.3 * 0.7 / (1000 * BATCH))
    print(
        f"realized weight of 'small' over 1,000 batches: {share:.4f} (asked 0.3, 5 sd {bound:.4f})"
    )
    common.write_record(
        "mixtures",
        args,
        results,
        load=load,
        resume_seconds=resume,
        realized_small_1000=share,
        bound_5sd=bound,
        cpu_count=os.cpu_count(),
    )


if __name__ == "__main__":
    main()

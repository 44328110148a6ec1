"""Every backend's loader-only epoch on a small dataset, where per-epoch costs show.

The 8,000 real training digits of ``mnist-10k`` (MNIST-shaped: uint8
28x28x1 images, int32 labels), batch 128, shuffled: ``for b in
source.iter_epoch(e): pass`` per backend, backends interleaved (numpy, torch,
tf, grain, hf, numpy, ...) over ``--repeats`` epochs; median seconds, rows/s
and each backend's ratio to the fastest (also of the best epoch, which
other work on a shared machine delays least); and the process's CPU ms per epoch
(all threads: a read-ahead thread's too), which other work on a shared
machine sways less than wall time. At this size a fixed cost per epoch
(a thread started, a file advised, an Arrow call set up) weighs as much as
the reading.

    python3 benchmarks/small_epochs.py --data-dir ../shared/data/mnist
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from common import SHARED_MNIST, write_record  # also puts the repo on sys.path

from jaxfeed import loaders


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=str(SHARED_MNIST))
    parser.add_argument("--dataset", default="mnist-10k")
    parser.add_argument("--loaders", default="numpy,torch,tf,grain,hf")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--tag", default="cpu")
    args = parser.parse_args()
    load = {"start": os.getloadavg()[0]}
    sources = {
        name: loaders.make(
            name, dataset=args.dataset, data_dir=args.data_dir, batch_size=args.batch_size
        )
        for name in args.loaders.split(",")
    }
    times: dict[str, list[float]] = {name: [] for name in sources}
    cpu: dict[str, list[float]] = {name: [] for name in sources}
    for epoch in range(args.repeats + 1):  # epoch 0: warm-up (compiles, maps, caches)
        for name, source in sources.items():
            started, cpu_started = time.perf_counter(), time.process_time()
            for _ in source.iter_epoch(epoch):
                pass
            if epoch:
                times[name].append(time.perf_counter() - started)
                cpu[name].append(time.process_time() - cpu_started)
    rows = sources["numpy" if "numpy" in sources else next(iter(sources))].num_batches
    rows *= args.batch_size
    medians = {name: statistics.median(t) for name, t in times.items()}
    best = {name: min(t) for name, t in times.items()}
    cpu_ms = {name: 1e3 * statistics.median(t) for name, t in cpu.items()}
    fastest, least_cpu = min(medians.values()), min(cpu_ms.values())
    results = []
    for name, seconds in medians.items():
        results.append(
            {
                "backend": name,
                "epoch_ms": round(seconds * 1e3, 3),
                "rows_per_s": round(rows / seconds),
                "vs_fastest": round(seconds / fastest, 2),
                "best_epoch_ms": round(best[name] * 1e3, 3),
                "best_vs_fastest": round(best[name] / min(best.values()), 2),
                "cpu_ms": round(cpu_ms[name], 3),
                "cpu_vs_least": round(cpu_ms[name] / least_cpu, 2),
                "epoch_ms_all": [round(t * 1e3, 3) for t in times[name]],
            }
        )
        print(f"{name:6s} {seconds * 1e3:7.2f} ms  {rows / seconds:>12,.0f} rows/s  "
              f"{seconds / fastest:5.2f}x the fastest;  best {best[name] * 1e3:6.2f} ms "
              f"({best[name] / min(best.values()):5.2f}x);  CPU {cpu_ms[name]:7.2f} ms "
              f"({cpu_ms[name] / least_cpu:5.2f}x the least)", flush=True)  # fmt: skip
    load["end"] = os.getloadavg()[0]
    write_record("small-epochs", args, results, rows=rows, load_average=load, cpus=os.cpu_count())


if __name__ == "__main__":
    main()

"""CPU per record of the decode workload's per-record work: jaxfeed's Python
``augment`` (Pillow) beside tf.data's native ops, on the same images.

    python3 benchmarks/decode_cpu.py --data-dir ../shared/data/mnist --batches 60

What bounds jaxfeed's tf backend against tf.data's native-ops pipeline when
both keep the cores busy (2 workers on 2 cores): the CPU each spends per
record. In one process, batch by batch in turn (so load hits both alike),
each batch timed in CPU seconds of the whole process (``time.process_time``:
tf's ops run on its own threads):

- ``pillow augment``: `encoded.augment` on 128 records and the stack, what
  each record-pool worker runs per batch (its reading of the rows aside);
- ``tf native ops``: the tf.data idiom's map function
  (`idioms.tf_native_augment`) on the same 128 PNGs, one batch per
  ``next`` of a sequential tf.data map with no prefetch and no autotuning
  (its cheapest form: the timed pipeline's parallel map adds thread hand-offs).

Prints the median microseconds per record and their ratio: at 2 CPU-bound
workers jaxfeed's tf can reach at most native's µs over Pillow's, before the
reader's own cost per batch (taking in, copying, tf.data's conversion).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
from common import SHARED_MNIST  # also puts the repo on sys.path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=str(SHARED_MNIST))
    parser.add_argument("--batches", type=int, default=60, help="timed batches per row")
    parser.add_argument("--batch-size", type=int, default=128)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from jaxfeed.loaders._doors.tf import import_tensorflow
    from jaxfeed.loaders.data import encoded

    from jaxfeed import loaders
    from jaxfeed.compare.workloads.decode.idioms import Records, tf_native_augment

    tf = import_tensorflow()
    records = Records.of(loaders.load_dataset("digits-png", "train", data_dir=args.data_dir))
    order = np.random.default_rng(0).permutation(len(records))
    n = args.batch_size
    starts = list(range(0, len(order) - n + 1, n))

    def pillow(step: int) -> None:
        rng = np.random.default_rng(step)
        rows = order[starts[step % len(starts)] :][:n]
        out = [encoded.augment(records.record(i), rng) for i in rows.tolist()]
        np.stack([r["image"] for r in out])

    options = tf.data.Options()
    options.autotune.enabled = False
    # Nothing runs ahead (on tf's threads, billed to the other row): no
    # injected prefetch, no map+batch fusion (an asynchronous op), no parallel map.
    options.experimental_optimization.inject_prefetch = False
    options.experimental_optimization.map_and_batch_fusion = False
    options.experimental_optimization.map_parallelization = False
    native_ds = (
        tf.data.Dataset.from_tensor_slices(([records.png[i] for i in order], records.label[order]))
        .map(tf_native_augment(0))
        .batch(n, drop_remainder=True)
        .repeat()
        .with_options(options)
    )
    native_batches = iter(native_ds)

    def native(step: int) -> None:
        next(native_batches)

    rows = {"pillow augment": pillow, "tf native ops": native}
    for run in rows.values():
        run(0)  # imports, tracing: untimed
    micros: dict[str, list[float]] = {name: [] for name in rows}
    load = os.getloadavg()[0]
    for step in range(1, args.batches + 1):
        for name, run in rows.items():
            cpu = time.process_time()
            run(step)
            micros[name].append((time.process_time() - cpu) / n * 1e6)
    native_us = statistics.median(micros["tf native ops"])
    print(f"CPU µs per record, median of {args.batches} batches of {n} (load {load:.1f}):")
    for name, values in micros.items():
        us = statistics.median(values)
        print(f"  {name:16s} {us:7.1f}  ({native_us / us:.2f}x native's rate per core)")


if __name__ == "__main__":
    main()

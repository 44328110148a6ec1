"""How long deleting an exhausted tf.data ``from_generator`` iterator takes,
with tf.data's autotuning on (the default) and off, in turn.

    python3 benchmarks/tf_iterator_end.py --runs 12

The tf backend's workers feed each epoch through ``Dataset.from_generator``;
with autotuning on, deleting the epoch's iterator waited for the autotune
thread's next wake-up, at random up to ~1 s (the 1-worker decode row's two
rates, benchmarks/README.md). Each run: a generator of ``--elements``
batch-sized arrays, one every ``--step`` seconds (an epoch's pace), read to
its end, then the iterator deleted and timed. Prints each mode's times in
milliseconds, sorted. A wait, not CPU: load shifts it little.
"""

from __future__ import annotations

import argparse
import os
import time

import common  # noqa: F401  (puts the repo on sys.path)
import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=12, help="runs per mode")
    parser.add_argument("--elements", type=int, default=60)
    parser.add_argument("--step", type=float, default=0.025, help="seconds between elements")
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from jaxfeed.loaders._doors.tf import import_tensorflow

    tf = import_tensorflow()
    batch = np.zeros((128, 56, 56, 3), np.float32)
    signature = {"image": tf.TensorSpec(batch.shape, tf.float32)}

    def generate():
        for _ in range(args.elements):
            time.sleep(args.step)
            yield {"image": batch}

    def deletion_ms(autotune: bool) -> float:
        options = tf.data.Options()
        options.autotune.enabled = autotune
        dataset = tf.data.Dataset.from_generator(generate, output_signature=signature)
        iterator = dataset.with_options(options).as_numpy_iterator()
        for _ in iterator:
            pass
        started = time.perf_counter()
        del iterator
        return (time.perf_counter() - started) * 1e3

    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(args.runs):
        for autotune in times:
            times[autotune].append(deletion_ms(autotune))
    print(f"deleting an exhausted from_generator iterator, ms (load {os.getloadavg()[0]:.1f}):")
    for autotune, values in times.items():
        label = "autotune on " if autotune else "autotune off"
        print(f"  {label}: " + ", ".join(f"{v:.1f}" for v in sorted(values)))


if __name__ == "__main__":
    main()

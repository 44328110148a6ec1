"""What exact resume costs a wrapped tf.data pipeline: its checkpoint per epoch.

A wrapped tf.data pipeline resumes from tf.data's own iterator checkpoint,
taken at each epoch's start (`loaders/wrapping/tf.py`). This times one epoch of
the compare's tf-data tutorial pipeline (``from_tensor_slices(...).shuffle(N,
seed).batch(B).prefetch(AUTOTUNE)``, N = every row, so the checkpoint holds
the whole shuffle buffer) three ways, interleaved: iterated bare; through
``jaxfeed.wrap`` as made (the checkpoints); and through its
``without_data_state()`` view, which `jaxfeed.fit` reads when it does not
checkpoint. From the repository root::

    python3 benchmarks/tf_state_cost.py --data-dir ../shared/data/mnist
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
from common import SHARED_MNIST, write_record  # also puts the repo on sys.path

from jaxfeed import loaders


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=str(SHARED_MNIST))
    parser.add_argument("--dataset", default="mnist-10k", help="falls back to mnist-sample")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=6, help="per repeat; the first is left out")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tag", default="cpu")
    args = parser.parse_args()
    import tensorflow as tf

    dataset = args.dataset if Path(args.data_dir).is_dir() else "mnist-sample"
    source = loaders.make("numpy", dataset=dataset, data_dir=args.data_dir, shuffle=False)
    rows = list(source.iter_epoch(0))
    images = np.concatenate([b["image"][b["mask"]] for b in rows])
    labels = np.concatenate([b["label"][b["mask"]] for b in rows])

    def pipeline():
        data = tf.data.Dataset.from_tensor_slices({"image": images, "label": labels})
        data = data.shuffle(len(labels), seed=0).batch(args.batch_size)
        return data.prefetch(tf.data.AUTOTUNE)

    def bare():
        data = pipeline()
        return [lambda: data.as_numpy_iterator() for _ in range(args.epochs)]

    def wrapped(keep: bool):
        def epochs():
            wrap = loaders.wrap(pipeline())
            source = wrap if keep else wrap.without_data_state()
            return [lambda e=e: source.iter_epoch(e) for e in range(args.epochs)]

        return epochs

    ways = {"bare": bare, "wrap": wrapped(True), "wrap, without_data_state()": wrapped(False)}
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.repeats):
        for name, way in ways.items():
            times = []
            for epoch in way():
                started = time.perf_counter()
                for _ in epoch():
                    pass
                times.append(time.perf_counter() - started)
            seconds[name] += times[1:]  # the first epoch sets the pipeline up
    ms = {name: 1e3 * statistics.median(s) for name, s in seconds.items()}
    for name, value in ms.items():
        print(f"{name:28s} {value:7.1f} ms per epoch  ({value / ms['bare']:.2f}x bare)")
    write_record(
        "tf-state-cost",
        args,
        [
            {"way": name, "epoch_ms": round(v, 2), "per_epoch_ms": seconds[name]}
            for name, v in ms.items()
        ],
        dataset=dataset,
        rows=len(labels),
    )


if __name__ == "__main__":
    main()

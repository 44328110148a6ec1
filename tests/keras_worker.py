"""Keras 3 on the JAX backend, fed by `jaxfeed.keras_data`, in a process of its own.

  python keras_worker.py OUT

Keras picks its backend when it is imported, so the tests run this with
``KERAS_BACKEND=jax`` and read the JSON it writes to OUT:

* ``native``: the MNIST MLP trained 2 epochs on ``keras_data`` over a source
  whose last batch is padded (``padding="weight"``, and ``"drop"`` with
  Keras's default compile), and trained from the same weights on tf.data
  over the same rows in the same order (a short last batch); how far the
  weights are apart, and the per-epoch training and validation metrics.
* ``padding``: the weight-trained model evaluated on a source whose padding
  rows are real digits with wrong labels (both paddings), on exactly the
  real rows, through ``wrap`` of tf.data over them, and on every row
  unweighted; then with plain ``metrics``.
* ``passes``: what a recording source served, as ``(epoch, batch)``, to a
  new model's ``fit`` with validation (and reading one batch ahead, as on an
  accelerator), ``fit(steps_per_epoch=3)``, ``evaluate`` and ``predict``;
  the tuple shapes for each kind of source.
* ``warnings``: what ``evaluate`` on a padded source warned, for a model
  compiled with plain ``metrics`` and for one with ``weighted_metrics``.
* ``tf_order``: how far from plain Keras's ``fit(ds)`` on a seeded, shuffled
  tf.data pipeline the weights end, through ``keras_data(wrap(ds), epoch=e)``.
* ``grain_folder``: ``keras_data(wrap(image_dataset_from_directory(...,
  format="grain")))`` on 10 images in batches of 4: its length, and the
  batches a ``fit`` epoch read.
"""

import json
import os
import sys
import warnings
from collections.abc import Iterator
from unittest import mock

import numpy as np

os.environ.setdefault("KERAS_BACKEND", "jax")  # Keras picks its backend when imported
import jax
import keras
from jaxfeed.loaders._doors.tf import import_tensorflow

import jaxfeed
from jaxfeed.compare.workloads.copy.keras_fit import build_model

B, SEED, EPOCHS = 128, 0, 2  # mnist-sample: 4,000 train rows (last batch 32 real), 1,000 test


def sources(**options) -> tuple[jaxfeed.BatchSource, jaxfeed.BatchSource]:
    train = jaxfeed.make("numpy", dataset="mnist-sample", batch_size=B, seed=SEED, **options)
    test = jaxfeed.make(
        "numpy", dataset="mnist-sample", split="test", shuffle=False, batch_size=B, **options
    )
    return train, test


def compiled() -> keras.Model:
    """The MLP as docs/keras.md compiles it for padding="weight": the loss averages a
    padded batch over its real rows (as over a short batch); the metrics are weighted."""
    return build_model(
        keras,
        SEED,
        loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction="mean_with_sample_weight"
        ),
        metrics=[],
        weighted_metrics=[
            keras.metrics.SparseCategoricalAccuracy(name="accuracy"),
            keras.metrics.SparseCategoricalCrossentropy(from_logits=True, name="crossentropy"),
        ],
    )


def gap(a: keras.Model, b: keras.Model) -> float:
    return max(
        float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
        for x, y in zip(a.get_weights(), b.get_weights(), strict=True)
    )


def real_rows(source: jaxfeed.BatchSource, epoch: int) -> tuple[np.ndarray, np.ndarray]:
    """The epoch's real rows (padding dropped), in the source's order."""
    batches = list(source.iter_epoch(epoch))
    keep = [b.get("mask", np.ones(len(b["label"]), bool)) for b in batches]
    images = np.concatenate([b["image"][k] for b, k in zip(batches, keep, strict=True)])
    labels = np.concatenate([b["label"][k] for b, k in zip(batches, keep, strict=True)])
    return images, labels


def native(tf) -> tuple[keras.Model, dict]:
    train, test = sources()
    data = {"x": "image", "y": "label"}
    bridged = compiled()
    weighted = bridged.fit(  # fit's default shuffle=True: Keras's index order must not matter
        jaxfeed.keras_data(train, **data),
        validation_data=jaxfeed.keras_data(test, **data),
        epochs=EPOCHS,
        verbose=0,
    )
    dropped = build_model(keras, SEED)  # Keras's default compile: plain metrics, default loss
    short = dropped.fit(
        jaxfeed.keras_data(train, **data, padding="drop"),
        validation_data=jaxfeed.keras_data(test, **data, padding="drop"),
        epochs=EPOCHS,
        verbose=0,
    )
    plain = compiled()
    test_ds = tf.data.Dataset.from_tensor_slices(real_rows(test, 0)).batch(B)
    history: dict[str, list[float]] = {}
    for epoch in range(EPOCHS):
        train_ds = tf.data.Dataset.from_tensor_slices(real_rows(train, epoch)).batch(B)
        done = plain.fit(
            train_ds,
            validation_data=test_ds,
            epochs=epoch + 1,
            initial_epoch=epoch,
            shuffle=False,  # the order is the source's, as above
            verbose=0,
        )
        for key, values in done.history.items():
            history.setdefault(key, []).extend(values)
    return bridged, {
        "weight": weighted.history,
        "drop": short.history,
        "tf_data": history,
        "weight_gap": gap(bridged, plain),
        "drop_gap": gap(dropped, plain),
        "weight_scale": float(max(np.max(np.abs(w)) for w in plain.get_weights())),
    }


class Garbled:
    """A source whose padding rows are real digits with wrong labels."""

    def __init__(self, source: jaxfeed.BatchSource):
        self.source = source
        self.batch_size, self.num_batches = source.batch_size, source.num_batches
        self.element_spec = source.element_spec

    def iter_epoch(self, epoch: int = 0, *, start: int = 0) -> Iterator[jaxfeed.Batch]:
        for batch in self.source.iter_epoch(epoch, start=start):
            pad = ~batch["mask"]
            batch = dict(batch)
            batch["image"] = batch["image"].copy()
            batch["label"] = batch["label"].copy()
            batch["image"][pad] = batch["image"][: pad.sum()]
            batch["label"][pad] = (batch["label"][: pad.sum()] + 1) % 10
            yield batch


def padding(model: keras.Model, tf) -> dict:
    _, test = sources()
    garbled = Garbled(test)
    batches = list(garbled.iter_epoch(0))
    assert sum((~b["mask"]).sum() for b in batches) > 0  # the last batch is padded
    images, labels = real_rows(test, 0)

    def scores(x, y=None, **options):
        metrics = model.evaluate(x, y, batch_size=B, verbose=0, return_dict=True, **options)
        return {k: float(v) for k, v in metrics.items()}

    every_row = [np.concatenate([b[k] for b in batches]) for k in ("image", "label")]
    result = {
        "weight": scores(jaxfeed.keras_data(garbled, x="image", y="label")),
        "drop": scores(jaxfeed.keras_data(garbled, x="image", y="label", padding="drop")),
        "real_rows": scores(images, labels),
        # A stream: wrap pads tf.data's short last batch.
        "wrapped_tf_data": scores(
            jaxfeed.keras_data(
                jaxfeed.wrap(tf.data.Dataset.from_tensor_slices((images, labels)).batch(B)),
                x="image",
                y="label",
            )
        ),
        "every_row": scores(*every_row),
        "real": len(labels),
    }
    model.compile(loss=model.loss, metrics=["accuracy"])  # plain metrics ignore sample weights
    result["plain_metrics"] = scores(jaxfeed.keras_data(garbled, x="image", y="label"))
    result["plain_metrics_every_row"] = scores(*every_row)
    return result


class Recording:
    """A source that logs each batch it serves as [epoch, batch]."""

    def __init__(self, source: jaxfeed.BatchSource):
        self.source, self.log = source, []
        self.batch_size, self.num_batches = source.batch_size, source.num_batches
        self.element_spec = source.element_spec

    def iter_epoch(self, epoch: int = 0, *, start: int = 0) -> Iterator[jaxfeed.Batch]:
        for index, batch in enumerate(self.source.iter_epoch(epoch, start=start), start):
            self.log.append([epoch, index])
            yield batch


def passes() -> dict:
    train, test = (Recording(s) for s in sources())
    model = compiled()  # new: Keras reads one batch to build its metrics before the first pass
    model.fit(
        jaxfeed.keras_data(train, x="image", y="label"),
        validation_data=jaxfeed.keras_data(test, x="image", y="label"),
        epochs=2,
        verbose=0,
    )
    fit_log, val_log = train.log[:], test.log[:]
    ahead = Recording(sources()[0])
    # Keras 3.15 reads one batch ahead when JAX's default backend is not the CPU
    # (JAXEpochIterator._get_iterator), so its look before the first pass reads two.
    with mock.patch.object(jax, "default_backend", return_value="gpu"):
        compiled().fit(jaxfeed.keras_data(ahead, x="image", y="label"), epochs=2, verbose=0)
    train.log.clear()
    data = jaxfeed.keras_data(train, x="image", y="label", epoch=5)
    model.fit(data, epochs=2, steps_per_epoch=3, verbose=0)
    short_log = train.log[:]
    test.log.clear()
    model.evaluate(jaxfeed.keras_data(test, x="image", y="label", epoch=7), verbose=0)
    evaluate_log = test.log[:]
    test.log.clear()
    predicted = model.predict(jaxfeed.keras_data(test, x="image"), verbose=0)
    dropped, _ = sources(drop_remainder=True)
    shapes = {}
    for name, data in {
        "padded": jaxfeed.keras_data(train, x="image", y="label"),
        "dropped": jaxfeed.keras_data(dropped, x="image", y="label"),
        "x_only": jaxfeed.keras_data(train, x="image"),
        "several": jaxfeed.keras_data(train, x=("image", "label"), y={"out": "label"}),
    }.items():
        first = data[0]
        shapes[name] = json.loads(json.dumps(first, default=lambda a: [str(a.dtype), a.shape]))
        data.close()
    return {
        "fit": fit_log,
        "fit_reading_ahead": ahead.log,
        "validation": val_log,
        "steps_per_epoch": short_log,
        "evaluate": evaluate_log,
        "predict": test.log[:],
        "predicted_rows": len(predicted),
        "num_batches": [train.num_batches, test.num_batches],
        "shapes": shapes,
    }


def padding_warnings() -> dict:
    """Warnings of ``evaluate`` on a source whose last batch is padded."""
    _, test = sources()
    said = {}
    for name, metrics in {"metrics": ["accuracy"], "weighted_metrics": ["accuracy"]}.items():
        model = keras.Sequential(  # small: what matters is how it is compiled
            [
                keras.Input((28, 28, 1), dtype="uint8"),
                keras.layers.Flatten(),
                keras.layers.Dense(10),
            ]
        )
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        model.compile(loss=loss, **{name: metrics})
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.evaluate(jaxfeed.keras_data(test, x="image", y="label"), verbose=0)
        said[name] = [str(w.message) for w in caught if "keras_data" in str(w.message)]
    return said


def tf_order(tf) -> dict:
    """Plain Keras's ``fit`` on tf.data against ``keras_data(wrap(ds), epoch=e)``."""
    rng = np.random.default_rng(SEED)
    x, y = rng.normal(size=(64, 4)).astype(np.float32), np.arange(64, dtype=np.int32)

    def dataset():  # seeded: every build shuffles the same orders, iteration after iteration
        return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(64, seed=3).batch(16)

    def model() -> keras.Model:
        init = keras.initializers.GlorotUniform(seed=SEED)
        m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(64, kernel_initializer=init)])
        m.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
        return m

    plain = model()
    plain.fit(dataset(), epochs=2, verbose=0)
    gaps = {}
    for epoch in (0, 1):
        bridged = model()
        data = jaxfeed.keras_data(jaxfeed.wrap(dataset()), x="image", y="label", epoch=epoch)
        bridged.fit(data, epochs=2, verbose=0)
        gaps[f"epoch={epoch}"] = gap(plain, bridged)
    return gaps


def grain_folder(folder: str) -> dict:
    """An image folder as Keras reads it with ``format="grain"``, through keras_data."""
    from PIL import Image

    for i in range(10):
        os.makedirs(f"{folder}/class_{i % 2}", exist_ok=True)
        Image.new("RGB", (8, 8), (i * 20, 0, 0)).save(f"{folder}/class_{i % 2}/{i}.png")
    images = keras.utils.image_dataset_from_directory(
        folder, format="grain", batch_size=4, image_size=(8, 8), seed=SEED, verbose=False
    )
    source = Recording(jaxfeed.wrap(images))
    data = jaxfeed.keras_data(source, x="image", y="label")
    model = keras.Sequential(
        [keras.Input((8, 8, 3)), keras.layers.Flatten(), keras.layers.Dense(2)]
    )
    model.compile(loss="sparse_categorical_crossentropy", weighted_metrics=["accuracy"])
    model.fit(data, epochs=1, verbose=0)
    return {"num_batches": source.num_batches, "fit": source.log}


def main(out: str) -> None:
    if keras.backend.backend() != "jax":
        raise SystemExit(f"Keras runs on {keras.backend.backend()!r}; run with KERAS_BACKEND=jax")
    tf = import_tensorflow()
    model, result = native(tf)
    result = {"native": result, "padding": padding(model, tf), "passes": passes()}
    result |= {"warnings": padding_warnings(), "tf_order": tf_order(tf)}
    result["grain_folder"] = grain_folder(os.path.join(os.path.dirname(out), "folder"))
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1])

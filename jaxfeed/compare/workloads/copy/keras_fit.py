"""Keras 3 ``fit`` on the JAX backend: the same MLP, the same user loader object,
handed to Keras as it is or through ``jaxfeed.keras_data(wrap(obj))``.

Runs only in a fresh process (`jaxfeed.compare.workloads.copy.fresh`): Keras picks its
backend once, at import, and ``import tensorflow`` imports Keras on the
TensorFlow backend, so in the parent it may already be the wrong one.

The model matches `jaxfeed.mnist.model` (784-512-512-10, ReLU, He-normal weights,
zero biases, uint8 images normalised inside the model) and the optimiser
matches `jaxfeed.mnist.train.TrainConfig` (SGD, momentum); loss and accuracy are
computed every step, as jaxfeed's loop does.
"""

from __future__ import annotations

import os
import statistics
import time
import warnings
from typing import Any

import numpy as np

from jaxfeed.compare.training import steady, trained_epochs
from jaxfeed.compare.workloads.copy.baselines import Baseline
from jaxfeed.keras import jax_keras, keras_data
from jaxfeed.loaders.protocol import BatchSource
from jaxfeed.mnist.model import LAYER_SIZES
from jaxfeed.mnist.train import TrainConfig


def import_keras() -> Any:
    """Keras on the JAX backend, or an error that says why not."""
    os.environ.setdefault("KERAS_BACKEND", "jax")  # before keras (or tensorflow) imports it
    return jax_keras()


def _pair(batch: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    return batch["image"], batch["label"]


def fit_input(keras: Any, loop: Baseline, batch_size: int) -> tuple[Any, str]:
    """What ``model.fit`` gets for ``loop``'s loader object, and that in words."""
    if loop.framework in ("torch", "tf"):
        return loop.obj, "fit(the same object)"
    if loop.framework == "grain":
        # Keras's Grain adapter reads (x, y) tuples; this loop's records are dicts.
        return loop.obj.map(_pair), "fit(the same IterDataset.map(dict -> (x, y)))"
    if loop.framework == "hf":
        # Keras takes no datasets.Dataset: a PyDataset is how a Keras user feeds one.
        return _hf_batches(keras, loop.obj, batch_size), (
            "fit(keras.utils.PyDataset of ds[i*B:(i+1)*B] slices of the same Dataset, "
            'formatted "numpy" with stored dtypes)'
        )
    raise ValueError(f"no Keras input for framework {loop.framework!r}")


def _hf_batches(keras: Any, dataset: Any, batch_size: int) -> Any:
    class HFBatches(keras.utils.PyDataset):
        """Batches of a ``datasets.Dataset`` by index (Keras's own protocol)."""

        def __init__(self) -> None:
            super().__init__()
            self.table = dataset.with_format("numpy", dtype=None)  # uint8 stays uint8

        def __len__(self) -> int:
            return -(-len(self.table) // batch_size)

        def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
            rows = self.table[index * batch_size : (index + 1) * batch_size]
            return rows["image"], rows["label"]

    return HFBatches()


def build_model(
    keras: Any, seed: int, config: TrainConfig = TrainConfig(), **compile_options: Any
) -> Any:
    """The compiled MLP of `jaxfeed.mnist.model`, in Keras; ``compile_options``
    replace or add to ``model.compile``'s (SGD with momentum, cross-entropy
    on logits, accuracy)."""
    layers = keras.layers
    inputs = keras.Input(shape=(28, 28, 1), dtype="uint8")
    x = layers.Flatten()(layers.Rescaling(1 / 255)(inputs))
    *hidden, classes = LAYER_SIZES[1:]
    for i, units in enumerate([*hidden, classes]):
        init = keras.initializers.VarianceScaling(
            2.0, "fan_in", "untruncated_normal", seed=seed + i
        )  # jaxfeed.mnist.model's He-normal: N(0, 2 / fan_in), not truncated
        activation = "relu" if i < len(hidden) else None
        x = layers.Dense(units, activation=activation, kernel_initializer=init)(x)
    model = keras.Model(inputs, x)
    options = dict(
        optimizer=keras.optimizers.SGD(config.learning_rate, momentum=config.momentum),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["sparse_categorical_accuracy"],
    )
    model.compile(**(options | compile_options))
    return model


def describe(keras: Any, model: Any) -> dict[str, Any]:
    """What was trained, for the record: backend, weight shapes, optimiser."""
    optimizer = model.optimizer.get_config()
    return {
        "keras": keras.__version__,
        "backend": keras.backend.backend(),
        "input_dtype": str(model.input.dtype),
        "weight_shapes": [list(w.shape) for w in model.weights],
        "optimizer": {k: optimizer[k] for k in ("name", "learning_rate", "momentum")},
    }


def measure(
    loop: Baseline,
    batch_size: int,
    seed: int,
    test: tuple[np.ndarray, np.ndarray],
    epochs: int,
    max_batches: int | None,
    source: BatchSource | None = None,
) -> dict[str, Any]:
    """A fresh model, one ``fit`` call, every epoch timed.

    ``source``: fit on ``jaxfeed.keras_data(source)`` (the loop's object
    wrapped) instead of on the object itself.

    Returns ``epoch_s`` and ``epoch_cpu_s`` (medians over `rows.steady`'s
    epochs), ``test_accuracy``, the per-epoch ``history`` and ``model``
    (`describe`).
    """
    keras = import_keras()
    if source is None:
        data, how = fit_input(keras, loop, batch_size)
    else:
        data = keras_data(source, x="image", y="label")
        how = 'fit(jaxfeed.keras_data(wrap(the same object), x="image", y="label"))'
    keras.utils.set_random_seed(seed)
    model = build_model(keras, seed)
    timer = _epoch_timer(keras)
    with warnings.catch_warnings():
        # An IterDataset has no length: Keras finds each epoch's end by
        # exhausting it and warns "ran out of data", though every epoch is whole.
        warnings.filterwarnings("ignore", "Your input ran out of data")
        model.fit(
            data,
            epochs=trained_epochs(epochs),
            steps_per_epoch=max_batches,
            shuffle=False,  # the loader shuffles; Keras warns that it ignores shuffle=True
            verbose=0,
            callbacks=[timer],
        )
    history = timer.history
    timed = steady(history, epochs)
    scores = model.evaluate(*test, batch_size=batch_size, verbose=0, return_dict=True)
    return {
        "epoch_s": statistics.median(h["seconds"] for h in timed),
        "epoch_cpu_s": statistics.median(h["cpu_s"] for h in timed),
        "test_accuracy": float(scores["sparse_categorical_accuracy"]),
        "history": history,
        "how": f"Keras {keras.__version__} (JAX backend) model.{how}",
        "model": describe(keras, model),
    }


def _epoch_timer(keras: Any) -> Any:
    class EpochTimer(keras.callbacks.Callback):
        """Wall time of each epoch, ``on_epoch_begin`` to ``on_epoch_end``: the
        window jaxfeed.mnist.train times (its step loop until the totals reach the host)."""

        def __init__(self) -> None:
            super().__init__()
            self.history: list[dict[str, Any]] = []
            self.started = 0.0
            self.cpu = time.process_time()  # CPU time, all threads, at the last epoch's end

        def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
            self.started = time.perf_counter()

        def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
            logs = {k: float(v) for k, v in (logs or {}).items()}  # waits for the device
            seconds = time.perf_counter() - self.started
            cpu, self.cpu = self.cpu, time.process_time()
            entry = {"epoch": epoch + 1, "seconds": seconds, "cpu_s": self.cpu - cpu}
            self.history.append(entry | logs)

    return EpochTimer()

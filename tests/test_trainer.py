"""The common MLP trainer: masked metrics, determinism, and the accuracy target."""

import jax
import numpy as np
import pytest

import loaders
from jaxfeed import TrainConfig, evaluate, init_params, predict, train
from sharding import data_mesh


def _make(split, batch_size, **kwargs):
    return loaders.make(
        "numpy", dataset="mnist-sample", split=split, batch_size=batch_size, **kwargs
    )


def test_padded_rows_never_count():
    params = init_params(jax.random.key(1))
    data = loaders.load_dataset("mnist-sample", "test")
    expected = float(np.mean(np.argmax(np.asarray(predict(params, data.images)), 1) == data.labels))
    # 1000 test digits in batches of 384: the last batch has 232 real rows.
    padded = _make("test", 384, shuffle=False)
    assert padded.num_batches == 3
    accuracy = evaluate(params, padded, data_mesh())
    assert accuracy == pytest.approx(expected, abs=1e-6)


def test_default_run_reaches_90_percent_on_mnist_sample():
    _, history = train(
        _make("train", 128),
        _make("test", 128, shuffle=False),
        TrainConfig(epochs=5, seed=0),
        sharding=data_mesh(),
        progress=False,
    )
    assert len(history) == 5
    assert history[-1]["test_accuracy"] >= 0.90
    assert history[-1]["loss"] < history[0]["loss"]
    for m in history:
        assert 0 <= m["data_wait_fraction"] <= 1 and m["samples_per_second"] > 0
        assert m["seconds"] > 0


def test_same_seed_same_curve_and_different_seed_differs():
    def curve(seed):
        _, history = train(
            _make("train", 256, seed=seed),
            None,
            TrainConfig(epochs=2, seed=seed),
            sharding=data_mesh(),
            progress=False,
        )
        return [m["loss"] for m in history]

    assert curve(3) == curve(3)
    assert curve(3) != curve(4)


def test_one_device_and_eight_devices_agree():
    def final(devices):
        _, history = train(
            _make("train", 128),
            _make("test", 128, shuffle=False),
            TrainConfig(epochs=2),
            sharding=data_mesh(devices),
            progress=False,
        )
        return history[-1]

    one, eight = final(jax.devices()[:1]), final(jax.devices())
    assert one["test_accuracy"] == pytest.approx(eight["test_accuracy"], abs=1e-3)
    assert one["loss"] == pytest.approx(eight["loss"], rel=1e-4)

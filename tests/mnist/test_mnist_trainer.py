"""The common MLP trainer: masked metrics, determinism, and the accuracy target."""

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jaxfeed.sharding import DeviceFeed, data_mesh

from jaxfeed import loaders
from jaxfeed.mnist import TrainConfig, evaluate, init_params, predict, train
from jaxfeed.mnist.train import init_state, make_train_step


def _make(split, batch_size, **kwargs):
    return loaders.make(
        "numpy", dataset="mnist-sample", split=split, batch_size=batch_size, **kwargs
    )


def test_padded_rows_never_count():
    params = init_params(jax.random.key(1))
    data = loaders.load_dataset("mnist-sample", "test")
    expected = float(
        np.mean(np.argmax(np.asarray(predict(params, data["image"])), 1) == data["label"])
    )
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
    # Exact: every step sees the same global batch, byte for byte.
    def batches(devices):
        with DeviceFeed(_make("train", 128), data_mesh(devices), epoch=1) as feed:
            return [{k: np.asarray(v) for k, v in b.items()} for b in feed]

    for a, b in zip(batches(jax.devices()[:1]), batches(jax.devices()), strict=True):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])

    # Each step, from the same state: 8 devices sum each gradient in another
    # order, and XLA's CPU code (so the order) differs by CPU. float32 rounds
    # each sum to ~1e-7 relative (2-3e-7 of a layer's largest weight seen on a
    # Xeon and an AMD EPYC); a step that saw other rows moves weights by ~1e-3.
    # Compared step by step, not after a whole run: once a ReLU input within
    # rounding of 0 falls on the other side in one of the two, training carries
    # that on (on an AMD EPYC: 3e-7 for 24 steps, then 8e-5 at step 26 and 1e-2
    # after 64), so a run's final weights cannot tell rounding from other rows.
    config = TrainConfig()
    step = jax.jit(make_train_step(config))
    one, eight = data_mesh(jax.devices()[:1]), data_mesh(jax.devices())
    state, steps = init_state(config), 0
    with (
        DeviceFeed(_make("train", 128), one, epoch=1) as feed1,
        DeviceFeed(_make("train", 128), eight, epoch=1) as feed8,
    ):
        for batch1, batch8 in zip(feed1, feed8, strict=True):
            after1, _ = step(state, batch1)
            after8, _ = step(jax.device_put(state, NamedSharding(eight, P())), batch8)
            for a, b in zip(
                jax.tree.leaves(after1["params"]), jax.tree.leaves(after8["params"]), strict=True
            ):
                a, b = np.asarray(a), np.asarray(b)
                assert np.max(np.abs(a - b)) <= 1e-5 * np.max(np.abs(a)), f"step {steps}"
            state, steps = after1, steps + 1
    assert steps == 32

    # A whole run on each: the same history, but for that drift.
    def final(devices):
        return train(
            _make("train", 128),
            _make("test", 128, shuffle=False),
            TrainConfig(epochs=2),
            sharding=data_mesh(devices),
            progress=False,
        )[1][-1]

    run1, run8 = final(jax.devices()[:1]), final(jax.devices())
    assert run1["step"] == run8["step"] == 64
    assert run1["loss"] == pytest.approx(run8["loss"], rel=1e-3)
    assert run1["test_accuracy"] == pytest.approx(run8["test_accuracy"], abs=0.005)


@pytest.mark.parametrize("devices", [1, 8])
def test_k_steps_per_transfer_train_exactly_like_one_step_per_transfer(devices):
    # 4,000 rows in batches of 128: 32 steps, so k=3 ends on a stack of 2.
    mesh = data_mesh(jax.devices()[:devices])
    runs = {}
    for k in (1, 3, 8):
        params, history = train(
            _make("train", 128),
            None,
            TrainConfig(epochs=2, seed=0, steps_per_transfer=k),
            sharding=mesh,
            progress=False,
        )
        runs[k] = (jax.tree.map(np.asarray, params), [m["loss"] for m in history])
    for k in (3, 8):
        assert runs[k][1] == runs[1][1]
        for a, b in zip(jax.tree.leaves(runs[k][0]), jax.tree.leaves(runs[1][0]), strict=True):
            np.testing.assert_array_equal(a, b)

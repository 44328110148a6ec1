"""`jaxfeed.fit` with a model that is not the MNIST MLP, fed by a wrapped torch DataLoader."""

import json
import math
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from jaxfeed.sharding import data_mesh
from torch.utils.data import DataLoader, TensorDataset

from jaxfeed import (
    Checkpointing,
    FitResult,
    Logging,
    NonFiniteMetric,
    batch_mask,
    evaluate_metrics,
    fit,
    loaders,
)
from jaxfeed.training import loop, run

CLASSES = 10


def _cifar_like(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """float32 [rows, 3, 32, 32] images whose channel means depend on the int64 label."""
    rng = np.random.default_rng(seed)
    means = np.random.default_rng(99).normal(size=(CLASSES, 3)) * 1.5
    labels = rng.integers(0, CLASSES, rows)
    images = rng.normal(size=(rows, 3, 32, 32)) + means[labels][:, :, None, None]
    return images.astype(np.float32), labels.astype(np.int64)


def _loader(rows: int, seed: int, batch_size: int, shuffle: bool) -> DataLoader:
    images, labels = _cifar_like(rows, seed)
    data = TensorDataset(torch.from_numpy(images), torch.from_numpy(labels))
    return DataLoader(data, batch_size=batch_size, shuffle=shuffle)


def init_cnn(key: jax.Array) -> dict:
    k1, k2, k3 = jax.random.split(key, 3)
    return {
        "conv1": jax.random.normal(k1, (8, 3, 3, 3)) * math.sqrt(2 / 27),
        "conv2": jax.random.normal(k2, (16, 8, 3, 3)) * math.sqrt(2 / 72),
        "dense": jax.random.normal(k3, (16, CLASSES)) * math.sqrt(1 / 16),
        "bias": jnp.zeros((CLASSES,)),
    }


def cnn(params: dict, images: jax.Array) -> jax.Array:
    """Two strided 3x3 convolutions (NCHW), global average pooling, a dense layer."""
    x = images
    for name in ("conv1", "conv2"):
        x = jax.nn.relu(jax.lax.conv_general_dilated(x, params[name], (2, 2), "SAME"))
    return x.mean(axis=(2, 3)) @ params["dense"] + params["bias"]


def _sums(params: dict, batch: dict) -> dict:
    logits = cnn(params, batch["image"])
    mask = batch_mask(batch)
    nll = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"])
    correct = (jnp.argmax(logits, axis=1) == batch["label"]).astype(jnp.float32)
    return {
        "loss": jnp.sum(nll * mask),
        "accuracy": jnp.sum(correct * mask),
        "count": jnp.sum(mask),
    }


def test_fit_trains_a_cnn_from_a_wrapped_torch_dataloader(tmp_path):
    tx = optax.sgd(0.05, momentum=0.9)

    def step(state, batch):
        def loss(params):
            sums = _sums(params, batch)
            return sums["loss"] / jnp.maximum(sums["count"], 1.0), sums

        grads, sums = jax.grad(loss, has_aux=True)(state["params"])
        updates, opt_state = tx.update(grads, state["opt_state"])
        return {
            "params": optax.apply_updates(state["params"], updates),
            "opt_state": opt_state,
        }, sums

    def eval_step(state, batch):
        return _sums(state["params"], batch)

    torch.manual_seed(0)
    train = loaders.wrap(_loader(500, 0, 64, shuffle=True))  # 500 = 7 x 64 + 52: padded
    test = loaders.wrap(_loader(200, 1, 64, shuffle=False))
    assert train.element_spec["image"].shape == (64, 3, 32, 32)
    params = init_cnn(jax.random.key(0))
    history_file = tmp_path / "history.json"
    seen = []
    result = fit(
        step,
        {"params": params, "opt_state": tx.init(params)},
        train,
        epochs=4,
        eval=test,
        eval_step=eval_step,
        mesh=data_mesh(jax.devices()[:2]),
        callbacks=[seen.append],
        log=Logging(progress=False, history_path=history_file),
    )
    assert isinstance(result, FitResult)
    history = result.history
    assert [m["epoch"] for m in history] == [1, 2, 3, 4]
    assert [m["step"] for m in history] == [8, 16, 24, 32]
    assert seen == history
    assert json.loads(history_file.read_text()) == json.loads(json.dumps(history))
    assert history[-1]["loss"] < 0.5 * history[0]["loss"], [m["loss"] for m in history]
    assert history[-1]["eval_accuracy"] > 0.5  # 10 classes: chance is 0.1
    for m in history:
        assert 0 <= m["data_wait_fraction"] <= 1 and m["samples_per_second"] > 0
    # The returned state is replicated on the mesh, and evaluates as the last epoch did.
    assert result.state["params"]["dense"].sharding.is_fully_replicated
    again = evaluate_metrics(eval_step, result.state, test, data_mesh(jax.devices()[:2]))
    assert again["accuracy"] == history[-1]["eval_accuracy"]


def _label_sums(state, batch):
    mask = batch_mask(batch)
    return {"label": jnp.sum(batch["label"] * mask), "count": jnp.sum(mask)}


@pytest.mark.parametrize("steps_per_transfer", [1, 3])
def test_metric_sums_leave_out_padding_rows(steps_per_transfer):
    # 300 rows in batches of 64: the last batch has 44 real rows and 20 padding rows.
    source = loaders.wrap(_loader(300, 0, 64, shuffle=False), keys=("image", "label"))
    *_, last = source.iter_epoch(0)
    assert source.num_batches == 5 and int(last["mask"].sum()) == 44

    def step(state, batch):
        return {"calls": state["calls"] + 1}, _label_sums(state, batch)

    result = fit(
        step,
        {"calls": jnp.zeros((), jnp.int32)},
        source,
        epochs=2,
        eval=source,
        eval_step=_label_sums,
        mesh=jax.devices()[:1],
        steps_per_transfer=steps_per_transfer,
        log=Logging(progress=False),
    )
    # Exact: the integer sums fit float32. Counting the padding rows would
    # divide by 320, not 300.
    expected = float(np.mean(_cifar_like(300, 0)[1]))
    for m in result.history:
        assert m["label"] == expected and m["eval_label"] == expected
    assert int(result.state["calls"]) == 10  # 5 steps per epoch, scanned or not


def _state():
    return {"w": jnp.zeros((3,))}


def _batches():
    return loaders.wrap(_loader(64, 0, 32, shuffle=False), keys=("image", "label"))


@pytest.mark.parametrize(
    ("step", "error", "match"),
    [
        (lambda s, b: (s, {"loss": jnp.sum(b["label"])}), TypeError, "with a 'count' entry"),
        (lambda s, b: ({"v": s["w"]}, _label_sums(s, b)), TypeError, "of the structure it took"),
        (lambda s, b: _label_sums(s, b), TypeError, r"must return \(state, metric sums\)"),
        (
            lambda s, b: (s, {"label": b["label"] * 1.0, "count": jnp.sum(batch_mask(b))}),
            TypeError,
            r"must be scalars \(summed over the batch\), got shapes \{'label': \(32,\)\}",
        ),
    ],
)
def test_a_step_that_breaks_the_contract_is_refused_before_any_data_moves(step, error, match):
    with pytest.raises(error, match=match):
        fit(
            step,
            _state(),
            _batches(),
            epochs=1,
            mesh=jax.devices()[:1],
            log=Logging(progress=False),
        )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"eval": "x"}, "pass eval and eval_step together"),
        ({"resume": True}, r"resume=True needs checkpoint=DIRECTORY"),
        ({"epochs": -1}, "epochs must be an integer >= 0, got -1"),
    ],
)
def test_bad_arguments_are_refused(kwargs, match):
    kwargs = {"epochs": 1, **kwargs}
    with pytest.raises(ValueError, match=match):
        fit(
            lambda s, b: (s, _label_sums(s, b)),
            _state(),
            _batches(),
            log=Logging(progress=False),
            **kwargs,
        )


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match=r"Logging.every must be an int >= 0 or None, got -1"):
        Logging(every=-1)
    with pytest.raises(TypeError, match=r"log takes a jaxfeed.Logging, .* got False"):
        fit(lambda s, b: (s, _label_sums(s, b)), _state(), _batches(), epochs=1, log=False)
    with pytest.raises(TypeError, match=r"callbacks takes jaxfeed.Callback objects .* got 3"):
        fit(lambda s, b: (s, _label_sums(s, b)), _state(), _batches(), epochs=1, callbacks=[3])


def test_an_epochs_seconds_include_the_steps_still_running_on_the_device():
    # Steps are dispatched ahead of the device. Each step here does ~tens of
    # ms of matmuls; an epoch of 4 of them must take longer than one step
    # alone, unless the epoch's clock stops before the device is done.
    def busy(state, batch):
        x = jax.lax.fori_loop(0, 40, lambda i, x: jnp.tanh(x @ x), jnp.eye(512) * 0.5)
        return {"w": state["w"] + x[0, :3]}, _label_sums(state, batch)

    state = _state()
    source = loaders.wrap(_loader(128, 0, 32, shuffle=False), keys=("image", "label"))
    batch = jax.device_put(next(source.iter_epoch(0)))
    alone = jax.jit(busy)
    jax.block_until_ready(alone(state, batch))  # compiled
    started = time.perf_counter()
    jax.block_until_ready(alone(state, batch))
    one_step = time.perf_counter() - started
    result = fit(busy, state, source, epochs=2, mesh=jax.devices()[:1], log=Logging(progress=False))
    seconds = [m["seconds"] for m in result.history]
    assert min(seconds) > one_step, (seconds, one_step)


def test_a_progress_line_waits_for_its_step_only_once_the_next_step_is_dispatched(
    monkeypatch, capsys
):
    # Waiting at once would leave the device idle while the next batch is read.
    events = []
    compile_step, to_host = loop.compile_step, run.to_host

    def recorded_compile(*args):
        train = compile_step(*args)
        return lambda *a: events.append("step") or train(*a)

    monkeypatch.setattr(loop, "compile_step", recorded_compile)
    monkeypatch.setattr(run, "to_host", lambda sums: events.append("sync") or to_host(sums))
    source = loaders.wrap(_loader(192, 0, 32, shuffle=False), keys=("image", "label"))
    fit(
        lambda s, b: (s, _label_sums(s, b)),
        _state(),
        source,
        epochs=1,
        mesh=jax.devices()[:1],
        log=Logging(progress=False, every=2, records=False),
    )
    # Lines after batches 2 and 4 of 6, each read once the next step is on its
    # way; then the epoch's record (its NaN check, its means).
    assert events == ["step"] * 3 + ["sync", "step", "step", "sync", "step", "sync", "sync"]
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[3] for line in lines] == ["2/6", "4/6"]
    expected = np.mean(_cifar_like(192, 0)[1][:64]), np.mean(_cifar_like(192, 0)[1][:128])
    assert [float(line.split()[8]) for line in lines] == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize("devices", [1, 8])
def test_the_callers_state_stays_usable_after_fit_donates_its_copy(devices):
    # fit donates the state to its steps; the arrays passed in are copied first
    # (on 8 devices, device_put(may_alias=False) alone still shared device 0's buffer).
    mesh = data_mesh(jax.devices()[:devices])
    replicated = jax.NamedSharding(mesh, jax.sharding.PartitionSpec())
    state = {"w": jnp.arange(3.0)}  # on the default device, as a user makes it
    placed = {"w": jax.device_put(jnp.arange(3.0), replicated)}  # or placed as fit would

    def step(state, batch):
        return {"w": state["w"] + 1}, _label_sums(state, batch)

    for given in (state, placed):
        result = fit(step, given, _batches(), epochs=1, mesh=mesh, log=Logging(progress=False))
        assert not given["w"].is_deleted()
        assert given["w"].tolist() == [0.0, 1.0, 2.0]
        assert result.state["w"].tolist() == [2.0, 3.0, 4.0]


def _diverging(state, batch):
    # The weight doubles each step: past float32's range by step 130, then inf - inf = nan.
    w = state["w"] * 2.0
    mask = batch_mask(batch)
    return {"w": w}, {"loss": jnp.sum((w - w * 0.5 - w * 0.5 + w) * mask), "count": jnp.sum(mask)}


def test_a_metric_that_becomes_nan_stops_the_run_before_anything_is_saved(tmp_path):
    batches = [{k: v for k, v in b.items() if k != "mask"} for b in _batches().iter_epoch(0)]
    source = loaders.wrap(batches * 40)  # 80 batches an epoch
    run = dict(epochs=5, mesh=data_mesh(jax.devices()[:1]), log=Logging(progress=False))
    checkpoint = tmp_path / "checkpoints"
    with pytest.raises(
        NonFiniteMetric,
        match=r"loss sum is nan at step 130 \(epoch 2, batch 50\); it became so after step 120",
    ):
        fit(
            _diverging,
            {"w": jnp.ones(())},
            source,
            checkpoint=Checkpointing(checkpoint, every=10),
            **run,
        )
    from jaxfeed.training.checkpoint import latest

    assert latest(checkpoint)["step"] == 120  # the last save before it, none after
    result = fit(_diverging, {"w": jnp.ones(())}, source, nan_policy="continue", **run)
    assert len(result.history) == 5 and not math.isfinite(result.history[-1]["loss"])


def test_an_unwritable_history_path_is_refused_before_training(tmp_path):
    (tmp_path / "file").write_text("")  # a file where its folder should be
    with pytest.raises(ValueError, match=r"history_path .*file/h\.json cannot be written"):
        fit(
            _diverging,
            {"w": jnp.ones(())},
            _batches(),
            epochs=1,
            log=Logging(history_path=tmp_path / "file" / "h.json"),
        )

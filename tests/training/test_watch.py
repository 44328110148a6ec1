"""Training you can watch: TensorBoard scalars read back from the event file,
``eval_every`` records, per-step callbacks, and the warning for a step whose
sums count padding rows. (The CLI's progress lines: tests/cli/test_progress.py.)"""

import json
import os
import struct
import subprocess
import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxfeed
from jaxfeed.training.padding_check import PaddingCountedWarning

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 300

rng = np.random.default_rng(0)
Y = rng.integers(0, 4, 1000)
X = (rng.normal(size=(1000, 16)) + 2 * np.eye(4, 16)[Y]).astype(np.float32)
TX = optax.sgd(0.1, momentum=0.9)


def _sources(batch_size: int = 64):
    train = jaxfeed.make("numpy", dataset={"x": X[:800], "y": Y[:800]}, batch_size=batch_size)
    test = jaxfeed.make("numpy", dataset={"x": X[800:], "y": Y[800:]}, batch_size=200,
                        shuffle=False)  # fmt: skip
    return train, test


def _sums(params, batch, masked=True):
    mask = jaxfeed.batch_mask(batch) if masked else jnp.ones(batch["y"].shape[0])
    logits = batch["x"] @ params["w"]
    nll = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"])
    hit = (logits.argmax(-1) == batch["y"]).astype(jnp.float32)
    return {"loss": (nll * mask).sum(), "accuracy": (hit * mask).sum(), "count": mask.sum()}


def _step(masked=True):
    def step(state, batch):
        def loss(params):
            s = _sums(params, batch, masked)
            return s["loss"] / jnp.maximum(s["count"], 1), s

        grads, s = jax.grad(loss, has_aux=True)(state["params"])
        updates, opt_state = TX.update(grads, state["opt_state"], state["params"])
        return {"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state}, s

    return step


def _eval_step(state, batch):
    return _sums(state["params"], batch)


def _state():
    params = {"w": jnp.zeros((16, 4))}
    return {"params": params, "opt_state": TX.init(params)}


def _cli(tmp_path: Path, *args: str) -> str:
    """``jaxfeed train ARGS > file``: stdout is a file, not a terminal."""
    out = tmp_path / "log.txt"
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    with out.open("w") as file:
        subprocess.run([sys.executable, "-m", "jaxfeed", "train", "--batch-size", "256", *args],
                       stdout=file, stderr=subprocess.STDOUT, env=env, timeout=TIMEOUT,
                       check=True)  # fmt: skip
    return out.read_text()


def _events(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the TensorBoard event files under ``directory``, read back
    from the TFRecord framing (length, CRC, Event proto, CRC)."""
    from tensorboardX.proto.event_pb2 import Event

    scalars: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(directory.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        at = 0
        while at < len(data):
            (length,) = struct.unpack("<Q", data[at : at + 8])
            event = Event.FromString(data[at + 12 : at + 12 + length])
            at += 12 + length + 4
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


def test_tensorboard_scalars_are_the_history(tmp_path):
    train, test = _sources()
    result = jaxfeed.fit(_step(), _state(), train, epochs=2, eval=test, eval_step=_eval_step,
                         log=jaxfeed.Logging(tensorboard=tmp_path / "tb", every=5))  # fmt: skip
    scalars = _events(tmp_path / "tb")
    history = result.history
    assert [step for step, _ in scalars["epoch/loss"]] == [m["step"] for m in history] == [13, 26]
    np.testing.assert_allclose([v for _, v in scalars["epoch/loss"]],
                               [m["loss"] for m in history], rtol=1e-6)  # fmt: skip
    np.testing.assert_allclose([v for _, v in scalars["eval/accuracy"]],
                               [m["eval_accuracy"] for m in history], rtol=1e-6)  # fmt: skip
    assert [step for step, _ in scalars["train/loss"]] == [5, 10, 18, 23]  # batches 5, 10 of each
    # The CLI writes them too, with its epoch records.
    _cli(tmp_path, "--epochs", "1", "--quiet", "--tensorboard", str(tmp_path / "cli"),
         "--json", str(tmp_path / "cli.json"))  # fmt: skip
    cli = _events(tmp_path / "cli")
    record = json.loads((tmp_path / "cli.json").read_text())["epochs"][0]
    assert cli["eval/accuracy"] == [(16, pytest.approx(record["test_accuracy"], rel=1e-6))]


class Hooks(jaxfeed.Callback):
    """Keeps what each hook was told."""

    def __init__(self):
        self.steps, self.evals, self.epochs = [], [], []

    def on_step(self, info):
        self.steps.append(info)

    def on_eval(self, record):
        self.evals.append(record)

    def on_epoch(self, record):
        self.epochs.append(record)


def test_eval_every_records_evaluations_between_epochs_and_trains_the_same():
    train, test = _sources()
    plain = jaxfeed.fit(_step(), _state(), train, epochs=2, eval=test, eval_step=_eval_step)
    seen, hooks = [], Hooks()
    result = jaxfeed.fit(_step(), _state(), train, epochs=2, eval=test, eval_step=_eval_step,
                         eval_every=5, callbacks=[hooks, seen.append])  # fmt: skip
    assert [m["step"] for m in result.history] == [5, 10, 13, 15, 20, 25, 26]
    assert [m["epoch"] for m in result.history] == [1, 1, 1, 2, 2, 2, 2]
    assert all("eval_accuracy" in m for m in result.history)
    # Evaluating in between changes nothing in the training.
    for a, b in zip(jax.tree.leaves(plain.state), jax.tree.leaves(result.state), strict=True):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    again = jaxfeed.evaluate_metrics(_eval_step, result.state, test)
    assert abs(again["accuracy"] - result.history[-1]["eval_accuracy"]) < 1e-6
    # A function gets every record; a Callback each step, and each record at one hook.
    assert seen == result.history
    assert [s["step"] for s in hooks.steps] == list(range(1, 27))
    assert hooks.steps[13] == {"epoch": 2, "batch": 1, "num_batches": 13, "step": 14}
    assert [m["step"] for m in hooks.evals] == [5, 10, 15, 20, 25]
    assert [m["step"] for m in hooks.epochs] == [13, 26]
    # A function of the step: the Flax tutorial's "after steps 201, 401, ..." cadence.
    hooks = Hooks()
    odd = jaxfeed.fit(_step(), _state(), train, epochs=1, eval=test, eval_step=_eval_step,
                      eval_every=lambda s: s % 4 == 1 and s > 1, callbacks=[hooks])  # fmt: skip
    assert [m["step"] for m in odd.history] == [5, 9, 13]
    # The record of the epoch's last step is the epoch's: on_epoch, not on_eval.
    assert [m["step"] for m in hooks.evals] == [5, 9] and hooks.epochs == odd.history[2:]
    with pytest.raises(TypeError, match=r"pass an instance \(MyCallback\(\), not MyCallback\)"):
        jaxfeed.fit(_step(), _state(), train, epochs=1, callbacks=[Hooks])
    with pytest.raises(ValueError, match="eval_every must be an int >= 1"):
        jaxfeed.fit(_step(), _state(), train, epochs=1, eval_every=0)


def test_a_step_that_counts_padding_rows_is_warned_once():
    train, _ = _sources(batch_size=64)  # 800 rows: the 13th batch holds 32 padding rows
    with pytest.warns(PaddingCountedWarning, match=r"accuracy, loss sum\(s\) change .*batch_mask"):
        jaxfeed.fit(_step(masked=False), _state(), train, epochs=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PaddingCountedWarning)
        jaxfeed.fit(_step(), _state(), train, epochs=2)  # weighed by the mask: no warning
        jaxfeed.fit(_step(masked=False), _state(), train, epochs=1, check_mask=False)
    with pytest.warns(PaddingCountedWarning) as caught:
        jaxfeed.fit(_step(masked=False), _state(), train, epochs=3)
    assert len(caught) == 1, "warned more than once"

"""Flax NNX in `jaxfeed.fit` (docs/flax.md): the Flax NNX MNIST tutorial ported, with the
tutorial's own numbers at every evaluation; Ctrl-C and resume of NNX state, bit-identical;
`jaxfeed.nnx`'s refusals; NNX objects passed to `fit` as they are.

The tutorial is Flax's ``docs_nnx/mnist_tutorial`` as of flax 0.12.7 (the CNN with
BatchNorm and Dropout, ``nnx.view``, ``optimizer.update(model, grads)``), scaled down to
run in seconds on 2 CPU cores: mnist-sample instead of ``tfds.load('mnist')``, 60 train
steps evaluated every 20 instead of 1200 every 200, and 8/16 conv channels instead of
32/64. Both sides run the same scaled-down program; everything else is the tutorial's text.
"""

import signal
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jaxfeed.loaders._doors.tf import import_tensorflow

import jaxfeed
from jaxfeed.training.padding_check import PaddingCountedWarning

TRAIN_STEPS, EVAL_EVERY, BATCH_SIZE = 60, 20, 32  # the tutorial's: 1200, 200, 32
LEARNING_RATE, MOMENTUM = 0.005, 0.9
CHANNELS = (8, 16)  # the tutorial's: (32, 64)


def tutorial_datasets() -> tuple:
    """Section 2 of the tutorial, on mnist-sample's arrays instead of ``tfds.load``. A
    fresh pipeline per call: a tf.data shuffle draws a new order for each iterator."""
    tf = import_tensorflow()
    tf.random.set_seed(0)  # Set the random seed for reproducibility.
    splits = {s: jaxfeed.load_dataset("mnist-sample", s) for s in ("train", "test")}
    train_ds, test_ds = (
        tf.data.Dataset.from_tensor_slices(
            {"image": splits[s]["image"], "label": splits[s]["label"].astype(np.int64)}
        )
        for s in ("train", "test")
    )
    train_ds = train_ds.map(
        lambda sample: {
            "image": tf.cast(sample["image"], tf.float32) / 255,
            "label": sample["label"],
        }
    )  # normalize train set
    test_ds = test_ds.map(
        lambda sample: {
            "image": tf.cast(sample["image"], tf.float32) / 255,
            "label": sample["label"],
        }
    )  # Normalize the test set.
    train_ds = train_ds.repeat().shuffle(1024)
    train_ds = train_ds.batch(BATCH_SIZE, drop_remainder=True).take(TRAIN_STEPS).prefetch(1)
    test_ds = test_ds.batch(BATCH_SIZE, drop_remainder=True).prefetch(1)
    # The shuffle took its seed when it was made: leave no global seed behind, or an
    # unseeded shuffle in a later test would be seeded (and not refused where it must be).
    tf.random.set_seed(None)
    return train_ds, test_ds


class CNN(nnx.Module):
    """A simple CNN model (section 3 of the tutorial)."""

    def __init__(self, *, rngs: nnx.Rngs):
        c1, c2 = CHANNELS
        self.conv1 = nnx.Conv(1, c1, kernel_size=(3, 3), rngs=rngs)
        self.batch_norm1 = nnx.BatchNorm(c1, rngs=rngs)
        self.dropout1 = nnx.Dropout(rate=0.025)
        self.conv2 = nnx.Conv(c1, c2, kernel_size=(3, 3), rngs=rngs)
        self.batch_norm2 = nnx.BatchNorm(c2, rngs=rngs)
        self.avg_pool = partial(nnx.avg_pool, window_shape=(2, 2), strides=(2, 2))
        self.linear1 = nnx.Linear(7 * 7 * c2, 256, rngs=rngs)
        self.dropout2 = nnx.Dropout(rate=0.025)
        self.linear2 = nnx.Linear(256, 10, rngs=rngs)

    def __call__(self, x, rngs: nnx.Rngs | None = None):
        x = self.avg_pool(nnx.relu(self.batch_norm1(self.dropout1(self.conv1(x), rngs=rngs))))
        x = self.avg_pool(nnx.relu(self.batch_norm2(self.conv2(x))))
        x = x.reshape(x.shape[0], -1)  # flatten
        x = nnx.relu(self.dropout2(self.linear1(x), rngs=rngs))
        x = self.linear2(x)
        return x


def tutorial_objects() -> tuple:
    """The model, the optimizer and the train loop's Rngs (sections 3, 4 and 6)."""
    model = CNN(rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adamw(LEARNING_RATE, MOMENTUM), wrt=nnx.Param)
    return model, optimizer, nnx.Rngs(0)


def run_tutorial() -> tuple[dict, CNN]:
    """Sections 4 to 6 of the tutorial as written: its metrics_history, and the model."""
    train_ds, test_ds = tutorial_datasets()
    model, optimizer, rngs = tutorial_objects()
    metrics = nnx.MultiMetric(
        accuracy=nnx.metrics.Accuracy(),
        loss=nnx.metrics.Average("loss"),
    )

    def loss_fn(model: CNN, batch, rngs: nnx.Rngs | None = None):
        logits = model(batch["image"], rngs)
        loss = optax.softmax_cross_entropy_with_integer_labels(
            logits=logits, labels=batch["label"]
        ).mean()
        return loss, logits

    @nnx.jit
    def train_step(model, optimizer, metrics, rngs, batch):
        """Train for a single step."""
        grad_fn = nnx.value_and_grad(loss_fn, has_aux=True)
        (loss, logits), grads = grad_fn(model, batch, rngs)
        metrics.update(loss=loss, logits=logits, labels=batch["label"])  # In-place updates.
        optimizer.update(model, grads)  # In-place updates.

    @nnx.jit
    def eval_step(model: CNN, metrics: nnx.MultiMetric, batch):
        loss, logits = loss_fn(model, batch)
        metrics.update(loss=loss, logits=logits, labels=batch["label"])  # In-place updates.

    metrics_history = {"train_loss": [], "train_accuracy": [], "test_loss": [], "test_accuracy": []}
    train_model = nnx.view(model, deterministic=False, use_running_average=False)
    eval_model = nnx.view(model, deterministic=True, use_running_average=True)
    for step, batch in enumerate(train_ds.as_numpy_iterator()):
        train_step(train_model, optimizer, metrics, rngs, batch)
        if step > 0 and (step % EVAL_EVERY == 0 or step == TRAIN_STEPS - 1):
            for metric, value in metrics.compute().items():  # Compute the metrics.
                metrics_history[f"train_{metric}"].append(value)  # Record the metrics.
            metrics.reset()  # Reset the metrics for the test set.
            for test_batch in test_ds.as_numpy_iterator():
                eval_step(eval_model, metrics, test_batch)
            for metric, value in metrics.compute().items():
                metrics_history[f"test_{metric}"].append(value)
            metrics.reset()  # Reset the metrics for the next training epoch.
    return metrics_history, model


# The port: the tutorial's loss with per-row values kept (summed over the real rows
# by metric_sums), and its steps returning metric sums instead of updating a MultiMetric.


def loss_fn(model: CNN, batch, rngs: nnx.Rngs | None = None):
    logits = model(batch["image"], rngs)
    per_row = optax.softmax_cross_entropy_with_integer_labels(logits=logits, labels=batch["label"])
    mask = jaxfeed.batch_mask(batch)
    return (per_row * mask).sum() / mask.sum(), (per_row, logits)


@jaxfeed.nnx.step
def train_step(model: CNN, optimizer: nnx.Optimizer, rngs: nnx.Rngs, batch):
    train_model = nnx.view(model, deterministic=False, use_running_average=False)
    grad_fn = nnx.value_and_grad(loss_fn, has_aux=True)
    (_, (per_row, logits)), grads = grad_fn(train_model, batch, rngs)
    optimizer.update(train_model, grads)
    hit = logits.argmax(axis=1) == batch["label"]
    return jaxfeed.nnx.metric_sums(batch, loss=per_row, accuracy=hit)


@jaxfeed.nnx.eval_step
def eval_step(model: CNN, optimizer: nnx.Optimizer, rngs: nnx.Rngs, batch):
    eval_model = nnx.view(model, deterministic=True, use_running_average=True)
    _, (per_row, logits) = loss_fn(eval_model, batch)
    hit = logits.argmax(axis=1) == batch["label"]
    return jaxfeed.nnx.metric_sums(batch, loss=per_row, accuracy=hit)


def tutorial_cadence(step: int) -> bool:
    """The tutorial's ``step > 0 and (step % eval_every == 0 or step == train_steps - 1)``
    over its 0-based step; fit's steps count completed steps, from 1."""
    return step - 1 > 0 and ((step - 1) % EVAL_EVERY == 0 or step == TRAIN_STEPS)


def run_port(**kwargs) -> jaxfeed.FitResult:
    train_ds, test_ds = tutorial_datasets()
    return jaxfeed.fit(
        train_step,
        nnx.split(tutorial_objects()),
        jaxfeed.wrap(train_ds),
        epochs=1,
        eval=jaxfeed.wrap(test_ds),
        eval_step=eval_step,
        eval_every=tutorial_cadence,
        mesh=jax.devices()[:1],  # the tutorial's one device (a sum over 8 adds in another order)
        log=jaxfeed.Logging(progress=False, every=0),
        **kwargs,
    )


def _bits(tree) -> list[bytes]:
    """Every array's bytes (a PRNG key's data): equal bits, not values within rounding."""

    def raw(x):
        return jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x

    return [np.asarray(raw(leaf)).tobytes() for leaf in jax.tree.leaves(tree)]


@pytest.mark.slow  # whole training runs of a CNN, ~15 s each on 2 cores
def test_the_tutorial_port_reproduces_the_tutorials_numbers():
    history, model = run_tutorial()
    result = run_port()
    records = result.history

    assert [r["step"] for r in records] == [21, 41, 60]  # after the tutorial's steps 20, 40, 59
    assert len(history["test_loss"]) == len(records)
    for name in ("accuracy", "loss"):
        tutorial = np.array(history[f"train_{name}"] + history[f"test_{name}"], np.float32)
        port = np.array([r[name] for r in records] + [r[f"eval_{name}"] for r in records])
        # The same batches and the same float32 steps (the parameters below are
        # bit-identical), so accuracy (a count) is identical. The loss is not summed
        # alike: the tutorial adds batch means, the port per-row sums, 32 times as
        # large (a power of two); XLA's CPU code adds the rows in an order that
        # differs by CPU, so the two agree to float32's rounding of a sum of 32
        # (one ulp, 1.2e-7, seen on an AMD EPYC; identical on a Xeon).
        if name == "accuracy":
            assert port.astype(np.float32).tolist() == tutorial.tolist(), name
        else:
            np.testing.assert_allclose(port.astype(np.float32), tutorial, rtol=1e-6, err_msg=name)
    assert records[-1]["eval_accuracy"] > 0.5  # it learned (10 classes)

    trained, _, _ = nnx.merge(*result.state)
    assert _bits(nnx.state(trained)) == _bits(nnx.state(model))  # parameters and batch stats


def _digits(rows: int, split: str = "train") -> dict[str, np.ndarray]:
    """``rows`` mnist-sample digits as the tutorial feeds them: float32 [0, 1], NHWC."""
    data = jaxfeed.load_dataset("mnist-sample", split)
    return {"image": data["image"][:rows] / np.float32(255), "label": data["label"][:rows]}


@pytest.mark.slow  # whole training runs of a CNN, ~15 s each on 2 cores
def test_ctrl_c_and_resume_of_nnx_state_is_bit_identical(tmp_path):
    # BatchNorm's batch statistics would count padding rows: whole batches only.
    train = jaxfeed.make("numpy", dataset=_digits(512), batch_size=64, seed=0, drop_remainder=True)
    test = jaxfeed.make("numpy", dataset=_digits(256, "test"), batch_size=64, shuffle=False)

    def run(**kwargs) -> jaxfeed.FitResult:
        return jaxfeed.fit(
            train_step,
            nnx.split(tutorial_objects()),
            train,
            epochs=2,
            eval=test,
            eval_step=eval_step,
            eval_every=5,
            mesh=jax.devices()[:1],
            log=jaxfeed.Logging(progress=False, every=0),
            **kwargs,
        )

    class CtrlC(jaxfeed.Callback):  # the signal a terminal's Ctrl-C sends, mid epoch 2
        def on_step(self, info: dict) -> None:
            if info["step"] == 11:
                signal.raise_signal(signal.SIGINT)

    uninterrupted = run()
    checkpoints = jaxfeed.Checkpointing(tmp_path / "run", every=4)
    with pytest.raises(KeyboardInterrupt, match=r"stopped at epoch 2, batch 3 \(step 11\)"):
        run(checkpoint=checkpoints, callbacks=[CtrlC()])
    resumed = run(checkpoint=checkpoints, resume=True)

    # Model, optimizer and Rngs (its key and count: dropout draws on), bit for bit.
    assert _bits(resumed.state[1]) == _bits(uninterrupted.state[1])
    metrics = ("step", "loss", "accuracy", "eval_loss", "eval_accuracy")
    assert [{k: r[k] for k in metrics} for r in resumed.history] == [
        {k: r[k] for k in metrics} for r in uninterrupted.history
    ]
    model, _, rngs = nnx.merge(*resumed.state)
    assert isinstance(model, CNN) and int(rngs.default.count[...]) == 16 * 2  # 2 draws a step


class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs, tied: bool = False):
        self.first = nnx.Linear(8, 8, rngs=rngs)
        self.second = nnx.Linear(8, 8, rngs=rngs)
        if tied:
            self.second.kernel = self.first.kernel  # one Variable, reached twice

    def __call__(self, x):
        return self.second(nnx.relu(self.first(x)))


def _regression(rows: int = 256) -> jaxfeed.BatchSource:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 8)).astype(np.float32)
    return jaxfeed.make("numpy", dataset={"x": x, "y": np.roll(x, 1, axis=1)}, batch_size=32)


def _squared_error(model: MLP, batch) -> jax.Array:
    return ((model(batch["x"]) - batch["y"]) ** 2).sum(axis=1)


def _objects(tied: bool = False) -> tuple:
    model = MLP(nnx.Rngs(0), tied)
    return model, nnx.Optimizer(model, optax.sgd(0.01), wrt=nnx.Param)


def mlp_train(model: MLP, optimizer: nnx.Optimizer, batch):
    def loss_fn(model):
        per_row, mask = _squared_error(model, batch), jaxfeed.batch_mask(batch)
        return (per_row * mask).sum() / mask.sum(), per_row

    (_, per_row), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
    optimizer.update(model, grads)
    return jaxfeed.nnx.metric_sums(batch, loss=per_row)


mlp_step = jaxfeed.nnx.step(mlp_train)


def test_nnx_objects_as_the_state_train_the_same_as_split_ones():
    def objects_step(state, batch):  # fit's own contract, on NNX objects updated in place
        model, optimizer = state
        return state, mlp_train(model, optimizer, batch)

    split = jaxfeed.fit(
        mlp_step,
        nnx.split(_objects()),
        _regression(),
        epochs=2,
        log=jaxfeed.Logging(progress=False),
    )
    objects = jaxfeed.fit(
        objects_step, _objects(), _regression(), epochs=2, log=jaxfeed.Logging(progress=False)
    )

    assert [r["loss"] for r in objects.history] == [r["loss"] for r in split.history]
    assert _bits(nnx.state(objects.state)) == _bits(split.state[1])


def test_split_keeps_a_shared_variable_shared_objects_lose_it():
    def objects_step(state, batch):
        return state, mlp_train(*state, batch)

    split = jaxfeed.fit(mlp_step, nnx.split(_objects(tied=True)), _regression(), epochs=1)
    model, _ = nnx.merge(*split.state)
    assert model.first.kernel is model.second.kernel  # trained as one weight

    # As a pytree, each reference is a leaf of its own: the first step unties them.
    (model, _), _ = jaxfeed.fit(objects_step, _objects(tied=True), _regression(), epochs=1)
    assert not np.array_equal(model.first.kernel[...], model.second.kernel[...])


def test_a_step_never_changes_the_state_it_is_given():
    state = nnx.split(_objects())
    before = _bits(state)
    batch = next(iter(_regression().iter_epoch(0)))
    first, second = (mlp_step(state, batch) for _ in range(2))
    assert _bits(state) == before and _bits(first) == _bits(second)


def test_the_padding_check_sees_batchnorm_counting_padding_rows():
    # 250 rows: the last batch has 26 real rows and 6 of padding, which the MLP ignores.
    jaxfeed.fit(mlp_step, nnx.split(_objects()), _regression(250), epochs=1)  # (no warning)

    # BatchNorm's batch statistics count them: the tutorial's CNN on a padded batch.
    padded = jaxfeed.make("numpy", dataset=_digits(100), batch_size=64)
    with pytest.warns(PaddingCountedWarning):
        jaxfeed.fit(
            train_step, nnx.split(tutorial_objects()), padded, epochs=1, mesh=jax.devices()[:1]
        )


def test_a_step_of_objects_not_split_is_refused_before_any_data_moves():
    with pytest.raises(
        TypeError, match=r"needs fit's state as nnx.split\(objects\).*got a tuple of MLP, Optimizer"
    ):
        jaxfeed.fit(mlp_step, _objects(), _regression(), epochs=1)


def test_metric_sums_sum_real_rows_and_refuse_a_batch_mean():
    batch = {"x": jnp.arange(4.0), "mask": jnp.array([True, True, True, False])}
    sums = jaxfeed.nnx.metric_sums(batch, loss=jnp.array([1.0, 2.0, 3.0, 100.0]),
                                   accuracy=jnp.array([True, False, True, True]))  # fmt: skip
    assert {k: float(v) for k, v in sums.items()} == {"loss": 6.0, "accuracy": 2.0, "count": 3.0}
    with pytest.raises(ValueError, match=r"'loss'; got shape \(\) \(a batch mean\?"):
        jaxfeed.nnx.metric_sums(batch, loss=jnp.float32(1.0))
    with pytest.raises(ValueError, match=r"one value per row, shape \(4,\), for 'loss'"):
        jaxfeed.nnx.metric_sums(batch, loss=jnp.ones((4, 7)))

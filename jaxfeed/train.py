"""The common training loop: any `BatchSource` -> device feed -> jitted SGD step."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec
from tqdm import tqdm  # not tqdm.auto: it warns in Jupyter without ipywidgets

from jaxfeed.model import Params, init_params, predict
from loaders.protocol import BatchSource
from sharding import DeviceFeed, batch_sharding

Sums = dict[str, jax.Array]  # running on-device totals: loss, correct, count


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters; defaults reach >= 90% on mnist-sample in 5 epochs."""

    epochs: int = 5
    learning_rate: float = 0.05
    momentum: float = 0.9
    seed: int = 0
    steps_per_transfer: int = 1  # k > 1: k batches per transfer, run in one lax.scan


def _mask(batch: Mapping[str, jax.Array]) -> jax.Array:
    if "mask" in batch:
        return batch["mask"].astype(jnp.float32)
    return jnp.ones(batch["label"].shape, jnp.float32)


def _sums(log_probs: jax.Array, batch: Mapping[str, jax.Array]) -> Sums:
    """Masked totals: padding rows never count towards loss or accuracy."""
    mask = _mask(batch)
    labels = batch["label"]
    nll = -jnp.take_along_axis(log_probs, labels[:, None], axis=1)[:, 0]
    correct = (jnp.argmax(log_probs, axis=1) == labels).astype(jnp.float32)
    return {"loss": jnp.sum(nll * mask), "correct": jnp.sum(correct * mask), "count": jnp.sum(mask)}


def _add(a: Sums, b: Sums) -> Sums:
    return jax.tree.map(jnp.add, a, b)


def _zero_sums() -> Sums:
    return {k: jnp.zeros((), jnp.float32) for k in ("loss", "correct", "count")}


def make_train_step(config: TrainConfig) -> Callable:
    """A jitted SGD-with-momentum step on a masked mean loss.

    With ``config.steps_per_transfer`` k > 1 it takes ``[k', B, ...]``
    stacks (k' <= k) and runs their k' steps in one `jax.lax.scan`.
    """

    def loss_fn(params: Params, batch: Mapping[str, jax.Array]) -> tuple[jax.Array, Sums]:
        sums = _sums(predict(params, batch["image"]), batch)
        return sums["loss"] / jnp.maximum(sums["count"], 1.0), sums

    def one_step(carry, batch):
        params, velocity, totals = carry
        grads, sums = jax.grad(loss_fn, has_aux=True)(params, batch)
        velocity = jax.tree.map(lambda v, g: config.momentum * v + g, velocity, grads)
        params = jax.tree.map(lambda p, v: p - config.learning_rate * v, params, velocity)
        return (params, velocity, _add(totals, sums)), None

    if config.steps_per_transfer == 1:
        return jax.jit(
            lambda params, velocity, totals, batch: one_step((params, velocity, totals), batch)[0]
        )
    return jax.jit(
        lambda params, velocity, totals, stack: jax.lax.scan(
            one_step, (params, velocity, totals), stack
        )[0]
    )


@jax.jit
def _eval_step(params: Params, totals: Sums, batch: Mapping[str, jax.Array]) -> Sums:
    return _add(totals, _sums(predict(params, batch["image"]), batch))


def _serialize_steps(sharding: NamedSharding) -> bool:
    """Whether each step must finish before the next is dispatched.

    On CPU, a step over several devices all-reduces across one thread per
    device. With steps dispatched ahead, queued executions can hold the small
    CPU thread pool while a running all-reduce waits for its last device
    thread: XLA aborts after 40 s ("only 7 of 8 arrived"; seen with jaxlib
    0.10.2 on 2 cores, 8 simulated devices, and across processes with gloo).
    GPU/TPU and single-device CPU keep asynchronous dispatch.
    """
    return sharding.mesh.devices.flat[0].platform == "cpu" and sharding.mesh.devices.size > 1


def evaluate(
    params: Params, source: BatchSource, sharding: NamedSharding | jax.sharding.Mesh | None = None
) -> float:
    """Accuracy of ``params`` over one pass of ``source`` (padding excluded)."""
    sharding = batch_sharding(sharding)
    totals = _zero_sums()
    serialize_steps = _serialize_steps(sharding)
    with DeviceFeed(source, sharding) as feed:
        for batch in feed:
            totals = _eval_step(params, totals, batch)
            if serialize_steps:
                jax.block_until_ready(totals)
    totals = _to_host(totals)
    return totals["correct"] / totals["count"]


def _to_host(totals: Sums) -> dict[str, float]:
    """Replicated scalars to floats; reads this process's copy, so it also
    works for multi-host arrays that are not fully addressable."""
    return {k: float(v.addressable_data(0)) for k, v in totals.items()}


def _run_epoch(
    feed: DeviceFeed,
    step: Callable,
    state: tuple[Params, Params, Sums],
    serialize_steps: bool,
    on_steps: Callable[[int], object],
) -> tuple[Params, Params, Sums, float]:
    """Steps through ``feed``; returns the new (params, velocity, totals) and
    the seconds the device may have idled waiting for data (see `train`)."""
    params, velocity, totals = state
    wait = 0.0
    while True:
        t = time.perf_counter()
        step_running = not totals["count"].is_ready()
        batch = next(feed, None)
        if not (step_running and not totals["count"].is_ready()):
            # The device may have idled for (part of) this wait: counted in
            # full, so the figure is an upper bound.
            wait += time.perf_counter() - t
        if batch is None:
            return params, velocity, totals, wait
        params, velocity, totals = step(params, velocity, totals, batch)
        if serialize_steps:
            jax.block_until_ready(totals)
        on_steps(len(next(iter(batch.values()))) if feed.steps_per_transfer > 1 else 1)


def train(
    train_source: BatchSource,
    test_source: BatchSource | None,
    config: TrainConfig = TrainConfig(),
    *,
    sharding: NamedSharding | jax.sharding.Mesh | None = None,
    on_epoch: Callable[[dict], None] | None = None,
    progress: bool | None = None,
) -> tuple[Params, list[dict]]:
    """Trains the MLP; returns the final parameters and per-epoch metrics.

    Args:
      train_source: training batches (any `BatchSource`).
      test_source: evaluated after every epoch, or None.
      config: hyper-parameters.
      sharding: batch sharding or mesh (default: all devices).
      on_epoch: called with each epoch's metrics as soon as they exist.
      progress: show a tqdm bar (default: only on a terminal).

    Each epoch's metrics: ``loss``, ``train_accuracy`` (running, over the
    epoch's batches), ``test_accuracy``, ``seconds``, ``samples_per_second``
    and ``data_wait_fraction``: the share of the epoch's wall time the device
    may have idled waiting for data. With asynchronous dispatch the loop
    reaches ``next(feed)`` while the previous step still computes; a wait
    that began and ended with that step still running was hidden by it and
    is not counted. Every other wait is counted in full (an upper bound).
    """
    sharding = batch_sharding(sharding)
    replicated = NamedSharding(sharding.mesh, PartitionSpec())
    params = jax.device_put(init_params(jax.random.key(config.seed)), replicated)
    velocity = jax.tree.map(jnp.zeros_like, params)
    step = make_train_step(config)
    serialize_steps = _serialize_steps(sharding)
    history = []
    k = config.steps_per_transfer
    feed = DeviceFeed(train_source, sharding, epoch=0, steps_per_transfer=k)
    try:
        for epoch in range(config.epochs):
            totals = jax.device_put(_zero_sums(), replicated)
            started = time.perf_counter()
            with tqdm(
                total=feed.num_batches,
                desc=f"epoch {epoch + 1}",
                leave=False,
                disable=None if progress is None else not progress,  # None: TTY only
            ) as bar:
                params, velocity, totals, wait = _run_epoch(
                    feed, step, (params, velocity, totals), serialize_steps, bar.update
                )
            feed.close()
            if epoch + 1 < config.epochs:
                # Opened now, so its first batches load while this epoch is evaluated.
                feed = DeviceFeed(train_source, sharding, epoch=epoch + 1, steps_per_transfer=k)
            totals = _to_host(totals)
            seconds = time.perf_counter() - started
            metrics = {
                "epoch": epoch + 1,
                "loss": totals["loss"] / totals["count"],
                "train_accuracy": totals["correct"] / totals["count"],
                "test_accuracy": None,
                "seconds": seconds,
                "samples_per_second": totals["count"] / seconds,
                "data_wait_fraction": wait / seconds,
            }
            if test_source is not None:
                metrics["test_accuracy"] = evaluate(params, test_source, sharding)
            history.append(metrics)
            if on_epoch is not None:
                on_epoch(metrics)
    finally:
        feed.close()  # also when a loader error ends training early
    return params, history

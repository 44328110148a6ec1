"""The LM trainer: one short user of `jaxfeed.fit` with a Flax NNX step (docs/text.md)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxfeed.loaders.protocol import BatchSource
from jaxfeed.nnx import step
from jaxfeed.textlm.model import ModelConfig, TransformerLM, loss_sums
from jaxfeed.training.log import Logging
from jaxfeed.training.loop import fit
from jaxfeed.training.steps import MeshLike, Sums


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters; the defaults train the tiny model on CPU in seconds."""

    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    epochs: int = 1
    learning_rate: float = 3e-3
    seed: int = 0
    record_every: int = 25  # a record (the mean loss since the last one) every this many steps


@step
def train_step(model: TransformerLM, optimizer: nnx.Optimizer, batch: Mapping) -> Sums:
    def mean_loss(model: TransformerLM) -> tuple[jax.Array, Sums]:
        sums = loss_sums(model, batch)
        return sums["loss"] / jnp.maximum(sums["count"], 1.0), sums

    (_, sums), grads = nnx.value_and_grad(mean_loss, has_aux=True)(model)
    optimizer.update(model, grads)
    return sums


def init_state(config: TrainConfig) -> tuple:
    """``nnx.split((model, optimizer))``: fit's state, from ``config.seed``."""
    model = TransformerLM(config.model, rngs=nnx.Rngs(config.seed))
    optimizer = nnx.Optimizer(model, optax.adamw(config.learning_rate), wrt=nnx.Param)
    return nnx.split((model, optimizer))


def train(
    source: BatchSource,
    config: TrainConfig = TrainConfig(),
    *,
    mesh: MeshLike = None,
    log: Logging | None = None,
) -> tuple[TransformerLM, list[dict]]:
    """Trains the LM with `jaxfeed.fit`; returns the trained model and fit's records.

    Args:
      source: batches of ``input_ids``, ``segment_ids`` and ``positions``, all
        ``[B, L]`` with ``L <= config.model.max_len`` (the batches of
        ``jaxfeed.make(..., pack=L)``, ``pad=`` or ``bucket=``; docs/text.md).
      config: hyper-parameters and the model's sizes.
      mesh: as for `jaxfeed.fit` (default: all devices).
      log: as for `jaxfeed.fit` (default: no bar, no lines).

    Returns:
      ``(model, history)``: one record every ``config.record_every`` steps and
      at each epoch's end; a record's ``loss`` is the mean per predicted token
      over its steps.
    """
    result = fit(
        train_step,
        init_state(config),
        source,
        epochs=config.epochs,
        eval_every=config.record_every,
        mesh=mesh,
        log=Logging(progress=False, every=0, records=False) if log is None else log,
    )
    model, _ = nnx.merge(*result.state)
    return model, result.history

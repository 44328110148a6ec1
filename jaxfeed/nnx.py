"""Flax NNX in `jaxfeed.fit`: an NNX train step, run as fit's pure one (docs/flax.md).

`fit` trains a pytree with ``step(state, batch) -> (state, sums)``. An NNX
user has objects (a model, an ``nnx.Optimizer``, ``nnx.Rngs``) and a train
step that updates them in place. Flax's own functional API is the bridge::

    state = nnx.split((model, optimizer, rngs))  # (GraphDef, State): arrays only
    result = jaxfeed.fit(jaxfeed.nnx.step(train_step), state, train, epochs=3)
    nnx.update((model, optimizer, rngs), result.state[1])  # trained, in your objects

Why ``nnx.split`` and not the objects themselves: NNX objects are pytrees, and
fit takes them with the same results, but a pytree holds each reference on its
own, so a Variable reached twice (tied weights, one Variable in two objects)
is silently untied by the first step. ``nnx.split`` keeps each Variable once
and ``nnx.merge`` ties it again in every step. The split state is arrays only
(the GraphDef is static), so fit's jit, donation, placement on the mesh and
checkpoints treat it like any other state.

`metric_sums` turns per-row values into fit's sums (``nnx.MultiMetric`` keeps
running means, which a padded batch or a resumed epoch cannot add up); it
needs no Flax. Flax is imported when a step is traced, never by ``import jaxfeed``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from jaxfeed.training.steps import EvalStep, Step, Sums, batch_mask

__all__ = ["eval_step", "metric_sums", "step"]


def step(train_step: Callable[..., Mapping[str, jax.Array]]) -> Step:
    """Fit's ``step(state, batch) -> (state, sums)`` from an NNX-style step.

    Args:
      train_step: ``train_step(*objects, batch) -> sums``: updates the NNX
        objects in place (``optimizer.update(model, grads)``) and returns
        metric sums (see `metric_sums`). ``objects`` are the tuple (or list)
        that was split, unpacked; a single split object is passed as is.

    Returns:
      A step for `jaxfeed.fit` whose state is ``nnx.split(objects)``. It
      never changes the state it is given (fit may trace it twice on one).

    Example:
      >>> @jaxfeed.nnx.step  # doctest: +SKIP
      ... def train_step(model, optimizer, batch):
      ...     (loss, per_row), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model, batch)
      ...     optimizer.update(model, grads)
      ...     return jaxfeed.nnx.metric_sums(batch, loss=per_row)
      >>> jaxfeed.fit(train_step, nnx.split((model, optimizer)), train, epochs=3)  # doctest: +SKIP
    """

    @functools.wraps(train_step)
    def fit_step(state: Any, batch: Mapping[str, jax.Array]) -> tuple[Any, Sums]:
        from flax import nnx

        objects = _merge(state, "step")
        sums = train_step(*_arguments(objects), batch)
        return nnx.split(objects), sums

    return fit_step


def eval_step(evaluate: Callable[..., Mapping[str, jax.Array]]) -> EvalStep:
    """Fit's ``eval_step(state, batch) -> sums`` from ``evaluate(*objects, batch)
    -> sums`` on the NNX objects of ``state = nnx.split(objects)``.

    Evaluate on a view in evaluation mode, e.g. ``nnx.view(model,
    deterministic=True, use_running_average=True)``; whatever ``evaluate``
    changes in place is not kept.
    """

    @functools.wraps(evaluate)
    def fit_eval_step(state: Any, batch: Mapping[str, jax.Array]) -> Sums:
        return evaluate(*_arguments(_merge(state, "eval_step")), batch)

    return fit_eval_step


def metric_sums(batch: Mapping[str, jax.Array], /, **per_row: jax.Array) -> Sums:
    """Fit's metric sums: each per-row value summed over the batch's real rows,
    and their ``count``.

    Args:
      batch: the step's batch; its padding rows (`jaxfeed.batch_mask`) weigh 0.
      **per_row: ``name=values``, one value per row (shape ``[B]``): a loss
        before its ``.mean()``, a bool ``logits.argmax(-1) == labels`` for an
        accuracy. Means come out as ``sum / count`` in fit's records.

    Returns:
      ``{name: sum of values * mask, ..., "count": number of real rows}``.

    Raises:
      ValueError: a value is not one per row (a batch mean, a per-token array).
    """
    mask = batch_mask(batch)
    rows = mask.shape[0]
    sums = {}
    for name, values in per_row.items():
        shape = jnp.shape(values)
        if shape != (rows,):
            hint = " (a batch mean? pass the values before .mean())" if shape == () else ""
            raise ValueError(
                f"metric_sums needs one value per row, shape ({rows},), for {name!r}; got "
                f"shape {shape}{hint}. Reduce each row to one value first"
            )
        sums[name] = jnp.sum(jnp.asarray(values, jnp.float32) * mask)
    return {**sums, "count": jnp.sum(mask)}


def _merge(state: Any, who: str) -> Any:
    """The objects of ``state = nnx.split(objects)``, fresh: the step updates
    them in place, and the arrays of ``state`` must stay as they are."""
    from flax import nnx

    if not (isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], nnx.GraphDef)):
        raise TypeError(
            f"jaxfeed.nnx.{who} needs fit's state as nnx.split(objects), a (GraphDef, State) "
            f"pair; got {_describe(state)}. Pass state=nnx.split((model, optimizer, rngs)) "
            f"and get the objects back with nnx.merge(*result.state)"
        )
    graphdef, arrays = state
    return nnx.merge(graphdef, jax.tree.map(lambda leaf: leaf, arrays))  # new Variables


def _arguments(objects: Any) -> tuple:
    return tuple(objects) if isinstance(objects, tuple | list) else (objects,)


def _describe(state: Any) -> str:
    if isinstance(state, tuple | list):
        return f"a {type(state).__name__} of {', '.join(type(s).__name__ for s in state)}"
    return type(state).__name__

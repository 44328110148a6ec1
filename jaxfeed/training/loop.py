"""`fit`: one training loop for any model, fed by any `BatchSource`.

The user brings a step and a state; `fit` owns everything between the loader
and the step: a `DeviceFeed` per epoch (the next one opened while this one is
evaluated), the state replicated on the mesh, mask-aware metric sums, the
data-wait figure, a progress bar, a JSON history, verified checkpoints with
exact (and elastic) resume, Ctrl-C and preemption, a NaN policy, and
multi-process jobs. `fit` checks its arguments, compiles the steps and hands
the rest to a `TrainingRun` (`jaxfeed.training.run`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from jaxfeed.loaders.checks import check_bool, check_source
from jaxfeed.loaders.protocol import BatchSource, SkipsDataState
from jaxfeed.training.callbacks import Callback, as_callbacks
from jaxfeed.training.checkpoint import Checkpointer, Checkpointing
from jaxfeed.training.log import Logging, TrainingLog
from jaxfeed.training.run import CompiledSteps, NonFiniteMetric, TrainingRun
from jaxfeed.training.steps import (
    EvalStep,
    MeshLike,
    Step,
    Sums,
    batch_mask,
    batch_sharding_of,
    compile_eval,
    compile_step,
    evaluate_metrics,
    trace_step,
)

__all__ = [
    "FitResult",
    "NonFiniteMetric",
    "Sums",
    "batch_mask",
    "evaluate_metrics",
    "fit",
    "run_settings",
]


class FitResult(NamedTuple):
    """The trained state and one metrics record per epoch (see `fit`)."""

    state: Any
    history: list[dict]


def run_settings(train: BatchSource, settings: Mapping[str, Any] | None) -> dict[str, Any]:
    """What a checkpoint records of a run, and a resumed run must match: the
    caller's ``settings`` plus the global batch and the batches per epoch. The
    processes and devices may change (see `Checkpointer`): the same global
    batches then continue."""
    return {
        **(settings or {}),
        "global_batch": train.batch_size * jax.process_count(),
        "num_batches": train.num_batches,
    }


def run_topology(sharding: NamedSharding) -> dict[str, int]:
    """What a checkpoint records of the job's layout: it may change on resume."""
    return {"processes": jax.process_count(), "devices": sharding.mesh.devices.size}


def _copy(leaf: Any) -> Any:
    return leaf.copy() if isinstance(leaf, jax.Array | np.ndarray) else leaf


def fit(
    step: Step,
    state: Any,
    train: BatchSource,
    *,
    epochs: int,
    eval: BatchSource | None = None,
    eval_step: EvalStep | None = None,
    eval_every: int | Callable[[int], bool] | None = None,
    mesh: MeshLike = None,
    steps_per_transfer: int = 1,
    checkpoint: Checkpointing | str | os.PathLike | None = None,
    resume: bool = False,
    settings: Mapping[str, Any] | None = None,
    log: Logging | None = None,
    callbacks: Sequence[Callback | Callable[[dict], object]] = (),
    nan_policy: str = "stop",
    check_mask: bool = True,
) -> FitResult:
    """Trains ``state`` with ``step`` for ``epochs`` epochs of ``train`` (docs/fit.md).

    ``step(state, batch) -> (state, sums)`` gets the global batch as sharded
    arrays; ``sums`` are scalar metric sums over the batch's real rows (weigh
    rows by `batch_mask`) with a ``count`` entry. An epoch's record holds each
    metric's ``sum / count``, ``eval_``-prefixed for ``eval_step(state,
    batch) -> sums`` over ``eval``, and ``epoch``, ``step``, ``seconds``,
    ``samples_per_second`` and ``data_wait_fraction`` (and ``batch_shapes``,
    the shapes the step compiled for, when batches come in several: a
    bucketed sequence source). With ``eval_every``,
    a record also comes after every such step, over the steps since the
    previous record.

    Args:
      step, eval_step: see above; `fit` jits them. ``eval_step`` comes with ``eval``.
      state: a pytree of arrays (parameters, optimizer state...); replicated on the mesh.
      train, eval: the batches; ``eval`` (or None) is evaluated at every record.
      epochs: train until this many epochs are done, resumed ones included.
      eval_every: also make a record after every this many steps (counted
        from the run's start, resumed steps included), or after each step
        ``s`` for which ``eval_every(s)`` is true; every epoch's end still
        makes one (unless it just did).
      mesh: a `Mesh`, a batch `NamedSharding`, devices, or None for all devices.
      steps_per_transfer: k > 1 runs k steps per transfer in one `jax.lax.scan`.
      checkpoint: a directory or `Checkpointing`; ``resume=True`` continues
        from its newest checkpoint exactly (starts fresh if there is none).
      settings: JSON values a resumed run must share with the checkpoint's.
      log: what to report as it trains (`Logging`: the bar, progress lines,
        TensorBoard, the JSON history); None: ``Logging()``.
      callbacks: `Callback` objects (``on_step``, ``on_eval``, ``on_epoch``),
        or functions called with every record.
      nan_policy: ``"stop"``: a metric sum that is not finite stops the run
        with `NonFiniteMetric` at the next checkpoint or record, before
        anything is saved from it; ``"continue"`` trains on.
      check_mask: at the first padded batch, warn (`PaddingCountedWarning`)
        if the step's sums count the padding rows (one extra compilation of
        the step; skipped with ``steps_per_transfer > 1``).

    Returns:
      `FitResult` ``(state, history)``.

    Raises:
      TypeError, ValueError: bad arguments or a step that breaks the contract
        (before any data moves); a checkpoint written with other settings.
      NonFiniteMetric: see ``nan_policy``.
      KeyboardInterrupt: on Ctrl-C, once stopped at a step and checkpointed;
        `Preempted` (a KeyboardInterrupt) on SIGTERM.
    """
    _check_arguments(step, train, epochs, eval, eval_step, nan_policy, checkpoint, resume, log)
    check_mask = check_bool("check_mask", check_mask)
    eval_due = _eval_due(eval_every)
    hooks = as_callbacks(callbacks)
    if checkpoint is not None and not isinstance(checkpoint, Checkpointing):
        checkpoint = Checkpointing(checkpoint)
    sharding = batch_sharding_of(mesh)
    replicated = NamedSharding(sharding.mesh, PartitionSpec())
    # A copy: the steps donate the state, and the caller's arrays must outlive fit.
    # (device_put(may_alias=False) alone still shares a buffer on several devices.)
    state = jax.device_put(jax.tree.map(_copy, state), replicated)
    zeros = jax.device_put(trace_step(step, state, train), replicated)
    eval_run, eval_zeros = (None, None)
    if eval is not None:
        eval_run, eval_zeros = compile_eval(eval_step, state, eval, replicated)
    mask_step = step if check_mask and steps_per_transfer == 1 else None
    train_run = compile_step(step, steps_per_transfer, replicated)
    steps = CompiledSteps(train_run, zeros, eval_run, eval_zeros, mask_step)
    if checkpoint is None and isinstance(train, SkipsDataState):
        train = train.without_data_state()  # its state costs time, and nothing will ask
    # Closed in reverse, also on an error or Ctrl-C: the checkpointer (once the
    # last save is complete on disk), then the log.
    with contextlib.ExitStack() as open_until_done:
        training_log = open_until_done.enter_context(TrainingLog(log or Logging(), epochs))
        checkpointer = None
        if checkpoint is not None:
            written = run_settings(train, settings)
            checkpointer = Checkpointer(checkpoint, written, run_topology(sharding))
            open_until_done.callback(checkpointer.close)
        run = TrainingRun(
            train,
            eval,
            sharding,
            steps_per_transfer,
            steps,
            eval_due=eval_due,
            checkpointer=checkpointer,
            log=training_log,
            callbacks=hooks,
            stop_on_nan=nan_policy == "stop",
        )
        state, totals = run.resume(state) if resume else (state, zeros)
        state = run.train_epochs(state, totals, epochs)
    return FitResult(state, run.history)


def _check_arguments(
    step: Any,
    train: Any,
    epochs: Any,
    eval: BatchSource | None,
    eval_step: EvalStep | None,
    nan_policy: str,
    checkpoint: Any,
    resume: bool,
    log: Any,
) -> None:
    """Raises ValueError or TypeError for `fit` arguments that cannot work together."""
    if not callable(step):
        raise TypeError(
            f"step must be a function step(state, batch) -> (state, sums), got {step!r:.80}"
        )
    if eval_step is not None and not callable(eval_step):
        raise TypeError(
            f"eval_step must be a function eval_step(state, batch) -> sums, got {eval_step!r:.80}"
        )
    check_source("train", train)
    check_bool("resume", resume)
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
        raise ValueError(f"epochs must be an integer >= 0, got {epochs!r}")
    if (eval is None) != (eval_step is None):
        raise ValueError("pass eval and eval_step together (eval_step computes eval's sums)")
    if eval is not None:
        check_source("eval", eval)
    if nan_policy not in ("stop", "continue"):
        raise ValueError(f"nan_policy must be 'stop' or 'continue', got {nan_policy!r}")
    if resume and checkpoint is None:
        raise ValueError("resume=True needs checkpoint=DIRECTORY to resume from")
    if log is not None and not isinstance(log, Logging):
        raise TypeError(f"log takes a jaxfeed.Logging, e.g. Logging(progress=False), got {log!r}")


def _eval_due(eval_every: int | Callable[[int], bool] | None) -> Callable[[int], bool] | None:
    """``eval_every`` as a test of a step number (None: epochs only).

    Raises:
      ValueError: an int below 1, or neither an int nor a callable.
    """
    if eval_every is None or callable(eval_every):
        return eval_every
    if type(eval_every) is not int or eval_every < 1:
        raise ValueError(
            f"eval_every must be an int >= 1 (steps) or a function of the step, got {eval_every!r}"
        )
    return lambda step: step % eval_every == 0

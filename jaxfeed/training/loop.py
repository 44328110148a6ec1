"""`fit`: one training loop for any model, fed by any `BatchSource`.

The user brings a step and a state; `fit` owns everything between the loader
and the step: a `DeviceFeed` per epoch (the next one opened while this one is
evaluated), the state replicated on the mesh, mask-aware metric sums, the
data-wait figure, a progress bar, a JSON history, verified checkpoints with
exact (and elastic) resume, Ctrl-C and preemption, a NaN policy, and
multi-process jobs.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec
from jaxfeed.loaders.protocol import BatchSource, Resumable, SkipsDataState
from jaxfeed.sharding import DeviceFeed
from tqdm import tqdm  # not tqdm.auto: it warns in Jupyter without ipywidgets

from jaxfeed.training.checkpoint import Checkpointer, Checkpointing
from jaxfeed.training.interrupts import Interrupts, interrupt
from jaxfeed.training.log import TrainingLog
from jaxfeed.training.padding_check import warn_if_padding_counts
from jaxfeed.training.steps import (
    EvalStep,
    MeshLike,
    Step,
    Sums,
    batch_mask,
    batch_sharding_of,
    compile_eval,
    compile_step,
    device_part,
    eval_pass,
    evaluate_metrics,
    means,
    serialize_steps,
    to_host,
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


class NonFiniteMetric(ValueError):
    """A step's metric sum became NaN or infinite (`fit`'s ``nan_policy="stop"``)."""


def _check_writable(path: Path) -> None:
    """Refuses, before any training, a history file that could not be written."""
    folder = path.parent if path.parent != Path() else Path.cwd()
    existing = next((p for p in (folder, *folder.parents) if p.exists()), folder)
    if path.is_dir() or not existing.is_dir() or not os.access(existing, os.W_OK):
        raise ValueError(f"history_path {path} cannot be written; pick a writable file path")


def _copy(leaf: Any) -> Any:
    return leaf.copy() if isinstance(leaf, jax.Array | np.ndarray) else leaf


def _write_json(path: Path, value: Any) -> None:
    """Written whole or not at all: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(value, indent=2, default=str) + "\n")
    os.replace(partial, path)


class _Loop:
    """One `fit` run between its steps: the position a checkpoint records
    ``(epoch, next_batch, step)``, the history, and the work of an epoch."""

    def __init__(self, train: BatchSource, sharding: NamedSharding, k: int, progress: bool | None):
        self.train, self.sharding, self.k, self.progress = train, sharding, k, progress
        self.epoch = self.next_batch = self.step = 0
        self.counted = 0.0  # real rows of this record's window trained before a resume
        self.window_started = time.perf_counter()  # when this record's window began
        self.wait = 0.0  # seconds of this window the device may have waited for data
        self.eval_due: Callable[[int], bool] | None = None  # eval_every, as a test of a step
        self.on_window: Callable[[Any, Sums], Sums] | None = None  # makes an eval_every record
        self.log: TrainingLog | None = None
        self.step_callbacks: Sequence[Callable[[dict], object]] = ()
        self.mask_step: Step | None = None  # the step to check for padding use, until checked
        self.history: list[dict] = []
        self.checkpointer: Checkpointer | None = None
        self.interrupts = Interrupts()
        self.stop_signal: int | None = None  # what stopped the run, once decided
        self.stop_on_nan = True
        self.checked_step = 0  # the last step whose sums were found finite

    def resume(self, state: Any, totals: Sums) -> tuple[Any, Sums]:
        """State and sums of the newest checkpoint, the position set to its own
        (unchanged when there is none); restores the source's stream state."""
        restored = self.checkpointer.restore(state, totals)
        if restored is None:
            return state, totals
        self.step, self.epoch, self.next_batch = restored.step, restored.epoch, restored.next_batch
        self.history = restored.history
        self.counted = to_host(restored.totals)["count"]
        if restored.data_state is not None:
            if not isinstance(self.train, Resumable):
                raise ValueError(
                    f"the checkpoint holds the stream state of a source with data_state(), "
                    f"but this train source ({type(self.train).__name__}) has no "
                    f"restore_data_state(); resume with the same kind of source"
                )
            self.train.restore_data_state(restored.data_state)
        return restored.state, restored.totals

    def should_stop(self, sync_point: bool) -> bool:
        """Whether Ctrl-C or SIGTERM asked to stop (sets `stop_signal`).
        Processes of a job must stop at the same step, so they only decide
        together, at sync points (a due checkpoint, an epoch's end): a signal
        to one process stops them all."""
        if jax.process_count() == 1:
            self.stop_signal = self.interrupts.requested
            return self.stop_signal is not None
        if not sync_point:
            return False
        from jax.experimental import multihost_utils

        mine = np.int32(self.interrupts.requested or 0)
        signals = [int(s) for s in np.ravel(multihost_utils.process_allgather(mine)) if s]
        # SIGTERM wins: a preempted job exits as one.
        self.stop_signal = (
            signal.SIGTERM if signal.SIGTERM in signals else next(iter(signals), None)
        )
        return self.stop_signal is not None

    def stopping(self) -> bool:
        """A signal asked this (single) process to stop at the next check."""
        return jax.process_count() == 1 and self.interrupts.requested is not None

    def check_finite(self, totals: Sums) -> None:
        """Raises `NonFiniteMetric` if a metric sum is NaN or infinite (nan_policy "stop")."""
        if not self.stop_on_nan:
            return
        sums = to_host(totals)
        bad = sorted(name for name, value in sums.items() if not np.all(np.isfinite(value)))
        if bad:
            since = f"after step {self.checked_step}" if self.checked_step else "from the start"
            raise NonFiniteMetric(
                f"the step's {bad[0]} sum is {float(np.ravel(sums[bad[0]])[0])} at step "
                f"{self.step} (epoch {self.epoch + 1}, batch {self.next_batch}); it became so "
                f"{since}, and nothing was saved from it. Lower the learning rate or check "
                f"the data, or pass nan_policy='continue' (--nan-policy continue) to train on"
            )
        self.checked_step = self.step

    def save(self, state: Any, totals: Sums) -> None:
        if self.checkpointer is None:
            return
        self.check_finite(totals)
        data_state = None
        if isinstance(self.train, Resumable):
            data_state = self.train.data_state(self.epoch, self.next_batch)
        self.checkpointer.save(
            self.step,
            state,
            totals,
            epoch=self.epoch,
            next_batch=self.next_batch,
            history=self.history,
            data_state=data_state,
        )

    def stopped(self) -> KeyboardInterrupt:
        """`Preempted` after SIGTERM (also a peer's), else KeyboardInterrupt."""
        where = f"epoch {self.epoch + 1}, batch {self.next_batch} (step {self.step})"
        saved = (
            "checkpointing is off"
            if self.checkpointer is None
            else f"checkpoint of step {self.step} in {self.checkpointer.directory}"
        )
        return interrupt(self.stop_signal, f"stopped at {where}; {saved}")

    def open(self, epoch: int, start: int) -> DeviceFeed:
        return DeviceFeed(
            self.train, self.sharding, epoch=epoch, start=start, steps_per_transfer=self.k
        )

    def train_epoch(
        self, feed: DeviceFeed, run: Callable, state: Any, totals: Sums
    ) -> tuple[Any, Sums]:
        """Steps through ``feed`` to the epoch's end; returns the new state and
        sums (adding to `wait` the seconds the device may have idled for data)."""
        every = self.checkpointer.config.every if self.checkpointer else None
        serialize = serialize_steps(self.sharding)
        save_due = False
        bar = tqdm(
            total=feed.num_batches,
            initial=self.next_batch,
            desc=f"epoch {self.epoch + 1}",
            leave=False,
            disable=None if self.progress is None else not self.progress,  # None: TTY only
        )
        with bar:
            while True:
                t = time.perf_counter()
                step_running = not totals["count"].is_ready()
                batch = next(feed, None)
                if not (step_running and not totals["count"].is_ready()):
                    # The device may have idled for (part of) this wait: counted
                    # in full, so the figure is an upper bound.
                    self.wait += time.perf_counter() - t
                if batch is None:  # a checkpoint due now is left to the epoch's end
                    return state, totals
                # Saved here, not right after the step: at an epoch's last batch
                # the epoch-end checkpoint (after evaluation) takes its place.
                if self.should_stop(save_due):
                    self.save(state, totals)
                    raise self.stopped()
                if save_due:
                    self.save(state, totals)
                batch = device_part(batch, feed.host_fields)
                # Only a source's last batch may be padded: looking costs a device sync.
                last = feed.num_batches is None or self.next_batch + 1 == feed.num_batches
                if (
                    self.mask_step is not None
                    and last
                    and warn_if_padding_counts(self.mask_step, state, batch)
                ):
                    self.mask_step = None  # checked on the first padded batch
                state, totals = run(state, totals, batch)
                if serialize:
                    jax.block_until_ready(totals)
                n = next(iter(batch.values())).shape[0] if self.k > 1 else 1  # [k', B, ...]
                self.next_batch += n
                self.step += n
                save_due = every is not None and self.step // every > (self.step - n) // every
                bar.update(n)
                state, totals = self.after_steps(n, feed.num_batches, state, totals)

    def after_steps(self, n: int, num_batches: int | None, state: Any, totals: Sums):
        """Per-step work after ``n`` steps: step callbacks, a progress line, an
        ``eval_every`` record (which starts new sums)."""
        if self.step_callbacks:
            info = {"epoch": self.epoch + 1, "batch": self.next_batch,
                    "num_batches": num_batches, "step": self.step}  # fmt: skip
            for callback in self.step_callbacks:
                callback(info)
        if self.log is not None and self.log.due(self.next_batch, num_batches):
            values = self.running(totals)
            self.log.step(self.epoch + 1, self.next_batch, num_batches, self.step, values)
        due = self.eval_due
        if due is not None and any(due(s) for s in range(self.step - n + 1, self.step + 1)):
            totals = self.on_window(state, totals)
        return state, totals

    def running(self, totals: Sums) -> dict:
        """This window's means so far, its seconds and speed (a device sync)."""
        sums = to_host(totals)
        seconds = max(time.perf_counter() - self.window_started, 1e-9)
        return {
            **means(sums),
            "seconds": seconds,
            "samples_per_second": (sums["count"] - self.counted) / seconds,
            "data_wait_fraction": self.wait / seconds,
        }

    def record(self, totals: Sums) -> dict:
        """This window's record (see `next_window`)."""
        self.check_finite(totals)
        return {"epoch": self.epoch + 1, "step": self.step, **self.running(totals)}

    def next_window(self) -> None:
        """The next record's steps start now (after this one's evaluation and save)."""
        self.window_started, self.wait, self.counted = time.perf_counter(), 0.0, 0.0


def fit(
    step: Step,
    state: Any,
    train: BatchSource,
    *,
    epochs: int,
    eval: BatchSource | None = None,
    eval_step: EvalStep | None = None,
    mesh: MeshLike = None,
    steps_per_transfer: int = 1,
    checkpoint: Checkpointing | str | os.PathLike | None = None,
    resume: bool = False,
    settings: Mapping[str, Any] | None = None,
    callbacks: Sequence[Callable[[dict], object]] = (),
    step_callbacks: Sequence[Callable[[dict], object]] = (),
    progress: bool | None = None,
    history_path: str | os.PathLike | None = None,
    nan_policy: str = "stop",
    eval_every: int | Callable[[int], bool] | None = None,
    log_every: int | None = None,
    log_records: bool = True,
    tensorboard: str | os.PathLike | None = None,
    check_mask: bool = True,
) -> FitResult:
    """Trains ``state`` with ``step`` for ``epochs`` epochs of ``train`` (docs/fit.md).

    ``step(state, batch) -> (state, sums)`` gets the global batch as sharded
    arrays; ``sums`` are scalar metric sums over the batch's real rows (weigh
    rows by `batch_mask`) with a ``count`` entry. An epoch's record holds each
    metric's ``sum / count``, ``eval_``-prefixed for ``eval_step(state,
    batch) -> sums`` over ``eval``, and ``epoch``, ``step``, ``seconds``,
    ``samples_per_second`` and ``data_wait_fraction``. With ``eval_every``,
    a record also comes after every such step, over the steps since the
    previous record.

    Args:
      step, eval_step: see above; `fit` jits them. ``eval_step`` comes with ``eval``.
      state: a pytree of arrays (parameters, optimizer state...); replicated on the mesh.
      train, eval: the batches; ``eval`` (or None) is evaluated after every epoch.
      epochs: train until this many epochs are done, resumed ones included.
      mesh: a `Mesh`, a batch `NamedSharding`, devices, or None for all devices.
      steps_per_transfer: k > 1 runs k steps per transfer in one `jax.lax.scan`.
      checkpoint: a directory or `Checkpointing`; ``resume=True`` continues
        from its newest checkpoint exactly (starts fresh if there is none).
      settings: JSON values a resumed run must share with the checkpoint's.
      callbacks: called with each record (each epoch's, and ``eval_every``'s).
      step_callbacks: called after every step with ``{"epoch", "batch",
        "num_batches", "step"}`` (host numbers: no device sync).
      progress: a tqdm bar (default: only on a terminal).
      history_path: the records as JSON, rewritten every epoch (process 0);
        its directory must be writable before training starts.
      nan_policy: ``"stop"``: a metric sum that is not finite stops the run
        with `NonFiniteMetric` at the next checkpoint or epoch end, before
        anything is saved from it; ``"continue"`` trains on.
      eval_every: also make a record, with ``eval``'s metrics, after every
        this many steps (counted from the run's start, resumed steps
        included), or after each step ``s`` for which ``eval_every(s)`` is
        true; every epoch's end still makes one (unless it just did).
      log_every: print a progress line (process 0, stdout) every this many
        steps, and one per record; 0: none. None: only off a terminal (where
        no bar shows), about every 10% of an epoch and at least every 30 s.
      log_records: include the record lines (``jaxfeed train`` prints its own).
      tensorboard: a directory: TensorBoard scalars of the progress lines
        (``train/``), records (``epoch/``) and ``eval`` (``eval/``), by step
        (needs tensorboardX: the ``tensorboard`` extra).
      check_mask: at the first padded batch, warn (`PaddingCountedWarning`)
        if the step's sums change with the padding rows' values, i.e. count
        them (one extra compilation of the step; skipped with
        ``steps_per_transfer > 1``).

    Returns:
      `FitResult` ``(state, history)``.

    Raises:
      TypeError, ValueError: bad arguments or a step that breaks the contract
        (before any data moves); a checkpoint written with other settings.
      NonFiniteMetric: see ``nan_policy``.
      KeyboardInterrupt: on Ctrl-C, once stopped at a step and checkpointed;
        `Preempted` (a KeyboardInterrupt) on SIGTERM.
    """
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
        raise ValueError(f"epochs must be an integer >= 0, got {epochs!r}")
    if (eval is None) != (eval_step is None):
        raise ValueError("pass eval and eval_step together (eval_step computes eval's sums)")
    if nan_policy not in ("stop", "continue"):
        raise ValueError(f"nan_policy must be 'stop' or 'continue', got {nan_policy!r}")
    eval_due = _eval_due(eval_every)
    if history_path is not None:
        _check_writable(Path(history_path))
    if resume and checkpoint is None:
        raise ValueError("resume=True needs checkpoint=DIRECTORY to resume from")
    if checkpoint is not None and not isinstance(checkpoint, Checkpointing):
        checkpoint = Checkpointing(checkpoint)
    sharding = batch_sharding_of(mesh)
    replicated = NamedSharding(sharding.mesh, PartitionSpec())
    # A copy: the steps donate the state, and the caller's arrays must outlive fit.
    # (device_put(may_alias=False) alone still shares a buffer on several devices.)
    state = jax.device_put(jax.tree.map(_copy, state), replicated)
    zeros = jax.device_put(trace_step(step, state, train), replicated)
    if eval is not None:
        eval_run, eval_zeros = compile_eval(eval_step, state, eval, replicated)
    run = compile_step(step, steps_per_transfer, replicated)
    if checkpoint is None and isinstance(train, SkipsDataState):
        train = train.without_data_state()  # its state costs time, and nothing will ask
    loop = _Loop(train, sharding, steps_per_transfer, progress)
    loop.stop_on_nan = nan_policy == "stop"
    loop.step_callbacks = tuple(step_callbacks)
    if check_mask and steps_per_transfer == 1:
        loop.mask_step = step
    totals, feed = zeros, None

    def close_window(state: Any, totals: Sums, end_of_epoch: bool = False) -> Sums:
        """Makes a record of the steps since the last one (evaluated), keeps
        it, reports it; returns the sums of the next window."""
        jax.block_until_ready(totals)  # steps are dispatched ahead: wait for them
        record = loop.record(totals)
        if eval is not None:
            record |= means(eval_pass(eval_run, state, eval_zeros, eval, sharding), "eval_")
        loop.history.append(record)
        if end_of_epoch:
            loop.epoch, loop.next_batch = loop.epoch + 1, 0
            loop.save(state, zeros)
        if history_path is not None and jax.process_index() == 0:
            _write_json(Path(history_path), loop.history)
        loop.log.record(record)
        for callback in callbacks:
            callback(record)
        loop.next_window()
        return zeros

    if eval_due is not None:
        loop.eval_due, loop.on_window = eval_due, close_window
    try:
        loop.log = TrainingLog(log_every, epochs, log_records, tensorboard)
        if checkpoint is not None:
            topology = run_topology(sharding)
            loop.checkpointer = Checkpointer(checkpoint, run_settings(train, settings), topology)
            if resume:
                state, totals = loop.resume(state, totals)
        with loop.interrupts:
            loop.window_started = time.perf_counter()
            while loop.epoch < epochs:
                if feed is None:
                    feed = loop.open(loop.epoch, loop.next_batch)
                state, totals = loop.train_epoch(feed, run, state, totals)
                feed.close()
                feed = None
                if loop.epoch + 1 < epochs and not loop.stopping():
                    # Opened now, so its first batches load while the device
                    # finishes this epoch's steps and while it is evaluated.
                    feed = loop.open(loop.epoch + 1, 0)
                just_recorded = loop.history and loop.history[-1]["step"] == loop.step
                if eval_due is not None and just_recorded:  # eval_every's record ended it
                    loop.epoch, loop.next_batch = loop.epoch + 1, 0
                    loop.save(state, totals)
                else:
                    totals = close_window(state, totals, end_of_epoch=True)
                # Once the last epoch is done, Ctrl-C has nothing left to stop.
                if loop.epoch < epochs and loop.should_stop(sync_point=True):
                    raise loop.stopped()
    finally:
        if feed is not None:
            feed.close()  # also when a loader error or Ctrl-C ends training early
        if loop.checkpointer is not None:
            loop.checkpointer.close()  # the last save is complete on disk
        if loop.log is not None:
            loop.log.close()
    return FitResult(state, loop.history)


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

"""`TrainingRun`: one `fit` run between its steps. It owns the position a
checkpoint records ``(epoch, next_batch, step)``, the history, and the work of
an epoch: feeding the step, checkpoints, records, Ctrl-C and SIGTERM."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.sharding import NamedSharding

from jaxfeed.loaders.backends.mixture_source import MixtureSource
from jaxfeed.loaders.protocol import BatchSource, Resumable
from jaxfeed.sharding import DeviceFeed
from jaxfeed.training.callbacks import Callback
from jaxfeed.training.checkpoint import Checkpointer
from jaxfeed.training.interrupts import Interrupts, interrupt
from jaxfeed.training.log import TrainingLog
from jaxfeed.training.padding_check import warn_if_padding_counts
from jaxfeed.training.steps import (
    Step,
    Sums,
    device_part,
    eval_pass,
    means,
    serialize_steps,
    to_host,
)

__all__ = ["CompiledSteps", "NonFiniteMetric", "TrainingRun"]


class NonFiniteMetric(ValueError):
    """A step's metric sum became NaN or infinite (`fit`'s ``nan_policy="stop"``)."""


class CompiledSteps(NamedTuple):
    """A run's jitted steps (see `jaxfeed.training.steps`) and the placed zero
    sums each starts from; ``mask_step`` is the user's step to check for
    padding rows in its sums (None: no check)."""

    train: Callable  # (state, totals, batch) -> (state, totals)
    zeros: Sums
    eval: Callable | None = None  # (state, totals, batch) -> totals
    eval_zeros: Sums | None = None
    mask_step: Step | None = None


class TrainingRun:
    """One `fit` run: `train_epochs` trains to the last epoch, `resume` first
    continues from the newest checkpoint.

    Args:
      train, eval: the batches; ``eval`` (or None) is evaluated at each record.
      sharding: the batch sharding on the mesh.
      k: steps per transfer.
      steps: the compiled steps.
      eval_due: a test of a step number: make an (evaluated) record after it;
        None: records at epoch ends only.
      checkpointer: the run's checkpoints, or None.
      log: the run's reports.
      callbacks: told of every step and record.
      stop_on_nan: raise `NonFiniteMetric` when a metric sum is not finite.
    """

    def __init__(
        self,
        train: BatchSource,
        eval: BatchSource | None,
        sharding: NamedSharding,
        k: int,
        steps: CompiledSteps,
        *,
        eval_due: Callable[[int], bool] | None,
        checkpointer: Checkpointer | None,
        log: TrainingLog,
        callbacks: tuple[Callback, ...],
        stop_on_nan: bool,
    ):
        self.train, self.eval, self.sharding, self.k, self.steps = train, eval, sharding, k, steps
        self.eval_due, self.checkpointer, self.log = eval_due, checkpointer, log
        self.callbacks, self.stop_on_nan = callbacks, stop_on_nan
        self.mask_step = steps.mask_step  # the step to check for padding use, until checked
        self.epoch = self.next_batch = self.step = 0
        self.history: list[dict] = []
        self.counted = 0.0  # real rows of this record's window trained before a resume
        self.window_started = time.perf_counter()  # when this record's window began
        self.window_from = (0, 0)  # the (epoch, batch) it began at
        self.wait = 0.0  # seconds of this window the device may have waited for data
        # The batch shapes the step has seen: each is a compile (bucketed sequences: one a bucket).
        self.shapes: set[tuple] = set()
        self.interrupts = Interrupts()
        self.stop_signal: int | None = None  # what stopped the run, once decided
        self.checked_step = 0  # the last step whose sums were found finite
        self.line: tuple | None = None  # a progress line due, until `write_line` writes it
        # Whether the source was asked for its data state at the run's first
        # batch: a checkpoint needs it, so a refusal is said then, not at the first save.
        self.state_asked = checkpointer is None or not isinstance(train, Resumable)

    def resume(self, state: Any) -> tuple[Any, Sums]:
        """State and sums of the newest checkpoint, the position set to its own
        (the state and zero sums when there is none); restores the source's
        stream state."""
        restored = self.checkpointer.restore(state, self.steps.zeros)
        if restored is None:
            return state, self.steps.zeros
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

    def train_epochs(self, state: Any, totals: Sums, epochs: int) -> Any:
        """Trains until ``epochs`` epochs are done; returns the state."""
        feed = None
        try:
            with self.interrupts:
                self.window_started = time.perf_counter()
                self.window_from = (self.epoch, self.next_batch)
                while self.epoch < epochs:
                    if feed is None:
                        feed = self.open(self.epoch, self.next_batch)
                    state, totals = self.train_epoch(feed, state, totals)
                    feed.close()
                    feed = None
                    if self.epoch + 1 < epochs and not self.stopping():
                        # Opened now, so its first batches load while the device
                        # finishes this epoch's steps and while it is evaluated.
                        feed = self.open(self.epoch + 1, 0)
                    totals = self.end_epoch(state, totals)
                    # Once the last epoch is done, Ctrl-C has nothing left to stop.
                    if self.epoch < epochs and self.should_stop(sync_point=True):
                        raise self.stopped()
        finally:
            if feed is not None:
                feed.close()  # also when a loader error or Ctrl-C ends training early
            self.write_line()  # one due before a stop or an error
        return state

    def end_epoch(self, state: Any, totals: Sums) -> Sums:
        """The epoch's record (unless ``eval_every``'s just ended it) and its
        checkpoint; returns the next epoch's sums."""
        recorded = self.history and self.history[-1]["step"] == self.step
        record = None if self.eval_due is not None and recorded else self.make_record(state, totals)
        self.epoch, self.next_batch = self.epoch + 1, 0
        self.save(state, self.steps.zeros)
        if record is not None:
            self.report(record, epoch_end=True)
        return self.steps.zeros

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
                f"the data, or pass nan_policy='continue' to train on"
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

    def ask_data_state(self) -> None:
        """Asks the source where it stands after the run's first batch, as the
        first checkpoint will: a pipeline that cannot say (a tf.data pipeline
        with a stateful op, an unseeded shuffle) is refused now, not after
        training up to that checkpoint.

        Raises:
          ValueError: the source's refusal, with a note saying why it is asked.
        """
        self.state_asked = True
        try:
            self.train.data_state(self.epoch, self.next_batch)
        except ValueError as error:
            error.add_note(
                f"(asked at the run's first batch: checkpoint={self.checkpointer.directory} "
                "saves where the data stands; fix the pipeline as said, or train without "
                "checkpoint=)"
            )
            raise

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

    def train_epoch(self, feed: DeviceFeed, state: Any, totals: Sums) -> tuple[Any, Sums]:
        """Steps through ``feed`` to the epoch's end; returns the new state and
        sums (adding to `wait` the seconds the device may have idled for data)."""
        every = self.checkpointer.config.every if self.checkpointer else None
        serialize = serialize_steps(self.sharding)
        save_due = False
        with self.log.bar(self.epoch + 1, self.next_batch, feed.num_batches) as bar:
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
                self.shapes.add(tuple(value.shape for value in batch.values()))
                # Only a source's last batch may be padded: looking costs a device sync.
                last = feed.num_batches is None or self.next_batch + 1 == feed.num_batches
                if (
                    self.mask_step is not None
                    and last
                    and warn_if_padding_counts(self.mask_step, state, batch)
                ):
                    self.mask_step = None  # checked on the first padded batch
                state, totals = self.steps.train(state, totals, batch)
                if serialize:
                    jax.block_until_ready(totals)
                self.write_line()  # the previous step's: waited for while this one runs
                n = next(iter(batch.values())).shape[0] if self.k > 1 else 1  # [k', B, ...]
                self.next_batch += n
                self.step += n
                if not self.state_asked:
                    self.ask_data_state()
                save_due = every is not None and self.step // every > (self.step - n) // every
                bar.update(n)
                totals = self.after_steps(n, feed.num_batches, state, totals)

    def after_steps(self, n: int, num_batches: int | None, state: Any, totals: Sums) -> Sums:
        """Per-step work after ``n`` steps: callbacks, a progress line, an
        ``eval_every`` record (which starts new sums)."""
        if self.callbacks:
            info = {"epoch": self.epoch + 1, "batch": self.next_batch,
                    "num_batches": num_batches, "step": self.step}  # fmt: skip
            for callback in self.callbacks:
                callback.on_step(info)
        if self.log.due(self.next_batch, num_batches):
            # Written once the next step is dispatched: its sums waited for
            # here, the device would idle while the next batch is read.
            where = (self.epoch + 1, self.next_batch, num_batches, self.step)
            self.line = (where, totals, self.extras())
        due = self.eval_due
        if due is not None and any(due(s) for s in range(self.step - n + 1, self.step + 1)):
            record = self.make_record(state, totals)
            self.report(record, epoch_end=self.next_batch == num_batches)
            totals = self.steps.zeros
        return totals

    def write_line(self) -> None:
        """Writes the progress line `after_steps` made due, if any (a device sync)."""
        if self.line is not None:
            (where, totals, extras), self.line = self.line, None
            self.log.step(*where, self.running(totals, extras))

    def make_record(self, state: Any, totals: Sums) -> dict:
        """A record of the steps since the last one, evaluated, kept in the history."""
        self.write_line()  # (a line due at this step comes first)
        jax.block_until_ready(totals)  # steps are dispatched ahead: wait for them
        self.check_finite(totals)
        record = {"epoch": self.epoch + 1, "step": self.step, **self.running(totals)}
        if self.eval is not None:
            steps = self.steps
            sums = eval_pass(steps.eval, state, steps.eval_zeros, self.eval, self.sharding)
            record |= means(sums, "eval_")
        self.history.append(record)
        return record

    def report(self, record: dict, epoch_end: bool) -> None:
        """Writes, logs and passes on a record; the next record's steps start now."""
        self.log.record(record, self.history)
        for callback in self.callbacks:
            if epoch_end:
                callback.on_epoch(record)
            else:
                callback.on_eval(record)
        self.window_started, self.wait, self.counted = time.perf_counter(), 0.0, 0.0
        self.window_from = (self.epoch, self.next_batch)

    def running(self, totals: Sums, extras: dict | None = None) -> dict:
        """This window's means so far, its seconds and speed (a device sync),
        and `extras` (those of now unless given)."""
        sums = to_host(totals)
        seconds = max(time.perf_counter() - self.window_started, 1e-9)
        return {
            **means(sums),
            "seconds": seconds,
            "samples_per_second": (sums["count"] - self.counted) / seconds,
            "data_wait_fraction": self.wait / seconds,
            **(self.extras() if extras is None else extras),
        }

    def extras(self) -> dict:
        """The batch shapes, said only where batches come in several
        (bucketed sequences), and a `Mixture`'s shares."""
        shapes = {"batch_shapes": len(self.shapes)} if len(self.shapes) > 1 else {}
        return shapes | self.mixture_shares()

    def mixture_shares(self) -> dict[str, float]:
        """A `Mixture`'s realized share of each component in this window's
        batches, ``share_<name>`` (from its plan: what the steps were given)."""
        if not isinstance(self.train, MixtureSource):
            return {}
        before = self.train.positions(*self.window_from)
        now = self.train.positions(self.epoch, self.next_batch)
        rows = {name: now[name] - before[name] for name in now}
        total = sum(rows.values())
        return {f"share_{name}": n / total for name, n in rows.items()} if total else {}

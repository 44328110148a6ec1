"""`fit`: one training loop for any model, fed by any `BatchSource`.

The user brings a step and a state; `fit` owns everything between the loader
and the step: a `DeviceFeed` per epoch (the next one opened while this one is
evaluated), the state replicated on the mesh, mask-aware metric sums, the
data-wait figure, a progress bar, a JSON history, checkpoints with exact
resume, Ctrl-C, and multi-process jobs.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from tqdm import tqdm  # not tqdm.auto: it warns in Jupyter without ipywidgets

from jaxfeed.checkpoint import Checkpointer, Checkpointing
from loaders.protocol import BatchSource
from sharding import DeviceFeed, batch_sharding, data_mesh

Sums = dict[str, jax.Array]
Step = Callable[[Any, Mapping[str, jax.Array]], tuple[Any, Sums]]
EvalStep = Callable[[Any, Mapping[str, jax.Array]], Sums]
MeshLike = Mesh | NamedSharding | Sequence[jax.Device] | None


class FitResult(NamedTuple):
    """The trained state and one metrics record per epoch (see `fit`)."""

    state: Any
    history: list[dict]


def batch_mask(batch: Mapping[str, jax.Array]) -> jax.Array:
    """float32 ``[B]``: 1 for a real row, 0 for a padding row.

    A padded batch carries ``mask``; a batch without one is all real rows.
    Multiply per-row values by it before summing them into a step's metrics.
    """
    if "mask" in batch:
        return batch["mask"].astype(jnp.float32)
    rows = next(iter(batch.values())).shape[0]
    return jnp.ones((rows,), jnp.float32)


def _add(a: Sums, b: Sums) -> Sums:
    return jax.tree.map(jnp.add, a, b)


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


def _to_host(sums: Sums) -> dict[str, float]:
    """Replicated scalars to floats; reads this process's copy, so it also
    works for multi-host arrays that are not fully addressable."""
    return {k: float(v.addressable_data(0)) for k, v in sums.items()}


def _means(sums: Mapping[str, float], prefix: str = "") -> dict[str, float]:
    count = sums["count"]
    return {
        prefix + k: v / count if count else float("nan") for k, v in sums.items() if k != "count"
    }


def _abstract_batch(source: BatchSource) -> dict[str, jax.ShapeDtypeStruct]:
    """The global batch as the step sees it (the local batch of every process)."""
    processes = jax.process_count()
    return {
        key: jax.ShapeDtypeStruct((spec.shape[0] * processes, *spec.shape[1:]), spec.dtype)
        for key, spec in source.element_spec.items()
    }


def _check_sums(sums: Any, who: str) -> None:
    if not isinstance(sums, Mapping) or "count" not in sums:
        raise TypeError(
            f"{who} must return metric sums as a dict with a 'count' entry (the number of "
            f"real rows, e.g. jnp.sum(batch_mask(batch))); got {jax.tree.structure(sums)}"
        )
    shapes = {k: getattr(v, "shape", None) for k, v in sums.items()}
    wrong = {k: shape for k, shape in sorted(shapes.items()) if shape != ()}
    if wrong:
        raise TypeError(
            f"{who}'s metric sums must be scalars (summed over the batch), got shapes {wrong}"
        )


def _zeros(sums: Mapping[str, jax.ShapeDtypeStruct]) -> Sums:
    return {k: jnp.zeros(v.shape, v.dtype) for k, v in sums.items()}


def _trace_step(step: Step, state: Any, source: BatchSource) -> Sums:
    """Traces ``step`` once on an abstract batch, so that a broken contract is
    reported before any data moves; returns zero sums of its metrics."""
    out = jax.eval_shape(step, state, _abstract_batch(source))
    if not (isinstance(out, tuple) and len(out) == 2):
        raise TypeError(f"step must return (state, metric sums), got {jax.tree.structure(out)}")
    want, got = jax.tree.structure(state), jax.tree.structure(out[0])
    if want != got:
        raise TypeError(f"step must return a state of the structure it took: {want} != {got}")
    _check_sums(out[1], "step")
    return _zeros(out[1])


def _trace_eval(eval_step: EvalStep, state: Any, source: BatchSource) -> Sums:
    sums = jax.eval_shape(eval_step, state, _abstract_batch(source))
    _check_sums(sums, "eval_step")
    return _zeros(sums)


def _compile(step: Step, k: int, replicated: NamedSharding) -> Callable:
    """``(state, totals, batch) -> (state, totals)``, jitted; for k > 1 it runs a
    ``[k', B, ...]`` stack of batches as k' steps in one `jax.lax.scan`."""

    def one(carry, batch):
        state, totals = carry
        state, sums = step(state, batch)
        return (state, _add(totals, sums)), None

    # The state is donated: XLA updates it in place instead of allocating a
    # new copy every step (the MLP's step on CPU: 5.3 ms without, 3.6 ms with).
    if k == 1:
        return jax.jit(
            lambda s, t, b: one((s, t), b)[0], out_shardings=replicated, donate_argnums=0
        )
    return jax.jit(
        lambda s, t, b: jax.lax.scan(one, (s, t), b)[0],
        out_shardings=replicated,
        donate_argnums=0,
    )


def evaluate_metrics(
    eval_step: EvalStep, state: Any, source: BatchSource, mesh: MeshLike = None
) -> dict[str, float]:
    """One pass of ``source`` through ``eval_step``; the mean of each metric
    (its sum over the pass divided by the summed ``count``).

    Args:
      eval_step: ``(state, batch) -> sums``, the convention of `fit`.
      state: a pytree of arrays; replicated on the mesh.
      source: the batches.
      mesh: a `Mesh`, a batch `NamedSharding`, devices, or None for all devices.
    """
    sharding = _sharding(mesh)
    replicated = NamedSharding(sharding.mesh, PartitionSpec())
    state = jax.device_put(state, replicated)
    zeros = _trace_eval(eval_step, state, source)
    run = jax.jit(lambda s, t, b: _add(t, eval_step(s, b)), out_shardings=replicated)
    return _means(_eval_pass(run, state, jax.device_put(zeros, replicated), source, sharding))


def _device_part(batch: dict, host: frozenset[str]) -> dict:
    """The placed leaves of a batch: a source's ``host_fields`` (numpy, e.g.
    text) ride along in the feed's batches but never reach a jitted step."""
    return {k: v for k, v in batch.items() if k not in host} if host else batch


def _host_fields(source: BatchSource) -> frozenset[str]:
    return frozenset(getattr(source, "host_fields", ()))


def _eval_pass(run: Callable, state: Any, totals: Sums, source: BatchSource, sharding) -> dict:
    serialize = _serialize_steps(sharding)
    host = _host_fields(source)
    with DeviceFeed(source, sharding) as feed:
        for batch in feed:
            totals = run(state, totals, _device_part(batch, host))
            if serialize:
                jax.block_until_ready(totals)
    return _to_host(totals)


def _sharding(mesh: MeshLike) -> NamedSharding:
    if isinstance(mesh, Sequence):
        mesh = data_mesh(list(mesh))
    return batch_sharding(mesh)


def run_settings(train: BatchSource, settings: Mapping[str, Any] | None) -> dict[str, Any]:
    """What a checkpoint records of a run, and a resumed run must match: the
    caller's ``settings`` plus the batch size, batches per epoch and process count."""
    return {
        **(settings or {}),
        "batch_size": train.batch_size,
        "num_batches": train.num_batches,
        "process_count": jax.process_count(),
    }


class _Interrupts:
    """While active (main thread only), Ctrl-C asks the loop to stop at the next
    step instead of raising wherever Python happens to be; a second Ctrl-C
    raises `KeyboardInterrupt` at once, for a loop stuck in a slow call."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def __enter__(self) -> _Interrupts:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


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
        self.counted = 0.0  # real rows of this epoch trained before a resume
        self.history: list[dict] = []
        self.checkpointer: Checkpointer | None = None
        self.interrupts = _Interrupts()

    def resume(self, state: Any, totals: Sums) -> tuple[Any, Sums]:
        """State and sums of the newest checkpoint, the position set to its own
        (unchanged when there is none); restores the source's stream state."""
        restored = self.checkpointer.restore(state, totals)
        if restored is None:
            return state, totals
        self.step, self.epoch, self.next_batch = restored.step, restored.epoch, restored.next_batch
        self.history = restored.history
        self.counted = _to_host(restored.totals)["count"]
        if restored.data_state is not None:
            if not hasattr(self.train, "restore_data_state"):
                raise ValueError(
                    f"the checkpoint holds the stream state of a source with data_state(), "
                    f"but this train source ({type(self.train).__name__}) has no "
                    f"restore_data_state(); resume with the same kind of source"
                )
            self.train.restore_data_state(restored.data_state)
        return restored.state, restored.totals

    def should_stop(self, sync_point: bool) -> bool:
        """Whether Ctrl-C asked to stop. Processes of a job must stop at the
        same step, so they only decide together, at sync points (a due
        checkpoint, an epoch's end)."""
        if jax.process_count() == 1:
            return self.interrupts.requested
        if not sync_point:
            return False
        from jax.experimental import multihost_utils

        flags = multihost_utils.process_allgather(np.int32(self.interrupts.requested))
        return bool(np.any(flags))

    def stopping(self) -> bool:
        """Ctrl-C was pressed and this (single) process will stop at the next check."""
        return jax.process_count() == 1 and self.interrupts.requested

    def save(self, state: Any, totals: Sums) -> None:
        if self.checkpointer is None:
            return
        data_state = None
        if hasattr(self.train, "data_state"):
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
        where = f"epoch {self.epoch + 1}, batch {self.next_batch} (step {self.step})"
        if self.checkpointer is None:
            return KeyboardInterrupt(f"stopped at {where}; checkpointing is off")
        return KeyboardInterrupt(
            f"stopped at {where}; checkpoint of step {self.step} in {self.checkpointer.directory}"
        )

    def open(self, epoch: int, start: int) -> DeviceFeed:
        return DeviceFeed(
            self.train, self.sharding, epoch=epoch, start=start, steps_per_transfer=self.k
        )

    def train_epoch(
        self, feed: DeviceFeed, run: Callable, state: Any, totals: Sums
    ) -> tuple[Any, Sums, float]:
        """Steps through ``feed`` to the epoch's end; returns the new state and
        sums and the seconds the device may have idled waiting for data."""
        every = self.checkpointer.config.every if self.checkpointer else None
        serialize = _serialize_steps(self.sharding)
        host = _host_fields(self.train)
        wait, save_due = 0.0, False
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
                    wait += time.perf_counter() - t
                if batch is None:  # a checkpoint due now is left to the epoch's end
                    return state, totals, wait
                # Saved here, not right after the step: at an epoch's last batch
                # the epoch-end checkpoint (after evaluation) takes its place.
                if self.should_stop(save_due):
                    self.save(state, totals)
                    raise self.stopped()
                if save_due:
                    self.save(state, totals)
                batch = _device_part(batch, host)
                state, totals = run(state, totals, batch)
                if serialize:
                    jax.block_until_ready(totals)
                n = next(iter(batch.values())).shape[0] if self.k > 1 else 1  # [k', B, ...]
                self.next_batch += n
                self.step += n
                save_due = every is not None and self.step // every > (self.step - n) // every
                bar.update(n)

    def record(self, totals: Sums, seconds: float, wait: float) -> dict:
        sums = _to_host(totals)
        return {
            "epoch": self.epoch + 1,
            "step": self.step,
            **_means(sums),
            "seconds": seconds,
            "samples_per_second": (sums["count"] - self.counted) / seconds,
            "data_wait_fraction": wait / seconds,
        }


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
    progress: bool | None = None,
    history_path: str | os.PathLike | None = None,
) -> FitResult:
    """Trains ``state`` with ``step`` for ``epochs`` epochs of ``train`` (README:
    "Train your own model with jaxfeed.fit").

    ``step(state, batch) -> (state, sums)`` gets the global batch as sharded
    arrays; ``sums`` are scalar metric sums over the batch's real rows (weigh
    rows by `batch_mask`) with a ``count`` entry. An epoch's record holds each
    metric's ``sum / count``, ``eval_``-prefixed for ``eval_step(state,
    batch) -> sums`` over ``eval``, and ``epoch``, ``step``, ``seconds``,
    ``samples_per_second`` and ``data_wait_fraction``.

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
      callbacks: called with each epoch's record.
      progress: a tqdm bar (default: only on a terminal).
      history_path: the records as JSON, rewritten every epoch (process 0).

    Returns:
      `FitResult` ``(state, history)``.

    Raises:
      TypeError, ValueError: bad arguments or a step that breaks the contract
        (before any data moves); a checkpoint written with other settings.
      KeyboardInterrupt: on Ctrl-C, once stopped at a step and checkpointed.
    """
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
        raise ValueError(f"epochs must be an integer >= 0, got {epochs!r}")
    if (eval is None) != (eval_step is None):
        raise ValueError("pass eval and eval_step together (eval_step computes eval's sums)")
    if resume and checkpoint is None:
        raise ValueError("resume=True needs checkpoint=DIRECTORY to resume from")
    if checkpoint is not None and not isinstance(checkpoint, Checkpointing):
        checkpoint = Checkpointing(checkpoint)
    sharding = _sharding(mesh)
    replicated = NamedSharding(sharding.mesh, PartitionSpec())
    # A copy: the steps donate the state, and the caller's arrays must outlive fit.
    state = jax.device_put(state, replicated, may_alias=False)
    zeros = jax.device_put(_trace_step(step, state, train), replicated)
    if eval is not None:
        eval_zeros = jax.device_put(_trace_eval(eval_step, state, eval), replicated)
        eval_run = jax.jit(lambda s, t, b: _add(t, eval_step(s, b)), out_shardings=replicated)
    run = _compile(step, steps_per_transfer, replicated)
    loop = _Loop(train, sharding, steps_per_transfer, progress)
    totals, feed = zeros, None
    # A source whose stream state costs time keeps it only for checkpoints.
    kept = getattr(train, "keep_data_state", None)
    if kept is not None:
        train.keep_data_state = checkpoint is not None
    try:
        if checkpoint is not None:
            loop.checkpointer = Checkpointer(checkpoint, run_settings(train, settings))
            if resume:
                state, totals = loop.resume(state, totals)
        with loop.interrupts:
            while loop.epoch < epochs:
                if feed is None:
                    feed = loop.open(loop.epoch, loop.next_batch)
                started = time.perf_counter()
                state, totals, wait = loop.train_epoch(feed, run, state, totals)
                feed.close()
                feed = None
                if loop.epoch + 1 < epochs and not loop.stopping():
                    # Opened now, so its first batches load while the device
                    # finishes this epoch's steps and while it is evaluated.
                    feed = loop.open(loop.epoch + 1, 0)
                # Steps are dispatched ahead: the epoch ends when the device is done.
                jax.block_until_ready(totals)
                record = loop.record(totals, time.perf_counter() - started, wait)
                if eval is not None:
                    eval_sums = _eval_pass(eval_run, state, eval_zeros, eval, sharding)
                    record |= _means(eval_sums, "eval_")
                loop.history.append(record)
                loop.epoch, loop.next_batch, loop.counted, totals = loop.epoch + 1, 0, 0.0, zeros
                loop.save(state, totals)
                if history_path is not None and jax.process_index() == 0:
                    _write_json(Path(history_path), loop.history)
                for callback in callbacks:
                    callback(record)
                # Once the last epoch is done, Ctrl-C has nothing left to stop.
                if loop.epoch < epochs and loop.should_stop(sync_point=True):
                    raise loop.stopped()
    finally:
        if feed is not None:
            feed.close()  # also when a loader error or Ctrl-C ends training early
        if loop.checkpointer is not None:
            loop.checkpointer.close()  # the last save is complete on disk
        if kept is not None:
            train.keep_data_state = kept
    return FitResult(state, loop.history)

"""Training you can watch off a terminal: `fit`'s progress lines, and its
TensorBoard scalars.

A tqdm bar draws only on a terminal; in a log file or a job scheduler's
output it stays silent. So off a terminal (or whenever ``log_every`` is
given) `fit` prints a line every ``log_every`` steps, by default about every
10% of an epoch and at least every 30 s, plus one per record (an epoch's end,
or an evaluation of ``eval_every``). The running means need the step's sums
on the host: one device sync per line, never per step.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from typing import Any

import jax

__all__ = ["TrainingLog"]

LINES_PER_EPOCH = 10  # the default cadence: about every 10% of an epoch...
MAX_SECONDS = 30.0  # ...and at least this often


class TrainingLog:
    """Progress lines (process 0, to stdout, flushed) and TensorBoard scalars.

    Args:
      log_every: a line every this many steps; 0: no step lines; None: off a
        terminal only, about every 10% of an epoch and at least every 30 s.
      epochs: the run's epochs, for "epoch 2/5".
      records: also print a line per record (`fit`'s ``log_records``).
      tensorboard: a directory for TensorBoard event files, or None.

    Raises:
      ImportError: ``tensorboard`` without tensorboardX installed (the
        message says what to install).
    """

    def __init__(
        self,
        log_every: int | None,
        epochs: int,
        records: bool = True,
        tensorboard: str | os.PathLike | None = None,
    ):
        if log_every is not None and (type(log_every) is not int or log_every < 0):
            raise ValueError(f"log_every must be an int >= 0 or None, got {log_every!r}")
        self.lead = jax.process_index() == 0
        terminal = sys.stdout.isatty()
        self.every = log_every
        self.timed = log_every is None and not terminal  # the default: steps and seconds
        self.lines = self.lead and (self.timed or bool(log_every))
        self.records = self.lead and records and (log_every is not None or not terminal)
        self.epochs = epochs
        self.writer = _writer(tensorboard) if tensorboard is not None and self.lead else None
        self._last = time.monotonic()

    def due(self, batch: int, num_batches: int | None) -> bool:
        """Whether a step line is due after batch ``batch`` (1-based) of the epoch."""
        if not self.lines:
            return False
        every = self.every
        if self.timed:
            every = max(1, (num_batches or 0) // LINES_PER_EPOCH) if num_batches else None
            if time.monotonic() - self._last >= MAX_SECONDS:
                return True
        return bool(every) and batch % every == 0 and batch != num_batches

    def step(
        self, epoch: int, batch: int, num_batches: int | None, step: int, values: Mapping
    ) -> None:
        """A line for the running means ``values`` (and their scalars)."""
        self._last = time.monotonic()
        of = f"/{num_batches} ({100 * batch / num_batches:.0f}%)" if num_batches else ""
        print(f"epoch {epoch}/{self.epochs}  batch {batch}{of}  step {step}  {_format(values)}",
              flush=True)  # fmt: skip
        self.scalars("train/", step, values)

    def record(self, record: Mapping[str, Any]) -> None:
        """A line and scalars for one of `fit`'s records."""
        self._last = time.monotonic()
        step = record["step"]
        train = {k: v for k, v in record.items() if k not in ("epoch", "step")}
        if self.records:
            print(f"epoch {record['epoch']}/{self.epochs}  step {step}  {_format(train)}",
                  flush=True)  # fmt: skip
        self.scalars("epoch/", step, {k: v for k, v in train.items() if not k.startswith("eval_")})
        evals = {k.removeprefix("eval_"): v for k, v in train.items() if k.startswith("eval_")}
        self.scalars("eval/", step, evals)

    def scalars(self, prefix: str, step: int, values: Mapping[str, Any]) -> None:
        if self.writer is None:
            return
        for name, value in values.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                self.writer.add_scalar(prefix + name, value, step)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _format(values: Mapping[str, Any]) -> str:
    parts = []
    for name, value in values.items():
        if name == "seconds":
            parts.append(f"{value:.1f}s")
        elif name == "samples_per_second":
            parts.append(f"{value:,.0f} samples/s")
        elif name == "data_wait_fraction":
            parts.append(f"data-wait {100 * value:.1f}%")
        elif isinstance(value, float):
            parts.append(f"{name} {value:.4f}")
    return "  ".join(parts)


def _writer(directory: str | os.PathLike) -> Any:
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        raise ImportError(
            'TensorBoard scalars need tensorboardX: pip install "jaxfeed[tensorboard]"'
        ) from None
    return SummaryWriter(os.fspath(directory))

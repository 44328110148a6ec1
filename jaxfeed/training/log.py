"""What `fit` reports as it trains (`Logging`): a progress bar, progress lines,
TensorBoard scalars and the records as JSON.

A tqdm bar draws only on a terminal; in a log file or a job scheduler's
output it stays silent. So off a terminal (or whenever ``Logging.every`` is
given) `fit` prints a line every ``every`` steps, by default about every
10% of an epoch and at least every 30 s, plus one per record (an epoch's end,
or an evaluation of ``eval_every``). The running means need the step's sums
on the host: one device sync per line, never per step, made once the next
step is dispatched (so the device is not left idle while the loop waits).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
from tqdm import tqdm  # not tqdm.auto: it warns in Jupyter without ipywidgets

from jaxfeed.loaders.checks import check_bool

__all__ = ["Logging", "TrainingLog"]

LINES_PER_EPOCH = 10  # the default cadence: about every 10% of an epoch...
MAX_SECONDS = 30.0  # ...and at least this often


@dataclasses.dataclass(frozen=True)
class Logging:
    """What `jaxfeed.fit` reports as it trains (``fit(..., log=Logging(...))``).

    Args:
      progress: a tqdm bar; None: only on a terminal.
      every: a progress line (process 0, stdout) every this many steps, and
        one per record; 0: none. None: only off a terminal (where no bar
        shows), about every 10% of an epoch and at least every 30 s.
      records: include the record lines (``jaxfeed train`` prints its own).
      tensorboard: a directory: TensorBoard scalars of the progress lines
        (``train/``), records (``epoch/``) and evaluations (``eval/``), by
        step (needs tensorboardX: the ``tensorboard`` extra).
      history_path: the records as JSON, rewritten with every record
        (process 0); `fit` refuses, before training, one it cannot write.

    Raises:
      ValueError: ``every`` is not an int >= 0 or None.
      TypeError: ``progress`` or ``records`` is not a bool (``progress``: or None).
    """

    progress: bool | None = None
    every: int | None = None
    records: bool = True
    tensorboard: str | os.PathLike | None = None
    history_path: str | os.PathLike | None = None

    def __post_init__(self) -> None:
        if self.every is not None and (type(self.every) is not int or self.every < 0):
            raise ValueError(f"Logging.every must be an int >= 0 or None, got {self.every!r}")
        if self.progress is not None:
            check_bool("Logging.progress", self.progress)
        check_bool("Logging.records", self.records)


class TrainingLog:
    """One run's reports as `Logging` asks: the bar, progress lines (process
    0, to stdout, flushed), TensorBoard scalars and the JSON history. Closing
    it (or leaving its ``with``) closes the TensorBoard writer.

    Args:
      options: what to report.
      epochs: the run's epochs, for "epoch 2/5".

    Raises:
      ValueError: ``options.history_path`` cannot be written.
      ImportError: ``options.tensorboard`` without tensorboardX installed (the
        message says what to install).
    """

    def __init__(self, options: Logging, epochs: int):
        self.history_path = None
        if options.history_path is not None:
            self.history_path = Path(options.history_path)
            _check_writable(self.history_path)
        self.lead = jax.process_index() == 0
        terminal = sys.stdout.isatty()
        self.progress = options.progress
        self.every = options.every
        self.timed = options.every is None and not terminal  # the default: steps and seconds
        self.lines = self.lead and (self.timed or bool(options.every))
        self.records = self.lead and options.records and (options.every is not None or not terminal)
        self.epochs = epochs
        tensorboard = options.tensorboard
        self.writer = _writer(tensorboard) if tensorboard is not None and self.lead else None
        self._last = time.monotonic()

    def __enter__(self) -> TrainingLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def bar(self, epoch: int, batch: int, num_batches: int | None) -> tqdm:
        """The progress bar of epoch ``epoch`` (1-based), from batch ``batch``."""
        disable = None if self.progress is None else not self.progress  # None: TTY only
        return tqdm(
            total=num_batches, initial=batch, desc=f"epoch {epoch}", leave=False, disable=disable
        )

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

    def record(self, record: Mapping[str, Any], history: Sequence[Mapping[str, Any]]) -> None:
        """The JSON history (``history``, which ends with ``record``), a line and
        scalars for one of `fit`'s records."""
        if self.history_path is not None and self.lead:
            _write_json(self.history_path, history)
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


def _check_writable(path: Path) -> None:
    """Refuses, before any training, a history file that could not be written."""
    folder = path.parent if path.parent != Path() else Path.cwd()
    existing = next((p for p in (folder, *folder.parents) if p.exists()), folder)
    if path.is_dir() or not existing.is_dir() or not os.access(existing, os.W_OK):
        raise ValueError(f"history_path {path} cannot be written; pick a writable file path")


def _write_json(path: Path, value: Any) -> None:
    """Written whole or not at all: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(value, indent=2, default=str) + "\n")
    os.replace(partial, path)


def _format(values: Mapping[str, Any]) -> str:
    parts = []
    for name, value in values.items():
        if name == "seconds":
            parts.append(f"{value:.1f}s")
        elif name == "samples_per_second":
            parts.append(f"{value:,.0f} samples/s")
        elif name == "data_wait_fraction":
            parts.append(f"data-wait {100 * value:.1f}%")
        elif name == "batch_shapes":
            parts.append(f"{value} batch shapes (compiles)")
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

"""One row of `jaxfeed compare`: how to run each measurement, and what it gave."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator
from typing import Any

from jaxfeed import loaders


class Limited:
    """A `BatchSource` limited to the first ``limit`` batches of each epoch."""

    def __init__(self, source: loaders.BatchSource, limit: int | None):
        self.source, self.limit = source, limit
        self.batch_size, self.element_spec = source.batch_size, source.element_spec
        n = source.num_batches
        self.num_batches = n if limit is None or n is None else min(n, limit)

    def iter_epoch(self, epoch: int = 0, *, start: int = 0) -> Iterator[loaders.Batch]:
        return itertools.islice(self.source.iter_epoch(epoch, start=start), self.limit)


@dataclasses.dataclass
class Row:
    """One backend, baseline, wrapped loader or Keras ``fit``.

    Attributes:
      kind: ``"backend"``, ``"baseline"``, ``"wrap"`` or ``"keras"``.
      host, device: ``(epoch) -> iterator`` of host / device batches; None
        where the row has no loader to time on its own (Keras ``fit``).
      training: (train source, test source) for ``jaxfeed.mnist.train`` in this process.
      fit: ``(train_epochs, max_batches) -> figures``, a training measurement
        of the row's own (wrap and Keras rows: in a fresh process), used
        instead of ``training``.
      first_batch: makes a fresh source (backends only).
      bare: for wrap and Keras rows, the baseline row that iterates the same
        object bare.
    """

    name: str
    kind: str
    framework: str | None
    description: str
    host: Callable[[int], Iterator[Any]] | None
    device: Callable[[int], Iterator[Any]] | None
    training: tuple[Any, Any] | None = None
    fit: Callable[[int, int | None], dict[str, Any]] | None = None
    first_batch: Callable[[], Any] | None = None
    bare: str | None = None
    runs: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    memory: dict[str, float] = dataclasses.field(default_factory=dict)


def steady(history: list[dict[str, Any]], epochs: int) -> list[dict[str, Any]]:
    """The epochs that are timed: 2..``epochs`` of ``epochs + 1`` trained.

    Epoch 1 compiles. jaxfeed.mnist.train opens the next epoch's feed (reading its
    first batches) inside the current epoch's time, so its last epoch skips
    that work: training one epoch more and leaving it out gives every timed
    epoch one loader start, as each of Keras's has. Both sides do this.
    """
    return history[1:epochs] or history[:1]


def trained_epochs(epochs: int) -> int:
    return epochs + 1 if epochs > 1 else 1

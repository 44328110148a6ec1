"""What the training measurements of every workload share: a source cut to a
few batches, and which epochs are timed."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
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


def steady(history: list[dict[str, Any]], epochs: int) -> list[dict[str, Any]]:
    """The epochs that are timed: 2..``epochs`` of ``epochs + 1`` trained.

    Epoch 1 compiles. jaxfeed.mnist.train opens the next epoch's feed (reading its
    first batches) inside the current epoch's time, so its last epoch skips
    that work: training one epoch more and leaving it out gives every timed
    epoch one loader start, as each of Keras's has. Both sides do this.
    """
    return history[1:epochs] or history[:1]


def trained_epochs(epochs: int) -> int:
    """How many epochs to train for ``epochs`` timed ones (see `steady`)."""
    return epochs + 1 if epochs > 1 else 1

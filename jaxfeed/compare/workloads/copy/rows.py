"""One row of the copy workload: how to run each measurement, and what it gave."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any


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

    @property
    def label(self) -> str:
        return self.name

"""One row of the decode workload: a pipeline, and what reading it opens.

A jaxfeed backend or a framework's idiom at one worker count; opened, it is
one endless ``stream`` of batches, then a ``training`` source, then closed.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from jaxfeed import loaders
from jaxfeed.compare import training
from jaxfeed.loaders.data import encoded
from jaxfeed.loaders.protocol import MASK_KEY, ArraySpec, Batch


@dataclasses.dataclass
class Pipeline:
    """One row: a jaxfeed backend or a framework's idiom at one worker count."""

    backend: str
    name: str  # "jaxfeed" or the idiom's name
    workers: int | str
    description: str
    open: Callable[[], Any]  # -> an opened pipeline: ``stream``, ``training``, ``close``
    runs: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def kind(self) -> str:
        return "jaxfeed" if self.name == "jaxfeed" else "idiom"

    @property
    def label(self) -> str:
        return f"{self.backend} {self.name} w={self.workers}"


class JaxfeedOpened:
    """A `loaders.make` source read epoch after epoch; training reads the
    source itself, as `jaxfeed.fit` users do."""

    def __init__(self, source: loaders.BatchSource):
        self.source = source
        self.stream = self._epochs()

    def _epochs(self) -> Iterator[Batch]:
        for epoch in itertools.count():
            yield from self.source.iter_epoch(epoch)  # closing this closes the epoch's

    def training(self, limit: int | None) -> loaders.BatchSource:
        self.stream.close()
        return training.Limited(self.source, limit)

    def close(self) -> None:
        self.stream.close()
        close = getattr(self.source, "close", None)  # sources with workers stop them
        if close is not None:
            close()


class IdiomOpened:
    """An idiom's stream; training continues it through `_StreamSource`."""

    def __init__(self, stream: Iterator[Batch], batch_size: int, num_batches: int):
        self.stream, self.batch_size, self.num_batches = stream, batch_size, num_batches

    def training(self, limit: int | None) -> _StreamSource:
        epoch = self.num_batches if limit is None else min(limit, self.num_batches)
        return _StreamSource(self.stream, self.batch_size, epoch)

    def close(self) -> None:
        self.stream.close()


class _StreamSource:
    """A `BatchSource` whose every epoch is the next ``num_batches`` batches of
    one stream (an idiom's own epochs run back to back), a short batch padded
    and masked as jaxfeed's are, so `fit` trains on idioms and jaxfeed alike."""

    def __init__(self, stream: Iterator[Batch], batch_size: int, num_batches: int):
        self.stream, self.batch_size, self.num_batches = stream, batch_size, num_batches
        side = encoded.CROP
        self.element_spec = {
            "image": ArraySpec((batch_size, side, side, 3), np.dtype(np.float32)),
            "label": ArraySpec((batch_size,), np.dtype(np.int32)),
            MASK_KEY: ArraySpec((batch_size,), np.dtype(np.bool_)),
        }
        self._lock = threading.Lock()  # a closed feed's thread may still be inside next()

    def iter_epoch(self, epoch: int = 0, *, start: int = 0) -> Iterator[Batch]:
        for _ in range(start, self.num_batches):
            with self._lock:
                batch = next(self.stream)
            yield _padded(batch, self.batch_size)


def _padded(batch: Batch, size: int) -> Batch:
    rows_ = len(batch["label"])
    mask = np.arange(size) < rows_
    if rows_ == size:
        return {**batch, MASK_KEY: mask}
    pad = {k: np.zeros((size - rows_, *v.shape[1:]), v.dtype) for k, v in batch.items()}
    return {k: np.concatenate([v, pad[k]]) for k, v in batch.items()} | {MASK_KEY: mask}

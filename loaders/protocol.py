"""The `BatchSource` protocol: what every loader backend gives the device feed."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

MASK_KEY = "mask"
"""The batch field that marks real rows (True) and padding rows (False)."""

Batch = dict[str, np.ndarray]
"""A flat host batch: the dataset's own fields, ``[B, *row_shape]`` each, and
``mask`` bool [B] (False on padding rows) when the source pads. MNIST:
``image`` uint8 [B,28,28,1] and ``label`` int32 [B]."""


class ArraySpec(NamedTuple):
    """Static shape and dtype of one batch leaf (shape includes the batch axis)."""

    shape: tuple[int, ...]
    dtype: np.dtype


@runtime_checkable
class BatchSource(Protocol):
    """Process-local host batches for one JAX process.

    A user's own class fits without inheriting from anything. Contract:

    * ``batch_size``: rows per batch on *this* process. The global batch is
      ``batch_size * process_count``.
    * ``num_batches``: batches per epoch on this process, the same on every
      process; ``None`` when the length is unknown (a wrapped stream).
    * ``element_spec``: the static shape/dtype of each leaf of every batch.
      Every batch has exactly these keys, shapes and dtypes, so a jitted step
      compiles once (a short last batch is padded and marked by ``mask``).
    * ``iter_epoch(epoch, start=...)``: the batches of one epoch, beginning
      at batch ``start`` (for resuming). For built-in sources, ``epoch`` and
      the seed fully define the order: calling it twice gives identical
      batches, and different epochs are shuffled differently. Built-in and
      wrapped sources refuse, at the call, an ``epoch`` outside
      ``[0, 2**32 - 1]`` or a ``start`` outside ``[0, num_batches]``; an epoch
      with no batches at all is an error, never an empty iterator.

    Optional capabilities are protocols of their own, below: `HostFields`,
    `ProcessSlice`, `Resumable` and `SkipsDataState`. Consumers test for them
    with ``isinstance``; a source without them still feeds and trains.

    Resuming (used by `jaxfeed.fit` checkpoints): a position is ``(epoch,
    next_batch)``, restarted with ``iter_epoch(epoch, start=next_batch)``;
    built-in sources and sampler-ordered wraps restart there exactly without
    reading the skipped batches. A source that cannot restart exactly by
    position alone is `Resumable`, or raises ``ValueError`` from
    ``iter_epoch`` when ``start > 0``, saying why and what to use instead;
    it never delivers other batches.
    """

    @property
    def batch_size(self) -> int: ...

    @property
    def num_batches(self) -> int | None: ...

    @property
    def element_spec(self) -> Mapping[str, ArraySpec]: ...

    def iter_epoch(self, epoch: int = 0, *, start: int = 0) -> Iterator[Batch]: ...


@runtime_checkable
class HostFields(Protocol):
    """A source some of whose batch fields stay host numpy (text, ids)."""

    @property
    def host_fields(self) -> tuple[str, ...]:
        """Names of the leaves that are not in ``element_spec`` and never reach
        a device: ``batch_size`` rows each, dtype and trailing shape free to
        vary. `DeviceFeed` passes them through unplaced."""
        ...


@runtime_checkable
class ProcessSlice(Protocol):
    """A source made for one process of a multi-process job (every built-in one)."""

    @property
    def process_index(self) -> int:
        """The process whose slice of every global batch this source yields."""
        ...

    @property
    def process_count(self) -> int:
        """The processes the global batch is split over. The feed refuses a
        source made for another layout than the running job's."""
        ...


@runtime_checkable
class Resumable(Protocol):
    """A source whose position is more than ``(epoch, next_batch)`` (a stream)."""

    def data_state(self, epoch: int, next_batch: int) -> dict[str, Any]:
        """A JSON-serialisable snapshot of the source as it stood when batch
        ``next_batch - 1`` of ``epoch`` had been produced (bytes
        base64-encoded). Raises ``ValueError`` when it cannot come back there."""
        ...

    def restore_data_state(self, state: Mapping[str, Any]) -> None:
        """Restores what `data_state` returned, in this or a fresh process;
        ``iter_epoch(epoch, start=next_batch)`` is called next."""
        ...


@runtime_checkable
class SkipsDataState(Protocol):
    """A `Resumable` source whose state costs time even when nobody asks for it
    (a wrapped tf.data pipeline takes a checkpoint at each epoch's start)."""

    def without_data_state(self) -> BatchSource:
        """A view of the same data that keeps no state: the same batches, and
        ``data_state`` refused for the epochs read through it. `jaxfeed.fit`
        reads through it when it does not checkpoint."""
        ...


def host_fields(source: object) -> tuple[str, ...]:
    """The source's `HostFields`, or none."""
    return tuple(source.host_fields) if isinstance(source, HostFields) else ()

"""The `BatchSource` protocol: what every loader backend gives the device feed."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np

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

    Optional ``host_fields``: names of leaves that stay host numpy (text, ids):
    not in ``element_spec``, ``batch_size`` rows, dtype and trailing shape
    free to vary; `DeviceFeed` passes them through unplaced.

    Resuming (used by `jaxfeed.fit` checkpoints). A position is ``(epoch,
    next_batch)``, restarted with ``iter_epoch(epoch, start=next_batch)``;
    built-in sources and sampler-ordered wraps restart there exactly without
    reading the skipped batches. Two optional methods cover streams whose
    position is more than a count:

    * ``data_state(epoch, next_batch) -> dict``: a JSON-serialisable
      snapshot of the source as it stood when batch ``next_batch - 1`` of
      ``epoch`` had been produced (bytes base64-encoded by the source).
    * ``restore_data_state(state)``: called with that dict before
      ``iter_epoch(epoch, start=next_batch)`` in a fresh process.
    * ``keep_data_state`` (a settable bool, default True): False tells a
      source that no ``data_state`` will be asked for, so one whose state
      costs time (a wrapped tf.data pipeline's checkpoint per epoch) can skip
      it; ``data_state`` then raises. `jaxfeed.fit` sets it for its run: True
      when it checkpoints, else False.

    A source without them resumes by position alone; one that cannot do
    that exactly must raise ``ValueError`` from ``iter_epoch`` when ``start``
    > 0, saying why and what to use instead, never deliver other batches.
    """

    @property
    def batch_size(self) -> int: ...

    @property
    def num_batches(self) -> int | None: ...

    @property
    def element_spec(self) -> Mapping[str, ArraySpec]: ...

    def iter_epoch(self, epoch: int = 0, *, start: int = 0) -> Iterator[Batch]: ...

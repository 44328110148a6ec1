"""What `wrap` hands its adapters and what they give back: `WrapSettings` in,
`Epochs` out. (A stream's state as JSON, what a checkpoint stores of it, is
`state_json`'s `encode` / `decode`.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from jaxfeed.loaders.sampler import Sampler

if TYPE_CHECKING:
    from jaxfeed.loaders.wrapping.stream_state import Stream


@dataclasses.dataclass(frozen=True)
class WrapSettings:
    """What `wrap` was asked for, handed to every adapter.

    Attributes:
      batch_size: rows per batch, or None (the loader's own / the first batch's).
      drop_remainder: drop short batches instead of padding them.
      seed: with the epoch, the order of sampler-ordered (random-access) kinds.
      shuffle: None keeps the user's object's meaning (a DataLoader built with
        ``shuffle=True`` stays shuffled); True/False overrides it.
      process_index, process_count: this process's share on several hosts.
      steps_per_epoch: batches per epoch of a stream read as one live
        iterator (required for an endless one), else None.
      resume: ``"replay"``: a callable or custom re-iterable repeats its
        batches, so a position is reached by reading them again; else None.
    """

    batch_size: int | None = None
    drop_remainder: bool = False
    seed: int = 0
    shuffle: bool | None = None
    process_index: int = 0
    process_count: int = 1
    steps_per_epoch: int | None = None
    resume: str | None = None


@dataclasses.dataclass(frozen=True)
class Epochs:
    """What an adapter knows about a user's loader.

    Attributes:
      batches: ``(epoch, start) -> iterator`` of the loader's raw batches,
        beginning at batch ``start``.
      num_batches: batches per epoch after ``drop_remainder``; None if unknown.
      batch_size: rows of a full batch when the loader says; None: first batch.
      num_rows: rows per epoch when known (for error messages); else None.
      sampler: set for sampler-ordered (random-access) kinds: batch ``i`` of
        an epoch holds the rows of ``sampler.epoch_plan(epoch)``'s ``i``-th
        index batch, always ``batch_size`` rows (the last one padded by
        repeating a row); the rows past its ``num_valid`` are zeroed and
        masked by `WrappedSource`, exactly as `SampledSource` does.
      stream: set for streams: ``batches`` itself, a `jaxfeed.loaders.wrapping.stream_state.Stream`
        that also reports and restores positions. None: a position is
        ``(epoch, start)`` alone.
    """

    batches: Callable[[int, int], Iterator[Any]]
    num_batches: int | None = None
    batch_size: int | None = None
    num_rows: int | None = None
    sampler: Sampler | None = None
    stream: Stream | None = None

"""Streams: the loaders `wrap` reads in their own order, and how each resumes.

A stream keeps its framework's order; on several processes it is sharded
with its framework's own tool or refused, and an endless one needs
``steps_per_epoch``. Each is read through a `jaxfeed.loaders.wrapping.stream_state.Cursor`
whose state is the framework's own (torch streams: `jaxfeed.loaders.wrapping.torch`;
tf.data: `jaxfeed.loaders.wrapping.tf`):

* Grain: the iterator's ``get_state()`` / ``set_state()``, after every batch.
* HF: ``state_dict()`` / ``load_state_dict()`` after every batch, with
  ``set_epoch`` first; with a shuffle buffer, whose rows that state does not
  hold, the epoch's start and the batches read again.
* A list or tuple: its batches are fixed, so a position is reached by
  reading them again. A callable or another re-iterable may not repeat, so
  it restarts only at an epoch's start unless ``wrap(..., resume="replay")``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from jaxfeed.loaders.wrapping.epochs import Epochs, WrapSettings
from jaxfeed.loaders.wrapping.stream_state import Stream

SHARD_YOURSELF = (
    "Shard it yourself (keep every process_count-th batch, from the process_index-th), "
    "and pass process_index=0, process_count=1 to say each process's stream is its own"
)
# jaxfeed's own mixture, which resumes exactly (and elastically) on every backend.
MIXTURE = (
    "jaxfeed.make(backend, dataset=jaxfeed.Mixture({...}, weights={...}), batch_size=..., seed=...)"
)


def own_order(kind: str, settings: WrapSettings, why: str) -> None:
    """Refuses ``shuffle=`` for an object read in its own order (``why``)."""
    if settings.shuffle is not None:
        raise ValueError(
            f"shuffle={settings.shuffle} orders random-access datasets, but wrap reads this "
            f"{kind} in its own order ({why}); shuffle it with its own tool, and omit shuffle="
        )


def one_process(kind: str, settings: WrapSettings, why: str, shard: str) -> None:
    """Refuses several processes for an object wrap cannot split (``why``);
    ``shard`` says how the user gives each process its own rows."""
    if settings.process_count > 1:
        raise ValueError(
            f"wrap reads this {kind} in its own order ({why}) and cannot give each of the "
            f"{settings.process_count} processes its own rows: every process would read the "
            f"same ones. {shard}"
        )


def stream_epochs(
    kind: str,
    cursor: Any,
    settings: WrapSettings,
    *,
    endless: bool,
    num_batches: int | None = None,
    batch_size: int | None = None,
    num_rows: int | None = None,
) -> Epochs:
    """The epochs of a stream read by ``cursor``: its passes, or windows of
    ``steps_per_epoch`` batches over them.

    Raises:
      ValueError: an endless stream without ``steps_per_epoch``.
    """
    steps = settings.steps_per_epoch
    if steps is None and endless:
        raise ValueError(
            f"the wrapped {kind} never ends (it repeats forever), so an epoch would "
            f"never end; pass steps_per_epoch=N (each epoch is then the next N batches "
            f"of one pass through it), or remove its .repeat()"
        )
    stream = Stream(kind, cursor, steps)
    if steps is not None:
        num_batches, num_rows = steps, None
    return Epochs(stream, num_batches, batch_size, num_rows, stream=stream)


def length(obj: Any) -> int | None:
    """``len(obj)``, or None for an object without one."""
    try:
        return len(obj)
    except TypeError:
        return None


class IterCursor:
    """Passes of an iterable, ``make(pass_)`` each, with no state of their
    own: a position is reached by reading its pass again up to it.

    Args:
      make: ``pass_ -> iterator`` of that pass's raw batches (None for a
        subclass that makes its passes in its own ``begin``).
      refusal: why reading a pass again may not give the same batches, or None.
    """

    per_batch = False
    restartable = True
    keep_state = True  # (its state costs nothing either way)

    def __init__(
        self, make: Callable[[int], Iterator[Any]] | None = None, refusal: str | None = None
    ):
        self._make, self.refusal = make, refusal
        self._batches: Iterator[Any] | None = None

    def begin(self, pass_: int, state: Any, in_pass: int) -> int:
        self._close()
        self._batches = self._make(pass_)
        return 0  # (no state: the stream reads the pass again up to in_pass)

    def next(self) -> Any:
        return next(self._batches)

    def state(self) -> Any:
        return None

    def _close(self) -> None:
        close = getattr(self._batches, "close", None)
        self._batches = None
        if close is not None:
            close()

"""Streams: the loaders `wrap` reads in their own order, and how each resumes.

A stream keeps its framework's order; on several processes it is sharded
with its framework's own tool or refused, and an endless one needs
``steps_per_epoch``. Each is read through a `loaders.wrap_resume.Cursor`
whose state is the framework's own (torch streams: `loaders.wrap_torch`;
tf.data: `loaders.wrap_tf`):

* Grain: the iterator's ``get_state()`` / ``set_state()``, after every batch.
* HF: ``state_dict()`` / ``load_state_dict()`` after every batch, with
  ``set_epoch`` first; with a shuffle buffer, whose rows that state does not
  hold, the epoch's start and the batches read again.
* A list or tuple: its batches are fixed, so a position is reached by
  reading them again. A callable or another re-iterable may not repeat, so
  it restarts only at an epoch's start unless ``wrap(..., resume="replay")``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from loaders import wrap_sampled
from loaders.wrap_epochs import Epochs, WrapSettings
from loaders.wrap_resume import Stream

SHARD_YOURSELF = (
    "Shard it yourself (keep every process_count-th batch, from the process_index-th), "
    "and pass process_index=0, process_count=1 to say each process's stream is its own"
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


# --- cursors ------------------------------------------------------------------------


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

    def __init__(
        self, make: Callable[[int], Iterator[Any]] | None = None, refusal: str | None = None
    ):
        self._make, self.refusal = make, refusal
        self._batches: Iterator[Any] | None = None

    def begin(self, pass_: int, state: Any, in_pass: int) -> None:
        self._close()
        self._batches = self._make(pass_)

    def next(self) -> Any:
        return next(self._batches)

    def state(self) -> Any:
        return None

    def _close(self) -> None:
        close = getattr(self._batches, "close", None)
        self._batches = None
        if close is not None:
            close()


class GrainCursor(IterCursor):
    """A Grain iterator per pass (``iter(make(pass_))``); its own state."""

    per_batch = True

    def begin(self, pass_: int, state: Any, in_pass: int) -> None:
        self._close()
        self._batches = iter(self._make(pass_))
        if state is not None:
            self._batches.set_state(state)

    def state(self) -> Any:
        return self._batches.get_state()


class HfCursor(IterCursor):
    """An HF ``IterableDataset``'s pass ``p``: ``set_epoch(p)``, then its
    ``state_dict`` when ``exact`` (no shuffle buffer), else none."""

    def __init__(self, dataset: Any, batch_size: int, drop: bool, exact: bool):
        super().__init__()
        self._dataset, self._batch_size, self._drop = dataset, batch_size, drop
        self.per_batch = exact
        self._dtypes = _declared_dtypes(dataset.features)

    def begin(self, pass_: int, state: Any, in_pass: int) -> None:
        self._close()
        self._dataset.set_epoch(pass_)  # first: a state loads only into its own epoch
        self._dataset.load_state_dict(state)  # None: the pass's start
        self._batches = self._dataset.iter(self._batch_size, drop_last_batch=self._drop)

    def next(self) -> Any:
        batch = next(self._batches)
        # The numpy format takes no dtype=: the declared ones, cast back.
        return {k: v.astype(self._dtypes.get(k, v.dtype), copy=False) for k, v in batch.items()}

    def state(self) -> Any:
        return self._dataset.state_dict() if self.per_batch else None


# --- Grain -----------------------------------------------------------------------------


def grain_map(dataset: Any, settings: WrapSettings, why: str) -> Epochs:
    """A Grain ``MapDataset`` that keeps its own order (``why``): Grain's
    view of epoch ``e`` (``.repeat()``'s rows ``[e*N, (e+1)*N)``) per pass."""
    kind = "grain.MapDataset"
    fix = "Shard it with dataset[process_index::process_count], and pass process_count=1"
    own_order(kind, settings, why)
    one_process(kind, settings, why, fix)
    endless = len(dataset) >= sys.maxsize
    batched = "BatchMapDataset" in wrap_sampled.ancestors(dataset)
    if not batched and settings.batch_size is None:
        raise ValueError(f"this {kind} yields single records; pass batch_size= to batch them")
    length = len(dataset)

    def one_pass(epoch: int) -> Any:
        # Grain's own view of epoch `epoch` (new random_map draws), minus holes.
        view = dataset if endless else dataset.repeat()[epoch * length : (epoch + 1) * length]
        stream = view.to_iter_dataset()
        if not batched:
            stream = stream.batch(settings.batch_size, drop_remainder=settings.drop_remainder)
        return stream

    cursor = GrainCursor(one_pass)
    return stream_epochs(kind, cursor, settings, endless=endless, batch_size=settings.batch_size)


def grain_iter(dataset: Any, settings: WrapSettings, **_: Any) -> Epochs:
    kind = "grain.IterDataset"
    fix = (
        "Shard the MapDataset it comes from before .to_iter_dataset() "
        "(dataset[process_index::process_count]) and pass process_count=1, or wrap the "
        "MapDataset itself: wrap reads it in the shared order, one slice per process"
    )
    own_order(kind, settings, "it is a stream")
    one_process(kind, settings, "it is a stream", fix)
    batch_size = settings.batch_size
    native = wrap_sampled.grain_batch_size(dataset)
    if native is not None and batch_size not in (None, native):
        raise ValueError(
            f"the grain.IterDataset yields batches of {native} but batch_size={batch_size}; "
            f"omit batch_size, or build it with .batch({batch_size})"
        )
    if native is None and batch_size is not None:
        dataset = dataset.batch(batch_size, drop_remainder=settings.drop_remainder)
    endless = wrap_sampled.grain_endless(dataset)
    cursor = GrainCursor(lambda pass_: dataset)
    return stream_epochs(kind, cursor, settings, endless=endless, batch_size=batch_size or native)


def grain_loader(loader: Any, settings: WrapSettings, why: str) -> Epochs:
    """A Grain ``DataLoader`` whose sampler is not an ``IndexSampler``."""
    kind = "grain.DataLoader"
    fix = "Build it with grain.samplers.IndexSampler(...) so wrap reads it in the shared order"
    own_order(kind, settings, why)
    one_process(kind, settings, why, fix)
    return stream_epochs(kind, GrainCursor(lambda pass_: loader), settings, endless=False)


# --- Hugging Face ----------------------------------------------------------------------


def hf_stream(dataset: Any, settings: WrapSettings, columns: Any = None) -> Epochs:
    """A ``datasets.IterableDataset``, in its own order; on several processes
    each reads its share from ``datasets.distributed.split_dataset_by_node``."""
    kind = "datasets.IterableDataset"
    own_order(kind, settings, "it is a stream")
    batch_size, drop_remainder = settings.batch_size, settings.drop_remainder
    if batch_size is None:
        raise ValueError("a datasets.IterableDataset streams rows; pass batch_size= to batch it")
    if columns is not None:
        dataset = dataset.select_columns(list(columns))
    if settings.process_count > 1:
        from datasets.distributed import split_dataset_by_node

        dataset = split_dataset_by_node(
            dataset, rank=settings.process_index, world_size=settings.process_count
        )
    exact = not _hf_buffer_shuffled(dataset)
    cursor = HfCursor(dataset.with_format("numpy"), batch_size, drop_remainder, exact)
    return stream_epochs(kind, cursor, settings, endless=False, batch_size=batch_size)


def _hf_buffer_shuffled(dataset: Any) -> bool:
    """Whether a stream's chain holds a shuffle buffer, whose rows HF's
    ``state_dict`` leaves out ("examples from shuffle buffers are lost when
    resuming", its docs say).

    datasets 5.2 shows no public view of the chain: the private
    ``_ex_iterable`` and each step's ``ex_iterable(s)`` are walked; a layout
    not found counts as shuffled (resumed by reading again, always exact).
    """
    todo = [getattr(dataset, "_ex_iterable", None)]
    if todo[0] is None:
        return True
    while todo:
        node = todo.pop()
        if type(node).__name__ == "BufferShuffledExamplesIterable":
            return True
        todo.extend(getattr(node, "ex_iterables", ()))
        if getattr(node, "ex_iterable", None) is not None:
            todo.append(node.ex_iterable)
    return False


def _declared_dtypes(features: Mapping[str, Any] | None) -> dict[str, np.dtype]:
    """Numeric dtypes the user declared per column (Value, ArrayND, nested List)."""
    out = {}
    for name, feature in (features or {}).items():
        while getattr(feature, "dtype", None) is None and hasattr(feature, "feature"):
            feature = feature.feature
        try:
            dtype = np.dtype(getattr(feature, "dtype", None) or "O")
        except TypeError:  # "string", "timestamp[s]", PIL images, ...
            continue
        if dtype.kind in "biuf":
            out[name] = dtype
    return out


# --- plain Python ----------------------------------------------------------------------

_REPLAY = (
    "Pass a list of the batches, or a random-access dataset (read in the shared order, "
    "it restarts anywhere exactly); or, if every {again} yields the same batches, pass "
    "resume='replay' to wrap() and they are read again up to the position"
)


def reiterable(obj: Iterable, settings: WrapSettings, **_: Any) -> Epochs:
    """A list or tuple of batches (fixed: read again, exact), or another
    re-iterable (restarts only at an epoch's start, unless ``resume``)."""
    kind = "re-iterable of batches"
    own_order(kind, settings, "it is a sequence of batches")
    one_process(kind, settings, "it is a sequence of batches", SHARD_YOURSELF)
    refusal = None
    if not isinstance(obj, list | tuple) and settings.resume is None:
        name = type(obj).__name__
        refusal = (
            f"wrap cannot know that iterating the {name} again gives the same batches. "
            + _REPLAY.format(again="iteration")
        )
    num = None if settings.drop_remainder else length(obj)
    cursor = IterCursor(lambda pass_: iter(obj), refusal)
    return stream_epochs(kind, cursor, settings, endless=False, num_batches=num)


def factory(make: Callable, settings: WrapSettings, **_: Any) -> Epochs:
    """A zero-argument callable returning an iterator of batches, called per pass."""
    kind = "callable returning batches"
    own_order(kind, settings, "it is a stream")
    one_process(kind, settings, "it is a stream", SHARD_YOURSELF)
    refusal = None
    if settings.resume is None:
        refusal = (
            "wrap cannot know that calling the function again gives the same batches. "
            + _REPLAY.format(again="call")
        )
    cursor = IterCursor(lambda pass_: iter(make()), refusal)
    return stream_epochs(kind, cursor, settings, endless=False)

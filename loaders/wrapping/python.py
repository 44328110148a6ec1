"""Plain Python for `wrap`: a list, tuple or other re-iterable of batches, or a
callable returning an iterator of them, each read in its own order.

A list or tuple is fixed, so a position is reached by reading it again. A
callable or another re-iterable may not repeat, so it restarts only at an
epoch's start unless ``wrap(..., resume="replay")`` vouches that it does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from jaxfeed.loaders.wrapping.epochs import Epochs, WrapSettings
from jaxfeed.loaders.wrapping.streams import (
    SHARD_YOURSELF,
    IterCursor,
    length,
    one_process,
    own_order,
    stream_epochs,
)

_REPLAY = (
    "Pass a list of the batches, or a random-access dataset (read in the shared order, "
    "it restarts anywhere exactly); or, if every {again} yields the same batches, pass "
    "resume='replay' to wrap() and they are read again up to the position"
)


def wrap_reiterable(obj: Iterable, settings: WrapSettings, **_: Any) -> Epochs:
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


def wrap_factory(make: Callable, settings: WrapSettings, **_: Any) -> Epochs:
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

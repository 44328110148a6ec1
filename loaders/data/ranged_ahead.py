"""Read-ahead across batches for fields read in place (`ranged_npy.RangedRows`):
the reads of the next batches start while this one is gathered and used.

A batch's reads run in its block cache's sliding window, but without help
the window drains at the batch's end: the next batch's reads begin only when
it is asked for. The sampler knows an epoch's order, so as the reader reaches
each batch (`RangedReadAhead.reached`) the blocks of the batches after it
are hinted to their fields' caches (`RangedRows.prefetch`), at least
`MIN_STEPS` batches ahead and more while the caches welcome them (their
hints queued are under their read-ahead share), at most `MAX_STEPS`. The
cache reads them behind every batch's own reads, within half its byte
bound, and holds them for their batch (`BlockCache.hint`). A batch passed
lets its pins go; `close` (an epoch's end, or its iterator closed) drops
every hint not yet read. It starts no thread: the cache's read pool does
the reads. The batches are the same bytes: a hint only decides when a block
is read, never what a batch is gathered from.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
from jaxfeed.loaders.data.ranged_npy import BlockCache, RangedRows

__all__ = ["MAX_STEPS", "MIN_STEPS", "RangedReadAhead"]

MIN_STEPS = 2  # batches always hinted past the one reached: the next is read while it is used
MAX_STEPS = 64  # the most: a plan whose blocks are held already is not walked to its end


class RangedReadAhead:
    """Hints the rows of ``plan``'s coming batches to ``fields`` as the reader
    reaches each (see the module). A no-op without fields read in place.

    Args:
      fields: the fields this process gathers the batches from; those read
        in place are read ahead, the others passed by.
      plan: the epoch's index batches, in reading order (from its resume point).
    """

    def __init__(self, fields: Iterable[object], plan: Sequence[np.ndarray]):
        self._fields = [f for f in fields if isinstance(f, RangedRows)]
        self._caches: list[BlockCache] = []
        for field in self._fields:
            if all(field.cache is not c for c in self._caches):
                self._caches.append(field.cache)
        self._plan = plan
        self._next = 0  # the next batch to hint
        self._closed = False
        self.reached(-1)

    def reached(self, step: int) -> None:
        """The reader has batch ``step`` of the plan: the pins of it and of
        the batches before are let go, and the batches after it hinted."""
        if self._closed or not self._fields:
            return
        for cache in self._caches:
            cache.passed(self, step)
        self._next = max(self._next, step + 1)
        while self._next < len(self._plan) and self._next <= step + MAX_STEPS:
            pin = (self, self._next)
            welcome = [field.prefetch(self._plan[self._next], pin) for field in self._fields]
            self._next += 1
            if self._next > step + MIN_STEPS and not all(welcome):
                break

    def close(self) -> None:
        """Drops every hint not yet read and lets every pin go (reads in
        flight finish into the cache)."""
        self._closed = True
        for cache in self._caches:
            cache.passed(self)

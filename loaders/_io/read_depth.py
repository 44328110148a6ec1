"""How many reads the disk read-ahead keeps outstanding: found from the
throughput they reach, not tuned for one disk.

A disk's bandwidth and random-read rate grow with the reads in flight up to
a point that differs by disk (one measured 3.8k random 4 KiB reads/s with one
reader and 10k with 32, another 16.5k and 54k). `ReadDepth` climbs: it
doubles the depth while each doubling raises the throughput by more than
`GAIN`, goes back to the last depth that helped once one does not, and tries
again after `RETRY_PERIODS` periods at the same depth (another job may have
freed the disk). Periods in which the readers ran out of work say nothing
about the disk (the reader of the batches set the pace) and are not judged.
The depth never passes ``ceiling``, which the caller derives from its memory
budget.
"""

from __future__ import annotations

import time
from collections.abc import Callable

GAIN = 0.1
"""A step up in depth is kept when throughput rises by more than this fraction."""
PERIOD_SECONDS = 0.25
"""Throughput is judged over periods this long (thousands of random reads)."""
RETRY_PERIODS = 16
"""Periods held at one depth before trying a step up again."""


class ReadDepth:
    """The number of reads to keep outstanding, from the throughput they reach.

    Args:
      ceiling: the most reads ever outstanding (the memory budget over the
        bytes of one read).
      floor: the fewest (and the start).
      clock: seconds, monotonic (a fake one in tests).
    """

    def __init__(self, ceiling: int, floor: int = 2, clock: Callable[[], float] = time.monotonic):
        self.floor = max(1, min(floor, ceiling))
        self.ceiling = max(self.floor, ceiling)
        self.depth = self.floor
        self._clock = clock
        self._good = self.floor  # the deepest depth that raised throughput
        self._rate = 0.0  # bytes/s at ``_good``
        self._held = 0  # periods judged at the current depth
        self._started: float | None = None
        self._bytes = 0
        self._busy = True  # no read found the queue empty this period

    def done(self, nbytes: int, backlog: bool) -> int:
        """One read of ``nbytes`` finished; ``backlog``: more were waiting. The depth now."""
        now = self._clock()
        if self._started is None:
            self._started = now
        self._bytes += nbytes
        self._busy = self._busy and backlog
        elapsed = now - self._started
        if elapsed >= PERIOD_SECONDS:
            if self._busy:
                self._judge(self._bytes / elapsed)
            self._started, self._bytes, self._busy = now, 0, True
        return self.depth

    def _judge(self, rate: float) -> None:
        if rate > self._rate * (1 + GAIN):  # the last step helped (or none was taken yet)
            self._good, self._rate, self._held = self.depth, rate, 0
            self.depth = min(self.ceiling, self.depth * 2)
        elif self.depth > self._good:  # it did not: back to the last depth that did
            self.depth, self._held = self._good, 0
        else:
            self._rate, self._held = rate, self._held + 1  # the disk's rate now, at this depth
            if self._held >= RETRY_PERIODS and self.depth < self.ceiling:
                self.depth, self._held = min(self.ceiling, self.depth * 2), 0

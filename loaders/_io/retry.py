"""A call retried with exponential backoff and full jitter, within a time budget.

Object stores fail transiently (time-outs, connection resets, 5xx, 429 /
``SlowDown``); one such failure must not end a run, and a store that stays
down must not hang it. Which errors are transient is the caller's to say.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["RetriesExhausted", "with_retries"]

T = TypeVar("T")

FIRST_DELAY_S = 0.05
MAX_DELAY_S = 5.0


class RetriesExhausted(OSError):
    """A transient failure that lasted past the retry budget."""


def with_retries(
    call: Callable[[], T],
    *,
    what: str,
    transient: Callable[[BaseException], bool],
    budget_s: float,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``call()``, again after each transient failure until ``budget_s`` seconds
    have passed; the waits double from `FIRST_DELAY_S` up to `MAX_DELAY_S`,
    each a uniform draw below that (full jitter: many readers that failed
    together do not retry together).

    Args:
      call: what to do; it raises on failure.
      what: the work, for the final error (a URL and byte range).
      transient: whether an error is worth another try; others raise at once.
      budget_s: seconds, from the first try, after which no new try starts.

    Raises:
      RetriesExhausted: naming ``what``, the tries and the last error (its cause).
    """
    began = time.monotonic()
    for attempt in range(1_000_000):
        try:
            return call()
        except Exception as error:
            if not transient(error):
                raise
            delay = random.uniform(0, min(MAX_DELAY_S, FIRST_DELAY_S * 2**attempt))
            spent = time.monotonic() - began
            if spent + delay > budget_s:
                raise RetriesExhausted(
                    f"{what}: failed {attempt + 1} time(s) over {spent:.1f} s, past the retry "
                    f"budget of {budget_s:g} s; last error: {type(error).__name__}: {error}"
                ) from error
            sleep(delay)
    raise AssertionError("unreachable")

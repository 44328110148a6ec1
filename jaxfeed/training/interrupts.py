"""Stopping a run at a step: Ctrl-C (SIGINT) and preemption (SIGTERM).

Cloud machines are preempted with SIGTERM and a grace period (about 30 s);
`jaxfeed.fit` treats it as Ctrl-C: it stops at the next step boundary,
saves a checkpoint of that step, closes the feed and its workers, and raises
`Preempted`. ``jaxfeed train`` then exits with `PREEMPTED_STATUS`.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

PREEMPTED_STATUS = 128 + signal.SIGTERM  # 143, what a shell reports for a SIGTERM'd job


class Preempted(KeyboardInterrupt):
    """`fit` stopped at a step on SIGTERM (how cloud machines are preempted), checkpointed."""


class Interrupts:
    """While active (main thread only), Ctrl-C (SIGINT) and preemption (SIGTERM)
    ask the loop to stop at the next step instead of raising wherever Python
    happens to be; a second signal raises at once, for a loop stuck in a slow
    call."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.requested: int | None = None  # the signal that asked, if one did
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested is not None:
            raise interrupt(signum, "a second signal")
        self.requested = signum

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc_info: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)


def interrupt(signum: int | None, message: str) -> KeyboardInterrupt:
    """`Preempted` for SIGTERM, else a plain KeyboardInterrupt, saying ``message``."""
    return (Preempted if signum == signal.SIGTERM else KeyboardInterrupt)(message)

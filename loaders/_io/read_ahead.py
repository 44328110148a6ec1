"""One thread body that reads an iterator into a bounded queue, shared by
`DeviceFeed`'s opt-in reading thread and the torch worker watch."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

END = object()  # the last item of a finished iterator
POLL_SECONDS = 0.1  # how often a blocked put checks for ``stop``


def pump(items: Iterator[Any], out: queue.Queue, stop: threading.Event) -> None:
    """Thread body: ``(item, None)`` pairs into ``out``, then ``(END, None)``,
    or ``(None, error)`` after every good item. Returns early once ``stop``
    is set, and closes ``items`` if it can be closed."""

    def put(pair: tuple[Any, BaseException | None]) -> bool:
        while not stop.is_set():
            try:
                out.put(pair, timeout=POLL_SECONDS)
                return True
            except queue.Full:
                continue
        return False

    try:
        for item in items:
            if not put((item, None)):
                return
        put((END, None))
    except BaseException as error:  # re-raised by the consumer, in order
        put((None, error))
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            close()

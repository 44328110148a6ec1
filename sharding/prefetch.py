"""Two-stage prefetch: a host thread fills a bounded queue, and the consumer
keeps a few batches already placed on device, so the step never waits on
either the loader or the host-to-device copy when they can keep up."""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import jax
from jax.sharding import NamedSharding

from loaders.protocol import BatchSource
from sharding.mesh import batch_sharding
from sharding.placement import check_batch_size, place_batch

_END = object()
_POLL_SECONDS = 0.1


def _produce(batches: Iterator[Any], out: queue.Queue, stop: threading.Event) -> None:
    """Thread body: moves host batches into ``out`` until done or stopped.

    It holds no reference to the feed, so an abandoned feed can still be
    garbage-collected (and its ``__del__`` stops this thread).
    """

    def put(item: tuple[Any, BaseException | None]) -> bool:
        while not stop.is_set():
            try:
                out.put(item, timeout=_POLL_SECONDS)
                return True
            except queue.Full:
                continue
        return False

    try:
        for batch in batches:
            if not put((batch, None)):
                return
        put((_END, None))
    except BaseException as error:  # re-raised in the consumer
        put((None, error))
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()


class DeviceFeed:
    """Iterates one epoch of a `BatchSource` as placed, sharded `jax.Array`s.

    Args:
      source: the host batches.
      sharding: the batch sharding, a `Mesh`, or None for all devices.
      epoch: which epoch of ``source`` to read.
      start: first batch of that epoch (for resuming).
      host_buffer: host batches the producer thread may run ahead.
      device_buffer: batches kept placed on device ahead of the consumer.

    Raises:
      ValueError: the global batch does not divide over the mesh's data axis
        (raised here, before any data is read or placed).

    ``wait_seconds`` accumulates the time the consumer spent waiting for the
    host thread. Errors in the loader are re-raised from ``next()``. Use it as
    a context manager (or call ``close()``) to stop the thread early.

    Example:
      >>> with DeviceFeed(source, mesh, epoch=0) as feed:
      ...     for batch in feed:
      ...         state = train_step(state, batch)
    """

    def __init__(
        self,
        source: BatchSource,
        sharding: NamedSharding | jax.sharding.Mesh | None = None,
        *,
        epoch: int = 0,
        start: int = 0,
        host_buffer: int = 4,
        device_buffer: int = 2,
    ):
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if host_buffer < 1 or device_buffer < 1:
            raise ValueError(
                f"host_buffer and device_buffer must be >= 1, got {host_buffer}, {device_buffer}"
            )
        self.sharding = batch_sharding(sharding)
        check_batch_size(source.batch_size, self.sharding)
        self.num_batches = source.num_batches
        self.wait_seconds = 0.0
        self._device_buffer = device_buffer
        self._placed: collections.deque = collections.deque()
        self._queue: queue.Queue = queue.Queue(maxsize=host_buffer)
        self._exhausted = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=_produce,
            args=(source.iter_epoch(epoch, start=start), self._queue, self._stop),
            name=f"jaxfeed-prefetch-epoch{epoch}",
            daemon=True,
        )
        self._thread.start()

    def __iter__(self) -> DeviceFeed:
        return self

    def __next__(self) -> dict[str, jax.Array]:
        while not self._exhausted and len(self._placed) < self._device_buffer:
            if self._placed and self._queue.empty():
                break  # don't wait for the loader while a placed batch is ready
            batch = self._take()
            if batch is _END:
                self._exhausted = True
            else:
                self._placed.append(place_batch(batch, self.sharding))
        if self._placed:
            return self._placed.popleft()
        self.close()
        if self._error is not None:
            # Raised once, after every batch read before the failure was served.
            error, self._error = self._error, None
            raise error
        raise StopIteration

    def _take(self) -> Any:
        """The next host batch, or _END (also after a loader error, kept for later)."""
        started = time.perf_counter()
        try:
            while True:
                try:
                    batch, error = self._queue.get(timeout=_POLL_SECONDS)
                    break
                except queue.Empty:
                    if not self._thread.is_alive() and self._queue.empty():
                        raise RuntimeError("the prefetch thread stopped unexpectedly") from None
        finally:
            self.wait_seconds += time.perf_counter() - started
        if error is not None:
            self._error = error
            return _END
        return batch

    def close(self) -> None:
        """Stops the producer thread and drops buffered batches. Idempotent."""
        self._stop.set()
        if self._thread is None:  # __init__ raised before the thread existed
            return
        while True:  # unblock a producer waiting on a full queue
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        self._placed.clear()

    def __enter__(self) -> DeviceFeed:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

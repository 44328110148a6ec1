"""Two-stage prefetch: one thread reads host batches into a bounded queue,
a second places them on device into another, and the consumer only pops
batches that are already placed. The step never waits on the loader or on
the host-to-device copy while they keep up."""

from __future__ import annotations

import functools
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
from jax.sharding import NamedSharding

from loaders.protocol import BatchSource
from sharding.mesh import batch_sharding
from sharding.placement import check_batch_size, check_process, place_batch

_END = object()
_POLL_SECONDS = 0.1


def _put(out: queue.Queue, item: tuple[Any, BaseException | None], stop: threading.Event) -> bool:
    while not stop.is_set():
        try:
            out.put(item, timeout=_POLL_SECONDS)
            return True
        except queue.Full:
            continue
    return False


def _pump(
    items: Iterator[Any], out: queue.Queue, stop: threading.Event, apply: Callable | None = None
) -> None:
    """Thread body: moves ``items`` (through ``apply``) into ``out`` until done
    or stopped; an exception travels as the last item, after every good one.

    It holds no reference to the feed, so an abandoned feed can still be
    garbage-collected (and its ``__del__`` stops the threads).
    """
    try:
        for item in items:
            if not _put(out, (apply(item) if apply else item, None), stop):
                return
        _put(out, (_END, None), stop)
    except BaseException as error:  # re-raised in the consumer
        _put(out, (None, error), stop)
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            close()


def _drain(source: queue.Queue, stop: threading.Event) -> Iterator[Any]:
    """Items of a queue filled by `_pump`, re-raising its error in order."""
    while not stop.is_set():
        try:
            item, error = source.get(timeout=_POLL_SECONDS)
        except queue.Empty:
            continue
        if error is not None:
            raise error
        if item is _END:
            return
        yield item


class DeviceFeed:
    """Iterates one epoch of a `BatchSource` as placed, sharded `jax.Array`s.

    Args:
      source: the host batches.
      sharding: the batch sharding, a `Mesh`, or None for all devices.
      epoch: which epoch of ``source`` to read.
      start: first batch of that epoch (for resuming).
      host_buffer: host batches the reading thread may run ahead.
      device_buffer: placed batches kept on device ahead of the consumer.

    Raises:
      ValueError: the global batch does not divide over the mesh's data axis
        (raised here, before any data is read or placed).

    ``wait_seconds`` accumulates the time the consumer spent waiting for a
    placed batch. Errors in the loader are re-raised from ``next()`` after
    every batch read before them. Use it as a context manager (or call
    ``close()``) to stop the threads early.

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
        self._threads: list[threading.Thread] = []
        if host_buffer < 1 or device_buffer < 1:
            raise ValueError(
                f"host_buffer and device_buffer must be >= 1, got {host_buffer}, {device_buffer}"
            )
        self.sharding = batch_sharding(sharding)
        check_batch_size(source.batch_size, self.sharding)
        check_process(source)
        self.num_batches = source.num_batches
        self.wait_seconds = 0.0
        self._done = False
        host: queue.Queue = queue.Queue(maxsize=host_buffer)
        self._placed: queue.Queue = queue.Queue(maxsize=device_buffer)
        self._queues = (host, self._placed)
        # Not a bound method: the threads must not keep the feed alive.
        place = functools.partial(place_batch, sharding=self.sharding)
        stages = [
            ("read", (source.iter_epoch(epoch, start=start), host, self._stop)),
            ("place", (_drain(host, self._stop), self._placed, self._stop, place)),
        ]
        for name, args in stages:
            thread = threading.Thread(
                target=_pump, args=args, name=f"jaxfeed-prefetch-{name}-epoch{epoch}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def __iter__(self) -> DeviceFeed:
        return self

    def __next__(self) -> dict[str, jax.Array]:
        if self._done:
            raise StopIteration
        started = time.perf_counter()
        try:
            while True:
                try:
                    batch, error = self._placed.get(timeout=_POLL_SECONDS)
                    break
                except queue.Empty:
                    if not any(t.is_alive() for t in self._threads) and self._placed.empty():
                        raise RuntimeError("the prefetch threads stopped unexpectedly") from None
        finally:
            self.wait_seconds += time.perf_counter() - started
        if error is not None or batch is _END:
            self.close()
            if error is not None:
                raise error
            raise StopIteration
        return batch

    def close(self) -> None:
        """Stops the threads and drops buffered batches. Idempotent."""
        self._done = True
        self._stop.set()
        for q in getattr(self, "_queues", ()):
            while True:  # unblock a producer waiting on a full queue
                try:
                    q.get_nowait()
                except queue.Empty:
                    break
        for thread in self._threads:
            if thread.is_alive() and thread is not threading.current_thread():
                thread.join(timeout=10)

    def __enter__(self) -> DeviceFeed:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not sys.is_finalizing():  # at exit, module globals may already be gone
            self.close()

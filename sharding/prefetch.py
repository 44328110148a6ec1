"""DeviceFeed: one epoch of host batches, placed on the mesh ahead of the step.

Where the time goes (``benchmarks/feed_overhead.py``): on CPython, handing a
batch from one thread to another costs more than reading an in-memory batch
(a wake-up plus a GIL switch, ~100 µs on a loaded 2-core machine, against
~20 µs to slice 128 digits). So by default the feed reads on the caller's
thread and gets ahead the way accelerators do: ``jax.device_put`` is
asynchronous, and several batches go in one call, which amortizes its
per-call cost (on CPU a jitted identity places each small batch, cheaper still:
`place_local`). The loaders bring their own read-ahead (torch and Grain
workers, tf.data's prefetch). A background reading thread is one argument
away (``host_buffer=N``) for a loader that blocks in Python without one.
"""

from __future__ import annotations

import atexit
import collections
import queue
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec
from jaxfeed.loaders._io.read_ahead import END, POLL_SECONDS, pump
from jaxfeed.loaders.checks import check_source
from jaxfeed.loaders.protocol import BatchSource, host_fields
from jaxfeed.sharding.mesh import batch_sharding
from jaxfeed.sharding.placement import (
    check_global_batch_divides_mesh,
    check_process,
    place_batch,
    place_local,
)

_OPEN_FEEDS: weakref.WeakSet = weakref.WeakSet()
_EXIT_HOOK: list[bool] = []


def _close_open_feeds() -> None:
    """At exit, close feeds left open, before the frameworks tear down: a
    tf.data iterator still alive in interpreter shutdown aborts the process."""
    for feed in list(_OPEN_FEEDS):
        feed.close()


def _register(feed: DeviceFeed) -> None:
    _OPEN_FEEDS.add(feed)
    if not _EXIT_HOOK:
        # Registered at the first feed, so after the framework the source
        # imported: atexit runs last-in first-out, so this runs before its hooks.
        atexit.register(_close_open_feeds)
        _EXIT_HOOK.append(True)


_ALIGN = 64  # bytes: XLA's CPU client places an array this aligned without copying it


def _aligned_stack(arrays: list[np.ndarray]) -> np.ndarray:
    """The arrays stacked into a fresh buffer aligned to ``_ALIGN`` bytes. On
    CPU, ``jax.device_put`` then aliases it instead of copying it a second
    time (measured: 800 KB of digits placed in 38 µs aligned, 168 µs not).
    Row by row, not ``np.stack``: its set-up costs more than copying a small
    leaf (a label vector)."""
    first = np.asarray(arrays[0])
    nbytes = first.nbytes * len(arrays)
    raw = np.empty(nbytes + _ALIGN, np.uint8)
    offset = -raw.ctypes.data % _ALIGN
    out = raw[offset : offset + nbytes].view(first.dtype).reshape(len(arrays), *first.shape)
    for i, array in enumerate(arrays):
        # Checked, as assignment would broadcast a shape and cast a dtype silently.
        if array.shape != first.shape or array.dtype != first.dtype:
            raise ValueError(
                f"the batches of one transfer differ: batch {i} is {array.dtype} "
                f"{array.shape}, batch 0 {first.dtype} {first.shape}"
            )
        out[i] = array
    return out


def stack_transfer(batches: list[dict[str, np.ndarray]], host: tuple[str, ...]) -> dict[str, Any]:
    # Host fields may change width between batches (strings): a list, not a stack.
    return {
        key: [b[key] for b in batches]
        if key in host
        else _aligned_stack([np.asarray(b[key]) for b in batches])
        for key in batches[0]
    }


def _transfers(
    batches: Iterator[dict[str, np.ndarray]], k: int, host: tuple[str, ...]
) -> Iterator[dict]:
    """Host batches grouped into what one transfer carries: k stacked batches.
    A function, not a method: the reading thread must not keep the feed alive."""
    if k == 1:
        return batches
    return _stacked(batches, k, host)


def _stacked(
    batches: Iterator[dict[str, np.ndarray]], k: int, host: tuple[str, ...]
) -> Iterator[dict]:
    group: list = []
    try:
        for batch in batches:
            group.append(batch)
            if len(group) == k:
                yield stack_transfer(group, host)
                group = []
        if group:
            yield stack_transfer(group, host)
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()


def transfer_sharding(sharding: NamedSharding, steps_per_transfer: int) -> NamedSharding:
    """The sharding of one transfer: the batch sharding, or for k > 1 steps
    per transfer that of the ``[k, B, ...]`` stack (batch axis 1)."""
    if steps_per_transfer == 1:
        return sharding
    return NamedSharding(sharding.mesh, PartitionSpec(None, *sharding.spec))


class DeviceFeed:
    """Iterates one epoch of a `BatchSource` as placed, sharded `jax.Array`s.

    Args:
      source: the host batches.
      sharding: the batch sharding, a `Mesh`, or None for all devices.
      epoch: which epoch of ``source`` to read.
      start: first batch of that epoch (for resuming).
      device_buffer: transfers issued together and kept on device ahead of
        the consumer.
      host_buffer: 0 (default) reads on the caller's thread; N > 0 reads on
        a background thread up to N transfers ahead. Use it for a loader
        that blocks in Python and has no read-ahead of its own.
      steps_per_transfer: k > 1 stacks k host batches into one ``[k, B, ...]``
        array per leaf, sharded on axis 1, for a training loop that runs k
        steps in one ``lax.scan``. The epoch's last transfer holds the
        remaining ``num_batches % k`` batches when k does not divide it.

    A source's ``host_fields`` (optional attribute, e.g. a wrapped loader's
    text column) are not placed: each batch carries them as this process's
    numpy arrays (with k > 1, a list of k arrays), next to the device leaves.

    Raises:
      TypeError: ``source`` is not a `BatchSource`, or ``sharding`` neither a
        sharding, a mesh nor None.
      ValueError: a bad argument, or the global batch does not divide over
        the mesh's data axis (raised here, before any data is read).

    The first transfer is read and placed here, so a feed opened for the
    next epoch loads while the current one is evaluated. ``wait_seconds``
    accumulates the time the consumer spent in ``next()``. A loader error is
    raised from ``next()`` after every batch read before it. Use the feed as
    a context manager (or call ``close()``) to stop early; feeds still open
    at interpreter exit are closed then.

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
        device_buffer: int = 4,
        host_buffer: int = 0,
        steps_per_transfer: int = 1,
    ):
        self._closed = False
        self._ended = False  # the loader has no more batches
        self._error: BaseException | None = None  # raised once the batches before it are served
        self._placed: collections.deque = collections.deque()
        self._thread: threading.Thread | None = None
        for name, value, low in (
            ("device_buffer", device_buffer, 1),
            ("host_buffer", host_buffer, 0),
            ("steps_per_transfer", steps_per_transfer, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        check_source("source", source)
        self.sharding = batch_sharding(sharding, argument="sharding")
        check_global_batch_divides_mesh(source.batch_size, self.sharding)
        check_process(source)
        self.num_batches = source.num_batches
        self.host_fields = host_fields(source)
        self.steps_per_transfer = int(steps_per_transfer)
        self._transfer_sharding = transfer_sharding(self.sharding, self.steps_per_transfer)
        self.wait_seconds = 0.0
        self._device_buffer = int(device_buffer)
        self._host = _transfers(
            source.iter_epoch(epoch, start=start), self.steps_per_transfer, self.host_fields
        )
        if host_buffer:
            self._stop = threading.Event()
            self._queue: queue.Queue = queue.Queue(maxsize=int(host_buffer))
            self._thread = threading.Thread(
                target=pump,
                args=(self._host, self._queue, self._stop),
                name=f"jaxfeed-read-epoch{epoch}",
                daemon=True,
            )
            self._thread.start()
        _register(self)
        started = time.perf_counter()
        self._fill()
        self.wait_seconds += time.perf_counter() - started

    def _next_host(self) -> Any:
        """The next host transfer, or ``END``; raises the loader's error."""
        if self._thread is None:
            return next(self._host, END)
        while True:
            try:
                item, error = self._queue.get(timeout=POLL_SECONDS)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    raise RuntimeError("the feed's reading thread stopped unexpectedly") from None
        if error is not None:
            raise error
        return item

    def _fill(self) -> None:
        """Reads up to ``device_buffer`` transfers and places them in one call.
        A loader error is kept until the batches read before it are served."""
        group = []
        try:
            while len(group) < self._device_buffer:
                item = self._next_host()
                if item is END:
                    self._ended = True
                    break
                group.append(item)
        except Exception as error:
            self._error = error
        if not group:
            return
        fields = self.host_fields
        if fields:  # host fields skip placement and stay this process's numpy arrays
            host = [{k: b[k] for k in fields} for b in group]
            group = [{k: v for k, v in b.items() if k not in fields} for b in group]
        if jax.process_count() == 1:
            placed = place_local(group, self._transfer_sharding)
        else:
            placed = [place_batch(b, self._transfer_sharding) for b in group]
        if fields:
            placed = [p | h for p, h in zip(placed, host, strict=True)]
        self._placed.extend(placed)

    def __iter__(self) -> DeviceFeed:
        return self

    def __next__(self) -> dict[str, Any]:
        if self._closed:
            raise StopIteration
        started = time.perf_counter()
        try:
            if not self._placed and self._error is None and not self._ended:
                self._fill()
            if self._placed:
                return self._placed.popleft()
        finally:
            self.wait_seconds += time.perf_counter() - started
        error, self._error = self._error, None
        self.close()
        if error is not None:
            raise error
        raise StopIteration

    def close(self) -> None:
        """Stops reading and drops batches not yet served. Idempotent."""
        if self._closed:
            return
        self._closed = True
        _OPEN_FEEDS.discard(self)
        self._placed.clear()
        if self._thread is not None:
            self._stop.set()
            if self._thread is not threading.current_thread():
                self._thread.join(timeout=10)
        else:
            close = getattr(getattr(self, "_host", None), "close", None)
            if close is not None:
                close()

    def __enter__(self) -> DeviceFeed:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not sys.is_finalizing() and hasattr(self, "_placed"):
            self.close()

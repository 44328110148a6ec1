"""Batches handed from worker processes to the reader through a ring of
batch-sized slots in one shared-memory file per epoch, reused batch after batch.

A file per batch (`jaxfeed.loaders._workers.shared_batches`) costs the kernel
a new file's pages in the worker and their release in the reader, every
batch: for batches of raw rows that was most of the CPU time of the whole
read. Here the reader's process makes the ring (its pages allocated once,
up front) and gives each index batch a free slot (`BatchRing.lease`) before
it goes to a worker; the worker gathers the rows straight into that slot
(`gather_into`, or copies a transformed batch there with `write`), and the
reader copies the batch out and frees the slot (`BatchRing.collect`).

Only the reader's process says which slot is free, so the processes share no
lock: a slot goes to a worker with its task and comes back with the reply.
When every slot is taken (the consumer holds more batches than the ring has
slots), or a batch does not fit one, the batch goes as a file, as before.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import uuid
import weakref
from collections.abc import Callable, Mapping
from typing import NamedTuple

import numpy as np
from jaxfeed.loaders._workers.shared_batches import Layout, layout_bytes, views

__all__ = ["BatchRing", "Ringed", "Slot", "gather_into", "write"]


class Slot(NamedTuple):
    """Where a worker puts one batch: slot ``index`` of ``nbytes`` in ring ``path``."""

    path: str
    index: int
    nbytes: int


class Ringed(NamedTuple):
    """A batch a worker put in its slot: what it hands back."""

    slot: Slot
    layout: Layout


class BatchRing:
    """``slots`` slots of ``slot_bytes`` in a new file in ``directory``
    (shared memory), all free; the file goes with `close` (or the ring).

    Raises:
      OSError: the file system has no room for the ring (then hand files).
    """

    def __init__(self, directory: str, slot_bytes: int, slots: int):
        page = mmap.PAGESIZE
        self.slot_bytes = -(-max(1, slot_bytes) // page) * page  # page-aligned slots
        self.path = os.path.join(directory, f"ring-{uuid.uuid4().hex}")
        size = self.slot_bytes * slots
        handle = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            # Pages taken now: a write to a mapped page of a full tmpfs is SIGBUS.
            os.posix_fallocate(handle, 0, size)
            self._map = mmap.mmap(handle, size)
        except OSError:
            os.unlink(self.path)
            raise
        finally:
            os.close(handle)
        self._data = np.frombuffer(self._map, np.uint8).reshape(slots, self.slot_bytes)
        self._free = [True] * slots
        self._next = 0
        self._unlink = weakref.finalize(self, _unlink, self.path)

    def lease(self) -> Slot | None:
        """The next slot in turn, now taken; None when it is still taken."""
        index = self._next
        if not self._free[index]:
            return None
        self._free[index] = False
        self._next = (index + 1) % len(self._free)
        return Slot(self.path, index, self.slot_bytes)

    def collect(self, ringed: Ringed) -> dict[str, np.ndarray]:
        """The batch in ``ringed``'s slot (one copy, views of it per field); the slot freed."""
        index = ringed.slot.index
        data = self._data[index, : layout_bytes(ringed.layout)].copy()
        self._free[index] = True
        return views(data, ringed.layout)

    def close(self) -> None:
        """Removes the file (a worker still writing to it writes to memory that goes with it)."""
        self._unlink()


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


# In a worker: the ring of the epoch it serves, mapped. The last epoch's is
# let go at once: its pages (unlinked) count against /dev/shm while mapped.
_MAPPED: dict[str, np.ndarray] = {}


def _slot_memory(slot: Slot) -> np.ndarray | None:
    """In a worker: slot ``slot`` of its ring, mapped; None when the ring is gone."""
    data = _MAPPED.get(slot.path)
    if data is None:
        try:
            with open(slot.path, "r+b") as file:
                data = np.frombuffer(mmap.mmap(file.fileno(), 0), np.uint8)
        except (FileNotFoundError, ValueError):  # its epoch ended, or cut short
            return None
        _MAPPED.clear()
        _MAPPED[slot.path] = data
    start = slot.index * slot.nbytes
    return data[start : start + slot.nbytes]


def _place(slot: Slot, layout: Layout, fill: Callable[[str, np.ndarray], None]) -> Ringed | None:
    """Lays ``layout`` out in ``slot`` and has ``fill(key, view)`` fill each
    field; None when the slot is gone or too small."""
    nbytes = layout_bytes(layout)
    memory = _slot_memory(slot) if nbytes <= slot.nbytes else None
    if memory is None:
        return None
    for key, view in views(memory[:nbytes], layout).items():
        fill(key, view)
    return Ringed(slot, layout)


def gather_into(slot: Slot, arrays: Mapping[str, np.ndarray], indices: np.ndarray) -> Ringed | None:
    """In a worker: the rows ``indices`` of each of ``arrays``, gathered
    straight into ``slot`` (no batch in between); None when it cannot be."""
    layout = [(k, a.dtype.str, (len(indices), *a.shape[1:])) for k, a in arrays.items()]
    # mode="raise" would gather into a buffer first and copy that; the sampler's
    # indices are in range, as checked once here.
    if len(indices) and (indices.min() < 0 or indices.max() >= len(next(iter(arrays.values())))):
        raise IndexError(f"row indices {indices.min()}..{indices.max()} out of range")

    def fill(key: str, out: np.ndarray) -> None:
        np.take(arrays[key], indices, 0, out=out, mode="clip")

    return _place(slot, layout, fill)


def write(slot: Slot, batch: Mapping[str, np.ndarray]) -> Ringed | None:
    """In a worker: ``batch`` copied into ``slot``; None when it cannot be."""
    arrays = {key: np.asarray(array) for key, array in batch.items()}
    layout = [(key, a.dtype.str, a.shape) for key, a in arrays.items()]
    return _place(slot, layout, lambda key, out: np.copyto(out, arrays[key]))

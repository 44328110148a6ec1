"""Read-ahead that keeps the disk busy for a dataset bigger than memory.

A backend reading memory-mapped rows waits for each page fault in turn. A
thread walks the epoch's index plan up to `AHEAD_BYTES` ahead of the reader
and asks the kernel to start reading the coming batches' rows
(``madvise(WILLNEED)`` on the mapped rows returns at once; the reads fill the
page cache meanwhile, which torch and Grain worker processes share). The
rows may lie in several mapped chunks (`MappedRows`): hf reads its Arrow
copy, chunk by chunk, not the dataset's files. Rows closer than
`MERGE_GAP` bytes are asked for as one range, so a block order's batch
becomes a few long reads; a full permutation's rows are asked for one by one,
which keeps many reads in flight (with ``MADV_RANDOM``, measured on 36M rows
bigger than memory: 92,000 random rows/s with hints 4 batches ahead, 16,600
without). A batch whose sampled rows are in memory already is skipped, so a
warm dataset costs a few ``mincore`` calls per batch.
"""

from __future__ import annotations

import ctypes
import mmap
import threading
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from jaxfeed.loaders.workers.mapped_files import MADVISE as _MADVISE
from jaxfeed.loaders.workers.mapped_files import file_rows, libc_function

AHEAD_BYTES = 256 << 20
"""How far ahead of the reader rows are asked for (at least one batch)."""
MERGE_GAP = 64 << 10
"""Rows this close together are read as one range."""
_PROBES = 8  # rows of a batch checked for residency before it is asked for
_PAGE = mmap.PAGESIZE


_MINCORE = libc_function("mincore", ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)


class MappedRows(NamedTuple):
    """Where one field's rows lie in memory mapped from a file: row ``i`` is
    ``row_bytes`` bytes at ``bases[i // chunk_rows] + (i % chunk_rows) * row_bytes``."""

    bases: np.ndarray  # int64 addresses, one per chunk
    chunk_rows: int
    row_bytes: int

    def addresses(self, rows: np.ndarray) -> np.ndarray:
        return self.bases[rows // self.chunk_rows] + (rows % self.chunk_rows) * self.row_bytes


def mapped_rows(arrays: Sequence[np.ndarray]) -> list[MappedRows]:
    """The layouts of the fields among ``arrays`` that are mapped from files."""
    return [
        MappedRows(np.array([a.ctypes.data], np.int64), max(1, len(a)), rows.row_bytes)
        for a in arrays
        if (rows := file_rows(a)) is not None and rows.row_bytes
    ]


class DiskReadAhead:
    """Asks for the rows of ``plan[i + 1 :]`` (up to `AHEAD_BYTES`) while the
    reader is at batch ``i`` (`reached`). A no-op without mapped fields.

    Args:
      fields: where the fields' rows lie (`mapped_rows`).
      plan: the epoch's index batches, in reading order.
    """

    def __init__(self, fields: Sequence[MappedRows], plan: Sequence[np.ndarray]):
        self._fields = list(fields)
        self._plan = plan
        self._reached = -1
        self._changed = threading.Condition()
        self._closed = False
        self._thread = None
        if not self._fields or _MADVISE is None or not len(plan):
            return
        batch_bytes = len(plan[0]) * sum(field.row_bytes for field in self._fields)
        self._ahead = max(1, AHEAD_BYTES // max(1, batch_bytes))
        self._thread = threading.Thread(target=self._run, name="jaxfeed-read-ahead", daemon=True)
        self._thread.start()

    def reached(self, step: int) -> None:
        """The reader is at batch ``step`` of the plan."""
        with self._changed:
            self._reached = step
            self._changed.notify()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        step = 0
        while step < len(self._plan):
            with self._changed:
                while not self._closed and step > self._reached + self._ahead:
                    self._changed.wait()
                if self._closed:
                    return
                step = max(step, self._reached + 1)  # never ask for what was read
            if step < len(self._plan):
                self._ask(self._plan[step])
            step += 1

    def _ask(self, indices: np.ndarray) -> None:
        rows = np.unique(indices)
        for field in self._fields:
            addresses = field.addresses(rows)
            if _resident(addresses, field.row_bytes):
                continue
            for start, stop in _ranges(np.sort(addresses), field.row_bytes):
                aligned = start - start % _PAGE
                _MADVISE(aligned, stop - aligned, mmap.MADV_WILLNEED)


def _resident(addresses: np.ndarray, row_bytes: int) -> bool:
    """Whether a sample of the rows at ``addresses`` is in the page cache already."""
    if _MINCORE is None:
        return False
    picked = addresses[np.linspace(0, len(addresses) - 1, min(_PROBES, len(addresses))).astype(int)]
    vector = ctypes.create_string_buffer(2)
    for address in picked.tolist():
        aligned = address - address % _PAGE
        length = max(1, address + row_bytes - aligned)
        pages = -(-length // _PAGE)
        if pages > len(vector):
            vector = ctypes.create_string_buffer(pages)
        if _MINCORE(aligned, length, vector) != 0:
            return False
        if any(b & 1 == 0 for b in vector.raw[:pages]):
            return False
    return True


def _ranges(addresses: np.ndarray, row_bytes: int) -> list[tuple[int, int]]:
    """Sorted row ``addresses`` as ``(start, stop)`` byte ranges, joined across
    gaps under `MERGE_GAP` bytes."""
    breaks = np.flatnonzero(np.diff(addresses) > row_bytes + MERGE_GAP)
    starts = addresses[np.concatenate([[0], breaks + 1])]
    stops = addresses[np.concatenate([breaks, [len(addresses) - 1]])] + row_bytes
    return list(zip(starts.tolist(), stops.tolist(), strict=True))

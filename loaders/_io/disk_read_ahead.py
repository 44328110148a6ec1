"""Read-ahead that keeps the disk busy for a dataset bigger than memory.

A backend reading memory-mapped rows waits for each page fault in turn. A
planner thread walks the epoch's index plan up to `AHEAD_BYTES` ahead of the
reader and turns each coming batch's rows into page ranges: rows closer than
`MERGE_GAP` bytes are one range, so a block order's batch becomes a few long
ranges and a full permutation's rows many short ones (grouped
`RANGES_PER_READ` to a read). Reader threads take the reads in order and ask
the kernel for them (``madvise(MADV_WILLNEED)``, which starts the reads and
returns once they are queued; the page cache it fills is shared with torch
and Grain worker processes). With `POPULATE` (off by default), where this
process gathers the rows, they then map the long ranges they asked for into
its page tables (``MADV_POPULATE_READ``, waiting for the reads), so the
gather finds them mapped instead of faulting them in; a kernel that refuses
it (before 5.14) leaves the gather to fault, as it does without.

Two things are measured, not assumed. The kernel reads at most its
read-ahead window per ``MADV_WILLNEED`` (``read_ahead_kb`` of the file's
device: 8 MiB on one disk, 128 KiB by default; a 16 MiB range asked for at
once came in half), so long ranges are cut into pieces of that window
(`mapped_files.read_window`), at most `READ_BYTES`. And one thread asking
stalls while the kernel queues its reads (measured cold on this machine:
1.1 GB/s from one thread asking 4 MiB pieces, 1.8 GB/s from two; 75k random
pages/s from one, 92k from four), so the number of readers is set by
`ReadDepth` from the throughput they reach, up to `MAX_READERS` and to
``AHEAD_BYTES`` over the piece: a slow disk gets a few, a fast one as many
as raise its rate. The rows may lie in several mapped chunks (`MappedRows`):
hf reads its Arrow copy, chunk by chunk, not the dataset's files. A batch
whose sampled rows are in memory already is skipped, so a warm dataset costs
a few ``mincore`` calls per batch, and a read for a batch the reader has
passed is dropped. Rows that fit in `AHEAD_BYTES` and are all in memory
already (a small dataset, warm) start no thread at all: its start and stop
cost a small epoch more than its reading.
"""

from __future__ import annotations

import collections
import ctypes
import mmap
import threading
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from jaxfeed.loaders._io.mapped_files import (
    MADV_POPULATE_READ,
    file_rows,
    libc_function,
    read_window,
)
from jaxfeed.loaders._io.mapped_files import MADVISE as _MADVISE
from jaxfeed.loaders._io.read_depth import ReadDepth

AHEAD_BYTES = 256 << 20
"""How far ahead of the reader rows are asked for (at least one batch); also
the bound on the bytes of the reads outstanding."""
MERGE_GAP = 64 << 10
"""Rows this close together are read as one range."""
READ_BYTES = 8 << 20
"""The longest piece one reader asks for at once (the read-ahead window may cap it)."""
RANGES_PER_READ = 64
"""Short ranges (a full permutation's rows) one reader asks for, one call each."""
MAX_READERS = 64
"""The most reader threads (reads queued at once)."""
POPULATE = False
"""Whether readers map the long ranges they read into this process's page
tables. Off: measured cold past memory, it cost more CPU than the gather's
faults it saved and did not raise the rate (docs/data.md);
`benchmarks/bigger_than_memory.py --populate off,on` measures both."""
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

    @property
    def span(self) -> tuple[int, int]:
        """The page-aligned addresses its rows lie within."""
        low = int(self.bases.min())
        return low - low % _PAGE, int(self.bases.max()) + self.chunk_rows * self.row_bytes


def mapped_rows(arrays: Sequence[np.ndarray]) -> list[MappedRows]:
    """The layouts of the fields among ``arrays`` that are mapped from files."""
    return [
        MappedRows(np.array([a.ctypes.data], np.int64), max(1, len(a)), rows.row_bytes)
        for a in arrays
        if (rows := file_rows(a)) is not None and rows.row_bytes
    ]


class _Read(NamedTuple):
    step: int  # the batch it is for
    ranges: list[tuple[int, int]]  # page-aligned (start, length)
    nbytes: int


class DiskReadAhead:
    """Reads the rows of ``plan[i + 1 :]`` (up to `AHEAD_BYTES`) into the page
    cache while the reader is at batch ``i`` (`reached`). A no-op without
    mapped fields.

    Args:
      fields: where the fields' rows lie (`mapped_rows`).
      plan: the epoch's index batches, in reading order.
      depth: sets the reads outstanding (a `ReadDepth` by default).
      populate: map long ranges' pages into this process's page tables
        (False where worker processes gather the rows, from their own mappings).
    """

    def __init__(
        self,
        fields: Sequence[MappedRows],
        plan: Sequence[np.ndarray],
        depth: ReadDepth | None = None,
        populate: bool = True,
    ):
        self._fields = list(fields)
        self._plan = plan
        self._reached = -1
        self._changed = threading.Condition()
        self._closed = False
        self._reads: collections.deque[_Read] = collections.deque()
        self._threads: list[threading.Thread] = []
        self._asked: set[int] = set()  # `MERGE_GAP` cells of long ranges asked for
        self._ahead: collections.deque[tuple[int, int]] = collections.deque()  # (step, bytes)
        self._ahead_bytes = 0
        self.populate = populate and POPULATE  # off once the kernel refuses it
        self.depth = depth
        if not self._fields or _MADVISE is None or not len(plan) or _all_resident(self._fields):
            return
        self._piece = min([READ_BYTES, *(read_window(int(f.bases[0])) for f in self._fields)])
        ceiling = min(MAX_READERS, max(1, AHEAD_BYTES // self._piece))
        self.depth = depth or ReadDepth(ceiling=ceiling)
        self._start(self._plan_reads, "jaxfeed-read-ahead")

    @property
    def threads(self) -> list[threading.Thread]:
        """The planner and the readers started so far."""
        return list(self._threads)

    def reached(self, step: int) -> None:
        """The reader is at batch ``step`` of the plan."""
        with self._changed:
            self._reached = step
            while self._ahead and self._ahead[0][0] <= step:
                self._ahead_bytes -= self._ahead.popleft()[1]
            self._changed.notify_all()

    def close(self) -> None:
        """Stops every thread (a reader first finishes the call it is in)."""
        with self._changed:
            self._closed = True
            self._reads.clear()
            self._changed.notify_all()
        for thread in self._threads:
            thread.join()
        self._threads.clear()

    def _start(self, target, name: str, *args) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _plan_reads(self) -> None:
        step = 0
        while step < len(self._plan):
            with self._changed:
                while not self._closed and self._too_far(step):
                    self._changed.wait()
                if self._closed:
                    return
                step = max(step, self._reached + 1)  # never ask for what was read
            if step < len(self._plan):
                reads = self._reads_of(step)
                with self._changed:
                    if self._closed:
                        return
                    self._reads.extend(reads)
                    self._ahead.append((step, sum(read.nbytes for read in reads)))
                    self._ahead_bytes += self._ahead[-1][1]
                    self._grow()
                    self._changed.notify_all()
            step += 1

    def _too_far(self, step: int) -> bool:
        """Whether ``step`` waits: the next batch is always asked for, later ones
        while under `AHEAD_BYTES` are (called holding ``_changed``)."""
        return step > self._reached + 1 and self._ahead_bytes >= AHEAD_BYTES

    def _reads_of(self, step: int) -> list[_Read]:
        rows = np.unique(self._plan[step])
        reads = []
        for field in self._fields:
            addresses = field.addresses(rows)
            if _resident(addresses, field.row_bytes):
                continue
            short: list[tuple[int, int]] = []
            for start, stop in _ranges(np.sort(addresses), field.row_bytes):
                start -= start % _PAGE
                long = stop - start > MERGE_GAP  # a window of blocks: its batches share it
                parts = self._not_asked(start, stop, field) if long else [(start, stop)]
                for first, end in parts:
                    for piece in range(first, end, self._piece):
                        length = min(self._piece, end - piece)
                        if length > self._piece // 2:
                            reads.append(_Read(step, [(piece, length)], length))
                            continue
                        short.append((piece, length))
                        if len(short) == RANGES_PER_READ:
                            reads.append(_Read(step, short, sum(n for _, n in short)))
                            short = []
            if short:
                reads.append(_Read(step, short, sum(n for _, n in short)))
        return reads

    def _not_asked(self, start: int, stop: int, field: MappedRows) -> list[tuple[int, int]]:
        """The whole `MERGE_GAP` cells over a long range (within ``field``) that
        were not asked for yet, now marked asked: a block order's batches of one
        window share their ranges, and each cell is read once."""
        low, high = field.span
        parts: list[tuple[int, int]] = []
        for cell in range(start // MERGE_GAP, (stop - 1) // MERGE_GAP + 1):
            if cell in self._asked:
                continue
            self._asked.add(cell)
            first, end = max(low, cell * MERGE_GAP), min(high, (cell + 1) * MERGE_GAP)
            if parts and parts[-1][1] == first:
                parts[-1] = (parts[-1][0], end)
            else:
                parts.append((first, end))
        return parts

    def _grow(self) -> None:
        """Starts readers up to the depth (called holding ``_changed``)."""
        while len(self._threads) - 1 < self.depth.depth:
            self._start(self._read, "jaxfeed-read-ahead-reader", len(self._threads) - 1)

    def _read(self, me: int) -> None:
        """Reader ``me``: asks for the waiting reads while ``me`` is under the depth."""
        while True:
            with self._changed:
                while not self._closed and (me >= self.depth.depth or not self._reads):
                    self._changed.wait()
                if self._closed:
                    return
                read = self._reads.popleft()
                if read.step <= self._reached:
                    continue  # the reader got there first
            for start, length in read.ranges:
                _MADVISE(start, length, mmap.MADV_WILLNEED)  # all queued first
            if self.populate:
                # Long ranges only: a random row's page costs the gather one fault
                # either way, and waiting for it here holds back the reads behind it.
                for start, length in [r for r in read.ranges if r[1] >= MERGE_GAP]:
                    if _MADVISE(start, length, MADV_POPULATE_READ) != 0:
                        self.populate = False  # refused (EINVAL before 5.14): the gather faults
                        break
            with self._changed:
                self.depth.done(read.nbytes, backlog=bool(self._reads))
                self._grow()
                self._changed.notify_all()


def _all_resident(fields: Sequence[MappedRows]) -> bool:
    """Whether every row of ``fields`` is in the page cache, and they span at
    most `AHEAD_BYTES` (larger spans are not checked: their pages may go)."""
    spans = [field.span for field in fields]
    if _MINCORE is None or sum(stop - start for start, stop in spans) > AHEAD_BYTES:
        return False
    for start, stop in spans:
        vector = ctypes.create_string_buffer(-(-(stop - start) // _PAGE))
        if _MINCORE(start, stop - start, vector) != 0:
            return False
        if not np.all(np.frombuffer(vector, np.uint8) & 1):  # bit 0: the page is resident
            return False
    return True


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

"""A store's ``.npy`` objects read in place, by ranged reads, as they are asked
for: how a split bigger than the cache trains.

Each object's header is parsed from one ranged read of its first bytes
(numpy's own ``np.lib.format``); its rows are then read a block at a time
through `RemoteObjects.read` (retried, never short) into a `BlockCache`: the
least recently used blocks in memory, at most a quarter of
``JAXFEED_CACHE_BYTES`` in each process that reads. A batch's rows are grouped
by block, so one request serves every row of a block: big blocks
(`BLOCK_BYTES`) where a batch's rows share them (``shuffle="blocks"``), small
ones (`SMALL_BYTES`) where they are scattered (a full permutation). A batch's
reads run in a sliding window, as many at once as `ReadDepth` measures the
link needs, and no more bytes than the cache holds; the blocks of the batches
to come fill it while nothing else waits (`BlockCache.hint`, from
`ranged_ahead`), so it does not drain at a batch's end.
Pickled into a worker, a field travels as its URL, header and an empty cache;
the worker opens the store itself (`RemoteObjects.read`).
"""

from __future__ import annotations

import collections
import concurrent.futures
import hashlib
import io
import itertools
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
from jaxfeed.loaders._doors.fsspec import Listed
from jaxfeed.loaders.array_dataset import device_dtype, narrowed
from jaxfeed.loaders.data.on_disk import RAGGED_PARTS, MissingSplitError
from jaxfeed.loaders.data.remote import RemoteObjects, cache_bytes

__all__ = [
    "BLOCK_BYTES",
    "BatchFields",
    "READ_ENV",
    "SMALL_BYTES",
    "BlockCache",
    "RangedNpy",
    "RangedRows",
    "ReadDepth",
    "npy_fields",
    "read_mode",
]

READ_ENV = "JAXFEED_READ"
READS = ("auto", "ranges", "whole")
BLOCK_BYTES = 8 << 20  # one ranged read: long enough to amortise a request's latency
SMALL_BYTES = 64 << 10  # a scattered row's read: a big block would be mostly wasted
SHARED_ROWS = 2  # a batch with fewer rows per big block than this reads small blocks
HEADER_BYTES = 64 << 10  # read first: every header numpy writes for a field fits
DEPTH_FLOOR, DEPTH_CEILING = 4, 64  # reads in flight, whatever `ReadDepth` measures


def read_mode(objects: RemoteObjects) -> str | None:
    """`READ_ENV`'s choice for ``objects``: ``"ranges"`` (read in place, or
    refused), ``"auto"`` (in place where the format allows: they do not fit
    the cache), or None (fetched whole: ``whole``, or ``auto`` and they fit).

    Raises:
      ValueError: an unknown `READ_ENV` value.
    """
    mode = os.environ.get(READ_ENV, "") or "auto"
    if mode not in READS:
        raise ValueError(f"{READ_ENV}={mode!r}: expected one of {list(READS)}")
    fits = sum(v.size for v in objects.made_from.values()) <= cache_bytes()
    return None if mode == "whole" or (mode == "auto" and fits) else mode


def npy_fields(objects: RemoteObjects, split: str, splits: tuple[str, ...]) -> dict | None:
    """``split``'s fields as `RangedNpy`, or None where its objects are fetched
    whole: `READ_ENV` is ``whole``, or ``auto`` (the default) and the objects
    fit the cache, or they are not a directory of plain ``<field>.npy`` files.

    Raises:
      ValueError: `READ_ENV` is ``ranges`` for objects that are not such a
        directory, or an unknown value; an object that is no readable ``.npy``.
      MissingSplitError: the directory holds ``.npy`` data but not ``split``.
    """
    mode = read_mode(objects)
    if mode is None:
        return None
    files = _split_files(objects.url, objects.made_from, split, splits)
    if files is None:
        if mode == "auto":
            return None
        raise ValueError(
            f"{READ_ENV}=ranges: {objects.url} is not a directory of <field>.npy files nor "
            "of Parquet objects, TFRecord shards or ArrayRecord files, the only objects read "
            "in place (Arrow and image folders are fetched whole); unset "
            f"{READ_ENV} to fetch them into the cache"
        )
    cache = BlockCache(cache_bytes() // 4)
    return {
        relative.rpartition("/")[2].removesuffix(".npy"): RangedNpy(objects, relative, size, cache)
        for relative, size in files.items()
    }


def _split_files(
    url: str, listed: Mapping[str, Listed], split: str, splits: tuple[str, ...]
) -> dict[str, int] | None:
    """The objects of ``split`` (relative path -> size) of a directory laid out
    as `on_disk.npy_directory` reads one; None when it is not one of plain
    ``.npy`` fields (ragged parts too, a single object, other files)."""
    if "" in listed or not all(r.endswith(".npy") for r in listed):
        return None
    laid_out = [s for s in splits if any(r.startswith(f"{s}/") for r in listed)]
    prefix = f"{split}/" if laid_out else ""
    if (laid_out and split not in laid_out) or (not laid_out and split != splits[0]):
        raise MissingSplitError(f"{url} has no {split!r} split: its .npy splits are {laid_out}")
    files = {
        r: v.size for r, v in listed.items() if r.startswith(prefix) and "/" not in r[len(prefix) :]
    }
    parts = [r for r in files if r.removesuffix(".npy").rpartition(".")[2] in RAGGED_PARTS]
    return None if parts or not files else files


class ReadDepth:
    """How many reads to keep in flight: the bandwidth-delay product of what
    the reads measure, over the bytes of a read.

    The delay is the fastest of the last `WINDOW` reads' seconds (a batch's
    first reads queue behind none: slower ones waited, they were not further
    away); the bandwidth, the bytes of the last `depth` reads (about one round
    trip's) over the seconds any read was in flight meanwhile (a moving
    average: a burst of answers is not the link's pace). Their product over
    the mean bytes of a read, times `GAIN` so that the depth climbs while more
    reads deliver more, is the depth, between ``floor`` and ``ceiling``.
    """

    WINDOW = 64
    GAIN = 1.25

    def __init__(
        self,
        floor: int = DEPTH_FLOOR,
        ceiling: int = DEPTH_CEILING,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.floor, self.ceiling, self._clock = floor, ceiling, clock
        self.depth = floor
        self._in_flight, self._busy_s, self._since = 0, 0.0, clock()
        # Per read: its seconds, its bytes, and the busy seconds when it ended.
        self._samples: collections.deque[tuple[float, int, float]] = collections.deque(
            maxlen=self.WINDOW
        )
        self._lock = threading.Lock()

    def _tick(self, change: int) -> float:
        now = self._clock()
        self._busy_s += (now - self._since) if self._in_flight else 0.0
        self._since, self._in_flight = now, self._in_flight + change
        return now

    def started(self) -> float:
        """What `finished` needs of a read starting now."""
        with self._lock:
            return self._tick(+1)

    def finished(self, started: float, nbytes: int) -> None:
        """A read begun at `started` delivered ``nbytes``: the depth follows."""
        with self._lock:
            seconds = max(self._tick(-1) - started, 1e-6)
            self._samples.append((seconds, nbytes, self._busy_s))
            # The bytes of about one round trip's reads (the last `depth`), over
            # the busy seconds they took; reads that all ended together: over
            # the longest of them.
            recent = list(itertools.islice(reversed(self._samples), self.depth + 1))
            since = recent[-1][2]
            later = [s[1] for s in recent if s[2] > since]
            if later:
                bandwidth = sum(later) / (self._busy_s - since)
            else:
                bandwidth = sum(s[1] for s in recent) / max(s[0] for s in recent)
            delay = min(s[0] for s in self._samples)
            per_read = max(1.0, sum(s[1] for s in self._samples) / len(self._samples))
            wanted = math.ceil(self.GAIN * bandwidth * delay / per_read)
            self.depth = min(self.ceiling, max(self.floor, wanted))


class _Read:
    """One block asked for and not yet held: queued, then read by the pool.
    ``waiters``: the `BlockCache.blocks` calls waiting for it; ``pins``: the
    read-ahead's ``(owner, step)`` of each batch to come that wants it."""

    __slots__ = ("ahead", "block", "future", "hinted", "pins", "started", "waiters")

    def __init__(self, block: Block):
        self.block = block
        self.future: concurrent.futures.Future | None = None  # made when a batch waits
        self.waiters, self.pins, self.started, self.hinted = 0, [], False, False
        self.ahead = False  # started for the read-ahead: its failure is no batch's


class BlockCache:
    """Blocks of ranged reads held in memory, at most ``max_bytes`` of them,
    counting those being read; the least recently used go first. Shared by
    the fields of one split in one process (threads take turns).

    Reads run in one window: as many at once as their `ReadDepth` says and
    the bytes allow. A batch's own blocks (`blocks`) go first; blocks of the
    batches to come (`hint`, from `ranged_ahead.RangedReadAhead`) fill the
    window while no batch waits, using at most half of the bound (their reads
    and the blocks they hold), so a batch's reads always have the other half.
    A block read ahead is held (pinned: the eviction passes it by) until its
    batch takes it or the read-ahead has passed that batch (`passed`); a
    batch's reads keep out of it, but one read always may, and evicts it if
    nothing else makes room (it is read again then).
    """

    AHEAD_SHARE = 2  # read-ahead holds and reads at most 1/AHEAD_SHARE of the bound

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.nbytes = 0  # held (pinned too) and reserved for reads in flight
        self.peak_bytes = 0  # the most it ever held: its bound is tested
        self.reading = 0  # bytes reserved for reads in flight
        self.pinned = 0  # bytes held for the batches to come
        self.depths: dict[str, ReadDepth] = collections.defaultdict(ReadDepth)  # by block size
        self._blocks: collections.OrderedDict[Any, np.ndarray] = collections.OrderedDict()
        # Read ahead, not yet taken: key -> [block, its pins (owner, step)], oldest first.
        self._pinned: collections.OrderedDict[Any, list] = collections.OrderedDict()
        self._pending: dict[Any, _Read] = {}  # queued or being read
        self._urgent: collections.deque[_Read] = collections.deque()  # a batch waits for them
        self._hints: collections.deque[_Read] = collections.deque()  # for the batches to come
        self._hinted_bytes = 0  # of the hints queued, not yet started
        # Per read-ahead: its pins in step order, each with the keys it pinned.
        self._pins: dict[Any, collections.deque[tuple[tuple[Any, int], list]]] = {}
        self._running: collections.Counter[str] = collections.Counter()  # in flight, by size
        self._lock = threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def __getstate__(self) -> dict:
        # Into a worker: the bound only; its blocks are read there again.
        return {"max_bytes": self.max_bytes}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["max_bytes"])

    @property
    def ahead_bytes(self) -> int:
        """The most bytes the read-ahead reads and holds at once."""
        return self.max_bytes // self.AHEAD_SHARE

    def holds(self, key: Any) -> bool:
        """Whether block ``key`` is held, or asked for already."""
        with self._lock:
            return key in self._blocks or key in self._pinned or key in self._pending

    def blocks(self, wanted: Sequence[Block]) -> Iterator[tuple[int, np.ndarray]]:
        """The ``wanted`` blocks, each with its place in ``wanted``, as they come:
        the held ones first, the others read in the sliding window (see the
        class): a new read starts as one finishes, while fewer are in flight
        than their `ReadDepth` says and the cache has room for their bytes."""
        ready, waiting = [], {}
        with self._lock:
            for i, block in enumerate(wanted):
                found = self._take(block.key)
                if found is not None:
                    ready.append((i, found))
                    continue
                entry = self._ask(block)
                waiting[entry.future] = (i, entry)
            self._dispatch()
        try:
            while ready:
                yield ready.pop(0)
            while waiting:
                done, _ = concurrent.futures.wait(waiting, return_when="FIRST_COMPLETED")
                for future in done:
                    i, entry = waiting.pop(future)
                    with self._lock:
                        entry.waiters -= 1
                        if future.exception() is not None and entry.ahead:
                            again = self._ask(entry.block)  # the batch's own read decides
                            waiting[again.future] = (i, again)
                            self._dispatch()
                            continue
                        if future.exception() is None:
                            self._take(entry.block.key)  # its pin, if it was read ahead
                    yield i, future.result()
        finally:
            with self._lock:  # left early: what nothing else wants is not read
                for _, entry in waiting.values():
                    entry.waiters -= 1
                    self._drop_if_unwanted(entry)
                self._dispatch()

    def _ask(self, block: Block) -> _Read:
        """A batch waits for ``block``: its read, queued first if not yet
        asked for (called holding the lock)."""
        entry = self._pending.get(block.key)
        if entry is None:
            entry = self._pending[block.key] = _Read(block)
        if entry.future is None:
            entry.future = concurrent.futures.Future()
        if not entry.started and not entry.waiters:
            self._urgent.append(entry)
        entry.waiters += 1
        return entry

    def hint(self, blocks: Sequence[Block], pin: tuple[Any, int]) -> bool:
        """Reads ``blocks`` ahead for a batch to come (``pin``: the read-ahead
        and the batch's step), behind any batch's own reads; held ones are
        pinned for it. Whether more hints are welcome (those queued are under
        `ahead_bytes`)."""
        with self._lock:
            steps = self._pins.setdefault(pin[0], collections.deque())
            if not steps or steps[-1][0] != pin:
                steps.append((pin, []))
            keys = steps[-1][1]
            for block in blocks:
                keys.append(block.key)
                if block.key in self._blocks:
                    held = self._blocks[block.key]
                    if self.pinned + held.nbytes > self.ahead_bytes:
                        self._blocks.move_to_end(block.key)  # kept while it can be
                        continue
                    del self._blocks[block.key]
                    self._pinned[block.key] = [held, [pin]]
                    self.pinned += held.nbytes
                elif block.key in self._pinned:
                    self._pinned[block.key][1].append(pin)
                elif block.key in self._pending:
                    self._pending[block.key].pins.append(pin)
                else:
                    entry = self._pending[block.key] = _Read(block)
                    entry.pins.append(pin)
                    entry.hinted = True
                    self._hints.append(entry)
                    self._hinted_bytes += block.nbytes
            self._dispatch()
            return self._hinted_bytes < self.ahead_bytes

    def passed(self, owner: Any, step: float = math.inf) -> None:
        """``owner``'s batches up to ``step`` are gone: their pins are let go,
        and their blocks not yet read are not read (``step`` left out: all of
        ``owner``'s, at an epoch's end or close)."""
        with self._lock:
            steps = self._pins.get(owner, collections.deque())
            while steps and steps[0][0][1] <= step:
                pin, keys = steps.popleft()
                for key in keys:  # a pin a batch took already is gone
                    held = self._pinned.get(key)
                    if held is not None and pin in held[1]:
                        held[1].remove(pin)
                        if not held[1]:
                            self._unpin(key)
                    entry = self._pending.get(key)
                    if entry is not None and pin in entry.pins:
                        entry.pins.remove(pin)
                        self._drop_if_unwanted(entry)
            if not steps:
                self._pins.pop(owner, None)
            if step == math.inf:  # passed steps' hints go at the queue's head; the rest now
                self._hints = collections.deque(e for e in self._hints if e.hinted)
            self._dispatch()

    def _take(self, key: Any) -> np.ndarray | None:
        """Block ``key`` if held, taken by a batch: its first pin let go
        (called holding the lock)."""
        held = self._pinned.get(key)
        if held is not None:
            held[1].pop(0)
            if not held[1]:
                self._unpin(key)
            return held[0]
        block = self._blocks.get(key)
        if block is not None:
            self._blocks.move_to_end(key)
        return block

    def _unpin(self, key: Any) -> None:
        block = self._pinned.pop(key)[0]
        self.pinned -= block.nbytes
        self._blocks[key] = block  # the most recently used

    def _drop_if_unwanted(self, entry: _Read) -> None:
        """Forgets a queued read that no batch wants any longer."""
        if entry.started or entry.waiters or entry.pins:
            return
        if self._pending.get(entry.block.key) is entry:
            del self._pending[entry.block.key]
        if entry.hinted:
            entry.hinted = False
            self._hinted_bytes -= entry.block.nbytes

    def _dispatch(self) -> None:
        """Starts the queued reads the window has room for: a batch's own
        first, the read-ahead's only while none waits (called holding the lock)."""
        while self._urgent:
            entry = self._urgent[0]
            if entry.started or self._pending.get(entry.block.key) is not entry:
                self._urgent.popleft()
            elif not entry.waiters:  # its batch stopped asking
                self._urgent.popleft()
                self._drop_if_unwanted(entry)
            elif self._start(entry, urgent=True):
                self._urgent.popleft()
            else:
                return  # the read-ahead waits for it too
        while self._hints:
            entry = self._hints[0]
            if entry.started or self._pending.get(entry.block.key) is not entry:
                self._hints.popleft()
            elif not self._start(entry, urgent=False):
                return
            else:
                self._hints.popleft()

    def _start(self, entry: _Read, urgent: bool) -> bool:
        """Reads ``entry`` if the window and the bytes allow: one read always
        may; the read-ahead's within `ahead_bytes` (called holding the lock)."""
        block = entry.block
        if self._running[block.size] >= self.depths[block.size].depth:
            return False
        if urgent:  # past the blocks read ahead: one read evicting them would be read again
            if self.reading and self.reading + self.pinned + block.nbytes > self.max_bytes:
                return False
        elif self.reading + self.pinned + block.nbytes > self.ahead_bytes:
            return False
        while self._blocks and self.nbytes + block.nbytes > self.max_bytes:
            self.nbytes -= self._blocks.popitem(last=False)[1].nbytes
        while urgent and self._pinned and self.nbytes + block.nbytes > self.max_bytes:
            key = next(iter(self._pinned))  # read ahead, and read again when its batch comes
            self._unpin(key)
            self.nbytes -= self._blocks.pop(key).nbytes
        if entry.hinted:
            entry.hinted = False
            self._hinted_bytes -= block.nbytes
        entry.started, entry.ahead = True, not urgent
        self.nbytes += block.nbytes
        self.reading += block.nbytes
        self.peak_bytes = max(self.peak_bytes, self.nbytes)
        self._running[block.size] += 1
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(DEPTH_CEILING, "jaxfeed-ranges")
        self._pool.submit(self._read, entry)
        return True

    def _read(self, entry: _Read) -> None:
        """In the pool: ``entry`` read, held (pinned if read ahead), and its
        waiters told; a failed read tells them the error."""
        block = entry.block
        depth = self.depths[block.size]
        started, rows, error = depth.started(), None, None
        try:
            rows = block.read()
            depth.finished(started, block.nbytes)
        except BaseException as failed:  # handed to the batch that waits
            error = failed
        with self._lock:
            self.nbytes -= block.nbytes
            self.reading -= block.nbytes
            self._running[block.size] -= 1
            del self._pending[block.key]
            if rows is not None:
                self._hold(block.key, rows, entry.pins)
            if entry.future is not None:  # a batch waits for it
                if rows is not None:
                    entry.future.set_result(rows)
                else:
                    entry.future.set_exception(error)
            self._dispatch()

    def _hold(self, key: Any, block: np.ndarray, pins: list) -> None:
        """Keeps ``block`` if it fits (called holding the lock)."""
        while pins and self._blocks and self.nbytes + block.nbytes > self.max_bytes:
            self.nbytes -= self._blocks.popitem(last=False)[1].nbytes
        if self.nbytes + block.nbytes > self.max_bytes:
            return
        self.nbytes += block.nbytes
        if pins:
            self._pinned[key] = [block, list(pins)]
            self.pinned += block.nbytes
        else:
            self._blocks[key] = block

    def pool(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(DEPTH_CEILING, "jaxfeed-ranges")
            return self._pool


class BatchFields:
    """Every field of a batch gathered at once, each handed out once as its
    field asks (a backend asks for a batch's fields in turn: one read serves
    them all, and no array is ever shared). Keeps the last `KEEP` batches'
    remaining fields, at most ``max_bytes`` of each (a batch, not a split)."""

    KEEP = 4

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._kept: collections.OrderedDict[bytes, dict] = collections.OrderedDict()
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        return {"max_bytes": self.max_bytes}  # into a worker: nothing kept

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["max_bytes"])

    def field(
        self,
        name: str,
        rows: np.ndarray,
        gather: Callable[[np.ndarray], dict[str, np.ndarray]],
    ) -> np.ndarray:
        """Field ``name``'s ``rows``: kept from an earlier `gather` of the same
        rows, or gathered now with every other field (those kept)."""
        key = hashlib.blake2b(rows.tobytes(), digest_size=16).digest()
        with self._lock:
            kept = self._kept.get(key, {})
            if name in kept:
                values = kept.pop(name)
                if not kept:
                    del self._kept[key]
                return values
        out = gather(rows)
        values = out.pop(name)
        if out and sum(a.nbytes for a in out.values()) <= self.max_bytes:
            with self._lock:
                self._kept[key] = out
                while len(self._kept) > self.KEEP:
                    self._kept.popitem(last=False)
        return values


class Block(NamedTuple):
    """One block to read: its cache key, its size's name (``"big"`` or
    ``"small"``: each has its `ReadDepth`), its bytes and how to read them."""

    key: Any
    size: str
    nbytes: int
    read: Callable[[], np.ndarray]


class RangedRows:
    """What a field read in place shares (`RangedNpy`, and the Parquet and
    TFRecord fields): rows indexed as an array's are (an int, a slice, an
    array of ints or bools), gathered by the field's ``_gather`` and served
    as the device takes them (`_served`). Needs ``shape``, ``dtype``, ``url``."""

    shape: tuple[int, ...]
    dtype: np.dtype
    url: str

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        rows = self[:]
        return rows if dtype is None else rows.astype(dtype)

    def __getitem__(self, index: Any) -> np.ndarray:
        if isinstance(index, int | np.integer):
            return self[np.asarray([index])][0]
        if isinstance(index, slice):
            index = np.arange(*index.indices(len(self)))
        index = np.asarray(index)
        if index.dtype == np.bool_:
            index = np.flatnonzero(index)
        if index.dtype.kind not in "iu":
            raise IndexError(f"{self!r}: rows are indexed by ints, slices or arrays of them")
        flat = np.where(index < 0, index + len(self), index).astype(np.int64).reshape(-1)
        if len(flat) and (flat.min() < 0 or flat.max() >= len(self)):
            raise IndexError(f"{self!r}: row index out of range 0..{len(self) - 1}")
        return self._served(self._gather(flat).reshape(*index.shape, *self.shape[1:]))

    @property
    def cache(self) -> BlockCache:
        """The block cache the field reads through (its split's, in this process)."""
        raise NotImplementedError

    def prefetch(self, rows: np.ndarray, pin: tuple[Any, int]) -> bool:
        """Starts reading the blocks a gather of ``rows`` (row numbers, as the
        sampler gives them) will need, for a batch to come (``pin``: the
        read-ahead and its step; see `BlockCache.hint`). Whether the cache
        takes more."""
        return self.cache.hint(self._blocks_of(np.asarray(rows, np.int64)), pin)

    def _blocks_of(self, rows: np.ndarray) -> list[Block]:
        """The blocks a gather of ``rows`` reads."""
        raise NotImplementedError

    def _gather(self, rows: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _served(self, rows: np.ndarray) -> np.ndarray:
        return narrowed(rows, self.dtype, self.url)


class RangedNpy(RangedRows):
    """One ``.npy`` object's rows, read in place (a `RemoteField`; see the module).

    Raises:
      ValueError: (made) the object is no readable ``.npy`` array of numbers
        in C order, or its size is not its header's plus its rows.
    """

    def __init__(self, objects: RemoteObjects, relative: str, size: int, cache: BlockCache):
        self.url = objects.object_url(relative)
        self._objects, self._relative, self._cache = objects, relative, cache
        head = objects.read(relative, 0, min(size, HEADER_BYTES))
        try:
            file = io.BytesIO(head)
            version = np.lib.format.read_magic(file)
            header = (
                np.lib.format.read_array_header_1_0
                if version == (1, 0)
                else np.lib.format.read_array_header_2_0
            )
            shape, fortran, stored = header(file)
        except (ValueError, OSError, EOFError) as error:
            raise ValueError(f"{self.url} is not a readable .npy array: {error}") from None
        self.shape, self._stored, self._offset = tuple(shape), stored, file.tell()
        rows = self.shape[0] if self.shape else 0
        self._row_bytes = stored.itemsize * int(np.prod(self.shape[1:], dtype=np.int64))
        if stored.kind not in "biuf" or not self.shape or (fortran and len(self.shape) > 1):
            raise ValueError(
                f"{self.url} holds {stored} {'Fortran-order ' if fortran else ''}{list(shape)}: "
                "read in place are C-order arrays of numbers with a row axis; rewrite it so, "
                f"or set {READ_ENV}=whole to fetch it"
            )
        if self._offset + rows * self._row_bytes != size:
            raise ValueError(
                f"{self.url} is {size} bytes, but its header says {list(shape)} {stored}: "
                f"{self._offset + rows * self._row_bytes} bytes; it is cut short or not one array"
            )
        self.dtype = device_dtype(stored.newbyteorder("="))
        self.nbytes = rows * self.dtype.itemsize * (self._row_bytes // max(1, stored.itemsize))
        # Big blocks: four fit the cache. Small ones: as many as the most reads
        # in flight fit it, so a scattered batch's reads are not held back by bytes.
        big = min(BLOCK_BYTES, max(1, cache.max_bytes // 4))
        small = min(big, SMALL_BYTES, max(1, cache.max_bytes // DEPTH_CEILING))
        row_bytes = max(1, self._row_bytes)
        self._block_rows = {"small": max(1, small // row_bytes), "big": max(1, big // row_bytes)}

    def __repr__(self) -> str:
        return f"RangedNpy({self.url!r}, {self.dtype} {list(self.shape)})"

    def _served(self, rows: np.ndarray) -> np.ndarray:
        if not rows.dtype.isnative:
            rows = rows.astype(rows.dtype.newbyteorder("="))
        return super()._served(rows)

    @property
    def cache(self) -> BlockCache:
        return self._cache

    def _gather(self, rows: np.ndarray) -> np.ndarray:
        """``rows``, read a block at a time (see the module): a batch's rows of
        one block come from one read, of big blocks where the rows share them or
        one is held, else of small ones."""
        out = np.empty((len(rows), *self.shape[1:]), self._stored)
        codes = self._codes(rows)
        order = np.argsort(codes, kind="stable")
        needed, starts = np.unique(codes[order], return_index=True)
        groups = np.split(order, starts[1:])
        wanted = [self._block("big" if c % 2 else "small", int(c) // 2) for c in needed]
        for i, block in self._cache.blocks(wanted):
            where = groups[i]
            out[where] = block[rows[where] - int(needed[i]) // 2 * self._block_rows[wanted[i].size]]
        return out

    def _blocks_of(self, rows: np.ndarray) -> list[Block]:
        codes = np.unique(self._codes(rows))
        return [self._block("big" if c % 2 else "small", int(c) // 2) for c in codes]

    def _codes(self, rows: np.ndarray) -> np.ndarray:
        """Each row's block, as a code: its index, and whether it is big (odd)."""
        big = rows // self._block_rows["big"]
        held = np.unique(big)
        if len(rows) < SHARED_ROWS * len(held):  # scattered: a row's own small block
            asked = [self._cache.holds(self._key("big", b)) for b in held]
            held = held[np.asarray(asked, bool)]
        is_big = np.isin(big, held)
        return np.where(is_big, big * 2 + 1, rows // self._block_rows["small"] * 2)

    def _key(self, size: str, index: int) -> tuple:
        return self._relative, self._block_rows[size], int(index)

    def _block(self, size: str, index: int) -> Block:
        """Block ``index`` of ``size``: rows ``[index * block_rows, ...)`` (as stored)."""
        first = index * self._block_rows[size]
        count = min(self._block_rows[size], len(self) - first)
        start = self._offset + first * self._row_bytes
        nbytes = count * self._row_bytes

        def read() -> np.ndarray:
            data = self._objects.read(self._relative, start, start + nbytes)
            return np.frombuffer(data, self._stored).reshape(count, *self.shape[1:])

        return Block(self._key(size, index), size, nbytes, read)

"""The read depth of ranged reads (loaders/data/ranged_npy.py's `ReadDepth`)
on fake timings, `BlockCache.blocks`' sliding window of reads, and the
read-ahead across batches (loaders/data/ranged_ahead.py) on reads that wait
for the test."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from jaxfeed.loaders._doors.fsspec import S3_CONNECTIONS, open_store
from jaxfeed.loaders.data.ranged_ahead import RangedReadAhead
from jaxfeed.loaders.data.ranged_npy import DEPTH_CEILING, Block, BlockCache, RangedRows, ReadDepth


def _steady(depth: ReadDepth, clock: list[float], latency_s: float, per_s: float, rounds=40):
    """``rounds`` of `depth.depth` reads of 1,000 bytes started together on a
    fake clock, as a store serving ``per_s`` reads a second in turn answers
    them: the k-th after ``max(latency_s, k / per_s)``; the depth after each."""
    seen = []
    for _ in range(rounds):
        began = clock[0]
        started = [depth.started() for _ in range(depth.depth)]
        for k, one in enumerate(started, 1):
            clock[0] = began + max(latency_s, k / per_s)
            depth.finished(one, 1000)
        seen.append(depth.depth)
    return seen


def test_the_depth_climbs_while_the_latency_alone_bounds_the_reads():
    clock = [0.0]
    depth = ReadDepth(clock=lambda: clock[0])
    assert depth.depth == 4  # the floor, before anything is measured
    seen = _steady(depth, clock, latency_s=0.05, per_s=1e9)
    assert seen == sorted(seen) and seen[0] > 4 and seen[-1] == 64, seen  # to the ceiling


def test_the_depth_stops_at_what_the_store_serves_and_follows_the_latency():
    clock = [0.0]
    depth = ReadDepth(clock=lambda: clock[0])
    # 400 reads/s at 50 ms: a bandwidth-delay product of 20 reads.
    assert 20 <= _steady(depth, clock, latency_s=0.05, per_s=400)[-1] <= 26
    # The latency doubles: once the window forgets the faster reads, twice as deep.
    assert 40 <= _steady(depth, clock, latency_s=0.1, per_s=400, rounds=80)[-1] <= 52
    # A store that serves 50 reads/s at 20 ms: one read's worth; the floor.
    slow = ReadDepth(clock=lambda: clock[0])
    assert _steady(slow, clock, latency_s=0.02, per_s=50)[-1] == 4


def test_a_batch_s_reads_slide_past_a_slow_one_within_the_cache_s_bound():
    """Block 0's read finishes only once every other has: in rounds of the
    depth it would wait for reads that never start; in a sliding window the
    others go past it, as many at once as the bytes the cache holds (six, the
    first six waiting for each other), never more."""
    cache = BlockCache(max_bytes=6 * 100)
    cache.depths["small"] = ReadDepth(floor=8, ceiling=8)
    others, lock, first = threading.Event(), threading.Lock(), threading.Barrier(6, timeout=10)
    state = {"done": 0, "in_flight": 0, "peak": 0}

    def reader(i: int):
        def read() -> np.ndarray:
            with lock:
                state["in_flight"] += 1
                state["peak"] = max(state["peak"], state["in_flight"])
            if i < 6:  # the first six wait for each other: all in flight at once
                first.wait()
            if i == 0:
                assert others.wait(10), "block 0 waited for reads that never started"
            with lock:
                state["in_flight"] -= 1
                state["done"] += 1
                if state["done"] == 39:
                    others.set()
            return np.full(100, i, np.uint8)

        return read

    wanted = [Block(("x", 1, i), "small", 100, reader(i)) for i in range(40)]
    got = dict(cache.blocks(wanted))
    assert sorted(got) == list(range(40)) and all((got[i] == i).all() for i in got)
    assert state["peak"] == 6, state  # the bytes bound, under the depth of 8
    assert cache.peak_bytes <= cache.max_bytes and cache.reading == 0


class _Field(RangedRows):
    """A field of ``rows`` one-byte-wide rows, 100 to a block, read through
    ``cache`` by ``read(block_index)`` (each row holds its block's index % 256)."""

    def __init__(self, cache: BlockCache, rows: int, read, row_bytes: int = 100):
        self.shape, self.dtype, self.url = (rows, row_bytes), np.dtype(np.uint8), "fake://x"
        self._cache, self._read, self._row_bytes = cache, read, row_bytes

    @property
    def cache(self) -> BlockCache:
        return self._cache

    def _blocks_of(self, rows: np.ndarray) -> list[Block]:
        read = self._read
        return [
            Block(("x", b), "small", self._row_bytes, lambda b=b: read(b)) for b in np.unique(rows)
        ]

    def _gather(self, rows: np.ndarray) -> np.ndarray:
        wanted = self._blocks_of(rows)
        index = {block.key[1]: i for i, block in enumerate(wanted)}
        got = dict(self.cache.blocks(wanted))
        return np.stack([got[index[int(r)]][0] for r in rows])


class _Reads:
    """Reads of one-row blocks that count as they start and end; those of
    blocks in ``held`` wait for `release`."""

    def __init__(self, held=(), fail_once=()):
        self.held, self.fail_once = set(held), set(fail_once)
        self.started: list[int] = []
        self.ended = 0
        self.pinned_seen: list[int] = []  # the cache's pinned bytes as each read starts
        self.changed = threading.Condition()
        self.gate = threading.Event()
        self.cache: BlockCache | None = None

    def __call__(self, b: int) -> np.ndarray:
        with self.changed:
            self.started.append(b)
            if self.cache is not None:
                self.pinned_seen.append(self.cache.pinned)
            self.changed.notify_all()
        try:
            if b in self.held:
                assert self.gate.wait(10), "the gate never opened"
            if b in self.fail_once:
                self.fail_once.discard(b)
                raise OSError(f"block {b}: read failed")
            return np.full((1, 100), b % 256, np.uint8)
        finally:
            with self.changed:
                self.ended += 1
                self.changed.notify_all()

    def wait_started(self, count: int) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.started) >= count, 10), self.started

    def wait_ended(self, count: int) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: self.ended >= count, 10), self.ended


def _window(depth: int, max_bytes: int = 100_000) -> BlockCache:
    cache = BlockCache(max_bytes)
    cache.depths["small"] = ReadDepth(floor=depth, ceiling=depth)
    return cache


def test_the_next_batches_are_read_while_this_one_is_used():
    """The window stays full across a batch's end: while the reader holds
    batch 0, the reads of batches 1 and 2 are in flight, the depth of them
    (before the read-ahead: none, the window drained at the batch's end); no
    block is read twice, and every batch is what its rows hold."""
    plan = [np.arange(4 * s, 4 * s + 4) for s in range(4)]
    reads = _Reads(held=range(4, 16))
    field = _Field(_window(depth=8), 16, reads)
    ahead = RangedReadAhead([field, np.zeros(16)], plan)  # arrays in memory are passed by
    try:
        assert (field[plan[0]] == np.arange(4)[:, None]).all()
        ahead.reached(0)
        reads.wait_started(12)  # batch 0's four, then batches 1 and 2: eight in flight
        assert sorted(reads.started[4:]) == list(range(4, 12)), reads.started
        assert reads.ended == 4  # the eight are in flight across the batch boundary
        reads.gate.set()
        for step in (1, 2, 3):
            assert (field[plan[step]] == plan[step][:, None]).all()
            ahead.reached(step)
    finally:
        ahead.close()
    assert sorted(reads.started) == list(range(16))  # each block read once


def test_read_ahead_keeps_the_bound_and_the_batches():
    """A cache of ten blocks, twenty batches of four scattered rows: the
    read-ahead never pins more than half the bound, the cache never holds
    more than it, and every batch (from a resume point too) is its rows."""
    rng = np.random.default_rng(0)
    order = rng.permutation(80)
    plan = [order[4 * s : 4 * s + 4] for s in range(20)]
    reads = _Reads()
    cache = reads.cache = _window(depth=8, max_bytes=1000)
    field = _Field(cache, 80, reads)
    for start in (0, 7):  # an epoch, and one resumed at batch 7
        ahead = RangedReadAhead([field], plan[start:])
        try:
            for step, rows in enumerate(plan[start:]):
                assert (field[rows] == rows[:, None]).all()
                ahead.reached(step)
        finally:
            ahead.close()
    assert max(reads.pinned_seen) <= cache.ahead_bytes == 500
    assert cache.peak_bytes <= cache.max_bytes
    assert (field[np.arange(80)] == np.arange(80)[:, None]).all()  # waits for any read in flight
    assert cache.reading == cache.pinned == 0


def test_close_drops_the_hints_not_yet_read_and_starts_no_thread():
    """Closed (an epoch left early), the reads not yet started never start,
    the ones in flight finish into the cache unpinned, and the read-ahead
    started no thread of its own (only the cache's read pool reads)."""
    plan = [np.arange(4 * s, 4 * s + 4) for s in range(5)]
    reads = _Reads(held=range(20))
    field = _Field(_window(depth=2), 20, reads)
    before = {t.ident for t in threading.enumerate()}
    ahead = RangedReadAhead([field], plan)  # hints batches 0 to 2: two reads start
    reads.wait_started(2)
    new = [t.name for t in threading.enumerate() if t.ident not in before]
    assert new and all(name.startswith("jaxfeed-ranges") for name in new), new
    ahead.close()
    reads.gate.set()
    assert (field[np.arange(2)] == np.arange(2)[:, None]).all()  # the two in flight, joined
    assert field.cache.reading == field.cache.pinned == 0
    assert not any(field.cache.holds(("x", b)) for b in range(2, 20))  # dropped, not queued
    assert sorted(reads.started) == [0, 1]
    ahead.reached(1)  # closed: hints nothing more
    assert sorted(reads.started) == [0, 1]


def test_a_failed_read_ahead_is_read_again_by_its_batch_never_served():
    """A block whose read ahead failed is not served: its batch reads it
    again, and gets its rows (a read that still fails raises, as before)."""
    plan = [np.arange(4), np.arange(4, 8)]
    reads = _Reads(fail_once={5})
    field = _Field(_window(depth=8), 8, reads)
    ahead = RangedReadAhead([field], plan)
    try:
        reads.wait_ended(8)  # both batches read ahead, block 5's read failed
        assert (field[plan[1]] == plan[1][:, None]).all()
        assert (field[plan[0]] == plan[0][:, None]).all()
    finally:
        ahead.close()
    assert sorted(reads.started) == [0, 1, 2, 3, 4, 5, 5, 6, 7]
    failing = _Field(_window(depth=8), 8, _Reads(fail_once={2}))
    with pytest.raises(OSError, match="block 2: read failed"):
        failing[np.arange(4)]


def test_s3_reads_are_not_capped_at_botocore_s_ten_connections():
    """s3fs opens as many connections as the window may read at once, unless
    the user's ``config_kwargs`` say otherwise (their other keys kept)."""
    options = {"client_kwargs": {"endpoint_url": "http://127.0.0.1:9"}, "anon": True}
    fs, _ = open_store("s3://bucket/prefix/", options)
    assert fs.config_kwargs["max_pool_connections"] == S3_CONNECTIONS >= DEPTH_CEILING
    mine = {
        **options,
        "config_kwargs": {"max_pool_connections": 5, "retries": {"mode": "standard"}},
    }
    fs, _ = open_store("s3://bucket/prefix/", mine)
    assert fs.config_kwargs == {"max_pool_connections": 5, "retries": {"mode": "standard"}}
    assert mine["config_kwargs"] == {"max_pool_connections": 5, "retries": {"mode": "standard"}}

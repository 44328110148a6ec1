"""The read depth of ranged reads (loaders/data/ranged_npy.py's `ReadDepth`)
on fake timings, and `BlockCache.blocks`' sliding window of reads."""

from __future__ import annotations

import threading

import numpy as np
from jaxfeed.loaders.data.ranged_npy import Block, BlockCache, ReadDepth


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

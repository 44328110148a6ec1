"""The shared sampler: the order every built-in backend follows."""

import numpy as np
import pytest
from jaxfeed.loaders import Sampler


def _epoch(sampler: Sampler, epoch: int) -> list[tuple[np.ndarray, int]]:
    return list(sampler.epoch_plan(epoch))


def test_epoch_covers_every_example_once_and_pads_the_end():
    sampler = Sampler(num_examples=10, batch_size=4, seed=3)
    plan = _epoch(sampler, 0)
    assert sampler.num_batches == len(plan) == 3
    assert [n for _, n in plan] == [4, 4, 2]
    assert all(len(idx) == 4 for idx, _ in plan)
    valid = np.concatenate([idx[:n] for idx, n in plan])
    np.testing.assert_array_equal(np.sort(valid), np.arange(10))


def test_drop_remainder_drops_the_partial_batch():
    sampler = Sampler(num_examples=10, batch_size=4, drop_remainder=True)
    assert [n for _, n in _epoch(sampler, 0)] == [4, 4]


def test_order_is_a_function_of_seed_and_epoch():
    a, b = Sampler(100, 10, seed=1), Sampler(100, 10, seed=1)
    np.testing.assert_array_equal(a.permutation(0), b.permutation(0))
    assert not np.array_equal(a.permutation(0), a.permutation(1))
    assert not np.array_equal(a.permutation(0), Sampler(100, 10, seed=2).permutation(0))
    np.testing.assert_array_equal(Sampler(100, 10, shuffle=False).permutation(5), np.arange(100))


def test_start_resumes_mid_epoch():
    sampler = Sampler(50, 8, seed=4)
    full = _epoch(sampler, 2)
    resumed = list(sampler.epoch_plan(2, start=3))
    assert len(resumed) == len(full) - 3
    for (a, na), (b, nb) in zip(full[3:], resumed, strict=True):
        np.testing.assert_array_equal(a, b)
        assert na == nb


@pytest.mark.parametrize("processes", [2, 3])
def test_process_slices_concatenate_to_the_single_process_global_batch(processes):
    local = 4
    single = Sampler(num_examples=50, batch_size=local * processes, seed=7)
    shards = [
        Sampler(50, local, seed=7, process_index=p, process_count=processes)
        for p in range(processes)
    ]
    assert {s.num_batches for s in shards} == {single.num_batches}
    plans = [_epoch(s, 1) for s in shards]
    for step, (global_idx, global_valid) in enumerate(_epoch(single, 1)):
        parts = [plan[step] for plan in plans]
        joined = np.concatenate([idx[:n] for idx, n in parts])
        np.testing.assert_array_equal(joined, global_idx[:global_valid])
        # Full rows first, then padding: a process past the end gets an all-padding batch.
        counts = [n for _, n in parts]
        assert counts == sorted(counts, reverse=True)
    assert plans[-1][-1][1] < local


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(num_examples=10, batch_size=0), r"batch_size must be an int >= 1, got 0"),
        (dict(num_examples=10, batch_size=-3), r"batch_size must be an int >= 1, got -3"),
        (dict(num_examples=10, batch_size=11), "larger than the split's 10 examples"),
        (
            dict(num_examples=10, batch_size=4, process_count=3),
            r"global batch 12 .* use batch_size <= 3",
        ),
        (
            dict(num_examples=10, batch_size=2, process_index=2, process_count=2),
            r"process_index=2 is not in \[0, process_count=2\)",
        ),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Sampler(**kwargs)


def test_start_out_of_range():
    with pytest.raises(ValueError, match=r"start=9 is outside \[0, 3\], the batches of one"):
        next(Sampler(10, 4).epoch_plan(0, start=9))


@pytest.mark.parametrize(("n", "block_rows", "window"), [(23, 5, 2), (1000, 7, 16), (64, 64, 1)])
def test_block_order_shuffles_whole_blocks_then_rows_within_each_window(n, block_rows, window):
    sampler = Sampler(n, 4, seed=3, shuffle="blocks", block_rows=block_rows, window_blocks=window)
    first, second = sampler.permutation(0), sampler.permutation(1)
    assert sorted(first) == list(range(n))  # every row once
    assert not np.array_equal(first, second) or n <= block_rows  # a new order every epoch
    np.testing.assert_array_equal(first, sampler.permutation(0))  # reproducible

    # Walk the epoch: each window holds `window` whole blocks (the last: what is left).
    def size(block: int) -> int:
        return min(block_rows, n - block * block_rows)

    window_blocks, rows = set(), 0
    for row in first.tolist():
        if row // block_rows not in window_blocks:
            assert len(window_blocks) < window, "a window reaches into another block"
            window_blocks.add(row // block_rows)
        rows += 1
        if len(window_blocks) == window and rows == sum(map(size, window_blocks)):
            window_blocks, rows = set(), 0  # this window is whole: the next one starts
    assert rows == sum(map(size, window_blocks))


def test_block_order_reads_long_runs_and_mixes_less_than_a_full_permutation():
    n, batch = 100_000, 256
    full = Sampler(n, batch, seed=0).permutation(0)
    blocks = Sampler(n, batch, seed=0, shuffle="blocks", block_rows=1000).permutation(0)
    # Rows of one batch come from at most a window's 16 blocks, not from all 100.
    per_batch = [len(np.unique(blocks[i : i + batch] // 1000)) for i in range(0, n, batch)]
    assert max(per_batch) <= 16 * 2  # a batch may straddle two windows
    assert len(np.unique(full[:batch] // 1000)) > 80


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(shuffle="windows"), r"shuffle must be True, False or 'blocks', got 'windows'"),
        (dict(shuffle="blocks"), r"shuffle='blocks' needs block_rows"),
        (dict(shuffle=True, block_rows=8), r"block_rows only apply to shuffle='blocks'"),
        (dict(shuffle="blocks", block_rows=0), r"block_rows must be an int >= 1, got 0"),
        (dict(shuffle="blocks", block_rows=8, window_blocks=0), r"window_blocks must be an int"),
    ],
)
def test_block_order_arguments_are_checked(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Sampler(100, 4, **kwargs)

"""The pack planner's output is the plan of its first, plain implementation
(kept here as the reference): a faster planner may not move one value."""

from __future__ import annotations

import numpy as np
import pytest
from jaxfeed.loaders.sequence_plan import EpochPlan, Pack, plan_epoch


def reference_pack(
    layout: Pack, order: np.ndarray, lengths: np.ndarray, global_batch: int, drop_remainder: bool
) -> EpochPlan:
    """`sequence_plan._pack` as of commit b2ae086, unchanged."""
    size_of = lengths[order]
    length = layout.length
    best = layout.method == "best_fit"
    pieces: list[list[tuple[int, int, int]]] = []  # per slot: its pieces (row, start, size)
    for first in range(0, len(order), layout.window):
        rows = order[first : first + layout.window].tolist()
        sizes = size_of[first : first + layout.window].tolist()
        free: list[int] = []  # room left in each slot opened in this window
        opened = len(pieces)
        for row, size in zip(rows, sizes, strict=True):
            start = 0
            while size - start > length:  # whole slots of a split row
                pieces.append([(row, start, length)])
                free.append(0)
                start += length
            need = size - start
            target = -1
            if best:
                room = length + 1
                for i, left in enumerate(free):
                    if need <= left < room:
                        target, room = i, left
            else:
                for i, left in enumerate(free):
                    if left >= need:
                        target = i
                        break
            if target < 0:
                pieces.append([])
                free.append(length)
                target = len(free) - 1
            slot = pieces[opened + target]
            slot.append((row, start, need))
            free[target] -= need
    slots = len(pieces)
    batches = slots // global_batch if drop_remainder else -(-slots // global_batch)
    pieces = pieces[: batches * global_batch]
    counts = np.zeros(batches * global_batch, np.int64)
    counts[: len(pieces)] = [len(p) for p in pieces]
    flat = np.array([piece for slot in pieces for piece in slot], np.int64).reshape(-1, 3)
    offset = np.zeros(len(flat), np.int64)
    if len(flat):
        ends = np.cumsum(flat[:, 2])
        slot_first = np.concatenate([[0], np.cumsum(counts)])[:-1]
        slot_of_piece = np.repeat(np.arange(len(counts)), counts)
        before = np.concatenate([[0], ends])[slot_first]  # values before the slot's first piece
        offset = ends - flat[:, 2] - before[slot_of_piece]
    return EpochPlan(
        batch_length=np.full(batches, length, np.int64),
        slot_pieces=np.concatenate([[0], np.cumsum(counts)]),
        row=flat[:, 0].copy(),
        start=flat[:, 1].copy(),
        size=flat[:, 2].copy(),
        offset=offset,
    )


@pytest.mark.parametrize("method", ["first_fit", "best_fit"])
@pytest.mark.parametrize("split", [False, True])
def test_pack_plan_is_the_reference_plan(method: str, split: bool) -> None:
    rng = np.random.default_rng(7)
    for trial in range(12):
        length = int(rng.choice([1, 3, 16, 64]))
        rows = int(rng.integers(0, 400))
        high = 3 * length if split else length
        lengths = rng.integers(1, high + 1, rows)
        if trial % 3 == 0:  # a long-tailed mix, as text is
            lengths = np.clip(rng.lognormal(np.log(length / 4 + 1), 1.0, rows), 1, high)
        lengths = lengths.astype(np.int64)
        order = rng.permutation(rows)
        layout = Pack(
            length, window=int(rng.choice([1, 2, 7, 64, 1024])), method=method, split=split
        )
        for batch, drop in ((1, False), (3, False), (4, True)):
            got = plan_epoch(layout, order, lengths, batch, drop)
            want = reference_pack(layout, order, lengths, batch, drop)
            for field in ("batch_length", "slot_pieces", "row", "start", "size", "offset"):
                np.testing.assert_array_equal(
                    getattr(got, field), getattr(want, field), err_msg=f"{field} {layout}"
                )

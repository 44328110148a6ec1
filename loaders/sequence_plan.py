"""Batch plans for variable-length rows: pad, bucket or pack into static shapes.

A plan is a pure function of the epoch's row order (the shared sampler's
permutation, so of ``(seed, epoch)``) and the rows' lengths. It never reads a
value, so every backend, worker count and process count gets the same
batches, and a resume at batch ``k`` plans the epoch again (the same cost for
every ``k``) instead of replaying its first ``k`` batches.

The plan fills *slots*: the rows of the global batches, ``G = batch_size *
process_count`` slots per batch, each ``L`` long (the batch's length). A slot
holds *pieces*: a run of one row's values, placed at an offset in the slot.

- `Pad`: one row per slot, every batch ``L`` long; a longer row is cut to
  ``L`` (``truncate=True``) or refused when the source is made.
- `Bucket`: one row per slot, each batch drawn from one bucket (the shortest
  of a few lengths that holds the row), emitted when full, in the order the
  rows come; the last partial batch of each bucket follows at the epoch's end.
- `Pack`: rows in order, ``window`` rows at a time, placed first-fit or
  best-fit into slots of ``L`` (a slot per bin, in the order the bins opened);
  a row longer than ``L`` is cut into pieces of ``L`` (``split=True``) or refused.

Batches carry ``segment_ids`` (1, 2, ... for the pieces of a slot, 0 on
padding) and ``positions`` (0, 1, ... within each piece): the same two fields
for all three, so one model step takes any of them.
"""

from __future__ import annotations

import bisect
import dataclasses

import numpy as np
from jaxfeed.loaders.checks import check_bool, check_int

__all__ = ["Bucket", "Pack", "Pad", "SEGMENT_IDS", "POSITIONS"]

SEGMENT_IDS = "segment_ids"
POSITIONS = "positions"
DEFAULT_WINDOW = 4096
"""Rows a pack plan places together. A window's last slots go out part full
(its open slots close with it): 4096 rows of a text corpus (lengths of median
16, up to 512 into L = 512) pack 99.7% real values, 1024 rows 99.0%
(benchmarks/sequences.py); best-fit's cost per row hardly grows with it."""
METHODS = ("first_fit", "best_fit")


@dataclasses.dataclass(frozen=True)
class Pad:
    """Every row in its own slot of ``length`` values.

    Args:
      length: the static length of every batch.
      truncate: cut longer rows to ``length``; False (default): refuse them
        when the source is made, naming the longest.
    """

    length: int
    truncate: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "length", check_int("pad length", self.length, 1))
        check_bool("truncate", self.truncate)


@dataclasses.dataclass(frozen=True)
class Bucket:
    """Each batch from one bucket: rows padded to the shortest of ``lengths``
    that holds them, so a step compiles once per bucket.

    Args:
      lengths: increasing static lengths; None: four from the rows' length
        histogram (the 50th, 75th, 90th percentiles and the longest row,
        rounded up to a multiple of 8).
      truncate: cut rows longer than the last length to it; False (default):
        refuse them when the source is made.
    """

    lengths: tuple[int, ...] | None = None
    truncate: bool = False

    def __post_init__(self) -> None:
        check_bool("truncate", self.truncate)
        if self.lengths is None:
            return
        if isinstance(self.lengths, int | str) or not len(self.lengths):
            raise ValueError(
                f"bucket lengths must be a tuple like (64, 128, 256), got {self.lengths!r}"
            )
        lengths = tuple(check_int("bucket length", n, 1) for n in self.lengths)
        if any(np.diff(lengths) <= 0):
            raise ValueError(f"bucket lengths must increase, got {lengths}")
        object.__setattr__(self, "lengths", lengths)

    def resolved(self, row_lengths: np.ndarray) -> Bucket:
        """These buckets, or (with ``lengths=None``) the histogram's."""
        if self.lengths is not None:
            return self
        picks = np.percentile(row_lengths, (50, 75, 90, 100), method="higher")
        lengths = sorted({int(-(-int(n) // 8) * 8) for n in picks})
        return Bucket(tuple(lengths), self.truncate)


@dataclasses.dataclass(frozen=True)
class Pack:
    """Rows packed into slots of ``length`` values.

    Args:
      length: the static length of every batch.
      window: rows of the shuffled order placed together (default 4096):
        a larger window packs tighter and plans slower.
      method: ``"best_fit"`` (default: the fullest slot with room) or
        ``"first_fit"`` (the first slot with room), among the window's open slots.
      split: cut a row longer than ``length`` into pieces of ``length`` (each
        its own segment, positions from 0); False (default): refuse such
        rows when the source is made.
    """

    length: int
    window: int = DEFAULT_WINDOW
    method: str = "best_fit"
    split: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "length", check_int("pack length", self.length, 1))
        object.__setattr__(self, "window", check_int("pack window", self.window, 1))
        check_bool("split", self.split)
        if self.method not in METHODS:
            raise ValueError(f"pack method must be one of {METHODS}, got {self.method!r}")


Layout = Pad | Bucket | Pack


def as_layout(pad: object = None, bucket: object = None, pack: object = None) -> Layout | None:
    """``make``'s ``pad=`` / ``bucket=`` / ``pack=`` as one layout (an int or a
    tuple of ints is the short form), or None when none is given.

    Raises:
      ValueError: more than one given.
      TypeError: a value that is neither the short form nor the class.
    """
    given = {k: v for k, v in (("pad", pad), ("bucket", bucket), ("pack", pack)) if v is not None}
    if len(given) > 1:
        raise ValueError(f"pass one of pad=, bucket= or pack=, not {' and '.join(given)}")
    if not given:
        return None
    ((name, value),) = given.items()
    kind = {"pad": Pad, "bucket": Bucket, "pack": Pack}[name]
    if isinstance(value, kind):
        return value
    if name == "bucket" and (value is True or isinstance(value, tuple | list)):
        return Bucket(None if value is True else tuple(value))
    if name != "bucket" and isinstance(value, int | np.integer) and not isinstance(value, bool):
        return kind(int(value))
    short = {
        "pad": "an int length",
        "bucket": "a tuple of lengths (or True)",
        "pack": "an int length",
    }
    raise TypeError(f"{name}= takes {short[name]} or jaxfeed.{kind.__name__}(...), got {value!r}")


def check_lengths(layout: Layout, lengths: np.ndarray, where: str) -> None:
    """Refuses, when the source is made, the rows this layout cannot place.

    Raises:
      ValueError: an empty row; a row too long for the layout without
        ``truncate`` / ``split`` (the longest named, with the fix).
    """
    empty = np.flatnonzero(lengths == 0)
    if len(empty):
        raise ValueError(
            f"{where}: row {int(empty[0])} (and {len(empty) - 1} more) is empty; a row of no "
            "values has nothing to train on: drop empty rows first"
        )
    longest = int(np.argmax(lengths))
    limit = layout.lengths[-1] if isinstance(layout, Bucket) else layout.length
    if lengths[longest] <= limit:
        return
    allowed = layout.split if isinstance(layout, Pack) else layout.truncate
    if not allowed:
        fix = (
            "split=True to cut it into pieces"
            if isinstance(layout, Pack)
            else "truncate=True to cut it"
        )
        raise ValueError(
            f"{where}: row {longest} has {int(lengths[longest])} values, more than the "
            f"longest length {limit} of {layout}; raise the length, or pass {fix}"
        )


@dataclasses.dataclass(frozen=True)
class EpochPlan:
    """Where every piece of an epoch goes. Pieces are sorted by slot, and
    within a slot by offset; slot ``s`` holds pieces
    ``slot_pieces[s]:slot_pieces[s + 1]``. Global batch ``k`` is slots
    ``k * G .. (k + 1) * G`` and is ``batch_length[k]`` long.
    """

    batch_length: np.ndarray  # int64 [batches]
    slot_pieces: np.ndarray  # int64 [slots + 1]
    row: np.ndarray  # int64 [pieces]: the row a piece is cut from
    start: np.ndarray  # int64 [pieces]: its first value within the row
    size: np.ndarray  # int64 [pieces]: its number of values
    offset: np.ndarray  # int64 [pieces]: where it starts in its slot
    _value_ends: np.ndarray | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def num_batches(self) -> int:
        return len(self.batch_length)

    def real_values(self) -> int:
        return int(self.size.sum())

    def value_ends(self) -> np.ndarray:
        """Values of pieces ``0..i-1`` at ``i`` (``[pieces + 1]``): a run of
        slots' values from two lookups."""
        if self._value_ends is None:
            object.__setattr__(self, "_value_ends", np.concatenate([[0], np.cumsum(self.size)]))
        return self._value_ends


def plan_epoch(
    layout: Layout, order: np.ndarray, lengths: np.ndarray, global_batch: int, drop_remainder: bool
) -> EpochPlan:
    """The plan of one epoch whose rows come in ``order`` (see the module)."""
    if isinstance(layout, Pack):
        return _pack(layout, order, lengths, global_batch, drop_remainder)
    g = global_batch
    if isinstance(layout, Pad):
        count = len(order) // g if drop_remainder else -(-len(order) // g)
        row = order[: count * g]
        slot = np.arange(len(row))
        batch_length = np.full(count, layout.length, np.int64)
    else:
        groups, group_lengths = _buckets(layout, order, lengths, g, drop_remainder)
        row = np.concatenate(groups) if groups else np.zeros(0, np.int64)
        slot = np.concatenate([k * g + np.arange(len(rows)) for k, rows in enumerate(groups)])
        batch_length = np.asarray(group_lengths, np.int64)
    # One row per slot, slots in order; a partial batch's other slots hold no piece.
    counts = np.zeros(len(batch_length) * g, np.int64)
    counts[slot] = 1
    row = row.astype(np.int64)
    return EpochPlan(
        batch_length=batch_length,
        slot_pieces=np.concatenate([[0], np.cumsum(counts)]),
        row=row,
        start=np.zeros(len(row), np.int64),
        size=np.minimum(lengths[row], batch_length[slot // g]),
        offset=np.zeros(len(row), np.int64),
    )


def _buckets(
    layout: Bucket, order: np.ndarray, lengths: np.ndarray, global_batch: int, drop_remainder: bool
) -> tuple[list[np.ndarray], list[int]]:
    """The rows of each bucket batch, in the order the batches fill (a bucket's
    batch is emitted when its last row comes), then each bucket's partial
    batch; one entry per batch, so every entry is one batch long at most."""
    bounds = np.asarray(layout.lengths)
    bucket = np.minimum(np.searchsorted(bounds, lengths[order], side="left"), len(bounds) - 1)
    full, rest = [], []
    for b in range(len(bounds)):
        where = np.flatnonzero(bucket == b)  # positions in the order, increasing
        whole = len(where) // global_batch * global_batch
        for first in range(0, whole, global_batch):
            positions = where[first : first + global_batch]
            full.append((int(positions[-1]), order[positions], int(bounds[b])))
        if whole < len(where) and not drop_remainder:
            rest.append((order[where[whole:]], int(bounds[b])))
    full.sort(key=lambda entry: entry[0])
    members = [rows for _, rows, _ in full] + [rows for rows, _ in rest]
    return members, [n for _, _, n in full] + [n for _, n in rest]


def _pack(
    layout: Pack, order: np.ndarray, lengths: np.ndarray, global_batch: int, drop_remainder: bool
) -> EpochPlan:
    """First-fit or best-fit of each window's rows (pieces, with ``split``) into
    slots of ``L``; slots in the order they opened."""
    length, window = layout.length, layout.window
    best = layout.method == "best_fit"
    rows, sizes = order.tolist(), lengths[order].tolist()
    # Each piece as placed, five ints: row, start, size, slot, offset (one flat
    # list: a Python loop over rows is the cost here, so it does little per row).
    placed: list[int] = []
    slots = 0
    for first in range(0, len(rows), window):
        opened = slots  # the window's slots are opened, opened + 1, ...
        free: list[int] = []  # first-fit: room left in each of them
        by_room: list[tuple[int, int]] = []  # best-fit: (room left, slot), sorted
        last = first + window
        for row, size in zip(rows[first:last], sizes[first:last], strict=True):
            start = 0
            while size - start > length:  # whole slots of a split row
                placed += (row, start, length, slots, 0)
                free.append(0)
                bisect.insort(by_room, (0, slots))
                slots += 1
                start += length
            need = size - start
            if best:
                # The fullest slot with room; of equally full ones, the first opened.
                k = bisect.bisect_left(by_room, (need, -1))
                if k < len(by_room):
                    left, slot = by_room.pop(k)
                else:
                    left, slot = length, slots
                    slots += 1
                bisect.insort(by_room, (left - need, slot))
            else:
                for i, left in enumerate(free):
                    if left >= need:
                        free[i] = left - need
                        slot = opened + i
                        break
                else:
                    left, slot = length, slots
                    free.append(length - need)
                    slots += 1
            placed += (row, start, need, slot, length - left)
    flat = np.array(placed, np.int64).reshape(-1, 5)
    flat = flat[np.argsort(flat[:, 3], kind="stable")]  # by slot, each slot's as placed
    batches = slots // global_batch if drop_remainder else -(-slots // global_batch)
    flat = flat[flat[:, 3] < batches * global_batch]
    counts = np.bincount(flat[:, 3], minlength=batches * global_batch)
    return EpochPlan(
        batch_length=np.full(batches, length, np.int64),
        slot_pieces=np.concatenate([[0], np.cumsum(counts)]),
        row=flat[:, 0].copy(),
        start=flat[:, 1].copy(),
        size=flat[:, 2].copy(),
        offset=flat[:, 4].copy(),
    )

"""The shared, seeded index sampler that gives every backend the same order.

One global permutation per epoch; global batch ``s`` is the contiguous slice
``perm[s*G:(s+1)*G]`` (``G = batch_size * process_count``) and process ``p``
reads the ``p``-th contiguous ``batch_size`` rows of it. So the global batch
is the concatenation of the process batches in process order, and equals the
single-process batch of size ``G`` with the same seed.

The permutation is either a full one (``shuffle=True``: every row anywhere,
one random read per row when the data is on disk) or a block one
(``shuffle="blocks"``: contiguous blocks of rows in a random order, and the
rows shuffled within each window of consecutive blocks, so a reader touches
few, long, contiguous runs at a time: disk-speed reads of data bigger than
memory, at the price of batches drawn from one window's blocks). Blocks can
follow the data's own units (``units``: the rows of each file, row group or
record batch it was read from, in order): no block then straddles two units,
and a unit longer than ``block_rows`` is cut into blocks of ``block_rows``
within it, so reading a block is one run inside one shard.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

import numpy as np
from jaxfeed.loaders.checks import (
    check_batch_size,
    check_bool,
    check_int,
    check_position,
    check_seed,
)

SHUFFLES = (True, False, "blocks")
DEFAULT_WINDOW_BLOCKS = 16
"""Blocks whose rows are shuffled together in ``shuffle="blocks"``."""
DEFAULT_BLOCK_BYTES = 1 << 20
"""A block's size when ``block_rows`` is not given: one long read off a disk."""


def default_block_rows(row_bytes: int) -> int:
    """Rows of about `DEFAULT_BLOCK_BYTES` (1 MiB), at least one."""
    return max(1, DEFAULT_BLOCK_BYTES // max(1, row_bytes))


@dataclasses.dataclass(frozen=True)
class Sampler:
    """Index plan of every epoch for one process.

    Args:
      num_examples: size of the split.
      batch_size: process-local batch size.
      seed: with the epoch number, defines the permutation.
      shuffle: ``True``: a full permutation each epoch; ``"blocks"``: a block
        permutation each epoch (see the module); ``False``: dataset order.
      block_rows: rows per block, for ``shuffle="blocks"`` only (required there).
      window_blocks: consecutive blocks (in their shuffled order) whose rows
        are shuffled together, for ``shuffle="blocks"`` only.
      units: the rows of each unit the data was read from (a file, a Parquet
        row group), summing to ``num_examples``; with ``shuffle="blocks"``,
        blocks stay inside units. None: one unit, the whole split.
      drop_remainder: drop the last partial global batch; otherwise pad it.
      process_index: this process, in ``[0, process_count)``.
      process_count: number of processes sharing the epoch.

    Raises:
      TypeError: a batch size, seed or process number that is not an int; a
        ``drop_remainder`` that is not a bool.
      ValueError: a batch size below 1, a seed outside ``[0, 2**32 - 1]``, a
        global batch larger than the split, or an inconsistent process
        index/count.
    """

    num_examples: int
    batch_size: int
    seed: int = 0
    shuffle: bool | str = True
    drop_remainder: bool = False
    process_index: int = 0
    process_count: int = 1
    block_rows: int | None = None
    window_blocks: int | None = None
    units: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        self._check_shuffle()
        # Normalised to Python ints: numpy integers are accepted, and a bool
        # or a float is refused here rather than while slicing an epoch.
        for name, value in (
            ("batch_size", check_batch_size(self.batch_size)),
            ("seed", check_seed(self.seed)),
            ("process_index", check_int("process_index", self.process_index, 0)),
            ("process_count", check_int("process_count", self.process_count, 1)),
            ("drop_remainder", check_bool("drop_remainder", self.drop_remainder)),
        ):
            object.__setattr__(self, name, value)
        if self.process_count < 1 or not 0 <= self.process_index < self.process_count:
            raise ValueError(
                f"process_index={self.process_index} is not in [0, process_count="
                f"{self.process_count}); pass jax.process_index() and jax.process_count()"
            )
        if self.num_examples <= 0:
            raise ValueError(f"the split is empty (num_examples={self.num_examples})")
        if self.global_batch_size > self.num_examples:
            raise ValueError(
                f"global batch {self.global_batch_size} (batch_size {self.batch_size} x "
                f"{self.process_count} processes) is larger than the split's "
                f"{self.num_examples} examples; use batch_size <= "
                f"{self.num_examples // self.process_count}"
            )

    def _check_shuffle(self) -> None:
        if not any(self.shuffle is choice or self.shuffle == choice for choice in SHUFFLES):
            raise ValueError(f"shuffle must be True, False or 'blocks', got {self.shuffle!r}")
        if self.shuffle != "blocks":
            given = [n for n in ("block_rows", "window_blocks") if getattr(self, n) is not None]
            if given:
                raise ValueError(
                    f"{' and '.join(given)} only apply to shuffle='blocks' (got shuffle="
                    f"{self.shuffle!r}); leave them out or pass shuffle='blocks'"
                )
            return
        if self.block_rows is None:
            raise ValueError("shuffle='blocks' needs block_rows, the rows of one block")
        block_rows = check_int("block_rows", self.block_rows, 1)
        window = self.window_blocks if self.window_blocks is not None else DEFAULT_WINDOW_BLOCKS
        object.__setattr__(self, "block_rows", block_rows)
        object.__setattr__(self, "window_blocks", check_int("window_blocks", window, 1))
        if self.units is not None:
            units = tuple(int(u) for u in self.units)
            if sum(units) != self.num_examples or min(units, default=0) < 1:
                raise ValueError(
                    f"units {units[:8]}... must be positive row counts summing to "
                    f"num_examples={self.num_examples}, got a sum of {sum(units)}"
                )
            object.__setattr__(self, "units", units)

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.process_count

    @property
    def num_batches(self) -> int:
        """Batches per epoch, identical on every process."""
        if self.drop_remainder:
            return self.num_examples // self.global_batch_size
        return math.ceil(self.num_examples / self.global_batch_size)

    def check_position(self, epoch: object, start: object) -> tuple[int, int]:
        """`check_position` with this sampler's ``num_batches``."""
        return check_position(epoch, start, self.num_batches)

    def epoch_seed(self, epoch: int) -> int:
        """A 32-bit seed for ``epoch``, derived from ``(seed, epoch)``, for a
        framework's own shuffle (``order="native"``): reproducible, and
        different for every epoch."""
        return int(np.random.SeedSequence((self.seed, epoch)).generate_state(1)[0])

    def permutation(self, epoch: int) -> np.ndarray:
        """The global order of ``epoch`` (int64 indices into the split)."""
        if not self.shuffle:
            return np.arange(self.num_examples, dtype=np.int64)
        # SeedSequence((seed, epoch)): independent, reproducible stream per epoch.
        rng = np.random.default_rng((self.seed, epoch))
        if self.shuffle == "blocks":
            return self._block_permutation(rng)
        return rng.permutation(self.num_examples)

    def _block_permutation(self, rng: np.random.Generator) -> np.ndarray:
        """Whole blocks in a random order, then each window of ``window_blocks``
        consecutive blocks' rows shuffled among themselves. Built in place: one
        int64 per row at the peak (288 MB for 36M rows), no temporaries."""
        n = self.num_examples
        starts, stops = self.blocks()
        shuffled = rng.permutation(len(starts))
        order = np.empty(n, dtype=np.int64)
        at = 0
        for window in range(0, len(shuffled), self.window_blocks):
            begin = at
            for block in shuffled[window : window + self.window_blocks].tolist():
                start, stop = int(starts[block]), int(stops[block])
                order[at : at + stop - start] = np.arange(start, stop)
                at += stop - start
            rng.shuffle(order[begin:at])  # in place, a view
        return order

    def blocks(self) -> tuple[np.ndarray, np.ndarray]:
        """The first row and the end of each block of ``shuffle="blocks"``,
        in data order: every ``block_rows`` rows of each unit."""
        assert self.block_rows is not None, "blocks are those of shuffle='blocks'"
        units = self.units if self.units is not None else (self.num_examples,)
        ends = np.cumsum(units)
        starts = np.concatenate(
            [
                np.arange(end - rows, end, self.block_rows)
                for end, rows in zip(ends, units, strict=True)
            ]
        )
        return starts, np.minimum(
            starts + self.block_rows,
            np.repeat(ends, [-(-rows // self.block_rows) for rows in units]),
        )

    def num_valid(self, step: int) -> int:
        """The real rows of this process's batch ``step`` of any epoch (the
        rest of its ``epoch_plan`` indices are padding)."""
        lo = step * self.global_batch_size + self.process_index * self.batch_size
        return max(0, min(self.batch_size, self.num_examples - lo))

    def epoch_plan(self, epoch: int, start: int = 0) -> Iterator[tuple[np.ndarray, int]]:
        """Yields ``(indices, num_valid)`` for batches ``start..num_batches-1``.

        ``indices`` always has ``batch_size`` entries so every backend fetches
        a full static shape; entries past ``num_valid`` are padding (they
        repeat a valid index and must be masked out by the caller).
        """
        epoch, start = self.check_position(epoch, start)
        perm = self.permutation(epoch)
        for step in range(start, self.num_batches):
            lo = step * self.global_batch_size + self.process_index * self.batch_size
            indices = perm[lo : lo + self.batch_size]
            num_valid = self.num_valid(step)
            if num_valid < self.batch_size:
                pad = np.full(self.batch_size - num_valid, perm[0], dtype=perm.dtype)
                indices = np.concatenate([indices, pad])
            yield indices, num_valid

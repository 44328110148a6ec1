"""The shared, seeded index sampler that gives every backend the same order.

One global permutation per epoch; global batch ``s`` is the contiguous slice
``perm[s*G:(s+1)*G]`` (``G = batch_size * process_count``) and process ``p``
reads the ``p``-th contiguous ``batch_size`` rows of it. So the global batch
is the concatenation of the process batches in process order, and equals the
single-process batch of size ``G`` with the same seed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

import numpy as np


@dataclasses.dataclass(frozen=True)
class Sampler:
    """Index plan of every epoch for one process.

    Args:
      num_examples: size of the split.
      batch_size: process-local batch size.
      seed: with the epoch number, defines the permutation.
      shuffle: permute each epoch; otherwise dataset order.
      drop_remainder: drop the last partial global batch; otherwise pad it.
      process_index: this process, in ``[0, process_count)``.
      process_count: number of processes sharing the epoch.

    Raises:
      ValueError: on a non-positive batch size, a global batch larger than
        the split, or an inconsistent process index/count.
    """

    num_examples: int
    batch_size: int
    seed: int = 0
    shuffle: bool = True
    drop_remainder: bool = False
    process_index: int = 0
    process_count: int = 1

    def __post_init__(self) -> None:
        if self.process_count < 1 or not 0 <= self.process_index < self.process_count:
            raise ValueError(
                f"process_index={self.process_index} is not in [0, process_count="
                f"{self.process_count}); pass jax.process_index() and jax.process_count()"
            )
        if self.batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {self.batch_size}")
        if self.num_examples <= 0:
            raise ValueError(f"the split is empty (num_examples={self.num_examples})")
        if self.global_batch_size > self.num_examples:
            raise ValueError(
                f"global batch {self.global_batch_size} (batch_size {self.batch_size} x "
                f"{self.process_count} processes) is larger than the split's "
                f"{self.num_examples} examples; use batch_size <= "
                f"{self.num_examples // self.process_count}"
            )

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.process_count

    @property
    def num_batches(self) -> int:
        """Batches per epoch, identical on every process."""
        if self.drop_remainder:
            return self.num_examples // self.global_batch_size
        return math.ceil(self.num_examples / self.global_batch_size)

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
        return np.random.default_rng((self.seed, epoch)).permutation(self.num_examples)

    def epoch_plan(self, epoch: int, start: int = 0) -> Iterator[tuple[np.ndarray, int]]:
        """Yields ``(indices, num_valid)`` for batches ``start..num_batches-1``.

        ``indices`` always has ``batch_size`` entries so every backend fetches
        a full static shape; entries past ``num_valid`` are padding (they
        repeat a valid index and must be masked out by the caller).
        """
        if not 0 <= start <= self.num_batches:
            raise ValueError(f"start={start} is outside [0, {self.num_batches}] batches")
        perm = self.permutation(epoch)
        for step in range(start, self.num_batches):
            lo = step * self.global_batch_size + self.process_index * self.batch_size
            indices = perm[lo : lo + self.batch_size]
            num_valid = len(indices)
            if num_valid < self.batch_size:
                pad = np.full(self.batch_size - num_valid, perm[0], dtype=perm.dtype)
                indices = np.concatenate([indices, pad])
            yield indices, num_valid

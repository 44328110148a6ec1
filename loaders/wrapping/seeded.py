"""The global random generators a wrapped loader's own code draws from, seeded
per batch while `wrap` reads it in the sampler's order.

A ``__getitem__``, collate function or formatting transform that augments
with ``np.random``, Python's ``random`` or torch's global generator (most
hand-written augmentation, torchvision's transforms) draws the same numbers
for the same batch in any process, worker, epoch re-read or resume, and new
ones every epoch: each batch runs with the three generators seeded by
``(seed, epoch, the batch's rows)``, and their states are put back after, so
the rest of the program does not see the seeding. Other generators (a
``default_rng()`` the user made, fresh entropy) cannot be reached this way.
"""

from __future__ import annotations

import contextlib
import random
import sys
import zlib
from collections.abc import Iterator, Sequence

import numpy as np


@contextlib.contextmanager
def seeded_globals(seed: int, epoch: int, rows: Sequence[int]) -> Iterator[None]:
    """numpy's legacy global generator, Python's ``random`` and (once imported)
    torch's CPU generator, seeded by ``(seed, epoch, rows)`` inside the block
    and restored after it."""
    rows_bytes = np.asarray(rows, np.int64).tobytes()
    key = np.random.SeedSequence([seed, epoch, zlib.crc32(rows_bytes)])
    numpy_state, python_state = np.random.get_state(), random.getstate()
    torch = sys.modules.get("torch")
    try:
        np.random.seed(key.spawn(1)[0].generate_state(4))
        random.seed(int.from_bytes(key.spawn(1)[0].generate_state(4).tobytes(), "little"))
        if torch is None:
            yield
            return
        with torch.random.fork_rng(devices=[]):
            # The CPU generator alone: torch.manual_seed also visits every device
            # backend (~90 us a batch, twice the rest of a small batch's reading).
            torch.default_generator.manual_seed(int(key.generate_state(1, np.uint64)[0]) >> 1)
            yield
    finally:
        np.random.set_state(numpy_state)
        random.setstate(python_state)

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

Most datasets never draw from them, and seeding costs more than reading a
small batch, so `GlobalDraws` seeds only once the reading is seen to draw
(docs/wrap.md, "Random augmentations").
"""

from __future__ import annotations

import contextlib
import ctypes
import random
import sys
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")


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


class GlobalDraws:
    """Reads batches under `seeded_globals` once the reading is seen to draw
    from a global generator, in this process; before that, plainly.

    Each plain read is watched: the generators' states are compared before
    and after it (a few µs; `seeded_globals` costs ~0.1-0.3 ms a batch). A
    read that moved one is undone (the states put back) and read again
    seeded, and every later read is seeded. A read that moved none drew
    nothing, so seeding would not have changed it: the batches are those of
    seeding every batch, however rarely the reading draws. Blind spots: a
    read whose only numpy draw takes the normal deviate that numpy's legacy
    ``normal`` family keeps cached from an earlier draw (the generator does
    not move; the next draw moves it), and code that reads a generator's
    state without drawing. A copy sent to a worker process learns on its own.
    """

    def __init__(self, seed: int):
        self.seed = seed
        self.draws = False  # seen to draw, in this process

    def read(self, epoch: int, rows: Sequence[int], read: Callable[[], T]) -> T:
        """``read()``, seeded by ``(seed, epoch, rows)`` if it draws."""
        before = None if self.draws else _states()
        if before is None:  # seen to draw, or numpy's generator cannot be watched
            self.draws = True
            with seeded_globals(self.seed, epoch, rows):
                return read()
        moved = True
        try:
            batch = read()
            moved = not _same(before, _states())
        finally:
            if moved:  # (on an error too: the program's generators as they were)
                _put_back(before)
                self.draws = True
        if not moved:
            return batch
        with seeded_globals(self.seed, epoch, rows):
            return read()


# numpy's global bit generator and a live view of its state, once checked.
_numpy_view: tuple[Any, np.ndarray | None] | None = None


def _numpy_words() -> np.ndarray | None:
    """numpy's global MT19937 state as a live uint32 view (624 key words, then
    the position), or None when it cannot be read so.

    ``np.random.get_state()`` copies the key word by word in Python (~75 µs
    in numpy 2.4); the view reads it in ~1 µs through the generator's public
    ``ctypes.state_address``. The struct's layout (``uint32_t key[624]; int
    pos``, numpy 1.17 to 2.4) is checked against ``get_state()`` once per
    generator, so a numpy that changes it gets None (every batch seeded),
    not a wrong watch.
    """
    global _numpy_view
    generator = np.random.get_bit_generator()
    if _numpy_view is None or _numpy_view[0] is not generator:
        words = None
        if type(generator).__name__ == "MT19937":
            address = generator.ctypes.state_address
            words = np.ctypeslib.as_array((ctypes.c_uint32 * 625).from_address(address))
            _, key, pos, *_ = np.random.get_state()
            if not (np.array_equal(words[:624], key) and int(words[624]) == pos):
                words = None
        _numpy_view = (generator, words)  # (holds the generator: the address stays valid)
    return _numpy_view[1]


def _states() -> tuple[np.ndarray, Any, Any] | None:
    """The global generators' states, or None when numpy's cannot be read cheaply."""
    words = _numpy_words()
    if words is None:
        return None
    torch = sys.modules.get("torch")
    torch_state = None if torch is None else torch.default_generator.get_state()
    return words.copy(), random.getstate(), torch_state


def _same(before: tuple[np.ndarray, Any, Any], after: tuple[np.ndarray, Any, Any] | None) -> bool:
    if after is None or not np.array_equal(before[0], after[0]) or before[1] != after[1]:
        return False
    if before[2] is None or after[2] is None:
        return before[2] is after[2]  # (torch imported by the read: treated as moved)
    return bool(before[2].equal(after[2]))


def _put_back(before: tuple[np.ndarray, Any, Any]) -> None:
    words = _numpy_words()
    if words is not None:
        words[:] = before[0]
    random.setstate(before[1])
    if before[2] is not None:
        sys.modules["torch"].default_generator.set_state(before[2])

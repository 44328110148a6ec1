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

    Each plain read is watched: the generators' states are copied before it
    and compared after it (~7 µs; `seeded_globals` costs ~0.1 ms a batch).
    A read that moved one is undone (the states put back) and read again
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
        self._spare: list[_Watch] = []  # (one per read at once: threads may share a loader)

    def __getstate__(self) -> dict[str, Any]:
        return {"seed": self.seed, "draws": self.draws, "_spare": []}

    def read(self, epoch: int, rows: Sequence[int], read: Callable[[], T]) -> T:
        """``read()``, seeded by ``(seed, epoch, rows)`` if it draws."""
        watch = None
        if not self.draws:
            watch = self._spare.pop() if self._spare else _Watch()
            if not watch.take():  # numpy's generator cannot be watched
                watch = None
        if watch is None:
            self.draws = True
            with seeded_globals(self.seed, epoch, rows):
                return read()
        moved = True
        try:
            batch = read()
            moved = watch.moved()
        finally:
            if moved:  # (on an error too: the program's generators as they were)
                watch.put_back()
                self.draws = True
            self._spare.append(watch)
        if not moved:
            return batch
        with seeded_globals(self.seed, epoch, rows):
            return read()


class _Watch:
    """The global generators' states before a read, copied into buffers kept
    for the next read (a fresh 2.5 KB copy a read costs ~3 µs more: the
    allocation, not the copy), to compare after it and to put back."""

    def __init__(self):
        self._numpy = np.empty(625, np.uint32)
        self._python = np.empty(625, np.uint32)
        self._python_rest: Any = None  # gauss_next, or getstate() without the view
        self._torch: Any = None

    def take(self) -> bool:
        """Copies the states; False when numpy's cannot be read cheaply."""
        numpy_words = _numpy_words()
        if numpy_words is None:
            return False
        np.copyto(self._numpy, numpy_words)
        python_words = _python_words()
        if python_words is None:
            self._python_rest = random.getstate()
        else:  # (gauss_next: `random.gauss` keeps a second deviate there)
            np.copyto(self._python, python_words)
            self._python_rest = random.random.__self__.gauss_next
        torch = sys.modules.get("torch")
        self._torch = None if torch is None else torch.default_generator.get_state()
        return True

    def moved(self) -> bool:
        """Whether a generator's state differs from the copy (torch imported
        since counts as moved)."""
        numpy_words = _numpy_words()
        if numpy_words is None or memoryview(numpy_words) != memoryview(self._numpy):
            return True
        python_words = _python_words()
        if python_words is None:
            if random.getstate() != self._python_rest:
                return True
        elif (
            memoryview(python_words) != memoryview(self._python)
            or random.random.__self__.gauss_next != self._python_rest
        ):
            return True
        torch = sys.modules.get("torch")
        if torch is None or self._torch is None:
            return torch is not None
        return not torch.equal(torch.default_generator.get_state(), self._torch)

    def put_back(self) -> None:
        words = _numpy_words()
        if words is not None:
            np.copyto(words, self._numpy)
        if _python_words() is None:
            random.setstate(self._python_rest)
        else:
            generator = random.random.__self__
            position, *key = self._python.tolist()
            generator.setstate((generator.VERSION, (*key, position), self._python_rest))
        if self._torch is not None:
            sys.modules["torch"].default_generator.set_state(self._torch)


# A global generator's state as a live view of its words, once checked per
# generator object: (the generator, the view or None).
_numpy_view: tuple[Any, np.ndarray | None] | None = None
_python_view: tuple[Any, np.ndarray | None] | None = None


def _numpy_words() -> np.ndarray | None:
    """numpy's global MT19937 state as a live uint32 view (624 key words, then
    the position), or None when it cannot be read so.

    ``np.random.get_state()`` copies the key word by word in Python (~75 µs
    in numpy 2.4); the view reads it in ~0.1 µs through the generator's public
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
            words = np.frombuffer((ctypes.c_uint32 * 625).from_address(address), np.uint32)
            _, key, pos, *_ = np.random.get_state()
            if not (np.array_equal(words[:624], key) and int(words[624]) == pos):
                words = None
        _numpy_view = (generator, words)  # (holds the generator: the address stays valid)
    return _numpy_view[1]


def _python_words() -> np.ndarray | None:
    """Python's global ``random`` generator's state as a live uint32 view (the
    position, then 624 words), or None when it cannot be read so.

    ``random.getstate()`` builds a tuple of 625 ints (~7 µs, twice a batch);
    the view reads the same words in ~0.1 µs. CPython's generator is the C
    struct ``{PyObject_HEAD; int index; uint32_t state[624];}`` (CPython 3.10
    to 3.13), which starts right after the object's header, at ``id(obj) +
    object.__basicsize__``; the words there are checked against
    ``getstate()`` once per generator, so another layout (or another Python)
    gets None, and the watch reads ``getstate()`` instead.
    """
    global _python_view
    generator = random.random.__self__  # the module's own Random instance
    if _python_view is None or _python_view[0] is not generator:
        words = None
        if sys.implementation.name == "cpython":  # (elsewhere id() need not be an address)
            address = id(generator) + object.__basicsize__
            words = np.frombuffer((ctypes.c_uint32 * 625).from_address(address), np.uint32)
            _, key, _ = generator.getstate()
            if not (words[1:].tolist() == list(key[:624]) and int(words[0]) == key[624]):
                words = None
        _python_view = (generator, words)  # (holds the generator: the address stays valid)
    return _python_view[1]

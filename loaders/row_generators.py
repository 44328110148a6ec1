"""The random generators of a batch of rows: ``numpy.random.default_rng((seed,
epoch, row))`` for each row, the same streams, built for the whole batch at once.

``default_rng((seed, epoch, row))`` spends most of its time in
``SeedSequence``: turning the tuple into 32-bit words and hashing them into
the PCG64 state, in Python, for every record (as much as a tenth of the time
of a PNG decode and crop). Here the hash runs once per batch, vectorised over
the rows with numpy (O'Neill's ``seed_seq`` as numpy's ``SeedSequence``
implements it: pool size 4, no spawn key), and each row's
``Generator(PCG64(...))`` is seeded from its precomputed words through a
`RowSeed`. tests/loaders/test_row_generators.py holds the streams to
``default_rng((seed, epoch, row))``'s on many rows (huge ones included).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from numpy.random.bit_generator import ISpawnableSeedSequence

__all__ = ["RowSeed", "row_generators"]

_MASK = 0xFFFFFFFF
# numpy's SeedSequence constants (numpy/random/bit_generator.pyx, unchanged since 1.17).
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R = 0xCA01F9DD, 0x4973F715
_POOL = 4  # SeedSequence's default pool size
_STATE_WORDS = 4  # uint64 words PCG64 asks its seed sequence for


def row_generators(seed: int, epoch: int, rows: np.ndarray) -> list[np.random.Generator]:
    """One fresh generator per row, each ``default_rng((seed, epoch, row))``.

    All are made here, one after the other, before the first is used: made
    one per record between a transform's calls, each cost 3-4 times as much
    CPU (measured with the decode workload: 4% of its records' time, against
    1.5% made together), its code and objects evicted from the caches by the
    transform's work each time.

    Args:
      seed, epoch: non-negative ints.
      rows: non-negative row numbers (below 2**64).
    """
    rows = np.asarray(rows, dtype=np.uint64).reshape(-1)
    states = np.empty((len(rows), _STATE_WORDS), np.uint64)
    common = [*_words(seed), *_words(epoch)]
    # A row is one 32-bit word below 2**32 and two above, as SeedSequence splits it.
    wide = rows > _MASK
    for pick, row_words in ((~wide, 1), (wide, 2)):
        if pick.any():
            part = rows[pick]
            entropy = np.empty((len(common) + row_words, len(part)), np.uint32)
            entropy[: len(common)] = np.array(common, np.uint32)[:, None]
            for k in range(row_words):
                entropy[len(common) + k] = part >> np.uint64(32 * k)  # the low 32 bits kept
            states[pick] = _state(_pool(entropy))
    generator, pcg64 = np.random.Generator, np.random.PCG64
    return [
        generator(pcg64(RowSeed((seed, epoch, row), state)))
        for row, state in zip(rows.tolist(), states, strict=True)
    ]


class RowSeed(ISpawnableSeedSequence):
    """``SeedSequence((seed, epoch, row))`` whose PCG64 state is already
    known: it hands that over without hashing again. ``entropy`` is the
    tuple; anything else a transform asks of it (``spawn``, another
    ``generate_state``, ``pool``) is answered by the real ``SeedSequence``,
    built on first use, so children and other states are the same too."""

    __slots__ = ("_sequence", "_state", "entropy")

    def __init__(self, entropy: tuple[int, ...], state: np.ndarray):
        self.entropy, self._state, self._sequence = entropy, state, None

    def generate_state(self, n_words: int, dtype: Any = np.uint32) -> np.ndarray:
        if n_words == _STATE_WORDS and (dtype is np.uint64 or np.dtype(dtype) == np.uint64):
            return self._state.copy()
        return self.sequence().generate_state(n_words, dtype)

    def spawn(self, n_children: int) -> list[np.random.SeedSequence]:
        return self.sequence().spawn(n_children)

    def sequence(self) -> np.random.SeedSequence:
        """The ``SeedSequence`` it stands for."""
        if self._sequence is None:
            self._sequence = np.random.SeedSequence(self.entropy)
        return self._sequence

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # unset slots (while unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.sequence(), name)

    def __getstate__(self) -> tuple:
        return self.entropy, self._state

    def __setstate__(self, state: tuple) -> None:
        self.__init__(*state)

    def __repr__(self) -> str:
        return repr(self.sequence())


def _words(n: int) -> list[int]:
    """``n`` as SeedSequence splits an int: 32-bit words, lowest first (0 is one word)."""
    words = [n & _MASK]
    while n := n >> 32:
        words.append(n & _MASK)
    return words


def _pool(entropy: np.ndarray) -> np.ndarray:
    """``SeedSequence.mix_entropy``: the 4-word pool ``[4, rows]`` of each row's
    entropy words (``entropy[i]`` holds word ``i`` of every row). Each step
    that mixes one word into the other three does so for all three at once:
    they read only that word, which the step leaves alone."""
    words = len(entropy)
    hash_consts = _hash_consts(_INIT_A, _MULT_A, _POOL + 3 * _POOL + _POOL * max(0, words - _POOL))
    pool = np.zeros((_POOL, entropy.shape[1]), np.uint32)
    pool[: min(words, _POOL)] = entropy[:_POOL]
    pool = _hashmix(pool, hash_consts, 0)
    used = _POOL
    for src in range(_POOL):
        others = [dst for dst in range(_POOL) if dst != src]
        pool[others] = _mix(pool[others], _hashmix(pool[src][None], hash_consts, used, 3))
        used += 3
    for word in entropy[_POOL:]:
        pool = _mix(pool, _hashmix(word[None], hash_consts, used, _POOL))
        used += _POOL
    return pool


def _state(pool: np.ndarray) -> np.ndarray:
    """``SeedSequence.generate_state(4, np.uint64)`` of each row's pool: ``[rows, 4]``."""
    hash_consts = _hash_consts(_INIT_B, _MULT_B, 2 * _STATE_WORDS)
    cycled = pool[np.arange(2 * _STATE_WORDS) % _POOL]
    words = _hashmix(cycled, hash_consts, 0).astype(np.uint64)
    # Little-endian pairs of 32-bit words, low word first.
    return (words[0::2] | (words[1::2] << np.uint64(32))).T


def _hashmix(values: np.ndarray, hash_consts: np.ndarray, used: int, count: int = 0) -> np.ndarray:
    """SeedSequence's ``hashmix`` of row ``i`` of ``values`` (broadcast to
    ``count`` rows) as its ``used + i``-th call: the multiplier moves on with
    every call, the same way for every row."""
    count = count or len(values)
    xor = hash_consts[used : used + count, None]
    times = hash_consts[used + 1 : used + count + 1, None]
    values = (values ^ xor) * times  # uint32 arrays wrap, as C does
    return values ^ (values >> np.uint32(16))


def _mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    result = x * np.uint32(_MIX_L) - y * np.uint32(_MIX_R)
    return result ^ (result >> np.uint32(16))


@functools.cache
def _hash_consts(init: int, mult: int, calls: int) -> np.ndarray:
    """The multiplier before each of ``calls`` hashmix calls, and after the last."""
    consts = [init]
    for _ in range(calls):
        consts.append(consts[-1] * mult & _MASK)
    consts = np.array(consts, np.uint32)
    consts.flags.writeable = False
    return consts

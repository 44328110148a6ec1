"""Rows of named arrays: gathered a batch at a time, padded to a full batch.

`ArrayRows` is the one reader of an in-memory (or memory-mapped) dataset's
rows that the numpy, torch and Grain backends share; a framework's class
adds only what its framework needs (torch's ``Dataset`` base).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from jaxfeed.loaders._io.mapped_files import for_pickle, from_pickle

__all__ = ["ArrayRows", "pad_rows"]


class ArrayRows:
    """Rows of in-memory (or memory-mapped) fields: one record by position
    (``__getitem__``, a random-access source such as Grain's
    ``RandomAccessDataSource``), or a whole batch in one numpy gather per
    field (`read_batch`, a `RowReader` of the record pool).

    Module-level and holding only arrays, so it pickles into spawned
    workers; pickled, an on-disk field travels as where it lies
    (`for_pickle`), not as all its bytes.
    """

    def __init__(self, arrays: Mapping[str, Any]):
        self.arrays = dict(arrays)
        self._rows = len(next(iter(self.arrays.values())))

    def __getstate__(self) -> dict:
        # Into a worker: an on-disk field as where it lies, not as all its bytes.
        return {**self.__dict__, "arrays": for_pickle(self.arrays)}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, arrays=from_pickle(state["arrays"]))

    def __len__(self) -> int:
        return self._rows

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {key: array[index] for key, array in self.arrays.items()}

    def read_batch(self, indices: np.ndarray) -> dict[str, Any]:
        """One numpy gather per field for the whole batch."""
        return {key: array[indices] for key, array in self.arrays.items()}


def pad_rows(array: np.ndarray, size: int) -> np.ndarray:
    """``array`` followed by zero rows up to ``size`` rows."""
    out = np.zeros((size, *array.shape[1:]), array.dtype)
    out[: len(array)] = array
    return out

"""torch's ``default_collate`` of records that hold numpy arrays and numbers,
made in numpy: the same arrays, without a torch tensor per row.

``default_collate`` turns every row's array into a tensor
(``torch.as_tensor``) and stacks them: ~1 µs a row, most of the reading of a
batch of small rows (a per-sample MNIST ``Dataset``: ~150 of ~260 µs a batch
of 128). `wrap` reads a map-style dataset through `collate_numpy` instead, in
the process that trains, when the loader collates with ``default_collate``
and torch's registry of collate functions is its own. Records (dicts, tuples,
lists) whose leaves are numpy arrays of one dtype and shape, numpy scalars of
one type, or Python ints, floats or bools become what ``default_collate``
makes of them, as numpy arrays of the same dtypes and values: a dict stays a
dict, a tuple or list becomes a list. Anything else (tensors, strings,
namedtuples, rows that disagree in type, dtype, shape or length) goes to
``default_collate``, which raises where it would. Two leaves it refuses or
warns about are stacked here: a view with negative strides (a flip;
``torch.as_tensor`` refuses it) and a read-only array (it warns). Worker
processes keep ``default_collate``: it puts a batch in shared memory, which
numpy cannot.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# The dtypes torch.as_tensor takes as they are (native byte order).
_DTYPES = frozenset(
    np.dtype(t)
    for t in (
        np.bool_,
        np.uint8,
        np.int8,
        np.int16,
        np.int32,
        np.int64,
        np.float16,
        np.float32,
        np.float64,
        np.complex64,
        np.complex128,
    )
)
# default_collate's torch.tensor(values) of Python numbers, as dtypes.
_PYTHON = {bool: np.dtype(np.bool_), int: np.dtype(np.int64), float: np.dtype(np.float64)}


class _NotNumpy(Exception):
    """Records `collate_numpy` leaves to ``default_collate``."""


def collate_numpy(records: Any) -> Any | None:
    """``default_collate(records)`` as numpy arrays, or None where
    ``default_collate`` must make it (see the module's docstring)."""
    if type(records) is not list or not records:
        return None
    try:
        return _collate(records)
    except _NotNumpy:
        return None


def _collate(values: list) -> Any:
    first = values[0]
    kind = type(first)
    if any(type(value) is not kind for value in values):
        raise _NotNumpy
    if kind is np.ndarray:
        dtype = first.dtype
        if dtype not in _DTYPES or any(value.dtype != dtype for value in values):
            raise _NotNumpy
        try:  # (np.array of equal shapes is np.stack's result, in half its time)
            return np.array(values, dtype)
        except ValueError:  # shapes differ: torch.stack's error, not numpy's
            raise _NotNumpy from None
    if kind is dict:
        try:
            return {key: _collate([row[key] for row in values]) for key in first}
        except KeyError:
            raise _NotNumpy from None
    if kind is tuple or kind is list:
        if any(len(value) != len(first) for value in values):
            raise _NotNumpy
        return [_collate(list(column)) for column in zip(*values, strict=True)]
    dtype = _PYTHON.get(kind)
    if dtype is None and isinstance(first, np.generic) and first.dtype in _DTYPES:
        dtype = first.dtype
    if dtype is None:
        raise _NotNumpy
    try:
        return np.array(values, dtype)
    except OverflowError:  # an int past int64: torch.tensor's error
        raise _NotNumpy from None

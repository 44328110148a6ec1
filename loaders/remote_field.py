"""`RemoteField`: a field whose rows stay in a store, read as they are asked for.

Its own module because `ArrayDataset` and `RaggedField` (whose values may be
one) both need it, and `array_dataset` imports `ragged_field`.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = ["RemoteField"]


@runtime_checkable
class RemoteField(Protocol):
    """A numeric field whose rows stay where they lie, read as they are asked
    for (a store's ``.npy`` object, by ranged reads): indexed by a row, a
    slice or an array of rows, it gives numpy arrays of ``dtype``, which is
    already what the device holds (this machine's byte order, 64-bit
    narrowed as `as_device_dtype` would). It is neither mapped nor in memory,
    so the kernel's read-ahead and a file's checks pass it by; ``url`` names
    where it lies (its `Origin` checks it)."""

    url: str
    shape: tuple[int, ...]
    dtype: np.dtype
    nbytes: int

    def __len__(self) -> int: ...

    def __getitem__(self, index: Any) -> np.ndarray: ...

"""`BytesField`: a field of variable-length bytes per row (encoded images,
serialized records), held as one buffer plus row offsets."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from jaxfeed.loaders.workers.mapped_files import for_pickle, from_pickle

__all__ = ["BytesField"]


class BytesField:
    """Row ``i`` is ``data[offsets[i]:offsets[i + 1]]``: one contiguous buffer,
    not a Python object per row, so it pickles into workers in one copy and
    hashes for a cache key like any array.

    It answers the few array questions a dataset asks of its fields
    (``len``, ``shape``, ``dtype`` (object), ``nbytes``, ``[:k]``) and a
    gather, ``field[indices]``, gives a numpy object array of ``bytes``.
    Such a field cannot reach a device: ``make`` needs a ``transform`` that
    turns it into numbers.

    Args:
      offsets: int64 ``[rows + 1]``, from 0, never decreasing, ending at ``len(data)``.
      data: the rows' bytes back to back, uint8.

    Raises:
      ValueError: offsets that do not describe ``data``.
    """

    dtype = np.dtype(object)
    ndim = 1

    def __init__(self, offsets: np.ndarray, data: np.ndarray):
        offsets = np.ascontiguousarray(offsets, dtype=np.int64)
        data = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        if offsets.ndim != 1 or not len(offsets) or offsets[0] != 0 or offsets[-1] != len(data):
            raise ValueError(
                f"offsets must run from 0 to len(data) = {len(data)}, one more than the "
                f"rows; got {len(offsets)} offsets"
            )
        if np.any(np.diff(offsets) < 0):
            raise ValueError("offsets must never decrease")
        for array in (offsets, data):
            array.flags.writeable = False
        self.offsets, self.data = offsets, data

    @classmethod
    def from_values(cls, values: Sequence[bytes]) -> BytesField:
        """From one ``bytes`` object per row (a list or a numpy object array).

        Raises:
          TypeError: a row that is not ``bytes`` (the message names it).
        """
        sizes = np.empty(len(values), np.int64)
        for i, value in enumerate(values):
            if not isinstance(value, bytes | bytearray | memoryview):
                raise TypeError(f"row {i} is {type(value).__name__}, not bytes")
            sizes[i] = len(value)
        offsets = np.zeros(len(values) + 1, np.int64)
        np.cumsum(sizes, out=offsets[1:])
        return cls(offsets, np.frombuffer(b"".join(values), np.uint8))

    @property
    def shape(self) -> tuple[int]:
        return (len(self),)

    @property
    def nbytes(self) -> int:
        return self.data.nbytes + self.offsets.nbytes

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, key: int | slice | Sequence[int] | np.ndarray):
        """``bytes`` for an int, a `BytesField` for a slice of step 1, a numpy
        object array of ``bytes`` for an array of row indices."""
        if isinstance(key, int | np.integer):
            row = int(key) + len(self) if key < 0 else int(key)
            if not 0 <= row < len(self):
                raise IndexError(f"row {key} is outside a field of {len(self)} rows")
            return self.data[self.offsets[row] : self.offsets[row + 1]].tobytes()
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step == 1:
                stop = max(start, stop)
                ends = self.offsets[start : stop + 1]
                return BytesField(ends - ends[0], self.data[ends[0] : ends[-1]])
            key = np.arange(start, stop, step)
        indices = np.asarray(key, dtype=np.int64)
        out = np.empty(len(indices), dtype=object)
        data, starts, stops = self.data, self.offsets[indices], self.offsets[indices + 1]
        for i, (start, stop) in enumerate(zip(starts.tolist(), stops.tolist(), strict=True)):
            out[i] = data[start:stop].tobytes()
        return out

    def __reduce__(self):
        """A field memory-mapped from files travels into workers as where it
        lies, not as all its bytes (`for_pickle`)."""
        return _unpickle, (for_pickle({"offsets": self.offsets, "data": self.data}),)

    def content(self) -> tuple[np.ndarray, np.ndarray]:
        """The two arrays that define the field (what a cache key hashes)."""
        return self.offsets, self.data

    def __repr__(self) -> str:
        return f"BytesField({len(self)} rows, {len(self.data)} bytes)"


def _unpickle(arrays: dict[str, object]) -> BytesField:
    arrays = from_pickle(arrays)
    return BytesField(arrays["offsets"], arrays["data"])

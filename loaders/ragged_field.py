"""`RaggedField`: a field whose rows are numeric arrays of different lengths
(token ids, audio frames, boxes), held as one values array plus row offsets."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from jaxfeed.loaders._io.mapped_files import for_pickle, from_pickle
from jaxfeed.loaders.remote_field import RemoteField

__all__ = ["RaggedField"]


class RaggedField:
    """Row ``i`` is ``values[offsets[i]:offsets[i + 1]]``, of shape
    ``[length_i, *frame_shape]``: one values array and one offsets array, not
    an object per row, so the lengths are known without reading a value (the
    batch plan needs only them), the values can be a memory-mapped ``.npy``
    read in place (a token corpus bigger than memory), and a field pickles
    into workers as where it lies.

    Args:
      values: every row's values back to back, ``[total, *frame_shape]``, numbers
        (or a `RemoteField` of them: a store's values read in place, as asked for).
      offsets: int64 ``[rows + 1]``, from 0, never decreasing, ending at ``len(values)``.

    Raises:
      ValueError: offsets that do not describe ``values``; values that are not numbers.

    Example:
      >>> field = RaggedField.from_rows([np.array([5, 6, 7]), np.array([8])])
      >>> field.lengths, field[1]
      (array([3, 1]), array([8]))
    """

    ndim = 1

    def __init__(self, values: np.ndarray, offsets: np.ndarray):
        if isinstance(values, np.ndarray) or not _read_in_place(values):
            values = np.asarray(values)
        offsets = np.ascontiguousarray(offsets, dtype=np.int64)
        if values.ndim < 1 or values.dtype.kind not in "biuf":
            raise ValueError(
                f"a ragged field's values must be numbers with a row axis, got "
                f"{values.dtype} {values.shape}"
            )
        if offsets.ndim != 1 or len(offsets) < 2 or offsets[0] != 0 or offsets[-1] != len(values):
            raise ValueError(
                f"offsets must run from 0 to len(values) = {len(values)}, one more than the "
                f"rows; got {len(offsets)} offsets"
            )
        if np.any(offsets[1:] < offsets[:-1]):
            raise ValueError("offsets must never decrease")
        offsets.flags.writeable = False
        self.values, self.offsets = values, offsets

    @classmethod
    def from_rows(cls, rows: Sequence[np.ndarray]) -> RaggedField:
        """From one array per row (a list, or a numpy object array); the rows
        share their dtype and every axis but the first.

        Raises:
          ValueError: no rows, or rows of other dtypes or frame shapes (named).
        """
        arrays = [np.asarray(row) for row in rows]
        if not arrays:
            raise ValueError("a ragged field needs at least one row")
        first = arrays[0]
        for i, row in enumerate(arrays):
            if row.ndim < 1 or row.dtype.kind not in "biuf" or row.shape[1:] != first.shape[1:]:
                raise ValueError(
                    f"row {i} is {row.dtype} {list(row.shape)}, but row 0 is {first.dtype} "
                    f"{list(first.shape)}: rows are numbers that differ only in their first "
                    "axis (length)"
                )
        # Rows of other integer or float widths (a list of lists is int64): numpy's
        # promotion, which holds every value exactly.
        dtype = np.result_type(*{a.dtype for a in arrays})
        lengths = np.fromiter((len(a) for a in arrays), np.int64, len(arrays))
        return cls.from_lengths(np.concatenate(arrays).astype(dtype, copy=False), lengths)

    @classmethod
    def from_lengths(cls, values: np.ndarray, lengths: Sequence[int]) -> RaggedField:
        """From the values back to back and each row's length (a ``(values,
        lengths)`` pair, as token corpora are often stored)."""
        lengths = np.asarray(lengths, dtype=np.int64)
        offsets = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return cls(values, offsets)

    @property
    def lengths(self) -> np.ndarray:
        """Each row's length (int64), from the offsets alone."""
        return np.diff(self.offsets)

    @property
    def dtype(self) -> np.dtype:
        return self.values.dtype

    @property
    def frame_shape(self) -> tuple[int, ...]:
        """The shape of one step of a row (``()`` for token ids)."""
        return self.values.shape[1:]

    @property
    def shape(self) -> tuple[int]:
        return (len(self),)

    @property
    def nbytes(self) -> int:
        return self.values.nbytes + self.offsets.nbytes

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, key: int | slice | Sequence[int] | np.ndarray):
        """A row's array for an int, a `RaggedField` for a slice of step 1, a
        numpy object array of rows for an array of row indices."""
        if isinstance(key, int | np.integer):
            row = int(key) + len(self) if key < 0 else int(key)
            if not 0 <= row < len(self):
                raise IndexError(f"row {key} is outside a field of {len(self)} rows")
            return self.values[self.offsets[row] : self.offsets[row + 1]]
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step == 1:
                ends = self.offsets[start : max(start, stop) + 1]
                return RaggedField(self.values[ends[0] : ends[-1]], ends - ends[0])
            key = np.arange(start, stop, step)
        out = np.empty(len(key), dtype=object)
        for i, row in enumerate(np.asarray(key, dtype=np.int64).tolist()):
            out[i] = self[row]
        return out

    def content(self) -> tuple[np.ndarray, ...]:
        """The arrays that define the field (what a cache key hashes)."""
        return self.offsets, self.values

    def __reduce__(self):
        """Into a worker as where a memory-mapped field lies, not as its bytes."""
        return _unpickle, (for_pickle({"values": self.values, "offsets": self.offsets}),)

    def __repr__(self) -> str:
        frame = f" x {list(self.frame_shape)}" if self.frame_shape else ""
        return f"RaggedField({len(self)} rows, {len(self.values)} values{frame}, {self.dtype})"


def _read_in_place(values: object) -> bool:
    """Whether ``values`` are a store's, read as they are asked for (a
    `RemoteField`): kept so, never read whole into memory."""
    return isinstance(values, RemoteField)


def _unpickle(arrays: dict[str, object]) -> RaggedField:
    arrays = from_pickle(arrays)
    return RaggedField(arrays["values"], arrays["offsets"])

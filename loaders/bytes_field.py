"""`BytesField`: a field of variable-length bytes per row (encoded images,
serialized records), held as one buffer plus row offsets, or as rows placed
anywhere in a few buffers (files read in place)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from jaxfeed.loaders._io.mapped_files import for_pickle, from_pickle

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

    With ``places``, the rows are not back to back: row ``i`` is its
    ``offsets[i + 1] - offsets[i]`` bytes at byte ``places[i, 1]`` of buffer
    ``data[places[i, 0]]``. That is a file read in place (an Arrow IPC file's
    binary column over many record batches, or several such files), each
    buffer one memory-mapped file; a step-1 slice of it is gathered into a
    contiguous field.

    Args:
      offsets: int64 ``[rows + 1]``, from 0, never decreasing, ending at
        ``len(data)`` (without ``places``; with them, at the rows' total bytes).
      data: the rows' bytes back to back, uint8; with ``places``, a tuple of
        uint8 buffers.
      places: None, or int64 ``[rows, 2]``: each row's buffer and first byte.

    Raises:
      ValueError: offsets (and places) that do not describe ``data``.
    """

    dtype = np.dtype(object)
    ndim = 1

    def __init__(
        self, offsets: np.ndarray, data: np.ndarray | tuple, places: np.ndarray | None = None
    ):
        offsets = np.ascontiguousarray(offsets, dtype=np.int64)
        if places is None:
            data = _bytes_view(data)
            total = len(data)
        else:
            data = tuple(_bytes_view(buffer) for buffer in data)
            places = np.ascontiguousarray(places, dtype=np.int64)
            total = int(offsets[-1]) if len(offsets) else 0
        if offsets.ndim != 1 or not len(offsets) or offsets[0] != 0 or offsets[-1] != total:
            raise ValueError(
                f"offsets must run from 0 to len(data) = {total}, one more than the "
                f"rows; got {len(offsets)} offsets"
            )
        if np.any(np.diff(offsets) < 0):
            raise ValueError("offsets must never decrease")
        if places is not None:
            _check_places(places, offsets, data)
            places.flags.writeable = False
        for array in (offsets, *(data if places is not None else (data,))):
            array.flags.writeable = False
        self.offsets, self.data, self.places = offsets, data, places

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
        return sum(array.nbytes for array in self.content())

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, key: int | slice | Sequence[int] | np.ndarray):
        """``bytes`` for an int, a `BytesField` for a slice of step 1, a numpy
        object array of ``bytes`` for an array of row indices."""
        if isinstance(key, int | np.integer):
            row = int(key) + len(self) if key < 0 else int(key)
            if not 0 <= row < len(self):
                raise IndexError(f"row {key} is outside a field of {len(self)} rows")
            return self[np.array([row])][0]
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step == 1 and self.places is not None:
                return BytesField.from_values(list(self[np.arange(start, max(start, stop))]))
            if step == 1:
                stop = max(start, stop)
                ends = self.offsets[start : stop + 1]
                return BytesField(ends - ends[0], self.data[ends[0] : ends[-1]])
            key = np.arange(start, stop, step)
        indices = np.asarray(key, dtype=np.int64)
        out = np.empty(len(indices), dtype=object)
        starts, stops = self.offsets[indices], self.offsets[indices + 1]
        if self.places is None:
            data = self.data
            for i, (start, stop) in enumerate(zip(starts.tolist(), stops.tolist(), strict=True)):
                out[i] = data[start:stop].tobytes()
            return out
        places = self.places[indices]
        firsts, ends = places[:, 1].tolist(), (places[:, 1] + stops - starts).tolist()
        views = self._views()  # bytes() of a memoryview slice: a third of numpy's cost a row
        if len(views) == 1:
            (view,) = views
            for i, (first, end) in enumerate(zip(firsts, ends, strict=True)):
                out[i] = bytes(view[first:end])
            return out
        buffers = places[:, 0].tolist()
        for i, (buffer, first, end) in enumerate(zip(buffers, firsts, ends, strict=True)):
            out[i] = bytes(views[buffer][first:end])
        return out

    def _views(self) -> tuple[memoryview, ...]:
        if getattr(self, "_memoryviews", None) is None:
            self._memoryviews = tuple(memoryview(buffer) for buffer in self.data)
        return self._memoryviews

    def __reduce__(self):
        """A field memory-mapped from files travels into workers as where it
        lies, not as all its bytes (`for_pickle`)."""
        if self.places is None:
            return _unpickle, (for_pickle({"offsets": self.offsets, "data": self.data}),)
        buffers = {f"data{i}": buffer for i, buffer in enumerate(self.data)}
        return _unpickle, (for_pickle({"offsets": self.offsets, "places": self.places, **buffers}),)

    def content(self) -> tuple[np.ndarray, ...]:
        """The arrays that define the field (what a cache key hashes)."""
        if self.places is None:
            return self.offsets, self.data
        return self.offsets, self.places, *self.data

    def __repr__(self) -> str:
        return f"BytesField({len(self)} rows, {int(self.offsets[-1])} bytes)"


def _bytes_view(buffer: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(buffer).view(np.uint8).reshape(-1)


def _check_places(places: np.ndarray, offsets: np.ndarray, data: tuple) -> None:
    rows = len(offsets) - 1
    if places.shape != (rows, 2):
        raise ValueError(f"places must be [rows, 2] = [{rows}, 2], got {list(places.shape)}")
    if not rows:
        return
    buffers, starts = places[:, 0], places[:, 1]
    if buffers.min() < 0 or buffers.max() >= len(data) or starts.min() < 0:
        raise ValueError(f"places name a buffer outside the {len(data)} given or a negative start")
    sizes = np.array([len(buffer) for buffer in data], np.int64)
    if np.any(starts + np.diff(offsets) > sizes[buffers]):
        raise ValueError("places put a row past the end of its buffer")


def _unpickle(arrays: dict[str, object]) -> BytesField:
    arrays = from_pickle(arrays)
    if "places" not in arrays:
        return BytesField(arrays["offsets"], arrays["data"])
    buffers = tuple(arrays[f"data{i}"] for i in range(len(arrays) - 2))
    return BytesField(arrays["offsets"], buffers, arrays["places"])

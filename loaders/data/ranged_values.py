"""Variable-length fields read in place, by ranged reads: a Parquet binary,
string or list column, a TFRecord bytes or variable-length feature.

The local copy holds such a field as a `BytesField` (encoded bytes per row)
or a `RaggedField` (numbers of different lengths per row: one values array
and the rows' offsets). Read in place, the same fields are made of blocks
(a Parquet row group, a run of TFRecord records) read through the split's
`ranged_npy.BlockCache`, each holding its rows of every field, decoded as
the local copy decodes them (`FieldBlock`):

- `RangedBytes` answers as a `BytesField` does: ``field[rows]`` an object
  array of ``bytes`` (a batch's rows, gathered from their blocks), a slice
  a `BytesField` of those rows, ``field[i]`` one ``bytes``.
- a ragged field is a real `RaggedField` whose offsets are in memory (8
  bytes a row: the batch plan of ``pad=``/``bucket=``/``pack=`` needs every
  row's length, as for the local copy) and whose values are `RangedValues`:
  indexed by value, as the sequence sources read a batch's values, each
  value found in its block by the blocks' first values.

Only a batch's values are ever gathered, never the split's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np
from jaxfeed.loaders.array_dataset import narrowed
from jaxfeed.loaders.bytes_field import BytesField
from jaxfeed.loaders.data.ranged_npy import Block, BlockCache, RangedRows
from jaxfeed.loaders.ragged_field import RaggedField

__all__ = [
    "FieldBlock",
    "RangedBytes",
    "RangedValues",
    "block_indices",
    "blocks_for",
    "gather_rows",
    "gather_values",
    "ragged_parts",
]


class FieldBlock(dict):
    """One block's fields (name -> rows as the local copy holds them: an
    array, a `BytesField` or a `RaggedField`), as the `BlockCache` holds it."""

    @property
    def nbytes(self) -> int:
        return sum(field.nbytes for field in self.values())


class _Reader(Protocol):
    """What the fields below read through (`ranged_parquet`'s row groups,
    `ranged_tfrecord`'s shards)."""

    cache: BlockCache

    def rows_of(self, name: str, rows: np.ndarray) -> np.ndarray: ...

    def values_of(self, name: str, values: np.ndarray) -> np.ndarray: ...

    def value_blocks(self, name: str, values: np.ndarray) -> list[Block]: ...


def ragged_parts(values: np.ndarray | RaggedField, frame: tuple[int, ...]) -> RaggedField:
    """A block's ragged field as a `RaggedField`, also where its rows happen
    to share one length (the local decoder gives ``[k, n, *frame]`` then)."""
    if isinstance(values, RaggedField):
        return values
    values = np.asarray(values)
    rows = len(values)
    length = int(np.prod(values.shape[1 : values.ndim - len(frame)], dtype=np.int64))
    flat = values.reshape(rows * length, *frame)
    return RaggedField.from_lengths(flat, np.full(rows, length, np.int64))


def block_indices(starts: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """The block (by the blocks' first row or value, ``starts``) each of
    ``wanted`` lies in."""
    return np.searchsorted(starts, wanted, side="right") - 1


def blocks_for(
    block: Callable[[int], Block], starts: np.ndarray, wanted: np.ndarray
) -> list[Block]:
    """The blocks a gather of ``wanted`` reads (what the read-ahead asks for)."""
    return [block(int(b)) for b in np.unique(block_indices(starts, wanted))]


def _blocks_of(starts: np.ndarray, wanted: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """The blocks (by their first row or value, ``starts``) that ``wanted``
    lie in, and for each, where in ``wanted`` its items are."""
    blocks = block_indices(starts, wanted)
    order = np.argsort(blocks, kind="stable")
    needed, firsts = np.unique(blocks[order], return_index=True)
    return needed, np.split(order, firsts[1:])


def gather_rows(
    cache: BlockCache,
    block: Callable[[int], Block],
    starts: np.ndarray,
    rows: np.ndarray,
    fields: Mapping[str, tuple[str, np.dtype, tuple[int, ...]]],
) -> dict[str, np.ndarray]:
    """The ``rows`` of every row-indexed field (name -> ``("array", dtype,
    row shape)`` or ``("bytes", ...)``: an object array of ``bytes``), a
    block at a time (``starts``: each block's first row): a batch's rows of
    one block come from one read, the missing blocks read in the cache's
    sliding window (`BlockCache.blocks`)."""
    out = {
        name: np.empty(len(rows), object) if kind == "bytes" else np.empty((len(rows), *s), d)
        for name, (kind, d, s) in fields.items()
    }
    needed, wheres = _blocks_of(starts, rows)
    for i, held in cache.blocks([block(int(b)) for b in needed]):
        where = wheres[i]
        at = rows[where] - starts[needed[i]]
        for name, array in out.items():
            array[where] = held[name][at]
    return out


def gather_values(
    cache: BlockCache,
    block: Callable[[int], Block],
    starts: np.ndarray,
    values: np.ndarray,
    name: str,
    dtype: np.dtype,
    frame: tuple[int, ...],
) -> np.ndarray:
    """The ragged field ``name``'s ``values`` (indices into its values back to
    back), a block at a time (``starts``: each block's first value; a block
    of no values is never chosen: a later block starts at the same value)."""
    out = np.empty((len(values), *frame), dtype)
    needed, wheres = _blocks_of(starts, values)
    for i, held in cache.blocks([block(int(b)) for b in needed]):
        where = wheres[i]
        out[where] = held[name].values[values[where] - starts[needed[i]]]
    return out


class RangedBytes:
    """A field of encoded bytes per row, read in place (see the module): it
    answers as the local copy's `BytesField` does, a batch's rows gathered
    from their blocks. A `RemoteField` of dtype object."""

    dtype = np.dtype(object)
    ndim = 1

    def __init__(self, reader: _Reader, name: str, rows: int, nbytes: int, url: str):
        self._reader, self._name = reader, name
        self.shape, self.nbytes, self.url = (rows,), nbytes, url

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return f"RangedBytes({self.url!r}, {len(self)} rows)"

    def __getitem__(self, key: Any):
        """``bytes`` for an int, a `BytesField` for a slice of step 1, a numpy
        object array of ``bytes`` for an array of row indices (or bools)."""
        if isinstance(key, int | np.integer):
            row = int(key) + len(self) if key < 0 else int(key)
            if not 0 <= row < len(self):
                raise IndexError(f"row {key} is outside a field of {len(self)} rows")
            return self._reader.rows_of(self._name, np.array([row]))[0]
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            rows = np.arange(start, stop, step)
            if step == 1:
                return BytesField.from_values(list(self._reader.rows_of(self._name, rows)))
            return self._reader.rows_of(self._name, rows)
        index = np.asarray(key)
        if index.dtype == np.bool_:
            index = np.flatnonzero(index)
        if index.dtype.kind not in "iu" or index.ndim != 1:
            raise IndexError(f"{self!r}: rows are indexed by ints, slices or 1-D arrays of them")
        flat = np.where(index < 0, index + len(self), index).astype(np.int64)
        if len(flat) and (flat.min() < 0 or flat.max() >= len(self)):
            raise IndexError(f"{self!r}: row index out of range 0..{len(self) - 1}")
        return self._reader.rows_of(self._name, flat)

    def content(self) -> tuple[np.ndarray, ...]:
        """The arrays that define the field, as the local `BytesField`'s
        (what a cache key hashes): every row gathered, the whole field in
        memory once (tf and hf copy every row into their stores anyway)."""
        return BytesField.from_values(list(self[np.arange(len(self))])).content()


class RangedValues(RangedRows):
    """A ragged field's values back to back, read in place (see the module):
    the values of a `RaggedField` whose offsets are in memory (a sequence
    source reads them as rows of their own, so they are read ahead too)."""

    def __init__(
        self,
        reader: _Reader,
        name: str,
        total: int,
        frame: tuple[int, ...],
        dtype: np.dtype,
        url: str,
    ):
        self._reader, self._name, self.url = reader, name, url
        self.shape, self.dtype = (total, *frame), dtype
        self.nbytes = total * dtype.itemsize * int(np.prod(frame, dtype=np.int64))

    def __repr__(self) -> str:
        return f"RangedValues({self.url!r}, {self.dtype} {list(self.shape)})"

    @property
    def cache(self) -> BlockCache:
        return self._reader.cache

    def _gather(self, values: np.ndarray) -> np.ndarray:
        return self._reader.values_of(self._name, values)

    def _blocks_of(self, values: np.ndarray) -> list[Block]:
        return self._reader.value_blocks(self._name, values)

    def _served(self, values: np.ndarray) -> np.ndarray:
        return narrowed(values, self.dtype, self.url)

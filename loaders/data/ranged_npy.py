"""A store's ``.npy`` objects read in place, by ranged reads, as they are asked
for: how a split bigger than the cache trains.

Each object's header is parsed from one ranged read of its first bytes
(numpy's own ``np.lib.format``); its rows are then read a block at a time
(`BLOCK_BYTES`, whole rows) through `RemoteObjects.read` (retried, never
short) into a `BlockCache`: the least recently used blocks in memory, at most
a quarter of ``JAXFEED_CACHE_BYTES`` in each process that reads. A batch's
rows are grouped by block, so one request serves every row of a block
(``shuffle="blocks"`` makes those reads large and mostly sequential).
Pickled into a worker, a field travels as its URL, header and an empty cache;
the worker opens the store itself (`RemoteObjects.read`).
"""

from __future__ import annotations

import collections
import concurrent.futures
import io
import os
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
from jaxfeed.loaders._doors.fsspec import Listed
from jaxfeed.loaders.array_dataset import device_dtype, narrowed
from jaxfeed.loaders.data.on_disk import RAGGED_PARTS, MissingSplitError
from jaxfeed.loaders.data.remote import RemoteObjects, cache_bytes

__all__ = ["BLOCK_BYTES", "READ_ENV", "BlockCache", "RangedNpy", "npy_fields"]

READ_ENV = "JAXFEED_READ"
READS = ("auto", "ranges", "whole")
BLOCK_BYTES = 8 << 20  # one ranged read: long enough to amortise a request's latency
HEADER_BYTES = 64 << 10  # read first: every header numpy writes for a field fits
READ_THREADS = 8  # a batch's missing blocks read at once


def npy_fields(objects: RemoteObjects, split: str, splits: tuple[str, ...]) -> dict | None:
    """``split``'s fields as `RangedNpy`, or None where its objects are fetched
    whole: `READ_ENV` is ``whole``, or ``auto`` (the default) and the objects
    fit the cache, or they are not a directory of plain ``<field>.npy`` files.

    Raises:
      ValueError: `READ_ENV` is ``ranges`` for objects that are not such a
        directory, or an unknown value; an object that is no readable ``.npy``.
      MissingSplitError: the directory holds ``.npy`` data but not ``split``.
    """
    mode = os.environ.get(READ_ENV, "") or "auto"
    if mode not in READS:
        raise ValueError(f"{READ_ENV}={mode!r}: expected one of {list(READS)}")
    listed = objects.made_from
    if mode == "whole" or (
        mode == "auto" and sum(v.size for v in listed.values()) <= cache_bytes()
    ):
        return None
    files = _split_files(objects.url, listed, split, splits)
    if files is None:
        if mode == "auto":
            return None
        raise ValueError(
            f"{READ_ENV}=ranges: {objects.url} is not a directory of <field>.npy files nor "
            "of TFRecord shards, the only objects read in place (Parquet, Arrow, ArrayRecord "
            f"and image folders are fetched whole); unset {READ_ENV} to fetch them into the cache"
        )
    cache = BlockCache(cache_bytes() // 4)
    return {
        relative.rpartition("/")[2].removesuffix(".npy"): RangedNpy(objects, relative, size, cache)
        for relative, size in files.items()
    }


def _split_files(
    url: str, listed: Mapping[str, Listed], split: str, splits: tuple[str, ...]
) -> dict[str, int] | None:
    """The objects of ``split`` (relative path -> size) of a directory laid out
    as `on_disk.npy_directory` reads one; None when it is not one of plain
    ``.npy`` fields (ragged parts too, a single object, other files)."""
    if "" in listed or not all(r.endswith(".npy") for r in listed):
        return None
    laid_out = [s for s in splits if any(r.startswith(f"{s}/") for r in listed)]
    prefix = f"{split}/" if laid_out else ""
    if (laid_out and split not in laid_out) or (not laid_out and split != splits[0]):
        raise MissingSplitError(f"{url} has no {split!r} split: its .npy splits are {laid_out}")
    files = {
        r: v.size for r, v in listed.items() if r.startswith(prefix) and "/" not in r[len(prefix) :]
    }
    parts = [r for r in files if r.removesuffix(".npy").rpartition(".")[2] in RAGGED_PARTS]
    return None if parts or not files else files


class BlockCache:
    """Blocks of ranged reads held in memory, at most ``max_bytes`` of them,
    counting those being read; the least recently used go first. Shared by
    the fields of one split in one process (threads take turns)."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.nbytes = 0  # held and reserved for reads in flight
        self.peak_bytes = 0  # the most it ever held: its bound is tested
        self._blocks: collections.OrderedDict[Any, np.ndarray] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def __getstate__(self) -> dict:
        # Into a worker: the bound only; its blocks are read there again.
        return {"max_bytes": self.max_bytes}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["max_bytes"])

    def get(self, key: Any) -> np.ndarray | None:
        with self._lock:
            block = self._blocks.get(key)
            if block is not None:
                self._blocks.move_to_end(key)
            return block

    def reserve(self, nbytes: int) -> None:
        """Room for ``nbytes`` about to be read: evicts until they fit."""
        with self._lock:
            while self._blocks and self.nbytes + nbytes > self.max_bytes:
                self.nbytes -= self._blocks.popitem(last=False)[1].nbytes
            self.nbytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.nbytes)

    def put(self, key: Any, block: np.ndarray | None, reserved: int) -> None:
        """``block``, read into room `reserve` made (``reserved`` bytes); None:
        the read failed, and its room is given back."""
        with self._lock:
            self.nbytes -= reserved
            if block is None:
                return
            if key not in self._blocks and self.nbytes + block.nbytes <= self.max_bytes:
                self._blocks[key] = block
                self.nbytes += block.nbytes

    def pool(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(READ_THREADS, "jaxfeed-ranges")
            return self._pool


class RangedNpy:
    """One ``.npy`` object's rows, read in place (a `RemoteField`; see the module).

    Raises:
      ValueError: (made) the object is no readable ``.npy`` array of numbers
        in C order, or its size is not its header's plus its rows.
    """

    def __init__(self, objects: RemoteObjects, relative: str, size: int, cache: BlockCache):
        self.url = objects.object_url(relative)
        self._objects, self._relative, self._cache = objects, relative, cache
        head = objects.read(relative, 0, min(size, HEADER_BYTES))
        try:
            file = io.BytesIO(head)
            version = np.lib.format.read_magic(file)
            header = (
                np.lib.format.read_array_header_1_0
                if version == (1, 0)
                else np.lib.format.read_array_header_2_0
            )
            shape, fortran, stored = header(file)
        except (ValueError, OSError, EOFError) as error:
            raise ValueError(f"{self.url} is not a readable .npy array: {error}") from None
        self.shape, self._stored, self._offset = tuple(shape), stored, file.tell()
        rows = self.shape[0] if self.shape else 0
        self._row_bytes = stored.itemsize * int(np.prod(self.shape[1:], dtype=np.int64))
        if stored.kind not in "biuf" or not self.shape or (fortran and len(self.shape) > 1):
            raise ValueError(
                f"{self.url} holds {stored} {'Fortran-order ' if fortran else ''}{list(shape)}: "
                "read in place are C-order arrays of numbers with a row axis; rewrite it so, "
                f"or set {READ_ENV}=whole to fetch it"
            )
        if self._offset + rows * self._row_bytes != size:
            raise ValueError(
                f"{self.url} is {size} bytes, but its header says {list(shape)} {stored}: "
                f"{self._offset + rows * self._row_bytes} bytes; it is cut short or not one array"
            )
        self.dtype = device_dtype(stored.newbyteorder("="))
        self.nbytes = rows * self.dtype.itemsize * (self._row_bytes // max(1, stored.itemsize))
        block_bytes = min(BLOCK_BYTES, max(1, cache.max_bytes // 4))
        self._block_rows = max(1, block_bytes // max(1, self._row_bytes))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return f"RangedNpy({self.url!r}, {self.dtype} {list(self.shape)})"

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        rows = self[:]
        return rows if dtype is None else rows.astype(dtype)

    def __getitem__(self, index: Any) -> np.ndarray:
        if isinstance(index, int | np.integer):
            return self[np.asarray([index])][0]
        if isinstance(index, slice):
            index = np.arange(*index.indices(len(self)))
        index = np.asarray(index)
        if index.dtype == np.bool_:
            index = np.flatnonzero(index)
        if index.dtype.kind not in "iu":
            raise IndexError(f"{self!r}: rows are indexed by ints, slices or arrays of them")
        flat = np.where(index < 0, index + len(self), index).astype(np.int64).reshape(-1)
        if len(flat) and (flat.min() < 0 or flat.max() >= len(self)):
            raise IndexError(f"{self!r}: row index out of range 0..{len(self) - 1}")
        out = self._gather(flat).reshape(*index.shape, *self.shape[1:])
        if not out.dtype.isnative:
            out = out.astype(out.dtype.newbyteorder("="))
        return narrowed(out, self.dtype, self.url)

    def _gather(self, rows: np.ndarray) -> np.ndarray:
        """``rows``, read a block at a time in block order: a batch's rows of one
        block come from one read; at most `READ_THREADS` reads at once, and no
        more at once than the cache's bound holds."""
        out = np.empty((len(rows), *self.shape[1:]), self._stored)
        blocks = rows // self._block_rows
        order = np.argsort(blocks, kind="stable")
        needed, starts = np.unique(blocks[order], return_index=True)
        groups = np.split(order, starts[1:])
        at_once = max(1, min(READ_THREADS, self._cache.max_bytes // self._block_bytes()))
        for first in range(0, len(needed), at_once):
            chunk = needed[first : first + at_once]
            read = self._cache.pool().map if len(chunk) > 1 else map
            for block, where in zip(read(self._block, chunk), groups[first:], strict=False):
                out[where] = block[rows[where] % self._block_rows]
        return out

    def _block_bytes(self) -> int:
        return self._block_rows * self._row_bytes

    def _block(self, block: int) -> np.ndarray:
        """Rows ``[block * block_rows, ...)`` (as stored), cached or read now."""
        key = (self._relative, int(block))
        found = self._cache.get(key)
        if found is not None:
            return found
        first = int(block) * self._block_rows
        count = min(self._block_rows, len(self) - first)
        start = self._offset + first * self._row_bytes
        nbytes = count * self._row_bytes
        self._cache.reserve(nbytes)
        rows = None
        try:
            data = self._objects.read(self._relative, start, start + nbytes)
            rows = np.frombuffer(data, self._stored).reshape(count, *self.shape[1:])
        finally:
            self._cache.put(key, rows, nbytes)
        return rows

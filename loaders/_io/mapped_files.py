"""Fields memory-mapped from files: where their rows lie, how the kernel
should read them, and how they travel into a worker process.

Pickled, a memory-mapped array would copy all of its bytes into the pickle
(into every torch or Grain worker); `for_pickle` sends where it lies
instead, and `from_pickle` maps the file again in the worker.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "MADVISE",
    "MADV_POPULATE_READ",
    "FileRows",
    "advise",
    "file_rows",
    "for_pickle",
    "from_pickle",
    "libc_function",
    "memmap_of",
    "read_window",
]


class FileRows(NamedTuple):
    """Where an on-disk field's rows lie: row ``i`` is ``row_bytes`` bytes at
    ``offset + i * row_bytes`` of ``path``."""

    path: str
    offset: int
    row_bytes: int


def memmap_of(array: np.ndarray | None) -> np.memmap | None:
    """The memory map an array is a view of, if any."""
    while isinstance(array, np.ndarray):
        if isinstance(array, np.memmap):
            return array
        array = array.base
    return None


def file_rows(array: np.ndarray) -> FileRows | None:
    """Where ``array``'s rows lie on disk, or None when it is not a C-contiguous
    view of a memory-mapped file (then it is treated as held in memory)."""
    mapped = memmap_of(array)
    if mapped is None or mapped.filename is None or not array.flags.c_contiguous:
        return None
    mapping = mapped.base  # an np.memmap is an ndarray over its mmap.mmap buffer
    if not isinstance(mapping, mmap.mmap):
        return None
    # np.memmap maps from its offset rounded down to the allocation granularity.
    mapped_from = mapped.offset - mapped.offset % mmap.ALLOCATIONGRANULARITY
    start = np.frombuffer(mapping, np.uint8).ctypes.data
    row_bytes = array[:1].nbytes if len(array) else 0
    return FileRows(os.fspath(mapped.filename), mapped_from + array.ctypes.data - start, row_bytes)


def libc_function(name: str, *argtypes: type) -> Any | None:
    """The C library's ``name`` with its argument types, or None where there is
    none (not glibc, not Linux): then the advice it would give is skipped."""
    try:
        function = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    function.argtypes = argtypes
    return function


MADVISE = libc_function("madvise", ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)
"""Maps a range's pages into the page tables, reading those not cached (Linux
5.14+; Python's mmap module names it from 3.13 on only)."""
_RANDOM = "_jaxfeed_random_reads"  # set on a np.memmap: its advice, for workers' copies


def advise(array: np.ndarray, random: bool) -> None:
    """Tells the kernel how ``array``'s memory-mapped pages will be read.

    By default a page fault on a mapped file reads far around the page (3 MB
    per 784-byte row, measured on this machine's disk: 461 random rows/s on
    data bigger than memory). ``random=True`` (``MADV_RANDOM``) reads just
    the page (14,000 rows/s); ``False`` puts the default back, which suits
    contiguous reads. Any array works (a view of a mapped file or of Arrow's
    mapped buffers); for one in memory it changes nothing.
    """
    if MADVISE is None or not array.nbytes:
        return
    start = array.ctypes.data - array.ctypes.data % mmap.PAGESIZE
    advice = mmap.MADV_RANDOM if random else mmap.MADV_NORMAL
    MADVISE(start, array.ctypes.data + array.nbytes - start, advice)
    mapped = memmap_of(array)
    if mapped is not None:
        setattr(mapped, _RANDOM, random)


DEFAULT_READ_WINDOW = 128 << 10
"""The kernel's default read-ahead window (``VM_READAHEAD_PAGES``)."""


def read_window(address: int) -> int:
    """The most bytes the kernel reads ahead at once for the file mapped at
    ``address``: ``read_ahead_kb`` of its device's backing store, found
    through ``/proc/self/maps``; `DEFAULT_READ_WINDOW` where it cannot be read
    (no such file, another system). ``MADV_WILLNEED`` reads no more per call."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                span, _, _, device, *_ = line.split(maxsplit=5)
                low, high = (int(end, 16) for end in span.split("-"))
                if low <= address < high:
                    major, minor = (int(part, 16) for part in device.split(":"))
                    with open(f"/sys/class/bdi/{major}:{minor}/read_ahead_kb") as kb:
                        return int(kb.read()) << 10 or DEFAULT_READ_WINDOW
    except (OSError, ValueError):
        pass
    return DEFAULT_READ_WINDOW


class _Reopen(NamedTuple):
    """An on-disk field in a pickle: where it lies, not its bytes."""

    rows: FileRows
    dtype: str
    shape: tuple[int, ...]
    random: bool


def for_pickle(arrays: dict[str, np.ndarray]) -> dict[str, object]:
    """``arrays`` with every on-disk field replaced by where it lies: pickling a
    memory-mapped array would copy all of its bytes into the pickle (into
    every torch or Grain worker), `from_pickle` maps the file again."""
    out: dict[str, object] = {}
    for key, array in arrays.items():
        rows = file_rows(array)
        if rows is None:
            out[key] = array
        else:
            random = getattr(memmap_of(array), _RANDOM, False)
            out[key] = _Reopen(rows, array.dtype.str, array.shape, random)
    return out


def from_pickle(arrays: dict[str, object]) -> dict[str, np.ndarray]:
    """The inverse of `for_pickle`: on-disk fields memory-mapped read-only again."""
    out = {}
    for key, value in arrays.items():
        if isinstance(value, _Reopen):
            reopened = np.memmap(value.rows.path, np.dtype(value.dtype), mode="r",
                                 offset=value.rows.offset, shape=value.shape)  # fmt: skip
            advise(reopened, value.random)
            value = reopened
        out[key] = value
    return out

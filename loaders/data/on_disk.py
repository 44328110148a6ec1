"""Datasets that stay on disk: memory-mapped arrays, and directories of ``.npy`` files.

A field backed by a memory-mapped file is read where it lies: the backends
index it like any array and the operating system pages in the rows they
touch, so the dataset may be far larger than memory. Its identity (for cache
keys and the processes' agreement) comes from the file's path, size,
modification time and inode plus a sample of its rows, not from hashing
every byte: opening a 30 GB dataset costs milliseconds, and a file changed
or replaced since gets another key.
"""

from __future__ import annotations

import ctypes
import hashlib
import mmap
import os
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from jaxfeed.loaders.frameworks.numpy import memmap_mapping

__all__ = [
    "MADVISE",
    "FileRows",
    "advise",
    "file_rows",
    "for_pickle",
    "from_pickle",
    "identity",
    "libc_function",
    "MissingSplitError",
    "load_npy_directory",
    "npy_directory",
]

SAMPLED_ROWS = 256
"""Rows hashed (evenly spaced, first and last included) into an on-disk field's identity."""


class FileRows(NamedTuple):
    """Where an on-disk field's rows lie: row ``i`` is ``row_bytes`` bytes at
    ``offset + i * row_bytes`` of ``path``."""

    path: str
    offset: int
    row_bytes: int


def _memmap(array: np.ndarray | None) -> np.memmap | None:
    """The memory map an array is a view of, if any."""
    while isinstance(array, np.ndarray):
        if isinstance(array, np.memmap):
            return array
        array = array.base
    return None


def file_rows(array: np.ndarray) -> FileRows | None:
    """Where ``array``'s rows lie on disk, or None when it is not a C-contiguous
    view of a memory-mapped file (then it is treated as held in memory)."""
    mapped = _memmap(array)
    if mapped is None or mapped.filename is None or not array.flags.c_contiguous:
        return None
    mapping = memmap_mapping(mapped)  # numpy keeps the map of every memmap view here
    if mapping is None:
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
    mapped = _memmap(array)
    if mapped is not None:
        setattr(mapped, _RANDOM, random)


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
            random = getattr(_memmap(array), _RANDOM, False)
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


def identity(array: np.ndarray) -> bytes | None:
    """A cheap identity of an on-disk field: dtype, shape, where it lies, the
    file's size, modification and change times and inode, and a sample of its
    rows. None for a field held in memory (hash its bytes instead). The change
    time (ctime) is what an edit that restores the mtime (``cp -p``, ``touch
    -d``) cannot restore, so such an edit outside the sampled rows still gives
    a new identity."""
    rows = file_rows(array)
    if rows is None:
        return None
    stat = os.stat(rows.path)
    digest = hashlib.sha1()
    digest.update(repr((array.dtype.str, array.shape, rows)).encode())
    digest.update(
        repr((stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino, stat.st_dev)).encode()
    )
    if len(array):
        picked = np.unique(np.linspace(0, len(array) - 1, SAMPLED_ROWS).astype(np.int64))
        digest.update(np.ascontiguousarray(array[picked]).data)
    return digest.digest()


def npy_directory(directory: Path, split: str, splits: tuple[str, ...]) -> Path | None:
    """The directory of ``split``'s ``.npy`` files under ``directory``.

    A directory laid out in splits (a subdirectory named for one of ``splits``
    holds ``.npy`` files) gives ``split``'s subdirectory; files beside the
    subdirectories belong to no split. A directory of ``.npy`` files alone is
    one split, ``splits[0]`` (train): it is never served as another split, so
    training rows cannot be evaluated as test rows.

    Returns:
      The directory, or None when ``directory`` holds no ``.npy`` files at all.

    Raises:
      MissingSplitError: the directory holds ``.npy`` data but not ``split``.
    """
    laid_out = [s for s in splits if any((directory / s).glob("*.npy"))]
    if laid_out:
        if split in laid_out:
            return directory / split
        raise MissingSplitError(
            f"{directory} has no {split!r} split: its .npy splits are {laid_out} "
            f"(subdirectories); add {directory / split}/ with the same fields"
        )
    if not any(directory.glob("*.npy")):
        return None
    if split == splits[0]:
        return directory
    raise MissingSplitError(
        f"{directory} has no {split!r} split: its .npy files are one split, {splits[0]!r}; "
        f"to have both, move them into {splits[0]}/ and add {split}/ beside it"
    )


class MissingSplitError(ValueError):
    """A dataset directory holds no data for the split asked for."""


def load_npy_directory(directory: Path) -> dict[str, np.ndarray]:
    """One field per ``<field>.npy`` file, memory-mapped read-only, by name.

    Raises:
      ValueError: a file is not a readable ``.npy`` array (the message names it).
    """
    fields = {}
    for file in sorted(directory.glob("*.npy")):
        try:
            fields[file.stem] = np.load(file, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as err:
            raise ValueError(f"{file} is not a readable .npy array: {err}") from err
    return fields

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

import hashlib
import os
from pathlib import Path

import numpy as np
from jaxfeed.loaders.workers.mapped_files import file_rows

__all__ = ["identity", "load_npy_directory", "npy_directory"]

SAMPLED_ROWS = 256
"""Rows hashed (evenly spaced, first and last included) into an on-disk field's identity."""


def identity(array: np.ndarray) -> bytes | None:
    """A cheap identity of an on-disk field: dtype, shape, where it lies, the
    file's size, modification time and inode, and a sample of its rows. None
    for a field held in memory (hash its bytes instead)."""
    rows = file_rows(array)
    if rows is None:
        return None
    stat = os.stat(rows.path)
    digest = hashlib.sha1()
    digest.update(repr((array.dtype.str, array.shape, rows)).encode())
    digest.update(repr((stat.st_size, stat.st_mtime_ns, stat.st_ino, stat.st_dev)).encode())
    if len(array):
        picked = np.unique(np.linspace(0, len(array) - 1, SAMPLED_ROWS).astype(np.int64))
        digest.update(np.ascontiguousarray(array[picked]).data)
    return digest.digest()


def npy_directory(directory: Path, split: str) -> Path | None:
    """The directory of ``split``'s ``.npy`` files under ``directory``: its
    ``split`` subdirectory when that holds some, else ``directory`` itself
    when it does; None when neither holds any."""
    for candidate in (directory / split, directory):
        if candidate.is_dir() and any(candidate.glob("*.npy")):
            return candidate
    return None


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

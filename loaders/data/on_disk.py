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

__all__ = ["MissingSplitError", "identity", "load_npy_directory", "npy_directory"]

SAMPLED_ROWS = 256
"""Rows hashed (evenly spaced, first and last included) into an on-disk field's identity."""


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

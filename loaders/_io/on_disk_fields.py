"""The fields a source reads, as the disk holds them: how the kernel should
read their mapped pages, their coming rows read ahead, and a check that their
files still hold all their rows (`OnDiskFields`); and a check that a dataset's
files are still the ones a source was made from (`file_identities`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np
from jaxfeed.loaders._io.disk_read_ahead import DiskReadAhead, MappedRows, mapped_rows
from jaxfeed.loaders._io.mapped_files import FileRows, advise, file_rows

__all__ = ["FileIdentity", "OnDiskFields", "check_unchanged", "file_identities"]


class OnDiskFields(NamedTuple):
    """The arrays one source reads in an epoch, any of them maybe a view of a
    memory-mapped file (an array held in memory passes every step unchanged).

    Args:
      dataset: the dataset's name, for errors.
      rows: its rows, which every field holds.
      fields: field name -> the rows of a numeric field read (checked and
        read ahead), or the buffers a bytes field is read from in place, the
        user's files (checked).
      mapped: every array read that may be mapped from a file: advised.
      nbytes: the fields' bytes in all (past half of memory, the page cache
        cannot keep them between epochs).
      layouts: where the rows read ahead lie, when not in ``arrays`` (hf reads
        its Arrow copy); None: in the numeric ``fields``.
    """

    dataset: str
    rows: int
    fields: Mapping[str, np.ndarray | tuple[np.ndarray, ...]]
    mapped: Sequence[np.ndarray]
    nbytes: int
    layouts: Sequence[MappedRows] | None = None

    def check_whole(self) -> None:
        """Each on-disk field's file still holds all its rows: one truncated
        under a live source kills the process at the first read of a page that
        is gone (SIGBUS), with no word of which file.

        Raises:
          ValueError: naming the field, the file and the bytes missing.
        """
        for name, field in self.fields.items():
            for array in (field,) if isinstance(field, np.ndarray) else field:
                self._check_whole(name, file_rows(array), array.nbytes)

    def _check_whole(self, name: str, rows: FileRows | None, nbytes: int) -> None:
        """`check_whole` for one file, whose ``nbytes`` (C-contiguous, as
        `file_rows` needs) lie at ``rows``."""
        if rows is not None:
            need = rows.offset + nbytes
            try:
                size = os.stat(rows.path).st_size
            except FileNotFoundError:
                return  # deleted: its pages stay readable while mapped
            if size < need:
                raise ValueError(
                    f"dataset {self.dataset!r}, field {name!r}: {rows.path} holds {size} bytes, "
                    f"but its {self.rows} rows end at byte {need}: the file was cut short after "
                    "it was opened, and reading it would crash the process (SIGBUS); make the "
                    "source again once the file is complete"
                )

    def advise(self, random_order: bool) -> None:
        """Page-sized reads of on-disk rows for a random order of data that the
        page cache cannot hold, read-around otherwise (`mapped_files.advise`).
        Read-around warms data that fits in memory faster (measured, 1M rows
        read cold: numpy 1.4M rows/s with it, grain 547k without); past memory
        it reads ~3 MB per random row. Block order past memory reads pages
        too: `DiskReadAhead` asks for the rows of each window of blocks, and a
        fault that came before it read the 8 MiB around it (this machine's
        ``read_ahead_kb``), mostly neighbouring blocks evicted before their
        turn (36M rows cold: 1.34-1.48 bytes read per byte used, 1.06 with
        page reads)."""
        random = random_order and _bigger_than_half_of_memory(self.nbytes)
        for array in self.mapped:
            advise(array, random)

    def read_ahead(self, plan: Sequence[np.ndarray], populate: bool) -> DiskReadAhead:
        """The kernel starts reading the rows of ``plan``'s coming batches early
        (`DiskReadAhead`; ``populate``: this process gathers them)."""
        layouts = self.layouts
        if layouts is None:
            layouts = mapped_rows([f for f in self.fields.values() if isinstance(f, np.ndarray)])
        return DiskReadAhead(layouts, plan, populate=populate)


class FileIdentity(NamedTuple):
    """What any rewrite or replacement of a file changes, read with one ``stat``."""

    size: int
    mtime_ns: int
    inode: int
    device: int


def _identity(path: str) -> FileIdentity | None:
    """``path``'s identity now, or None when it was deleted (its pages stay
    readable while mapped)."""
    try:
        status = os.stat(path)
    except FileNotFoundError:
        return None
    return FileIdentity(status.st_size, status.st_mtime_ns, status.st_ino, status.st_dev)


def file_identities(
    fields: Mapping[str, Sequence[np.ndarray]],
) -> dict[str, tuple[str, FileIdentity]]:
    """Each file the arrays of ``fields`` (field name -> its arrays) are
    memory-mapped from, as it is now: path -> (a field read from it, its
    identity). Arrays held in memory have no file: they are left out."""
    files = {}
    for name, arrays in fields.items():
        for rows in filter(None, map(file_rows, arrays)):
            if rows.path not in files and (identity := _identity(rows.path)) is not None:
                files[rows.path] = (name, identity)
    return files


def check_unchanged(dataset: str, files: Mapping[str, tuple[str, FileIdentity]]) -> None:
    """Each of a dataset's ``files`` (from `file_identities`) is as it was: a
    file rewritten in place or replaced under a live source would be read
    new by the backends that map it and old by those that read a copy (hf's
    Arrow file, a TFDS store), silently. One ``stat`` a file.

    Raises:
      ValueError: naming the dataset, the field and the file that changed.
    """
    for path, (name, was) in files.items():
        now = _identity(path)
        if now is not None and now != was:
            changed = ", ".join(f for f, a, b in zip(was._fields, was, now, strict=True) if a != b)
            raise ValueError(
                f"dataset {dataset!r}, field {name!r}: {path} changed after the source was "
                f"made ({changed} differ): some backends would read its new rows and others "
                "keep the old ones (a converted copy), so it is refused rather than read; make "
                "the source again to read the new data, and write new data to a new file, "
                "not over one a run reads"
            )


def _bigger_than_half_of_memory(nbytes: int) -> bool:
    """Whether ``nbytes`` exceed half of this machine's memory."""
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return True
    return nbytes > memory // 2

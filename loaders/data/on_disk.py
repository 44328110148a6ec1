"""Datasets that stay on disk: memory-mapped arrays, and directories of ``.npy`` files.

A field backed by a memory-mapped file is read where it lies: the backends
index it like any array and the operating system pages in the rows they
touch, so the dataset may be far larger than memory. Its identity (for cache
keys, the processes' agreement and checkpoints) is a hash of every byte of
its rows (`content_digest`), the same for byte-identical copies anywhere, so
hosts reading local copies agree, and another for any edit. The first use
reads the file once at disk speed; the digest is then memoised, keyed by the
file's cheap identity (path, size, modification and change times, inode), so
later uses cost a ``stat``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from jaxfeed.loaders._io.mapped_files import FileRows, file_rows
from jaxfeed.loaders.ragged_field import RaggedField

__all__ = [
    "MissingSplitError",
    "content_digest",
    "digest_of_bytes",
    "load_npy_directory",
    "npy_directory",
]

HASH = "sha256"  # hardware-accelerated on current CPUs: ~2 GB/s per core
_READ_BYTES = 8 << 20
_MEMO_BYTES = 4096  # a memo file is one short JSON object; anything bigger is not ours
PROGRESS_AFTER_S = 5.0
"""Hashing a file that takes longer than this says so on stderr, then every
`PROGRESS_EVERY_S`: the first use of a big dataset reads every byte once."""
PROGRESS_EVERY_S = 10.0


def digest_of_bytes(array: np.ndarray) -> bytes:
    """The content digest of an array held in memory: a hash of its bytes in C
    order, equal to `content_digest` of the same rows on disk."""
    return hashlib.new(HASH, np.ascontiguousarray(array).data).digest()


def content_digest(array: np.ndarray, memo: Path | None) -> bytes | None:
    """A hash of every byte of an on-disk field's rows, or None for a field held
    in memory (use `digest_of_bytes`).

    Args:
      array: the field, a C-contiguous view of a memory-mapped file.
      memo: a directory where digests are memoised by the file's cheap
        identity (path, where the rows lie, size, modification and change
        times, inode and device), or None to hash every time. The change
        time (ctime) is what an edit that restores the modification time
        (``cp -p``, ``touch -d``) cannot restore, so an edited file is hashed
        anew. A memo that cannot be read or written is ignored.

    Returns:
      The digest: equal for byte-identical rows wherever they lie.
    """
    rows = file_rows(array)
    if rows is None:
        return None
    length = array.nbytes
    key = _file_key(rows, length)
    memo_file = None
    if memo is not None:
        memo_file = memo / f"{hashlib.sha256(json.dumps(key).encode()).hexdigest()[:40]}.json"
        if (found := _read_memo(memo_file, key)) is not None:
            return found
    digest = _hash_file(rows.path, rows.offset, length)
    # Changed while it was read: the digest may mix old and new bytes; not kept.
    if memo_file is not None and _file_key(rows, length) == key:
        _write_memo(memo_file, key, digest)
    return digest


def _file_key(rows: FileRows, length: int) -> list:
    """What a memoised digest is valid for: where the rows lie and the file's
    state (any write changes its modification or change time)."""
    status = os.stat(rows.path)
    return [
        os.path.abspath(rows.path),
        rows.offset,
        length,
        status.st_size,
        status.st_mtime_ns,
        status.st_ctime_ns,
        status.st_ino,
        status.st_dev,
        HASH,
    ]


def _hash_file(path: str, offset: int, length: int) -> bytes:
    """Hashes ``length`` bytes of ``path`` from ``offset``, in large blocks (the
    hash releases the GIL), saying how far it is when it takes long."""
    digest = hashlib.new(HASH)
    buffer = bytearray(min(_READ_BYTES, max(length, 1)))
    view = memoryview(buffer)
    began = time.monotonic()
    said = began + PROGRESS_AFTER_S
    done = 0
    with open(path, "rb", buffering=0) as file:
        file.seek(offset)
        while done < length:
            got = file.readinto(view[: min(len(buffer), length - done)])
            if not got:
                raise ValueError(
                    f"{path} ended after {offset + done} bytes while its rows were hashed; "
                    f"they reach byte {offset + length} (was it cut short?)"
                )
            digest.update(view[:got])
            done += got
            if time.monotonic() >= said:
                said = time.monotonic() + PROGRESS_EVERY_S
                print(
                    f"jaxfeed: fingerprinting {path}: {done / 1e9:.1f} of {length / 1e9:.1f} GB "
                    f"({time.monotonic() - began:.0f} s; once: later runs reuse the digest "
                    "until the file changes)",
                    file=sys.stderr,
                    flush=True,
                )
    return digest.digest()


def _read_memo(memo_file: Path, key: list) -> bytes | None:
    """The digest memoised for ``key``, or None. The memo is cache data, so it is
    read warily: a regular file of ours, small, naming exactly this key."""
    try:
        fd = os.open(memo_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as file:
        status = os.fstat(file.fileno())
        if not stat.S_ISREG(status.st_mode) or status.st_uid != os.getuid():
            return None
        text = file.read(_MEMO_BYTES + 1)
    try:
        record = json.loads(text)
        digest = bytes.fromhex(record["digest"])
    except (ValueError, TypeError, KeyError):
        return None
    if record.get("key") != key or len(digest) != hashlib.new(HASH).digest_size:
        return None
    return digest


def _write_memo(memo_file: Path, key: list, digest: bytes) -> None:
    """Memoises ``digest`` atomically; a read-only or full cache only costs a re-hash."""
    with contextlib.suppress(OSError):
        memo_file.parent.mkdir(parents=True, exist_ok=True)
        fd, scratch = tempfile.mkstemp(dir=memo_file.parent, prefix=".memo-")
        try:
            with os.fdopen(fd, "w") as file:
                json.dump({"key": key, "digest": digest.hex()}, file)
            os.replace(scratch, memo_file)
        except OSError:
            os.unlink(scratch)
            raise


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


RAGGED_PARTS = ("values", "offsets", "lengths")
"""A field whose rows differ in length is ``<field>.values.npy`` with
``<field>.offsets.npy`` (rows + 1, from 0) or ``<field>.lengths.npy`` (one per row)."""


def load_npy_directory(directory: Path) -> dict[str, np.ndarray | RaggedField]:
    """One field per ``<field>.npy`` file, memory-mapped read-only, by name;
    a `RaggedField` per ``<field>.values.npy`` and its ``<field>.offsets.npy``
    or ``<field>.lengths.npy`` (`RAGGED_PARTS`), its values read in place.

    Raises:
      ValueError: a file is not a readable ``.npy`` array, or a ragged
        field's parts are missing, doubled or disagree (the message names it).
    """
    fields: dict[str, np.ndarray | RaggedField | None] = {}
    parts: dict[str, dict[str, Path]] = {}
    for file in sorted(directory.glob("*.npy")):
        field, _, part = file.stem.rpartition(".")
        if field and part in RAGGED_PARTS:
            fields.setdefault(field, None)  # its place, in file order, as any field's
            parts.setdefault(field, {})[part] = file
        else:
            fields[file.stem] = _npy(file)
    for field, files in parts.items():
        fields[field] = _ragged(directory, field, files)
    return fields


def _npy(file: Path) -> np.ndarray:
    try:
        return np.load(file, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as err:
        raise ValueError(f"{file} is not a readable .npy array: {err}") from err


def _ragged(directory: Path, field: str, files: dict[str, Path]) -> RaggedField:
    """The field of ``<field>.values.npy`` and its offsets or lengths."""
    bounds = sorted(files.keys() & {"offsets", "lengths"})
    if "values" not in files or len(bounds) != 1:
        found = ", ".join(p.name for p in files.values())
        raise ValueError(
            f"{directory}: {found} make no ragged field {field!r}: it needs {field}.values.npy "
            f"and one of {field}.offsets.npy (rows + 1, from 0) or {field}.lengths.npy (one "
            "per row); add the missing one, or remove the extra"
        )
    values, bound = _npy(files["values"]), _npy(files[bounds[0]])
    if bound.ndim != 1 or bound.dtype.kind not in "iu":
        raise ValueError(f"{files[bounds[0]]} is {bound.dtype} {bound.shape}, not 1-D integers")
    try:
        if bounds[0] == "lengths":
            return RaggedField.from_lengths(values, bound)
        return RaggedField(values, bound)
    except ValueError as err:
        raise ValueError(f"{files['values']} and {files[bounds[0]].name}: {err}") from None

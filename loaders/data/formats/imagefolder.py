"""An image folder: one subdirectory per class, as torchvision's ``ImageFolder``.

Fields ``image`` (the file's encoded bytes, decoded by ``transform=``) and
``label`` (int32: the class's index in sorted subdirectory order); the
class names are the subdirectories', in Unicode NFC, so a name spelled NFC in
one split and NFD in another (as macOS writes it) is one class. Files are
taken recursively, in sorted order, within each class.
"""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

__all__ = [
    "IMAGE_SUFFIXES",
    "class_directories",
    "files_in",
    "folder_batches",
    "folder_classes",
    "folder_files",
    "is_image_folder",
    "read_files",
]

IMAGE_SUFFIXES = frozenset(
    (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")
)
_BATCH_ROWS = 256
_READERS = 8  # threads reading files: a disk takes many reads at once (open/read release the GIL)
_FIRST_READ = 1 << 16  # bytes of a file's first read: most images' whole
_FILES_PER_TASK = 32  # files one thread reads in a row: a task per file cost more than the read


def _images(directory: Path) -> list[str]:
    return [p for p in files_in(directory) if os.path.splitext(p)[1].lower() in IMAGE_SUFFIXES]


def files_in(directory: Path) -> list[str]:
    """Every file under ``directory``, recursively, in sorted path order (as
    ``sorted(rglob)``), as strings: ``os.scandir``'s entries tell files
    without a stat, and a path object per name cost as much as reading a
    small file."""
    found: list[tuple[tuple[str, ...], str]] = []
    pending = [((), os.fspath(directory))]
    while pending:
        parts, top = pending.pop()
        try:
            entries = list(os.scandir(top))
        except OSError:  # unreadable: skipped, as os.walk does
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):  # os.walk's default: links not followed
                pending.append(((*parts, entry.name), entry.path))
            elif entry.is_file():
                found.append(((*parts, entry.name), entry.path))
    found.sort()
    return [path for _, path in found]


def read_files(paths: list[str]) -> list[bytes]:
    """Each file whole, in few calls: most images take one ``read``, with no
    ``fstat`` (``Path.read_bytes`` makes twice the calls and three objects)."""
    out = []
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            data = os.read(fd, _FIRST_READ)
            if len(data) == _FIRST_READ:  # else a short read of a regular file: its end
                data = _rest(fd, data)
        finally:
            os.close(fd)
        out.append(data)
    return out


def _rest(fd: int, first: bytes) -> bytes:
    chunks = [first]
    want = max(_FIRST_READ, os.fstat(fd).st_size - len(first) + 1)  # +1: a grown file is seen
    while len(chunk := os.read(fd, want)) == want:
        chunks.append(chunk)
    chunks.append(chunk)
    return b"".join(chunks)


def is_image_folder(directory: Path) -> bool:
    """Whether ``directory``'s subdirectories hold images (and it holds none itself)."""
    subdirectories = [p for p in directory.iterdir() if p.is_dir()]
    return bool(subdirectories) and any(
        p.suffix.lower() in IMAGE_SUFFIXES for d in subdirectories for p in d.iterdir()
    )


def class_directories(directory: Path) -> dict[str, Path]:
    """The class subdirectories (not hidden ones) by class name: the
    directory's name in Unicode NFC.

    Raises:
      ValueError: two subdirectories whose names are one name in NFC (both
        spellings named, with their code points).
    """
    found: dict[str, Path] = {}
    for path in sorted(directory.iterdir()):
        if not path.is_dir() or path.name.startswith("."):
            continue
        name = unicodedata.normalize("NFC", path.name)
        if name in found:
            first, second = found[name].name, path.name
            raise ValueError(
                f"{directory} holds class directories {first!r} ({first!a}) and "
                f"{second!r} ({second!a}): one name ({name!r}) in two Unicode "
                "spellings, which would be one class; merge them into one directory"
            )
        found[name] = path
    return found


def folder_classes(directory: Path) -> list[str]:
    """The class names: the subdirectories' names in NFC, sorted."""
    return sorted(class_directories(directory))


def folder_batches(directory: Path, classes: list[str]) -> Iterator[dict]:
    """Batches of ``{"image": [bytes], "label": int32}``, class by class;
    a class this split has no subdirectory for is skipped.

    Raises:
      ValueError: a class subdirectory without images (named); two class
        subdirectories whose names are one name in NFC.
    """
    with ThreadPoolExecutor(_READERS, thread_name_prefix="jaxfeed-imagefolder") as pool:
        for files, labels in _chunks(directory, classes):
            tasks = [files[i : i + _FILES_PER_TASK] for i in range(0, len(files), _FILES_PER_TASK)]
            yield {
                "image": [data for part in pool.map(read_files, tasks) for data in part],
                "label": labels,
            }


def folder_files(directory: Path, classes: list[str]) -> Iterator[tuple[str, int]]:
    """Each image file of ``directory`` with its label, in row order.

    Raises:
      ValueError: as `folder_batches`.
    """
    subdirectories = class_directories(directory)
    for label, name in enumerate(classes):
        if name not in subdirectories:
            continue
        files = _images(subdirectories[name])
        if not files:
            raise ValueError(
                f"{subdirectories[name]} holds no images ({', '.join(sorted(IMAGE_SUFFIXES))}): "
                "every class subdirectory of an image folder needs some; remove it or add them"
            )
        for file in files:
            yield file, label


def _chunks(directory: Path, classes: list[str]) -> Iterator[tuple[list[str], np.ndarray]]:
    """The files in order, ``_BATCH_ROWS`` at a time, with their labels."""
    pending: list[str] = []
    labels: list[int] = []
    for file, label in folder_files(directory, classes):
        pending.append(file)
        labels.append(label)
        if len(pending) == _BATCH_ROWS:
            yield pending, np.array(labels, np.int32)
            pending, labels = [], []
    if pending:
        yield pending, np.array(labels, np.int32)

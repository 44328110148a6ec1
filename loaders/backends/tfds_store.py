"""An `ArrayDataset` stored as a real TFDS dataset directory.

Both the tf backend (``tfrecord``, read by ``tf.data``) and the Grain backend's
``source="tfds"`` (``array_record``, random access through
``tfds.data_source``) read their split from here. The copy is built once
under ``cache_root()/tfds/`` by `jaxfeed.loaders.data.cache.build_once`, keyed by content
and by the writing tensorflow-datasets version, and checked against its manifest on
every open. TF and TFDS are imported quietly by the tf door (`jaxfeed.loaders._doors.tf`).
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

from jaxfeed.loaders._doors.tf import import_tfds, no_gcs_lookups, temporary_files_in
from jaxfeed.loaders.array_dataset import ArrayDataset
from jaxfeed.loaders.data.cache import build_once, cache_entry

__all__ = [
    "TFDS_NAME",
    "TFDS_VERSION",
    "split_name",
    "store",
]

TFDS_NAME = "jaxfeed_arrays"
"""The TFDS dataset name inside each cache entry."""
TFDS_VERSION = "1.1.0"
"""Bump to rebuild every cache entry when the stored layout changes (1.1.0:
entries carry a manifest)."""
FORMATS = ("tfrecord", "array_record")


def split_name(dataset: ArrayDataset) -> str:
    """The TFDS split holding ``dataset``: its own split's name (``"train"`` for
    ``"mnist-sample/train"``) when TFDS accepts it, else ``"data"``."""
    split = dataset.name.rsplit("/", 1)[-1]
    return split if re.fullmatch(r"[A-Za-z0-9_]+", split) else "data"


@contextlib.contextmanager
def quiet_build() -> Iterator[None]:
    """Silences TFDS's build chatter ("Downloading and preparing...", progress
    bars, absl warnings) and replays it to stderr if the build fails."""
    out = io.StringIO()
    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    absl_logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            yield
    except BaseException:
        sys.stderr.write(out.getvalue())
        raise
    finally:
        absl_logger.setLevel(level)


def store(dataset: ArrayDataset, file_format: str = "tfrecord") -> Path:
    """Stores ``dataset`` as a TFDS dataset once and returns its builder directory.

    Args:
      dataset: the split to store; record ``i`` is row ``i``.
      file_format: ``"tfrecord"`` (serves ``as_dataset``/``tf.data``) or
        ``"array_record"`` (serves ``tfds.data_source``; tfds 4.9.10 cannot
        read it with ``as_dataset``).

    Returns:
      ``<cache entry>/jaxfeed_arrays/1.0.0``, readable with
      ``tfds.builder_from_directory``; its one split is named `split_name`.

    Raises:
      ValueError: the cache directory is not writable (and the copy is not
        there yet), or an unknown format.
      RuntimeError: the cache entry is incomplete or fails its manifest
        (truncated or changed files); the message names the directory to delete.
    """
    if file_format not in FORMATS:
        raise ValueError(f"file_format must be one of {FORMATS}, got {file_format!r}")
    name = f"{dataset.name}-{file_format}"
    entry = cache_entry(
        "tfds", name, TFDS_VERSION, *dataset.content(), writer="tensorflow-datasets"
    )

    def build(scratch: Path) -> None:
        tfds = import_tfds()
        # Every field as a raw tensor of its own dtype and row shape (images too,
        # not PNG: loading the split then needs no decoding); bytes as tf.string.
        features = tfds.features.FeaturesDict(
            {
                key: tfds.features.Tensor(shape=array.shape[1:], dtype=_feature_dtype(array))
                for key, array in dataset.arrays.items()
            }
        )
        examples = (
            (i, {key: array[i] for key, array in dataset.arrays.items()})
            for i in range(len(dataset))
        )
        with quiet_build(), temporary_files_in(scratch / "tmp"), no_gcs_lookups(tfds):
            tfds.dataset_builders.store_as_tfds_dataset(
                name=TFDS_NAME,
                version=TFDS_VERSION,
                features=features,
                split_datasets={split_name(dataset): examples},
                data_dir=scratch,
                description=f"jaxfeed's copy of {dataset.name}",
                file_format=file_format,
                disable_shuffling=True,  # keep dataset order: record i is row i
            )
        for empty in ("downloads", "tmp"):  # nothing of the copy: TFDS's leftovers
            shutil.rmtree(scratch / empty, ignore_errors=True)

    return build_once(entry, build) / TFDS_NAME / TFDS_VERSION


def _feature_dtype(array: object) -> object:
    """A field's TFDS dtype: its own, or ``object`` (``tf.string``) for bytes."""
    import numpy as np

    return np.object_ if array.dtype == object else array.dtype

"""An `ArrayDataset` stored as a real TFDS dataset directory, and TF imported quietly.

Both the tf backend (``tfrecord``, read by ``tf.data``) and the Grain backend's
``source="tfds"`` (``array_record``, random access through
``tfds.data_source``) read their split from here. The copy is built once
under ``cache_root()/tfds/`` by `jaxfeed.loaders.data.cache.build_once`, keyed by content
and by the writing tensorflow-datasets version, and checked against its manifest on
every open.
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from jaxfeed.loaders.array_dataset import ArrayDataset
from jaxfeed.loaders.data.cache import build_once, cache_entry

__all__ = [
    "TFDS_NAME",
    "TFDS_VERSION",
    "import_tensorflow",
    "import_tfds",
    "split_name",
    "store",
]

TFDS_NAME = "jaxfeed_arrays"
"""The TFDS dataset name inside each cache entry."""
TFDS_VERSION = "1.1.0"
"""Bump to rebuild every cache entry when the stored layout changes (1.1.0:
entries carry a manifest)."""
FORMATS = ("tfrecord", "array_record")


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """Captures everything written to file descriptor 2, from Python and C++
    alike, and replays it only if the block fails.

    TensorFlow's import and device setup print oneDNN notices, absl
    pre-initialisation warnings and ``failed call to cuInit`` lines straight
    to fd 2 (TF 2.21 ignores ``TF_CPP_MIN_LOG_LEVEL`` for some of them). The
    capture is process-wide, so it is kept to those few seconds.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            captured.seek(0)
            sys.stderr.write(captured.read().decode(errors="replace"))
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


@functools.cache
def import_tensorflow() -> ModuleType:
    """Imports TensorFlow without its start-up noise, kept off any GPU (JAX owns those)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with quiet_stderr():
        import tensorflow as tf

        # Raises RuntimeError once TF is initialised; its devices are then fixed.
        with contextlib.suppress(RuntimeError):
            tf.config.set_visible_devices([], "GPU")
    return tf


@functools.cache
def import_tfds() -> ModuleType:
    """Imports tensorflow_datasets (after TensorFlow, quietly).

    Raises:
      ImportError: tensorflow_datasets failed to import. Its ``__init__``
        logs its own import error (e.g. protobuf's ``VersionError`` from a
        tensorflow-metadata built for another protobuf) and returns a module
        without its API; that logged error is raised here as the cause.
    """
    import_tensorflow()
    records: list[logging.LogRecord] = []
    logged = logging.Handler(logging.ERROR)
    logged.emit = records.append  # its stderr copy stays captured below
    absl_logger = logging.getLogger("absl")
    absl_logger.addHandler(logged)
    try:
        with quiet_stderr():
            import tensorflow_datasets as tfds
    finally:
        absl_logger.removeHandler(logged)
    if not hasattr(tfds, "__all__"):  # its __init__ sets __all__ last, if all went well
        errors = [r.exc_info[1] for r in records if r.exc_info and r.exc_info[1]]
        cause = errors[-1] if errors else None
        sys.modules.pop("tensorflow_datasets", None)  # let a fixed install import again
        raise ImportError(
            "tensorflow_datasets failed to import"
            + (f": {type(cause).__name__}: {str(cause).rstrip('.')}" if cause else "")
            + ". Check that tensorflow, tensorflow-datasets, tensorflow-metadata and"
            " protobuf are versions that work together (constraints.txt pins a tested set)"
        ) from cause
    return tfds


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
        with quiet_build():
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
        shutil.rmtree(scratch / "downloads", ignore_errors=True)  # always empty here

    return build_once(entry, build) / TFDS_NAME / TFDS_VERSION


def _feature_dtype(array: object) -> object:
    """A field's TFDS dtype: its own, or ``object`` (``tf.string``) for bytes."""
    import numpy as np

    return np.object_ if array.dtype == object else array.dtype

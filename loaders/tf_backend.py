"""TensorFlow backend: tf.data over a TFDS-format dataset directory.

The split is stored once as a real TFDS dataset (``tfrecord`` files plus
``dataset_info.json``) under ``cache_root()/tfds/<name>-<content hash>``,
read back with ``tfds.builder_from_directory``, and held as tensors. Batches
come from a tf.data pipeline, built once per source, that makes one
vectorised ``tf.gather`` per batch of indices and prefetches ahead.

The cache is built in a private temporary directory and renamed into place,
so a crash never leaves a half-built dataset and concurrent processes can
race to build it: the first rename wins and the others discard their copy.
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
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from loaders.cache import cache_root, fingerprint, writable_dir
from loaders.datasets import ArrayDataset
from loaders.sampler import Sampler
from loaders.source import SampledSource

OPTIONS = ("order",)

TFDS_NAME = "jaxfeed_arrays"
"""The TFDS dataset name inside each cache directory."""
BYTES_PER_STEP = 4 << 20  # images gathered per tf.data element (see _Pipeline)
TFDS_VERSION = "1.0.0"
"""Bump to rebuild every cache when the stored features change."""


@functools.cache
def _tensorflow() -> ModuleType:
    """Imports TensorFlow quietly and keeps it off any GPU (JAX owns those)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    # Raises RuntimeError once TF is initialised; its devices are then fixed.
    with contextlib.suppress(RuntimeError):
        tf.config.set_visible_devices([], "GPU")
    return tf


def _tfds() -> ModuleType:
    _tensorflow()
    import tensorflow_datasets as tfds

    return tfds


def cache_key(dataset: ArrayDataset) -> str:
    """``<readable name>-<format version>-<content fingerprint>``: new data (or a
    new stored layout) never reuses a stale cache."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", dataset.name).strip("-")[-60:]
    return f"{slug}-{TFDS_VERSION}-{fingerprint(dataset.images, dataset.labels)}"


def _split_name(dataset: ArrayDataset) -> str:
    split = dataset.name.rsplit("/", 1)[-1]
    return split if re.fullmatch(r"[A-Za-z0-9_]+", split) else "data"


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silences TFDS's build chatter ("Downloading and preparing...", progress
    bars, absl warnings) and replays it to stderr if the build fails. The
    redirect is process-wide, but only for the build's few seconds."""
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


def prepare_tfds(dataset: ArrayDataset) -> Path:
    """Stores ``dataset`` as a TFDS dataset once and returns its builder directory.

    Returns:
      ``cache_root()/tfds/<key>/jaxfeed_arrays/1.0.0``, readable with
      ``tfds.builder_from_directory``; its one split is named after the
      dataset's split (``"train"``/``"test"``).

    Raises:
      ValueError: the cache directory is not writable.
      RuntimeError: the final directory exists but holds no TFDS dataset.
    """
    root = writable_dir(cache_root() / "tfds")
    final = root / cache_key(dataset)
    builder_dir = final / TFDS_NAME / TFDS_VERSION
    if (builder_dir / "dataset_info.json").is_file():
        return builder_dir
    tfds = _tfds()
    features = tfds.features.FeaturesDict(
        {
            # Raw bytes, not PNG: loading the split then needs no decoding.
            "image": tfds.features.Tensor(shape=dataset.images.shape[1:], dtype=np.uint8),
            "label": tfds.features.Scalar(dtype=np.int32),
        }
    )
    examples = (
        (i, {"image": image, "label": label})
        for i, (image, label) in enumerate(zip(dataset.images, dataset.labels, strict=True))
    )
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{final.name}.tmp-"))
    try:
        with _quiet():
            tfds.dataset_builders.store_as_tfds_dataset(
                name=TFDS_NAME,
                version=TFDS_VERSION,
                features=features,
                split_datasets={_split_name(dataset): examples},
                data_dir=tmp,
                description=f"jaxfeed's copy of {dataset.name}",
                file_format="tfrecord",  # array_record cannot serve as_dataset (tfds 4.9.10)
                disable_shuffling=True,  # keep dataset order: index i is example i
            )
        shutil.rmtree(tmp / "downloads", ignore_errors=True)  # always empty here
        try:
            tmp.rename(final)
        except OSError:
            # Another process renamed its copy first (or a stray directory is in
            # the way); theirs is complete because renames are atomic.
            if not (builder_dir / "dataset_info.json").is_file():
                raise RuntimeError(
                    f"{final} exists but holds no TFDS dataset; delete it and retry"
                ) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # nothing left after a successful rename
    return builder_dir


def _gather(images: Any, labels: Any, indices: Any, batch_size: int) -> dict[str, Any]:
    """Several batches at once: one vectorised ``tf.gather`` per leaf, shaped
    ``[batches, batch_size, ...]``."""
    tf = _tensorflow()
    image, label = tf.gather(images, indices), tf.gather(labels, indices)
    return {
        "image": tf.reshape(image, [-1, batch_size, *images.shape[1:]]),
        "label": tf.reshape(label, [-1, batch_size]),
    }


class _Pipeline:
    """A sampler-order tf.data pipeline and its iterator, both made once.

    Creating a tf.data iterator costs ~10 ms here, as much as reading an MNIST
    epoch, so each pipeline keeps ONE iterator over an endless dataset whose
    map reads row ``cursor`` of an index table held in ``tf.Variable``s; a new
    epoch assigns the table and resets the cursor. This is only correct
    because the map is sequential with no prefetch (tf.data's autotuning,
    injected prefetch and parallel map are off): nothing reads a row before it
    is asked for. (jaxfeed's DeviceFeed reads ahead on its own thread.) Each
    row gathers ``per_step`` batches (~4 MiB), amortising the iterator step.
    """

    def __init__(self, images: Any, labels: Any, num_batches: int, batch_size: int):
        tf = _tensorflow()
        batch_bytes = batch_size * int(np.prod(images.shape[1:])) * images.dtype.size
        self.per_step = max(1, min(BYTES_PER_STEP // batch_bytes, num_batches))
        self.steps = -(-num_batches // self.per_step)
        self.shape = (self.steps * self.per_step, batch_size)
        table = tf.Variable(tf.zeros([self.steps, self.per_step * batch_size], tf.int64))
        cursor = tf.Variable(0, dtype=tf.int64)
        self.table, self.cursor = table, cursor

        def next_row(_: Any) -> dict[str, Any]:
            row = cursor.assign_add(1) - 1
            return _gather(images, labels, tf.gather(table, row), batch_size)

        options = tf.data.Options()
        options.autotune.enabled = False
        options.experimental_optimization.inject_prefetch = False
        options.experimental_optimization.map_parallelization = False
        elements = tf.data.Dataset.range(1).repeat().map(next_row).with_options(options)
        self.iterator = elements.as_numpy_iterator()

    def batches(self, index_batches: Sequence[np.ndarray]) -> Iterator[Mapping[str, np.ndarray]]:
        """The batches of ``index_batches`` (at most ``num_batches`` of them), in order."""
        if not len(index_batches):
            return
        table = np.zeros(self.shape, np.int64)
        table[: len(index_batches)] = index_batches
        self.table.assign(table.reshape(self.steps, -1))
        self.cursor.assign(0)
        remaining = len(index_batches)
        while remaining > 0:
            element = next(self.iterator)
            for i in range(min(self.per_step, remaining)):
                yield {"image": element["image"][i], "label": element["label"][i]}
            remaining -= self.per_step


class TfSource(SampledSource):
    """Batches from a tf.data pipeline over a TFDS-format copy of the dataset.

    Args:
      dataset, sampler, order: see `SampledSource`. ``order="sampler"``:
        ``Dataset.range(num_batches).map(gather(images, table[step]))
        .prefetch(AUTOTUNE)`` over the sampler's index table (one vectorised
        gather per batch). ``order="native"``: the order is the tf.data idiom
        ``Dataset.range(N).shuffle(N, seed=f(seed, epoch),
        reshuffle_each_iteration=False).shard(process_count, process_index)``,
        cut into batches as ``.batch(batch_size, drop_remainder)`` would and
        read through the same gather pipeline. Like torch's
        DistributedSampler, with several processes and ``drop_remainder=False``
        the order is first padded with its own head to a multiple of
        ``process_count``, so every process yields the same number of batches.
        A global seed set with ``tf.random.set_seed`` also changes this order.

    Raises:
      RuntimeError: the cached TFDS dataset does not match ``dataset``.
    """

    def __init__(self, dataset: ArrayDataset, sampler: Sampler, order: str = "sampler"):
        super().__init__(dataset, sampler, order)
        tfds = _tfds()
        self.builder_dir = prepare_tfds(dataset)
        builder = tfds.builder_from_directory(self.builder_dir)
        split = builder.as_dataset(split=_split_name(dataset), batch_size=-1)
        if not (
            np.array_equal(split["image"].numpy(), dataset.images)
            and np.array_equal(split["label"].numpy(), dataset.labels)
        ):
            raise RuntimeError(
                f"the TFDS cache {self.builder_dir} does not hold {dataset.name}'s data; "
                "delete that directory so it is rebuilt"
            )
        self._images, self._labels = split["image"], split["label"]
        # One pipeline per epoch being read at the same time (normally just one).
        self._idle: list[_Pipeline] = []
        self._lock = threading.Lock()

    def _fetch(self, index_batches: Sequence[np.ndarray]) -> Iterator[Mapping[str, np.ndarray]]:
        with self._lock:
            pipeline = self._idle.pop() if self._idle else None
        if pipeline is None:
            pipeline = _Pipeline(self._images, self._labels, self.num_batches, self.batch_size)
        try:
            yield from pipeline.batches(index_batches)
        finally:
            with self._lock:
                self._idle.append(pipeline)

    def _native_epoch(self, epoch: int) -> Iterator[Mapping[str, np.ndarray]]:
        tf = _tensorflow()
        s, n = self.sampler, len(self.dataset)
        order = tf.data.Dataset.range(n)
        if s.shuffle:
            seed = int(np.random.SeedSequence((s.seed, epoch)).generate_state(1)[0])
            order = order.shuffle(n, seed=seed, reshuffle_each_iteration=False)
        pad = 0 if s.drop_remainder else -n % s.process_count
        if pad:
            order = order.repeat(2).take(n + pad)  # same order twice: pad with its head
        # This process's whole shard as ONE element: a tf.data iterator step costs
        # far more than the gather it feeds, so batching happens on the result.
        mine = order.shard(s.process_count, s.process_index).batch(n + pad).get_single_element()
        # drop_remainder: shards may differ by one example; keep equal batch counts.
        count = min(len(mine), s.num_batches * s.batch_size)
        table = np.zeros(s.num_batches * s.batch_size, np.int64)
        table[:count] = mine.numpy()[:count]
        batches = self._fetch(list(table.reshape(s.num_batches, s.batch_size)))
        for step, batch in enumerate(batches):
            valid = min(s.batch_size, count - step * s.batch_size)
            yield {key: value[:valid] for key, value in batch.items()}


def build(dataset: ArrayDataset, sampler: Sampler, **options: Any) -> TfSource:
    """The backend's `BatchSource`; ``loaders.make`` has checked ``options``
    against `OPTIONS`."""
    return TfSource(dataset, sampler, **options)

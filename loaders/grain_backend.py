"""Grain backend: a `grain.MapDataset` whose elements are whole batches.

Grain's per-record path (``MapDataset.source(src).batch(B)``) reads one record
per ``__getitem__`` call and stacks them in Python. Here each element of the
MapDataset is one batch of indices, and a single vectorised read fetches the
whole batch from the random-access source, so Grain's threads, worker
processes and ordering guarantees apply to batches instead of records.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import grain
import numpy as np

from loaders.cache import cache_root, fingerprint, writable_dir
from loaders.datasets import ArrayDataset
from loaders.sampler import Sampler
from loaders.source import SampledSource

SOURCES = ("memory", "tfds")
OPTIONS = ("order", "source", "num_workers", "num_threads")
_TFDS_VERSION = "1.0.0"


class ArraySource:
    """Grain random-access source over in-memory arrays, plus batched reads.

    Satisfies ``grain.sources.RandomAccessDataSource`` (``__len__``,
    ``__getitem__``) for record-level pipelines; ``read_batch`` is the
    vectorised path this backend uses.
    """

    def __init__(self, images: np.ndarray, labels: np.ndarray):
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        return {"image": self.images[index], "label": self.labels[index]}

    def read_batch(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        """One numpy gather per leaf for the whole batch."""
        return {"image": self.images[indices], "label": self.labels[indices]}


class TfdsSource:
    """A TFDS ``array_record`` data source, read a batch at a time."""

    def __init__(self, source: Sequence[Mapping[str, np.ndarray]], dataset: ArrayDataset):
        self.source, self._empty = source, ArraySource(dataset.images[:0], dataset.labels[:0])

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> Mapping[str, np.ndarray]:
        return self.source[index]

    def read_batch(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        """One ``__getitems__`` call (one ArrayRecord batch read), then a stack."""
        if len(indices) == 0:
            return self._empty.read_batch(indices)
        records = self.source.__getitems__([int(i) for i in indices])
        return {key: np.stack([r[key] for r in records]) for key in ("image", "label")}


class _GatherBatch(grain.transforms.Map):
    """Maps one array of indices to one batch (picklable for worker processes)."""

    def __init__(self, records: ArraySource | TfdsSource):
        self.records = records

    def map(self, element: np.ndarray) -> dict[str, np.ndarray]:
        return self.records.read_batch(np.asarray(element, dtype=np.int64))


class GrainSource(SampledSource):
    """Batches from a Grain pipeline over a batch-level random-access source.

    Args:
      dataset, sampler, order: see `SampledSource`. ``order="native"`` uses
        Grain's own seeded ``shuffle`` (reseeded each epoch as ``repeat``
        does) and ``[process_index::process_count]`` sharding.
      source: ``"memory"`` (default): the in-memory arrays. ``"tfds"``: a
        TFDS dataset in ``array_record`` format, built once under the cache.
      num_workers: Grain worker processes (``IterDataset.mp_prefetch``);
        0 reads in this process.
      num_threads: Grain reader threads per process (``grain.ReadOptions``);
        default 0 for the in-memory source (a gather is too cheap to share
        out), 16 (Grain's default) for TFDS.
    """

    def __init__(
        self,
        dataset: ArrayDataset,
        sampler: Sampler,
        order: str = "sampler",
        source: str = "memory",
        num_workers: int = 0,
        num_threads: int | None = None,
    ):
        super().__init__(dataset, sampler, order)
        if source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
        for name, value in (("num_workers", num_workers), ("num_threads", num_threads)):
            if value is not None and (type(value) is not int or value < 0):
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        self.source = source
        self.num_workers = num_workers
        self.num_threads = (0 if source == "memory" else 16) if num_threads is None else num_threads
        if source == "memory":
            self.records = ArraySource(dataset.images, dataset.labels)
        else:
            self.records = TfdsSource(_tfds_data_source(dataset), dataset)

    def _fetch(self, index_batches: Sequence[np.ndarray]) -> Iterator[Mapping[str, np.ndarray]]:
        return self._iterate(grain.MapDataset.source(list(index_batches)))

    def _native_epoch(self, epoch: int) -> Iterator[Mapping[str, np.ndarray]]:
        s = self.sampler
        n = s.num_examples
        ds = grain.MapDataset.range(n)
        if s.shuffle:
            # repeat() folds the epoch into the shuffle seed; slice out this epoch.
            ds = ds.seed(s.seed).shuffle().repeat()[epoch * n : (epoch + 1) * n]
        ds = ds[s.process_index :: s.process_count]
        yield from self._iterate(ds.batch(s.batch_size, drop_remainder=s.drop_remainder))

    def _iterate(self, index_batches: grain.MapDataset) -> Iterator[Mapping[str, np.ndarray]]:
        ds = index_batches.map(_GatherBatch(self.records)).to_iter_dataset(
            grain.ReadOptions(num_threads=self.num_threads)
        )
        if self.num_workers:
            _mark_absl_flags_parsed()
            ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=self.num_workers))
        iterator = iter(ds)
        try:
            yield from iterator
        finally:
            iterator.close()  # stops worker processes now, not at garbage collection


def _mark_absl_flags_parsed() -> None:
    """Lets ``mp_prefetch`` run outside ``absl.app``.

    Grain 0.2.18 reads the absl flag ``--grain_enable_multiprocess_worker_profiling``
    when starting workers whenever ``jax.profiler`` is importable, and absl
    raises ``UnparsedFlagAccessError`` unless flags were parsed. Marking them
    parsed keeps every flag at its default, as ``absl.app.run`` would.
    """
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


def _tfds_data_source(dataset: ArrayDataset) -> Sequence[Mapping[str, np.ndarray]]:
    """``tfds.data_source`` over ``dataset``, stored once as TFDS ``array_record``."""
    import tensorflow_datasets as tfds

    root = writable_dir(cache_root() / "tfds-array_record")
    slug = re.sub(r"[^a-z0-9]+", "_", dataset.name.lower())[:40].strip("_")
    # A valid TFDS name, keyed by content.
    name = f"jaxfeed_{slug}_{fingerprint(dataset.images, dataset.labels)}"
    if not (root / name / _TFDS_VERSION / "dataset_info.json").exists():
        # Build beside the cache and rename into place: readers never see a
        # half-written dataset, and losing a race with another process is fine.
        scratch = Path(tempfile.mkdtemp(dir=root, prefix=".build-"))
        try:
            examples = (
                (i, {"image": image, "label": label})
                for i, (image, label) in enumerate(zip(dataset.images, dataset.labels, strict=True))
            )
            features = tfds.features.FeaturesDict(
                {
                    "image": tfds.features.Tensor(shape=dataset.images.shape[1:], dtype=np.uint8),
                    "label": tfds.features.Tensor(shape=(), dtype=np.int32),
                }
            )
            tfds.dataset_builders.store_as_tfds_dataset(
                name=name,
                version=_TFDS_VERSION,
                features=features,
                split_datasets={"train": examples},
                data_dir=scratch,
                file_format="array_record",
                disable_shuffling=True,  # keep record i == dataset row i
            )
            try:
                os.rename(scratch / name, root / name)
            except OSError:
                if not (root / name).is_dir():
                    raise  # not a lost race: a real failure
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return tfds.data_source(name, split="train", data_dir=root, download=False)


def build(dataset: ArrayDataset, sampler: Sampler, **options: Any) -> GrainSource:
    """The backend's `BatchSource`; ``loaders.make`` has checked ``options``
    against `OPTIONS`."""
    return GrainSource(dataset, sampler, **options)

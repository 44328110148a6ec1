"""Each framework's own reader of the user's files, doing the decode
workload's per-record work: the pipeline a user of that framework writes
today for the format, without jaxfeed (`jaxfeed compare --dataset DIR` and
benchmarks/formats.py both measure jaxfeed beside these).

- TFRecord: tf.data ``TFRecordDataset`` -> ``parse_single_example`` -> the
  augment in ``tf.numpy_function``; ``workers`` is ``map``'s
  ``num_parallel_calls`` (threads of tf.data's pool, then ``prefetch``). The
  augment is Python inside ``tf.numpy_function``, so those threads share
  the GIL: more of them overlap only what releases it (PNG decode in
  Pillow, numpy, the parse).
- ArrayRecord: Grain's ``ArrayRecordDataSource`` + ``MapDataset``; with
  ``workers``, ``to_iter_dataset().mp_prefetch(MultiprocessingOptions(
  num_workers=workers))`` (Grain's own processes, spawned).
- Parquet: ``datasets.load_dataset("parquet")`` + ``with_transform``, sliced
  by batch in this process; with ``workers``, that dataset in a torch
  ``DataLoader(batch_size=..., num_workers=workers)`` (Hugging Face's "Use
  with PyTorch" docs).
- image folder: a torch ``Dataset`` over the files in a ``DataLoader``
  (``num_workers=workers``).

Worker processes are spawned (forking a process that runs JAX/XLA or TF
threads can deadlock, as `jaxfeed.loaders.backends.torch` says; torch's
through jaxfeed's spawn context, for its clean exit only), start with
the stream's first batch and are gone once the stream is closed (its
``close()``). The files hold an ``image`` field of encoded bytes and a
``label``; the record work is `augment_image` (`encoded.augment` on that
field). Each reader reads its files in order (no shuffle: the framework's
plain reading) and is an endless stream of numpy batches ``{"image":
float32 [B, 56, 56, 3], "label": int32 [B]}`` (a short batch ends each
epoch). Each worker augments with its own copy of the seeded generator.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from jaxfeed.loaders.data import encoded
from jaxfeed.loaders.data.formats.detect import Found

Batch = dict[str, np.ndarray]

# The framework whose own reader reads each format, and the reader's name.
READERS = {
    "tfrecord": ("tf", "TFRecordDataset"),
    "arrayrecord": ("grain", "ArrayRecordDataSource"),
    "parquet": ("hf", "load_dataset-parquet"),
    "imagefolder": ("torch", "Dataset-of-files"),
}


def augment_image(record: dict[str, Any], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The decode workload's augment of a record read from files (an
    ``image`` field of encoded bytes, a ``label``)."""
    return encoded.augment({"png": record["image"], "label": record["label"]}, rng)


def own_reader(found: Found, batch_size: int, seed: int, workers: int = 0) -> Iterator[Batch]:
    """The endless stream of ``found``'s framework's own reader (`READERS`),
    its record work spread over ``workers`` (0: in this process).

    Raises:
      ValueError: a format no framework reader is listed for, or workers < 0.
    """
    readers: dict[str, Callable[..., Iterator[Batch]]] = {
        "tfrecord": _tfrecord,
        "arrayrecord": _arrayrecord,
        "parquet": _parquet,
        "imagefolder": _imagefolder,
    }
    if found.format not in readers:
        raise ValueError(f"no framework reader is compared for {found.format!r} files")
    if workers < 0:
        raise ValueError(f"workers must be 0 or more, not {workers}")
    return readers[found.format](found, batch_size, np.random.default_rng(seed), workers)


def _tfrecord(
    found: Found, batch_size: int, rng: np.random.Generator, workers: int
) -> Iterator[Batch]:
    import tensorflow as tf

    spec = {
        "image": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
    }

    def python(image: bytes, label: np.int64) -> tuple[np.ndarray, np.int32]:
        out = augment_image({"image": image, "label": label}, rng)
        return out["image"], out["label"]

    def parse(record: Any) -> tuple[Any, Any]:
        row = tf.io.parse_single_example(record, spec)
        return tf.numpy_function(python, [row["image"], row["label"]], (tf.float32, tf.int32))

    gzip = found.files[0].name.endswith(".gz")
    files = [str(p) for p in found.files]
    ds = tf.data.TFRecordDataset(files, "GZIP" if gzip else None)
    ds = ds.map(parse, num_parallel_calls=workers or None).batch(batch_size)
    if workers:  # the 0-worker pipeline keeps none, as before
        ds = ds.prefetch(tf.data.AUTOTUNE)
    for image, label in ds.repeat():
        yield {"image": image.numpy(), "label": label.numpy()}


class _DecodeExample:
    """A serialized Example's augment (a class: Grain pickles it into its
    spawned workers)."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    def __call__(self, record: bytes) -> dict[str, np.ndarray]:
        from jaxfeed.loaders.data.formats.example import parse_example

        row = parse_example(record)  # name -> (kind, values)
        image, label = row["image"][1][0], row["label"][1][0]
        return augment_image({"image": image, "label": label}, self.rng)


def _arrayrecord(
    found: Found, batch_size: int, rng: np.random.Generator, workers: int
) -> Iterator[Batch]:
    import grain

    source = grain.sources.ArrayRecordDataSource([str(p) for p in found.files])
    dataset = grain.MapDataset.source(source).map(_DecodeExample(rng)).batch(batch_size)
    if not workers:
        while True:
            yield from iter(dataset)
    from jaxfeed.loaders._doors.grain import mark_absl_flags_parsed

    mark_absl_flags_parsed()  # what absl.app.run does in a Grain user's main
    options = grain.MultiprocessingOptions(num_workers=workers)
    # Batched before repeat: each epoch still ends with its short batch.
    iterator = iter(dataset.repeat().to_iter_dataset().mp_prefetch(options))
    try:
        for batch in iterator:  # workers hand over views of shared memory
            yield {key: np.array(value) for key, value in batch.items()}
    finally:
        iterator.close()  # stops the workers now, not at garbage collection


class _ParquetTransform:
    """``with_transform``'s batch function (a class: spawned torch workers
    unpickle it)."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    def __call__(self, batch: dict[str, list]) -> dict[str, list]:
        outs = [
            augment_image({"image": image, "label": label}, self.rng)
            for image, label in zip(batch["image"], batch["label"], strict=True)
        ]
        return {"image": [o["image"] for o in outs], "label": [o["label"] for o in outs]}


def _parquet(
    found: Found, batch_size: int, rng: np.random.Generator, workers: int
) -> Iterator[Batch]:
    import datasets

    files = [str(p) for p in found.files]
    ds = datasets.load_dataset("parquet", data_files=files, split="train")
    ds = ds.with_transform(_ParquetTransform(rng))
    if workers:  # an endless stream: the slicing below is the 0-worker reader
        yield from _torch_batches(ds, batch_size, workers)
        return
    while True:
        for start in range(0, len(ds), batch_size):
            rows = ds[start : start + batch_size]
            yield {"image": np.stack(rows["image"]), "label": np.asarray(rows["label"], np.int32)}


class _Folder:
    """An image folder's files as a map-style torch Dataset (module level:
    spawned workers unpickle it; `torch_data.Dataset` is only a protocol)."""

    def __init__(self, files: list[tuple[Path, int]], rng: np.random.Generator):
        self.files, self.rng = files, rng

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.int32]:
        path, label = self.files[i]
        out = augment_image({"image": path.read_bytes(), "label": label}, self.rng)
        return out["image"], out["label"]


def _imagefolder(
    found: Found, batch_size: int, rng: np.random.Generator, workers: int
) -> Iterator[Batch]:
    root, classes = found.files[0], list(found.classes)
    files = [
        (path, index)
        for index, name in enumerate(classes)
        for path in sorted(p for p in (root / name).rglob("*") if p.is_file())
    ]
    return _torch_batches(_Folder(files, rng), batch_size, workers)


def _torch_batches(dataset: Any, batch_size: int, workers: int) -> Iterator[Batch]:
    """``dataset`` in a torch ``DataLoader`` with ``workers`` spawned,
    persistent workers (started once, not every epoch)."""
    import torch.utils.data as torch_data

    from jaxfeed.loaders._workers.spawn import SPAWN

    loader = torch_data.DataLoader(
        dataset,
        batch_size=batch_size,
        num_workers=workers,
        # spawn, through jaxfeed's context only so that a worker ended while its
        # queue's thread is in torch's C++ exits cleanly (`spawn`'s module doc).
        multiprocessing_context=SPAWN if workers else None,
        persistent_workers=bool(workers),
    )
    try:
        while True:
            for batch in loader:
                # A `datasets` row is a dict, the folder's a tuple.
                image, label = (
                    (batch["image"], batch["label"]) if isinstance(batch, dict) else batch
                )
                yield {"image": image.numpy(), "label": label.numpy().astype(np.int32)}
    finally:
        del loader  # its workers end with its (and its iterator's) last reference

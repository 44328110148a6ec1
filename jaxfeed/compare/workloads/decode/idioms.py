"""Each framework's own pipeline for the decode workload: the code a user of
that framework writes today to decode, crop, flip and normalise PNG records
in its workers, without jaxfeed.

Where the framework runs Python per record (torch, Grain, Hugging Face, the
plain loop), the record work is `encoded.augment` itself, with one generator
per worker process as those users seed them: so a jaxfeed row differs from its
idiom only by the plumbing (and by jaxfeed's generator per row, which makes
its batches identical across backends). tf.data's idiom is native ops
(``tf.io.decode_png``, ``tf.image``) with the same crop scale, aspect ratio,
flip and normalisation; its pixels differ slightly from Pillow's.

Beside tf.data's native-ops idiom, `SAME_TRANSFORM` holds a tf.data row that
runs `encoded.augment` itself through ``tf.numpy_function``, as a tf user runs
Python in tf.data: so a reader can tell the framework's cost of Python work
from jaxfeed's.

Each idiom is a generator function ``(records, batch_size, seed, workers)``
yielding endless numpy batches ``{"image": float32 [B, 56, 56, 3], "label":
int32 [B]}`` (a short batch ends each epoch); closing it stops its workers.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from jaxfeed.loaders.array_dataset import ArrayDataset
from jaxfeed.loaders.data import encoded

AUTO = "auto"  # tf.data's num_parallel_calls=AUTOTUNE, beside the fixed counts
Batch = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class Records:
    """The encoded split as a user holds it: one ``bytes`` per image, and labels."""

    png: list[bytes]
    label: np.ndarray

    @classmethod
    def of(cls, dataset: ArrayDataset) -> Records:
        field = dataset["png"]
        return cls([field[i] for i in range(len(field))], np.asarray(dataset["label"], np.int32))

    def __len__(self) -> int:
        return len(self.png)

    def record(self, i: int) -> dict[str, Any]:
        return {"png": self.png[i], "label": self.label[i]}


def _collate(records: Sequence[dict[str, np.ndarray]]) -> Batch:
    return {key: np.stack([r[key] for r in records]) for key in records[0]}


def python_loop(records: Records, batch_size: int, seed: int, workers: int) -> Iterator[Batch]:
    """No framework: shuffle, then `augment` record by record and stack, in
    this process (so ``workers`` must be 0)."""
    assert workers == 0, workers
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(len(records))
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            yield _collate([encoded.augment(records.record(i), rng) for i in chunk])


class _Augmented:
    """A map-style dataset of augmented records. torch needs only ``__len__``
    and ``__getitem__`` (not the ``Dataset`` base, which would import torch
    with this module). Its generator is made in each worker, from the seed
    torch gives that worker."""

    def __init__(self, records: Records, seed: int):
        self.records, self.seed, self.rng = records, seed, None

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        if self.rng is None:
            from torch.utils.data import get_worker_info

            info = get_worker_info()
            self.rng = np.random.default_rng(self.seed if info is None else info.seed)
        return encoded.augment(self.records.record(i), self.rng)


def _torch_loader(dataset: Any, batch_size: int, seed: int, workers: int) -> Any:
    """``DataLoader(shuffle=True)``, default collate; spawned persistent workers."""
    import torch
    from torch.utils.data import DataLoader

    generator = torch.Generator().manual_seed(seed)
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=True,
        generator=generator,
        num_workers=workers,
        multiprocessing_context="spawn" if workers else None,  # no fork under JAX
        persistent_workers=workers > 0,
    )


def _epochs_of(loader: Any) -> Iterator[Batch]:
    while True:
        for batch in loader:
            yield {key: value.numpy() for key, value in batch.items()}


def torch_dataloader(records: Records, batch_size: int, seed: int, workers: int) -> Iterator[Batch]:
    """A map-style dataset that decodes with Pillow, in ``DataLoader`` workers."""
    yield from _epochs_of(_torch_loader(_Augmented(records, seed), batch_size, seed, workers))


class _HfAugment:
    """The ``with_transform`` function: the rows of one query in, augmented
    batch out; its generator is made in the process that first calls it."""

    def __init__(self, seed: int):
        self.seed, self.rng = seed, None

    def __call__(self, batch: dict[str, list]) -> Batch:
        if self.rng is None:
            self.rng = np.random.default_rng((self.seed, os.getpid()))
        rows = zip(batch["png"], batch["label"], strict=True)
        return _collate([encoded.augment({"png": p, "label": y}, self.rng) for p, y in rows])


def hf_with_transform(
    records: Records, batch_size: int, seed: int, workers: int
) -> Iterator[Batch]:
    """An Arrow ``binary`` column under ``with_transform``; read by shuffled
    index batches here, or, with workers, by a torch ``DataLoader`` over the
    dataset (what Hugging Face's docs show for parallel loading)."""
    import datasets

    table = datasets.Dataset.from_dict({"png": records.png, "label": records.label})
    augmented = table.with_transform(_HfAugment(seed))
    if workers:
        yield from _epochs_of(_torch_loader(augmented, batch_size, seed, workers))
        return
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(len(records))
        for start in range(0, len(order), batch_size):
            yield augmented[order[start : start + batch_size]]


def _grain_augment(record: dict[str, Any], rng: np.random.Generator) -> dict[str, np.ndarray]:
    return encoded.augment(record, rng)


def grain_mapdataset(records: Records, batch_size: int, seed: int, workers: int) -> Iterator[Batch]:
    """``MapDataset``: shuffle, repeat, ``random_map`` (Grain's generator per
    element), batch; ``mp_prefetch`` worker processes. Grain's default read
    options (16 threads in each process)."""
    import grain

    from jaxfeed.loaders._doors.grain import mark_absl_flags_parsed

    rows = [records.record(i) for i in range(len(records))]
    ds = grain.MapDataset.source(rows).seed(seed).shuffle().repeat(None)
    ds = ds.random_map(_grain_augment).batch(batch_size).to_iter_dataset()
    if workers:
        mark_absl_flags_parsed()
        ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))
    iterator = iter(ds)
    try:
        yield from iterator
    finally:
        iterator.close()


def tf_native_augment(seed: int) -> Callable[[Any, Any], tuple[Any, Any]]:
    """tf.data's idiom's per-record function: ``(png, label) -> (image, label)``
    in native ops (decode, sampled crop, resize, flip, normalise), seeded from a
    ``tf.random.Generator`` (also timed alone by benchmarks/decode_cpu.py)."""
    from jaxfeed.loaders._doors.tf import import_tensorflow

    tf = import_tensorflow()
    generator = tf.random.Generator.from_seed(seed, alg="philox")
    mean, std = tf.constant(encoded.MEAN), tf.constant(encoded.STD)
    whole = tf.constant([[[0.0, 0.0, 1.0, 1.0]]])

    def augment(png: Any, label: Any) -> tuple[Any, Any]:
        seeds = generator.make_seeds(2)
        image = tf.io.decode_png(png, channels=3)
        begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
            tf.shape(image),
            whole,
            seed=seeds[:, 0],
            min_object_covered=0.0,
            aspect_ratio_range=encoded.RATIO,
            area_range=encoded.SCALE,
            max_attempts=10,
            use_image_if_no_bounding_boxes=True,
        )
        crop = tf.slice(image, begin, size)
        # tf's default, as users call it: no antialias, where Pillow's bilinear
        # filter widens when it shrinks (most crops here are enlarged).
        crop = tf.image.resize(crop, [encoded.CROP, encoded.CROP])
        crop = tf.image.stateless_random_flip_left_right(crop, seed=seeds[:, 1])
        return (crop / 255.0 - mean) / std, label

    return augment


def tf_data(records: Records, batch_size: int, seed: int, workers: int | str) -> Iterator[Batch]:
    """``from_tensor_slices`` over the PNG strings, shuffled each epoch, a
    ``map`` of native decode and ``tf.image`` ops seeded from a
    ``tf.random.Generator`` (TensorFlow's augmentation tutorial),
    ``num_parallel_calls`` = ``workers`` (0: sequential; `AUTO`: AUTOTUNE)."""
    from jaxfeed.loaders._doors.tf import import_tensorflow

    tf = import_tensorflow()
    augment = tf_native_augment(seed)
    calls = tf.data.AUTOTUNE if workers == AUTO else (workers or None)
    ds = tf.data.Dataset.from_tensor_slices((records.png, records.label))
    ds = ds.shuffle(len(records), seed=seed, reshuffle_each_iteration=True)
    ds = ds.map(augment, num_parallel_calls=calls).batch(batch_size).prefetch(tf.data.AUTOTUNE)
    while True:
        for image, label in ds.as_numpy_iterator():
            yield {"image": image, "label": label}


def tf_numpy_function(
    records: Records, batch_size: int, seed: int, workers: int
) -> Iterator[Batch]:
    """``from_tensor_slices`` over the PNG strings, shuffled each epoch, a
    ``map`` whose function calls `encoded.augment` on each record through
    ``tf.numpy_function`` (one numpy generator shared by the map's threads),
    ``num_parallel_calls`` = ``workers`` (0: sequential), ``batch``,
    ``prefetch(AUTOTUNE)``."""
    from jaxfeed.loaders._doors.tf import import_tensorflow

    tf = import_tensorflow()
    rng = np.random.default_rng(seed)

    def augment(png: bytes, label: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        out = encoded.augment({"png": png, "label": label}, rng)
        return out["image"], out["label"]

    def record(png: Any, label: Any) -> tuple[Any, Any]:
        image, label = tf.numpy_function(augment, [png, label], [tf.float32, tf.int32])
        return tf.ensure_shape(image, [encoded.CROP, encoded.CROP, 3]), tf.ensure_shape(label, [])

    ds = tf.data.Dataset.from_tensor_slices((records.png, records.label))
    ds = ds.shuffle(len(records), seed=seed, reshuffle_each_iteration=True)
    ds = ds.map(record, num_parallel_calls=workers or None)
    ds = ds.batch(batch_size).prefetch(tf.data.AUTOTUNE)
    while True:
        for image, label in ds.as_numpy_iterator():
            yield {"image": image, "label": label}


@dataclasses.dataclass(frozen=True)
class Idiom:
    """One framework's pipeline: its row name, what it is, and how to run it."""

    name: str
    description: str
    stream: Callable[..., Iterator[Batch]]
    workers: Callable[[Sequence[int]], list[int | str]]


def _given(counts: Sequence[int]) -> list[int | str]:
    return list(counts)


IDIOMS: dict[str, Idiom] = {
    "numpy": Idiom(
        "python-loop",
        "plain Python: augment each record, np.stack (one process; the numpy reference)",
        python_loop,
        lambda counts: [0] if 0 in counts else [],
    ),
    "torch": Idiom(
        "torch-dataloader",
        "map-style Dataset decoding with Pillow, DataLoader(num_workers, spawn, persistent)",
        torch_dataloader,
        _given,
    ),
    "tf": Idiom(
        "tf-data",
        "tf.data: tf.io.decode_png + tf.image crop/resize/flip in map(num_parallel_calls)",
        tf_data,
        lambda counts: [*counts, AUTO],
    ),
    "grain": Idiom(
        "grain-mapdataset",
        "Grain MapDataset.random_map(augment).batch, mp_prefetch(num_workers)",
        grain_mapdataset,
        _given,
    ),
    "hf": Idiom(
        "hf-with-transform",
        "datasets.Dataset (binary column).with_transform; workers: torch DataLoader over it",
        hf_with_transform,
        _given,
    ),
}

SAME_TRANSFORM: dict[str, Idiom] = {
    "tf": Idiom(
        "tf-numpy-function",
        "tf.data: the same Python augment in tf.numpy_function in map(num_parallel_calls)",
        tf_numpy_function,
        _given,
    ),
}
"""Rows beside a framework's idiom whose pipeline is the framework's, but whose
per-record work is jaxfeed's transform, where the idiom does other work (tf:
native ops): the framework's own cost of the same Python. Not what ``vs
idiom`` compares with."""

"""Each framework's own reader of the user's files, doing the decode
workload's per-record work: the pipeline a user of that framework writes
today for the format, without jaxfeed (`jaxfeed compare --dataset DIR` and
benchmarks/formats.py both measure jaxfeed beside these).

- TFRecord: tf.data ``TFRecordDataset`` -> ``parse_single_example`` -> the
  augment in ``tf.numpy_function``;
- ArrayRecord: Grain's ``ArrayRecordDataSource`` + ``MapDataset``;
- Parquet: ``datasets.load_dataset("parquet")`` + ``with_transform``;
- image folder: a torch ``Dataset`` over the files in a ``DataLoader``.

The files hold an ``image`` field of encoded bytes and a ``label``; the
record work is `augment_image` (`encoded.augment` on that field). Each
reader reads its files in order (no shuffle: the framework's plain reading),
in this process, and is an endless stream of numpy batches ``{"image":
float32 [B, 56, 56, 3], "label": int32 [B]}`` (a short batch ends each epoch).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
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


def own_reader(found: Found, batch_size: int, seed: int) -> Iterator[Batch]:
    """The endless stream of ``found``'s framework's own reader (`READERS`).

    Raises:
      ValueError: a format no framework reader is listed for.
    """
    readers: dict[str, Callable[..., Iterator[Batch]]] = {
        "tfrecord": _tfrecord,
        "arrayrecord": _arrayrecord,
        "parquet": _parquet,
        "imagefolder": _imagefolder,
    }
    if found.format not in readers:
        raise ValueError(f"no framework reader is compared for {found.format!r} files")
    return readers[found.format](found, batch_size, np.random.default_rng(seed))


def _tfrecord(found: Found, batch_size: int, rng: np.random.Generator) -> Iterator[Batch]:
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
    ds = tf.data.TFRecordDataset(files, "GZIP" if gzip else None).map(parse).batch(batch_size)
    for image, label in ds.repeat():
        yield {"image": image.numpy(), "label": label.numpy()}


def _arrayrecord(found: Found, batch_size: int, rng: np.random.Generator) -> Iterator[Batch]:
    import grain

    from jaxfeed.loaders.data.formats.example import parse_example

    source = grain.sources.ArrayRecordDataSource([str(p) for p in found.files])

    def decode(record: bytes) -> dict[str, np.ndarray]:
        row = parse_example(record)  # name -> (kind, values)
        return augment_image({"image": row["image"][1][0], "label": row["label"][1][0]}, rng)

    dataset = grain.MapDataset.source(source).map(decode).batch(batch_size)
    while True:
        yield from iter(dataset)


def _parquet(found: Found, batch_size: int, rng: np.random.Generator) -> Iterator[Batch]:
    import datasets

    files = [str(p) for p in found.files]
    ds = datasets.load_dataset("parquet", data_files=files, split="train")

    def transform(batch: dict[str, list]) -> dict[str, list]:
        outs = [
            augment_image({"image": image, "label": label}, rng)
            for image, label in zip(batch["image"], batch["label"], strict=True)
        ]
        return {"image": [o["image"] for o in outs], "label": [o["label"] for o in outs]}

    ds = ds.with_transform(transform)
    while True:
        for start in range(0, len(ds), batch_size):
            rows = ds[start : start + batch_size]
            yield {"image": np.stack(rows["image"]), "label": np.asarray(rows["label"], np.int32)}


def _imagefolder(found: Found, batch_size: int, rng: np.random.Generator) -> Iterator[Batch]:
    import torch.utils.data as torch_data

    root, classes = found.files[0], list(found.classes)
    files = [
        (path, index)
        for index, name in enumerate(classes)
        for path in sorted(p for p in (root / name).rglob("*") if p.is_file())
    ]

    class Folder(torch_data.Dataset):
        def __len__(self) -> int:
            return len(files)

        def __getitem__(self, i: int) -> tuple[np.ndarray, np.int32]:
            path, label = files[i]
            out = augment_image({"image": path.read_bytes(), "label": label}, rng)
            return out["image"], out["label"]

    loader = torch_data.DataLoader(Folder(), batch_size=batch_size)
    while True:
        for image, label in loader:
            yield {"image": image.numpy(), "label": label.numpy().astype(np.int32)}

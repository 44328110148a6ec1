"""``jaxfeed compare --workload sequences``: rows of different lengths.

The paragraphs of CPython's docs as byte tokens (`corpus`), batched by every
jaxfeed backend with ``pad=``, ``bucket=`` and ``pack=``, each backend's rows
followed by its framework's own way of batching the same rows (`idioms`).
Rows are measured in turn within each repeat (`jaxfeed.compare.runner`).

One measurement opens a fresh pipeline and reads epoch 0 (time to its first
batch; the rest untimed, hashed for jaxfeed rows), then `TIMED_EPOCHS` epochs
timed. Over every batch read it counts real tokens, padded places and the
distinct batch shapes (each one a compile of a jitted step); peak memory
throughout. Loader figures only: no step runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from jaxfeed import loaders
from jaxfeed.compare import processes
from jaxfeed.compare.runner import medians
from jaxfeed.compare.workloads.sequences import corpus
from jaxfeed.compare.workloads.sequences.idioms import IDIOMS, Batch, Epochs, Plan

TIMED_EPOCHS = 2
LAYOUTS = ("pad", "bucket", "pack")


@dataclasses.dataclass(frozen=True)
class SequencesConfig:
    """What `Sequences` measures; the fields mirror the ``jaxfeed compare`` flags."""

    backends: tuple[str, ...]
    batch_size: int = 128
    seed: int = 0
    repeats: int = 3
    warmup: int = 1
    max_batches: int | None = None  # per epoch
    idioms: bool = True


@dataclasses.dataclass
class Pipeline:
    """One row: a jaxfeed backend with one layout, or a framework's idiom."""

    backend: str
    name: str  # "jaxfeed" or the idiom's name
    layout: str
    description: str
    open: Callable[[], tuple[Epochs, Callable[[], None]]]  # -> (epochs, close)
    runs: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def kind(self) -> str:
        return "jaxfeed" if self.name == "jaxfeed" else "idiom"

    @property
    def label(self) -> str:
        return f"{self.backend} {self.name} {self.layout}"


def layouts(plan: Plan) -> dict[str, tuple[dict[str, Any], str]]:
    """jaxfeed's layouts: ``make``'s keyword, and the layout in words."""
    buckets = ",".join(map(str, plan.buckets))
    return {
        "pad": ({"pad": plan.length}, f"pad {plan.length}"),
        "bucket": ({"bucket": plan.buckets}, f"bucket {buckets}"),
        "pack": ({"pack": plan.length}, f"pack {plan.length} best-fit"),
    }


def pipelines(config: SequencesConfig, rows: list[np.ndarray], plan: Plan) -> list[Pipeline]:
    """Every row: each backend's three layouts, then its framework's idioms."""
    out = []
    for backend in config.backends:
        for name, (layout, words) in layouts(plan).items():

            def open_source(backend: str = backend, layout: dict = layout) -> tuple:
                source = loaders.make(
                    backend,
                    dataset={"input_ids": rows},
                    batch_size=config.batch_size,
                    seed=config.seed,
                    **layout,
                )
                return source.iter_epoch, getattr(source, "close", _nothing)

            what = f"jaxfeed.make({backend!r}, {name}={next(iter(layout.values()))})"
            out.append(Pipeline(backend, "jaxfeed", words, what, open_source))
        for idiom in IDIOMS.get(backend, ()) if config.idioms else ():
            words = idiom.layout
            if words == "bucket":
                words = layouts(plan)["bucket"][1]
            elif words.startswith("pack"):
                words = f"pack {plan.length} {words.split()[1]}"

            def open_idiom(idiom: Any = idiom) -> tuple:
                return idiom.open(rows, plan), _nothing

            out.append(Pipeline(backend, idiom.name, words, idiom.description, open_idiom))
    return out


def _nothing() -> None:
    pass


@dataclasses.dataclass
class Tally:
    """What a stretch of batches held: real tokens (ids > 0), places, shapes."""

    batches: int = 0
    tokens: int = 0
    places: int = 0
    shapes: set[tuple[int, ...]] = dataclasses.field(default_factory=set)

    def add(self, batch: Batch) -> None:
        ids = batch["input_ids"]
        self.batches += 1
        self.tokens += int(np.count_nonzero(ids))
        self.places += ids.size
        self.shapes.add(ids.shape)


def digest_of(batch: Batch, into: Any) -> None:
    """Adds every field of ``batch`` (names, dtypes, shapes, bytes) to a hash."""
    for key in sorted(batch):
        value = np.ascontiguousarray(batch[key])
        into.update(f"{key}{value.dtype}{value.shape}".encode())
        into.update(value.tobytes())


def read(batches: Iterator[Batch], limit: int | None, tally: Any = None, digest: Any = None) -> int:
    """Reads up to ``limit`` of ``batches`` into ``tally`` (and ``digest``), then
    closes them (where they can be closed); returns how many it read."""
    n = 0
    try:
        for batch in itertools.islice(batches, limit):
            n += 1
            if tally is not None:
                tally.add(batch)
            if digest is not None:
                digest_of(batch, digest)
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()
    return n


def measure(row: Pipeline, limit: int | None, warm_up: bool) -> dict[str, Any]:
    """One measurement (see the module); a warm-up reads only the first batch."""
    figures: dict[str, Any] = {}
    with processes.PeakMemory() as memory:
        started = time.perf_counter()
        epochs, close = row.open()
        try:
            first_epoch = epochs(0)
            first = next(first_epoch)
            figures["first_batch_s"] = time.perf_counter() - started
            if warm_up:
                first_epoch.close()
                return figures
            tally = Tally()
            digest = hashlib.sha256() if row.kind == "jaxfeed" else None
            tally.add(first)
            if digest is not None:
                digest_of(first, digest)
            read(first_epoch, None if limit is None else limit - 1, tally, digest)
            before, cpu = tally.tokens, processes.cpu_seconds()
            started = time.perf_counter()
            for epoch in range(1, 1 + TIMED_EPOCHS):
                read(epochs(epoch), limit, tally)
            seconds = time.perf_counter() - started
            cpu = processes.cpu_seconds() - cpu
            memory.sample()
        finally:
            close()
    figures |= {
        "timed_s": seconds,
        "tokens_per_s": (tally.tokens - before) / seconds,
        "cores_busy": cpu / seconds,
        "tokens": tally.tokens,
        "batches": tally.batches,
        "padding_fraction": 1 - tally.tokens / tally.places,
        "shapes": len(tally.shapes),
        "shape_list": sorted(tally.shapes),
    }
    if digest is not None:
        figures["digest"] = digest.hexdigest()
    if memory.supported:
        figures["peak_mb"] = memory.total_mb
        figures["peak_added_mb"] = memory.added_mb
    return figures


class Sequences:
    """The sequences workload (a `jaxfeed.compare.runner.Workload`).

    Per row and repeat: ``first_batch_s``; over epoch 0 and `TIMED_EPOCHS`
    more (each cut to ``max_batches``): ``padding_fraction`` (padded places
    over all places of ``input_ids``), ``shapes`` (distinct ``input_ids``
    shapes), ``tokens``; over the timed epochs ``tokens_per_s`` (real tokens)
    and ``cores_busy`` (CPU seconds, workers included, per wall second);
    ``digest`` (jaxfeed rows: a hash of epoch 0's batches, every field);
    ``peak_mb`` (see `processes.PeakMemory`).
    """

    name = "sequences"

    def __init__(self, config: SequencesConfig, mesh: object = None):  # mesh: no step runs
        self.config = config
        self.warmup, self.repeats = config.warmup, config.repeats
        self.rows_ = corpus.token_rows()
        lengths = np.array([len(r) for r in self.rows_])
        buckets = loaders.Bucket().resolved(lengths).lengths
        self.plan = Plan(config.batch_size, config.seed, corpus.MAX_TOKENS, buckets)

    def rows(self) -> list[Pipeline]:
        return pipelines(self.config, self.rows_, self.plan)

    def schedule(self, rows: list[Pipeline], warm_up: bool) -> list[tuple[str, Pipeline]]:
        return [("pipeline", row) for row in rows]

    def measure(self, row: Pipeline, what: str, round_: int, warm_up: bool) -> dict[str, Any]:
        return measure(row, self.config.max_batches, warm_up)

    def result(self, rows: list[Pipeline], command: list[str], seconds: float) -> dict[str, Any]:
        lengths = np.array([len(r) for r in self.rows_])
        entries = [entry(row) for row in rows]
        return {
            "workload": "sequences",
            "command": command,
            "config": dataclasses.asdict(self.config),
            "dataset": {
                "name": f"pydoc_data.topics paragraphs (Python {platform.python_version()})",
                "rows": len(lengths),
                "tokens": int(lengths.sum()),
                "lengths": {
                    "min": int(lengths.min()),
                    "median": float(np.median(lengths)),
                    "max": int(lengths.max()),
                },
                "tokenizer": f"UTF-8 bytes + 1, cut to {corpus.MAX_TOKENS}",
            },
            "layouts": {name: words for name, (_, words) in layouts(self.plan).items()},
            "timed_epochs": TIMED_EPOCHS,
            "same_batches": same_batches(entries),
            "versions": {"loaders": loaders.available(), "numpy": np.__version__},
            "machine": {
                "cpu_count": os.cpu_count(),
                "platform": platform.platform(),
                "python": sys.version.split()[0],
            },
            "rows": entries,
            "notes": NOTES,
            "total_seconds": seconds,
        }


NOTES = {
    "padding_fraction": "places of input_ids holding no token, over every batch read "
    "(a jaxfeed batch keeps its static [B, L] shape, masked rows included; an idiom's "
    "last batch is shorter instead, another shape)",
    "shapes": "distinct input_ids shapes over every batch read: the compiles a jitted step does",
    "digest": "sha256 of every field of epoch 0's batches (jaxfeed rows): equal across "
    "backends for one layout",
    "peak_mb": "this process's peak RSS plus its workers' (see the decode workload's note)",
}


def same_batches(entries: list[dict[str, Any]]) -> dict[str, bool | None]:
    """For each jaxfeed layout: whether every backend gave the same batches in
    every repeat (None: fewer than two backends measured)."""
    out: dict[str, bool | None] = {}
    for layout in dict.fromkeys(e["layout"] for e in entries if e["pipeline"] == "jaxfeed"):
        rows = [e for e in entries if e["pipeline"] == "jaxfeed" and e["layout"] == layout]
        digests = {run.get("digest") for row in rows for run in row["runs"]}
        out[layout.split()[0]] = None if len(rows) < 2 else len(digests) == 1
    return out


def entry(row: Pipeline) -> dict[str, Any]:
    """A row's figures as the result lists them."""
    return {
        "backend": row.backend,
        "pipeline": row.name,
        "layout": row.layout,
        "kind": row.kind,
        "description": row.description,
        "runs": row.runs,
        "median": medians(row.runs),
    }

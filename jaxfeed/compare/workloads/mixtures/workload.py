"""``jaxfeed compare --workload mixtures``: several datasets in one stream by weight.

Two or more components (by default the embedded digits split into 0-4 and
5-9, weights 0.7 and 0.3; or ``--dataset A --dataset B --weights ...``)
mixed by every jaxfeed backend (`jaxfeed.Mixture`, an epoch ending when the
first component has been read once), beside each framework's own mixture
over the same arrays: Grain's ``MapDataset.mix``, tf.data's
``sample_from_datasets`` and Hugging Face's ``interleave_datasets``.

One measurement opens a fresh pipeline, reads epoch 0 (time to its first
batch; jaxfeed rows hashed), then `TIMED_EPOCHS` epochs timed. Over the
timed epochs it counts each component's rows from the batches themselves
(their ``component`` field), so the realized shares are what a step saw:
over all of them and over the last `WINDOW` batches, and how far the
largest gap from the asked weights is in binomial standard deviations.
Loader figures only: no step runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

import jaxfeed
from jaxfeed import loaders
from jaxfeed.compare.workloads.sequences.workload import (
    Pipeline,
    entry,
    read,
    same_batches,
)
from jaxfeed.loaders.data.remote import without_secrets
from jaxfeed.loaders.mixture_plan import COMPONENT

TIMED_EPOCHS = 2
WINDOW = 50
"""Batches of the last window whose shares are reported beside the whole."""
DEFAULT_WEIGHTS = (0.7, 0.3)

Batch = dict[str, np.ndarray]
Epochs = Callable[[int], Iterator[Batch]]


@dataclasses.dataclass(frozen=True)
class MixturesConfig:
    """What `Mixtures` measures; the fields mirror the ``jaxfeed compare`` flags.
    ``datasets`` empty: the embedded digits, split in two."""

    backends: tuple[str, ...]
    datasets: tuple[str, ...] = ()
    weights: tuple[float, ...] = DEFAULT_WEIGHTS
    data_dir: str | None = None
    storage_options: dict[str, Any] | None = None  # for the datasets' URLs, one store's
    batch_size: int = 128
    seed: int = 0
    repeats: int = 3
    warmup: int = 1
    max_batches: int | None = None  # per epoch
    idioms: bool = True


def components(config: MixturesConfig) -> dict[str, dict[str, np.ndarray]]:
    """name -> the component's arrays (in memory: every row reads the same)."""
    storage = config.storage_options
    if not config.datasets:  # (storage_options= refused there: it is no URL)
        digits = loaders.load_dataset("mnist-sample", "train", storage_options=storage).arrays
        low = np.asarray(digits["label"]) < 5
        return {
            "digits 0-4": {k: np.asarray(v)[low] for k, v in digits.items()},
            "digits 5-9": {k: np.asarray(v)[~low] for k, v in digits.items()},
        }
    out = {}
    for i, dataset in enumerate(config.datasets):
        data = loaders.load_dataset(
            dataset, "train", data_dir=config.data_dir, storage_options=storage
        )
        name = os.path.basename(dataset.rstrip("/")) or dataset
        out[name if name not in out else f"{name} {i + 1}"] = {
            k: np.asarray(v) for k, v in data.arrays.items()
        }
    return out


def pipelines(
    config: MixturesConfig, parts: Mapping[str, Mapping[str, np.ndarray]]
) -> list[Pipeline]:
    names, weights = list(parts), list(config.weights)
    mixture = jaxfeed.Mixture(
        dict(parts), weights=dict(zip(names, weights, strict=True)), until=names[0]
    )
    out = []
    for backend in config.backends:

        def open_source(backend: str = backend) -> tuple:
            source = loaders.make(
                backend, dataset=mixture, batch_size=config.batch_size, seed=config.seed
            )
            return source.iter_epoch, source.close

        what = f"jaxfeed.make({backend!r}, dataset=Mixture(..., until={names[0]!r}))"
        out.append(Pipeline(backend, "jaxfeed", "mixture", what, open_source))
        idiom = IDIOMS.get(backend) if config.idioms else None
        if idiom is not None:
            name, description, build = idiom

            def open_idiom(build: Any = build) -> tuple:
                return build(parts, weights, config), _nothing

            out.append(Pipeline(backend, name, "mixture", description, open_idiom))
    return out


def _nothing() -> None:
    pass


def _labelled(parts: Mapping[str, Mapping[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """Each component's arrays with its index as a ``component`` field (what
    a jaxfeed mixture adds), so an idiom's batches show their shares too."""
    return [
        {**arrays, COMPONENT: np.full(len(next(iter(arrays.values()))), c, np.int32)}
        for c, arrays in enumerate(parts.values())
    ]


def _epoch_rows(parts: Mapping[str, Mapping[str, np.ndarray]], weights: list[float]) -> int:
    """Rows of an epoch that ends when the first component has been read once."""
    first = len(next(iter(next(iter(parts.values())).values())))
    return round(first / (weights[0] / sum(weights)))


def _grain_mix(parts, weights, config) -> Epochs:
    import grain

    def epochs(epoch: int) -> Iterator[Batch]:
        sources = [
            grain.MapDataset.range(len(arrays[COMPONENT]))
            .shuffle(seed=config.seed + 1000 * epoch + c)
            .repeat()
            .map(lambda i, arrays=arrays: {k: v[i] for k, v in arrays.items()})
            for c, arrays in enumerate(_labelled(parts))
        ]
        mixed = grain.MapDataset.mix(sources, weights)
        rows = _epoch_rows(parts, weights)
        return iter(mixed[:rows].batch(config.batch_size))

    return epochs


def _tf_sample(parts, weights, config) -> Epochs:
    from jaxfeed.loaders._doors.tf import import_tensorflow

    tf = import_tensorflow()
    sources = [
        tf.data.Dataset.from_tensor_slices(arrays)
        .shuffle(len(arrays[COMPONENT]), seed=config.seed + c)
        .repeat()
        for c, arrays in enumerate(_labelled(parts))
    ]
    mixed = tf.data.Dataset.sample_from_datasets(sources, weights, seed=config.seed)
    ds = mixed.take(_epoch_rows(parts, weights)).batch(config.batch_size)

    def epochs(epoch: int) -> Iterator[Batch]:
        return ds.as_numpy_iterator()

    return epochs


def _hf_interleave(parts, weights, config) -> Epochs:
    import datasets

    def features(arrays: Mapping[str, np.ndarray]) -> Any:
        # Fixed-shape columns (as jaxfeed's hf backend writes): nested lists
        # read back ~50x slower through a shuffled table's index.
        return datasets.Features(
            {
                k: datasets.Value(str(v.dtype))
                if v.ndim == 1
                else getattr(datasets, f"Array{v.ndim - 1}D")(v.shape[1:], str(v.dtype))
                for k, v in arrays.items()
            }
        )

    tables = [datasets.Dataset.from_dict(a, features=features(a)) for a in _labelled(parts)]
    total = sum(weights)

    def epochs(epoch: int) -> Iterator[Batch]:
        mixed = datasets.interleave_datasets(
            [t.shuffle(seed=config.seed + 1000 * epoch + c) for c, t in enumerate(tables)],
            probabilities=[w / total for w in weights],
            seed=config.seed + epoch,
            stopping_strategy="all_exhausted",
        ).with_format("numpy")
        rows = min(len(mixed), _epoch_rows(parts, weights))
        return iter(mixed.select(range(rows)).iter(batch_size=config.batch_size))

    return epochs


IDIOMS = {
    "grain": ("grain-mix", "grain.MapDataset.mix over shuffled, repeated sources", _grain_mix),
    "tf": ("tf-sample", "tf.data.Dataset.sample_from_datasets, seeded", _tf_sample),
    "hf": ("hf-interleave", "datasets.interleave_datasets(probabilities=...)", _hf_interleave),
}


class Tally:
    """Rows of each component over a stretch of batches, and the last `WINDOW`'s."""

    def __init__(self, n: int):
        self.rows = np.zeros(n, np.int64)
        self.recent: list[np.ndarray] = []

    def add(self, batch: Batch) -> None:
        component = np.asarray(batch[COMPONENT])
        if loaders.MASK_KEY in batch:
            component = component[np.asarray(batch[loaders.MASK_KEY])]
        counts = np.bincount(component, minlength=len(self.rows))
        self.rows += counts
        self.recent = [*self.recent[-(WINDOW - 1) :], counts]


def measure(
    row: Pipeline, names: list[str], weights: np.ndarray, limit: int | None, warm_up: bool
) -> dict[str, Any]:
    """One measurement (see the module); a warm-up reads only the first batch."""
    figures: dict[str, Any] = {}
    started = time.perf_counter()
    epochs, close = row.open()
    try:
        first_epoch = epochs(0)
        next(first_epoch)
        figures["first_batch_s"] = time.perf_counter() - started
        if warm_up:
            read(first_epoch, 0)  # closes it, where it can be closed
            return figures
        digest = hashlib.sha256() if row.kind == "jaxfeed" else None
        read(first_epoch, None if limit is None else limit - 1, None, digest)
        tally = Tally(len(names))
        started = time.perf_counter()
        batches = sum(read(epochs(e), limit, tally) for e in range(1, 1 + TIMED_EPOCHS))
        seconds = time.perf_counter() - started
    finally:
        close()
    total = int(tally.rows.sum())
    shares = tally.rows / max(1, total)
    recent = np.sum(tally.recent, axis=0) if tally.recent else tally.rows
    sd = np.sqrt(weights * (1 - weights) / max(1, total))
    figures |= {
        "timed_s": seconds,
        "rows_per_s": total / seconds,
        "batches": batches,
        "rows": total,
        "largest_gap_sd": float(np.max(np.abs(shares - weights) / np.where(sd > 0, sd, math.inf))),
    }
    for name, share, last in zip(names, shares, recent / max(1, recent.sum()), strict=True):
        figures[f"share {name}"] = float(share)
        figures[f"last {WINDOW} share {name}"] = float(last)
    if digest is not None:
        figures["digest"] = digest.hexdigest()
    return figures


class Mixtures:
    """The mixtures workload (a `jaxfeed.compare.runner.Workload`); figures per
    row and repeat as the module says."""

    name = "mixtures"

    def __init__(self, config: MixturesConfig, mesh: object = None):  # mesh: no step runs
        self.config = config
        self.warmup, self.repeats = config.warmup, config.repeats
        self.parts = components(config)
        if len(config.weights) != len(self.parts):
            raise ValueError(
                f"{len(self.parts)} components and {len(config.weights)} weights: give "
                "one weight per dataset (weights=)"
            )
        self.names = list(self.parts)
        self.weights = np.array(config.weights) / sum(config.weights)

    def rows(self) -> list[Pipeline]:
        return pipelines(self.config, self.parts)

    def schedule(self, rows: list[Pipeline], warm_up: bool) -> list[tuple[str, Pipeline]]:
        return [("pipeline", row) for row in rows]

    def measure(self, row: Pipeline, what: str, round_: int, warm_up: bool) -> dict[str, Any]:
        return measure(row, self.names, self.weights, self.config.max_batches, warm_up)

    def result(self, rows: list[Pipeline], command: list[str], seconds: float) -> dict[str, Any]:
        entries = [entry(row) for row in rows]
        return {
            "workload": "mixtures",
            "command": command,
            "config": dataclasses.asdict(self.config)
            | {"storage_options": without_secrets(self.config.storage_options or {}) or None},
            "components": {
                name: {"rows": len(next(iter(arrays.values()))), "weight": float(w)}
                for (name, arrays), w in zip(self.parts.items(), self.weights, strict=True)
            },
            "window": WINDOW,
            "timed_epochs": TIMED_EPOCHS,
            "same_batches": same_batches(entries)["mixture"],
            "versions": {"loaders": loaders.available(), "numpy": np.__version__},
            "machine": {
                "cpu_count": os.cpu_count(),
                "platform": platform.platform(),
                "python": sys.version.split()[0],
            },
            "rows": entries,
            "total_seconds": seconds,
        }

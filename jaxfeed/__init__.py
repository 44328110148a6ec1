"""jaxfeed: any Python data loader feeding NamedSharding-placed `jax.Array`s to a JAX step.

One import root for the whole public API::

    import jaxfeed
    source = jaxfeed.make("grain", dataset="mnist-sample", batch_size=64)
    source = jaxfeed.wrap(my_torch_dataloader)          # or your own loader
    feed = jaxfeed.DeviceFeed(source, jaxfeed.data_mesh())
    result = jaxfeed.fit(step, state, source, epochs=3)

Three packages, dependencies pointing one way (``jaxfeed`` -> ``sharding`` ->
``loaders``): `jaxfeed.loaders` (every loader behind one `BatchSource`
protocol; never touches a device), `jaxfeed.sharding` (placement and the
prefetching `DeviceFeed`), and this package's training loop (`fit`,
checkpoints). The MNIST example model lives in `jaxfeed.mnist`.

Names are imported on first use, so ``import jaxfeed.loaders`` stays free of
JAX and of every loader framework.
"""

# ruff: noqa: F401  (the TYPE_CHECKING imports are for type checkers; names resolve in __getattr__)
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> module that defines it (one spelling per name).
_EXPORTS = {
    "jaxfeed.loaders": (
        "BACKENDS",
        "DATASETS",
        "MASK_KEY",
        "ArrayDataset",
        "ArraySpec",
        "Batch",
        "BatchSource",
        "HostFields",
        "ProcessSlice",
        "Resumable",
        "Sampler",
        "SkipsDataState",
        "available",
        "load_dataset",
        "make",
        "wrap",
    ),
    "jaxfeed.sharding": (
        "DATA_AXIS",
        "DeviceFeed",
        "announce_failure",
        "batch_sharding",
        "check_agreement",
        "data_mesh",
        "initialize",
        "place_batch",
    ),
    "jaxfeed.checkpoint": ("CheckpointError", "Checkpointing", "TopologyChangedWarning"),
    "jaxfeed.interrupts": ("Preempted",),
    "jaxfeed.loop": ("FitResult", "NonFiniteMetric", "batch_mask", "evaluate_metrics", "fit"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
_SUBPACKAGES = ("loaders", "sharding", "mnist")

__all__ = sorted(_WHERE)

if TYPE_CHECKING:
    from jaxfeed.checkpoint import CheckpointError, Checkpointing, TopologyChangedWarning
    from jaxfeed.interrupts import Preempted
    from jaxfeed.loaders import (
        BACKENDS,
        DATASETS,
        MASK_KEY,
        ArrayDataset,
        ArraySpec,
        Batch,
        BatchSource,
        HostFields,
        ProcessSlice,
        Resumable,
        Sampler,
        SkipsDataState,
        available,
        load_dataset,
        make,
        wrap,
    )
    from jaxfeed.loop import FitResult, NonFiniteMetric, batch_mask, evaluate_metrics, fit
    from jaxfeed.sharding import (
        DATA_AXIS,
        DeviceFeed,
        announce_failure,
        batch_sharding,
        check_agreement,
        data_mesh,
        initialize,
        place_batch,
    )


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
    elif name in _SUBPACKAGES:
        value = importlib.import_module(f"jaxfeed.{name}")
    else:
        raise AttributeError(f"module 'jaxfeed' has no attribute {name!r}")
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, *_SUBPACKAGES})

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
checkpoints). The MNIST example model lives in `jaxfeed.mnist`; `jaxfeed.nnx`
runs Flax NNX steps in `fit` (and imports Flax only when a step is traced).

Names are imported on first use, so ``import jaxfeed.loaders`` stays free of
JAX and of every loader framework.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Public names are those of the two packages' __all__, and these of the library
# on top (name -> its module). Each name has one spelling: jaxfeed.make is
# jaxfeed.loaders.make.
_PACKAGES = ("jaxfeed.loaders", "jaxfeed.sharding")  # loaders first: it imports no JAX
_LIBRARY = {
    "CheckpointError": "jaxfeed.checkpoint",
    "Checkpointing": "jaxfeed.checkpoint",
    "TopologyChangedWarning": "jaxfeed.checkpoint",
    "Preempted": "jaxfeed.interrupts",
    "FitResult": "jaxfeed.loop",
    "NonFiniteMetric": "jaxfeed.loop",
    "batch_mask": "jaxfeed.loop",
    "evaluate_metrics": "jaxfeed.loop",
    "fit": "jaxfeed.loop",
    "keras_data": "jaxfeed.keras_bridge",
}
_SUBPACKAGES = ("loaders", "sharding", "mnist", "nnx")

if TYPE_CHECKING:  # what type checkers see; at run time __getattr__ imports on first use
    from jaxfeed.checkpoint import (  # noqa: F401
        CheckpointError,
        Checkpointing,
        TopologyChangedWarning,
    )
    from jaxfeed.interrupts import Preempted  # noqa: F401
    from jaxfeed.keras_bridge import keras_data  # noqa: F401
    from jaxfeed.loaders import *  # noqa: F403
    from jaxfeed.loop import (  # noqa: F401
        FitResult,
        NonFiniteMetric,
        batch_mask,
        evaluate_metrics,
        fit,
    )
    from jaxfeed.sharding import *  # noqa: F403


def _home(name: str) -> str | None:
    """The module that defines public ``name``, or None."""
    if name in _LIBRARY:
        return _LIBRARY[name]
    return next((p for p in _PACKAGES if name in importlib.import_module(p).__all__), None)


def __getattr__(name: str) -> Any:
    if name == "__all__":
        value = sorted(
            [*_LIBRARY, *(n for p in _PACKAGES for n in importlib.import_module(p).__all__)]
        )
    elif name in _SUBPACKAGES:
        value = importlib.import_module(f"jaxfeed.{name}")
    elif name.startswith("__") or (home := _home(name)) is None:  # (dunders: Python's probes)
        raise AttributeError(f"module 'jaxfeed' has no attribute {name!r}")
    else:
        value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__getattr__("__all__"), *_SUBPACKAGES})

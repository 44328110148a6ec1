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
prefetching `DeviceFeed`), and this package: the training loop
(`jaxfeed.training`: `fit`, checkpoints), the ``jaxfeed`` command
(`jaxfeed.cli`) and the bridges: `jaxfeed.nnx` runs Flax NNX steps in `fit`
(and imports Flax only when a step is traced), `keras_data` feeds Keras 3's
``model.fit``. The MNIST example model lives in `jaxfeed.mnist`.

Names are imported on first use, so ``import jaxfeed.loaders`` stays free of
JAX and of every loader framework.

- `training`: `fit`, checkpoints, signals.
- `mnist`: the example model.
- `textlm`: the second example, a Transformer LM on packed text.
- `nnx`: Flax NNX steps in `fit`.
- `keras`: `keras_data`, any `BatchSource` for Keras 3's ``model.fit``.
- `compare`: ``jaxfeed compare``.
- `cli`: the ``jaxfeed`` command.
- `__main__`: ``python -m jaxfeed``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Public names are those of these packages' __all__ (loaders first: it imports
# no JAX; training's face imports its modules on first use), and keras_data.
# Each name has one spelling: jaxfeed.make is jaxfeed.loaders.make.
_PACKAGES = ("jaxfeed.loaders", "jaxfeed.training", "jaxfeed.sharding")
_LIBRARY = {"keras_data": "jaxfeed.keras"}
_SUBPACKAGES = ("loaders", "sharding", "mnist", "nnx", "textlm")

if TYPE_CHECKING:  # what type checkers see; at run time __getattr__ imports on first use
    from jaxfeed.keras import keras_data  # noqa: F401
    from jaxfeed.loaders import *  # noqa: F403
    from jaxfeed.sharding import *  # noqa: F403
    from jaxfeed.training.callbacks import Callback  # noqa: F401
    from jaxfeed.training.checkpoint import (  # noqa: F401
        CheckpointError,
        Checkpointing,
        TopologyChangedWarning,
    )
    from jaxfeed.training.interrupts import Preempted  # noqa: F401
    from jaxfeed.training.log import Logging  # noqa: F401
    from jaxfeed.training.loop import FitResult, fit  # noqa: F401
    from jaxfeed.training.run import NonFiniteMetric  # noqa: F401
    from jaxfeed.training.steps import batch_mask, evaluate_metrics  # noqa: F401


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

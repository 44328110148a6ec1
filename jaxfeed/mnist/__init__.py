"""The example: the JAX tutorial's MNIST MLP (784-512-512-10) and its `train`.

What ``jaxfeed train`` runs. A model of your own uses `jaxfeed.fit` with its
own step instead; nothing in the library assumes MNIST.

- `model`: the MLP (`init_params`, `predict`, `LAYER_SIZES`).
- `train`: `train`, `evaluate` and `TrainConfig`, one short user of `fit`.
"""

from jaxfeed.mnist.model import LAYER_SIZES, init_params, predict
from jaxfeed.mnist.train import TrainConfig, evaluate, train

__all__ = ["LAYER_SIZES", "TrainConfig", "evaluate", "init_params", "predict", "train"]

"""jaxfeed, the application: the training loop, the MNIST MLP, the CLI and ``jaxfeed compare``.

The library it is built on is the two packages beside it: ``loaders`` (every
loader behind one `BatchSource` protocol) and ``sharding`` (placement and the
prefetching `DeviceFeed`).
"""

from jaxfeed.model import LAYER_SIZES, init_params, predict
from jaxfeed.train import TrainConfig, evaluate, train

__all__ = ["LAYER_SIZES", "TrainConfig", "evaluate", "init_params", "predict", "train"]

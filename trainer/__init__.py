"""jaxfeed trainer: the common MNIST MLP and its training loop."""

from trainer.model import LAYER_SIZES, init_params, predict
from trainer.train import TrainConfig, evaluate, train

__all__ = ["LAYER_SIZES", "TrainConfig", "evaluate", "init_params", "predict", "train"]

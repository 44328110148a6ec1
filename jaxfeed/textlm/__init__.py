"""The second example: a small Transformer language model on real text, trained on
packed variable-length rows (docs/text.md).

Needs the ``text`` extra (tokenizers) and Flax; ``import jaxfeed`` imports neither.

- `corpus`: CPython's own documentation as rows of BPE token ids (`load_corpus`).
- `model`: the segment-aware Transformer (`TransformerLM`, `ModelConfig`, `loss_sums`).
- `train`: `train` and `TrainConfig`, one short user of `fit` with an NNX step.
"""

from jaxfeed.textlm.corpus import load_corpus
from jaxfeed.textlm.model import ModelConfig, TransformerLM, attention_mask, loss_sums
from jaxfeed.textlm.train import TrainConfig, train

__all__ = [
    "ModelConfig",
    "TrainConfig",
    "TransformerLM",
    "attention_mask",
    "load_corpus",
    "loss_sums",
    "train",
]

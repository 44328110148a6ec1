"""jaxfeed loaders: every data loader behind one `BatchSource` protocol.

Importing this package imports none of torch, tensorflow, grain or datasets;
each backend imports its framework only when it is used.
"""

from loaders.datasets import DATASETS, ArrayDataset, load_dataset
from loaders.protocol import ArraySpec, Batch, BatchSource
from loaders.registry import BACKENDS, available, make
from loaders.sampler import Sampler
from loaders.wrap import wrap

__all__ = [
    "BACKENDS",
    "DATASETS",
    "ArrayDataset",
    "ArraySpec",
    "Batch",
    "BatchSource",
    "Sampler",
    "available",
    "load_dataset",
    "make",
    "wrap",
]

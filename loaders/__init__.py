"""jaxfeed loaders: every data loader behind one `BatchSource` protocol.

Importing this package imports none of torch, tensorflow, grain or datasets;
each backend imports its framework only when it is used.
"""

from jaxfeed.loaders.backends.registry import BACKENDS, available, make
from jaxfeed.loaders.bytes_field import BytesField
from jaxfeed.loaders.data.catalog import DATASETS, ArrayDataset, load_dataset
from jaxfeed.loaders.protocol import (
    MASK_KEY,
    ArraySpec,
    Batch,
    BatchSource,
    HostFields,
    ProcessSlice,
    Resumable,
    SkipsDataState,
)
from jaxfeed.loaders.sampler import Sampler
from jaxfeed.loaders.transform import TransformError
from jaxfeed.loaders.wrapping.wrapped_source import wrap

__all__ = [
    "BACKENDS",
    "DATASETS",
    "ArrayDataset",
    "ArraySpec",
    "Batch",
    "BatchSource",
    "BytesField",
    "HostFields",
    "MASK_KEY",
    "ProcessSlice",
    "Resumable",
    "SkipsDataState",
    "Sampler",
    "TransformError",
    "available",
    "load_dataset",
    "make",
    "wrap",
]

"""jaxfeed loaders: every data loader behind one `BatchSource` protocol.

Importing this package imports none of torch, tensorflow, grain or datasets;
each backend imports its framework only when it is used.

Its public face is this module's ``__all__``; the modules under it are
internal (docs/architecture.md says which room is which):

- `protocol`: `BatchSource`, `ArraySpec`, `MASK_KEY` and the optional protocols.
- `sampler`: the seeded `Sampler` every backend and random-access wrap shares.
- `checks`: the checks of user input shared by backends, `wrap` and the sampler.
- `array_dataset`: `ArrayDataset`, named arrays with one row axis.
- `bytes_field`: `BytesField`, encoded bytes per row.
- `ragged_field`: `RaggedField`, rows of numbers of different lengths.
- `remote_field`: `RemoteField`, a field whose rows are read from a store as asked for.
- `sequence_plan`: `Pad`, `Bucket`, `Pack`: static batches of such rows.
- `mixture_plan`: `Mixture`: several datasets in one stream by weight.
- `host_fields`: fields carried with each batch as host numpy.
- `transform`: the per-record transform contract.
- `row_generators`: each row's ``default_rng((seed, epoch, row))``.
- `rows`: `ArrayRows`, the one reader of named arrays' rows.
- `data`: datasets and the user's files.
- `backends`: `make` and one module per framework.
- `wrapping`: `wrap` and one module per kind of loader.
- `_io`: file and memory-map I/O.
- `_doors`: one door per library whose private names jaxfeed touches.
- `_workers`: processes and threads.
"""

from jaxfeed.loaders.backends.registry import BACKENDS, available, make
from jaxfeed.loaders.bytes_field import BytesField
from jaxfeed.loaders.data.catalog import DATASETS, ArrayDataset, load_dataset
from jaxfeed.loaders.mixture_plan import Mixture
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
from jaxfeed.loaders.ragged_field import RaggedField
from jaxfeed.loaders.sampler import Sampler
from jaxfeed.loaders.sequence_plan import Bucket, Pack, Pad
from jaxfeed.loaders.transform import TransformError
from jaxfeed.loaders.wrapping.wrapped_source import wrap

__all__ = [
    "ArrayDataset",
    "ArraySpec",
    "BACKENDS",
    "Batch",
    "BatchSource",
    "Bucket",
    "BytesField",
    "DATASETS",
    "HostFields",
    "MASK_KEY",
    "Mixture",
    "Pack",
    "Pad",
    "ProcessSlice",
    "RaggedField",
    "Resumable",
    "Sampler",
    "SkipsDataState",
    "TransformError",
    "available",
    "load_dataset",
    "make",
    "wrap",
]

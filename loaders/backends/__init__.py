"""`make()`: the built-in backends, looked up by name in one registry.

Each backend reads the same `ArrayDataset` in the shared `Sampler`'s order and
imports its framework only when it is used. Its modules are internal.

- `registry`: the backends by name, imported lazily; `make` and `available`.
- `sampled_source`: what every backend shares (batches in the sampler's order).
- `sequence_source`: variable-length rows padded, bucketed or packed through any backend.
- `mixture_source`: several datasets in one stream by weight, through any backend.
- `mixed_sequences`: a mixture of token corpora, padded, bucketed or packed.
- `numpy`, `torch`, `tf`, `grain`, `hf`: one module per framework.
- `ray`: Ray tasks on a cluster.
- `tfds_store`: the TFDS-format cache the tf backend reads.
"""

from jaxfeed.loaders.backends.registry import BACKENDS, Backend, available, make

__all__ = ["BACKENDS", "Backend", "available", "make"]

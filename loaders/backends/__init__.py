"""`make()`: the built-in backends, looked up by name in one registry.

One module per framework (`numpy`, `torch`, `tf`, `grain`, `hf`, `ray`), each reading
the same `ArrayDataset` in the shared `Sampler`'s order; `sampled_source`
holds what they share and `tfds_store` the TFDS-format cache. A backend
module imports its framework only when it is used.
"""

from jaxfeed.loaders.backends.registry import BACKENDS, Backend, available, make

__all__ = ["BACKENDS", "Backend", "available", "make"]

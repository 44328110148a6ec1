"""One door per library (internal): every private name of another library
that jaxfeed reads, writes or overrides, and every quirk it works around, as a
small named function.

Each function names the versions it was checked against, and
``tests/loaders/doors/`` calls each on a real object of that library, so an
upgrade that moves what it touches fails there, with the library's name and
version, instead of somewhere inside a loader. No module imports its library
at top level; a door may use `jaxfeed.loaders._io` and nothing else of jaxfeed.

- `grain`: Grain.
- `tf`: TensorFlow and TFDS.
- `hf`: Hugging Face ``datasets``.
- `torch`: PyTorch.
- `ray`: Ray.
- `jax`: JAX.
- `keras`: Keras 3.
- `fsspec`: fsspec and the object stores behind it.
- `multiprocessing`: the standard library's process start and pools.
"""

__all__: list[str] = []  # internal: nothing here is public

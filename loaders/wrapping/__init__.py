"""`wrap()`: a user's own loader (torch, tf.data, Grain, HF, Ray, plain Python)
as a `BatchSource`. Its modules are internal.

- `wrapped_source`: `wrap` and `WrappedSource`, what the kinds yield as
  protocol batches.
- `kinds`: what was passed, told by class name without importing a framework.
- `torch`, `tf`, `grain`, `hf`, `ray`, `python`: one module per kind of object.
- `random_access`: random-access objects read in the sampler's order.
- `streams`, `stream_state`: streams read, and their resume state.
- `state_json`: stream states as JSON.
- `raw_batches`: each batch flattened and checked.
- `epochs`: what every kind's adapter returns (`Epochs`, `WrapSettings`).
- `seeded`: the global generators seeded per batch while a loader's own code
  reads it.
- `numpy_collate`: torch's ``default_collate`` of numpy records, made in numpy.
"""

from jaxfeed.loaders.wrapping.wrapped_source import WrappedSource, wrap

__all__ = ["WrappedSource", "wrap"]

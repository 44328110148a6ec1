"""`wrap()`: a user's own loader (torch, tf.data, Grain, HF, plain Python) as a `BatchSource`.

`kinds` recognises what was passed (by class name, never importing a
framework), one module per framework reads it (`torch`, `tf`, `grain`, `hf`,
`python`), and `wrapped_source` turns what they yield into protocol batches.
"""

from jaxfeed.loaders.wrapping.wrapped_source import WrappedSource, wrap

__all__ = ["WrappedSource", "wrap"]

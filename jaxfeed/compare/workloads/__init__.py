"""The workloads of `jaxfeed compare`, each a `jaxfeed.compare.runner.Workload`.

- `copy`: (the default) decoded digits, every backend beside the in-memory
  ceiling, each framework's tutorial loop and the user's own loader.
- `decode`: PNG digits decoded and augmented per record, per worker count,
  beside each framework's own pipeline.
- `sequences`: text rows of different lengths padded, bucketed and packed on
  every backend, beside each framework's own text idiom.
- `mixtures`: datasets mixed by weight on every backend, beside each
  framework's own mixture, with the shares each realized.
"""

__all__: list[str] = []  # internal: nothing here is public

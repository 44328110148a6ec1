"""The decode workload (``jaxfeed compare --workload decode``): PNG digits
decoded and augmented per record, per worker count, each jaxfeed backend
beside its framework's own pipeline.

- `workload`: its rows and how one is measured.
- `report`: its targets checked and rendered.
- `rows`: what one row (a pipeline) opens.
- `idioms`: each framework's own pipeline.
- `own_readers`: each framework's own reader of the user's files.
"""

__all__: list[str] = []  # internal: nothing here is public

"""The sequences workload (``jaxfeed compare --workload sequences``): real
text of different lengths padded, bucketed and packed by every jaxfeed
backend, beside each framework's own way of batching it.

- `corpus`: the text (CPython's own docs) and its byte tokens.
- `idioms`: each framework's own padding, bucketing or packing.
- `workload`: its rows and how one is measured.
- `report`: its table.
"""

__all__: list[str] = []  # internal: nothing here is public

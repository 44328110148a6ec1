"""`jaxfeed compare`: loaders measured side by side on the same work. Its public
face is the command (docs/compare.md); its modules are internal.

- `runner`: a workload's rows run interleaved, every repeat kept.
- `workloads`: the plug-ins (``copy``, ``decode``).
- `report`: tables, target lines and the plot.
- `processes`: CPU and peak memory, worker processes included.
- `training`: what both workloads' trainings share.
"""

__all__: list[str] = []  # internal: nothing here is public

"""The training loop and what it stands on. Its public names are re-exported
by `jaxfeed` (``jaxfeed.fit``, ...); its modules are internal.

- `loop`: `fit` and `FitResult`.
- `run`: `TrainingRun`, one run between its steps.
- `steps`: the step contract, `batch_mask` and `evaluate_metrics`.
- `checkpoint`: `Checkpointing` and the Orbax checkpoints.
- `verify`: what a checkpoint is checked against before it is trusted.
- `interrupts`: Ctrl-C and SIGTERM stop a run at a step.
- `callbacks`: `Callback`.
- `padding_check`: the warning for a step whose sums count padding rows.
- `log`: `Logging`, what a run reports.
"""

from __future__ import annotations

import importlib
from typing import Any

# Each public name and its module, imported on first use: ``import
# jaxfeed.training.interrupts`` (the CLI's) does not import Orbax.
_HOMES = {
    "Callback": "callbacks",
    "CheckpointError": "checkpoint",
    "Checkpointing": "checkpoint",
    "FitResult": "loop",
    "Logging": "log",
    "NonFiniteMetric": "run",
    "Preempted": "interrupts",
    "TopologyChangedWarning": "checkpoint",
    "batch_mask": "steps",
    "evaluate_metrics": "steps",
    "fit": "loop",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'jaxfeed.training' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"jaxfeed.training.{_HOMES[name]}"), name)
    globals()[name] = value
    return value

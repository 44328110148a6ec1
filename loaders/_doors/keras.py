"""Keras's door: what a model was compiled with.

Checked against keras 3.15 (the pin in ``constraints.txt``).
"""

from __future__ import annotations

from typing import Any


def compiled_metrics(model: Any) -> tuple[list[Any], list[Any]]:
    """``(metrics, weighted_metrics)`` as given to ``model.compile``, each a list
    of names or metric objects (empty when none, or not compiled).

    The public ``get_compile_config()`` serializes the optimizer too, which
    fails inside ``fit`` on JAX (the variables are held outside the model
    while it trains), so this reads the arguments ``compile`` kept (private
    ``_compile_config.config``).
    """
    kept = getattr(model, "_compile_config", None)
    config = getattr(kept, "config", None) or {}
    return list(config.get("metrics") or []), list(config.get("weighted_metrics") or [])

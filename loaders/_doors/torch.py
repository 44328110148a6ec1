"""torch's door: the worker processes behind a ``DataLoader`` iterator.

Checked against torch 2.13.0 (the pin in ``constraints.txt``).
"""

from __future__ import annotations

from typing import Any


def loader_workers(batches: Any) -> list[Any]:
    """The worker processes behind a ``DataLoader`` iterator: its
    multiprocessing iterator keeps them in the private ``_workers``; another
    iterator (no workers) gives []."""
    return list(getattr(batches, "_workers", ()))

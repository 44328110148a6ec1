"""Hugging Face ``datasets``' door: a table's row order and a stream's chain.

Checked against datasets 5.2.0 (the pin in ``constraints.txt``).
"""

from __future__ import annotations

from typing import Any


def indices_mapping(dataset: Any) -> Any:
    """A ``datasets.Dataset``'s indices mapping (a pyarrow table of row
    numbers), or None when its rows are in storage order, also after a
    contiguous ``select`` (private ``_indices``)."""
    return getattr(dataset, "_indices", None)


def examples_iterable(dataset: Any) -> Any:
    """The first step of an ``IterableDataset``'s chain of examples iterables
    (private ``_ex_iterable``; each step's ``ex_iterable(s)`` are public), or
    None when it has none."""
    return getattr(dataset, "_ex_iterable", None)

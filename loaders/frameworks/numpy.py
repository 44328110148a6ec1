"""numpy's door: the memory map behind a ``np.memmap``.

Checked against numpy 2.4.6 (the pin in ``constraints.txt``).
"""

from __future__ import annotations

import mmap
from typing import Any


def memmap_mapping(mapped: Any) -> mmap.mmap | None:
    """The ``mmap.mmap`` a ``np.memmap`` (and every view of it) keeps in the
    private ``_mmap``, or None when it has none."""
    mapping = getattr(mapped, "_mmap", None)
    return mapping if isinstance(mapping, mmap.mmap) else None

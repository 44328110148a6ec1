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


def default_collate_is_torchs() -> bool:
    """Whether ``default_collate`` still collates with torch's own functions:
    its registry, the private ``default_collate_fn_map`` (users may extend it
    in place), holds exactly the types and functions torch put there."""
    import numpy as np
    import torch
    from torch.utils.data._utils import collate

    own = {
        torch.Tensor: collate.collate_tensor_fn,
        np.ndarray: collate.collate_numpy_array_fn,
        (np.bool_, np.number, np.object_): collate.collate_numpy_scalar_fn,
        float: collate.collate_float_fn,
        int: collate.collate_int_fn,
        str: collate.collate_str_fn,
        bytes: collate.collate_str_fn,
    }
    return getattr(collate, "default_collate_fn_map", None) == own

"""Grain's door: what a ``DataLoader`` and a batched dataset were built with,
the absl flag its worker processes read, and the shared memory they hand
batches over in.

Checked against grain 0.2.18 (the pin in ``constraints.txt``).
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def loader_sampler(loader: Any) -> Any:
    """The sampler a ``grain.DataLoader`` was built with (private ``_sampler``)."""
    return loader._sampler


def loader_data_source(loader: Any) -> Any:
    """The data source a ``grain.DataLoader`` reads (private ``_data_source``)."""
    return loader._data_source


def loader_operations(loader: Any) -> Sequence[Any]:
    """The operations a ``grain.DataLoader`` applies, in order (private ``_operations``)."""
    return loader._operations


def sampler_seed(sampler: Any) -> int | None:
    """An ``IndexSampler``'s seed, None when unseeded (private ``_seed``)."""
    return sampler._seed


def sampler_shuffles(sampler: Any) -> bool:
    """Whether an ``IndexSampler`` shuffles (private ``_shuffle``)."""
    return bool(sampler._shuffle)


def batch_settings(dataset: Any) -> tuple[int, bool, Callable]:
    """``(batch_size, drop_remainder, batch_fn)`` of a ``BatchMapDataset``
    (private ``_batch_size``, ``_drop_remainder``, ``_batch_fn``)."""
    return dataset._batch_size, dataset._drop_remainder, dataset._batch_fn


def batch_size(dataset: Any) -> int:
    """The batch size of a ``BatchIterDataset`` (private ``_batch_size``)."""
    return dataset._batch_size


def iter_batch_settings(dataset: Any) -> tuple[int, bool]:
    """``(batch_size, drop_remainder)`` of a ``BatchIterDataset`` (private
    ``_batch_size``, ``_drop_remainder``)."""
    return dataset._batch_size, dataset._drop_remainder


def mark_absl_flags_parsed() -> None:
    """Lets ``mp_prefetch`` run outside ``absl.app``.

    Grain 0.2.18 reads the absl flag ``--grain_enable_multiprocess_worker_profiling``
    when starting workers whenever ``jax.profiler`` is importable, and absl
    raises ``UnparsedFlagAccessError`` unless flags were parsed. Marking them
    parsed keeps every flag at its default, as ``absl.app.run`` would.
    """
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


def out_of_shared_memory(leaf: Any) -> Any:
    """``leaf`` copied out of the shared memory Grain's worker processes
    handed it over in (a ``SharedMemoryArray``), whose segment is unlinked now;
    any other leaf as it is.

    Grain unlinks a segment when its array is garbage, in a background
    thread; its iterator keeps the last batches in reference cycles (an
    exception's frames), freed only by a later garbage collection, so a run
    that ends first leaves their segments to the resource tracker ("leaked
    shared_memory objects"). The array is told not to unlink the name again
    (private ``_unlink_on_del``); a view of one (its ``base`` not the mapping,
    as Grain's own ``__del__`` tells) is only copied.
    """
    if type(leaf).__name__ != "SharedMemoryArray":
        return leaf
    copy = np.array(leaf)  # a plain ndarray of its own
    if isinstance(leaf.base, mmap.mmap) and leaf._unlink_on_del:
        leaf._unlink_on_del = False
        leaf.shm.unlink()
    return copy

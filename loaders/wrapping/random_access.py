"""Random-access objects that `wrap` reads in the shared sampler's order.

Each reader here says how many rows the user's object has, what
``shuffle=None`` means for it, and how to read one raw batch per index
batch of an epoch plan through the object's own framework: the user's
collate function, transforms and workers still run, only the order is the
sampler's (`jaxfeed.loaders.wrapping.kinds` builds the `Sampler` and the epochs).

What ``shuffle=None`` means, per kind (``shuffle=True/False`` overrides it):
a torch ``DataLoader`` keeps its own (``RandomSampler``: shuffled), a Grain
``DataLoader`` its ``IndexSampler``'s; a Grain ``MapDataset`` is shuffled
when its chain has a ``.shuffle()``, an HF ``Dataset`` when its rows were
reordered (``.shuffle()`` leaves a non-increasing indices mapping); a torch
``Dataset`` and a TFDS data source have no order of their own: not shuffled.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from jaxfeed.loaders.sampler import Sampler
from jaxfeed.loaders.wrapping.epochs import Epochs, WrapSettings
from jaxfeed.loaders.wrapping.raw_batches import map_leaves

# Reads ``(epoch, index batches)`` -> one raw batch per index batch, in order.
Read = Callable[[int, Sequence[np.ndarray]], Iterator[Any]]


@dataclasses.dataclass(frozen=True)
class RandomAccess:
    """How `wrap` reads a random-access object in sampler order.

    Attributes:
      num_rows: rows of one epoch.
      shuffled: what ``shuffle=None`` means for this object.
      read: ``(epoch, index_batches) -> iterator`` of raw batches, one per
        index batch (``batch_size`` long but the epoch's last, which holds its
        valid rows only), read through the framework.
      batch_size: the object's own batch size, if it has one.
      drop_remainder: the object drops a short last batch itself.
    """

    num_rows: int
    shuffled: bool
    read: Read
    batch_size: int | None = None
    drop_remainder: bool = False


def sampled_epochs(kind: str, access: RandomAccess, settings: WrapSettings) -> Epochs:
    """Epochs of ``access`` in the order of a `Sampler` built from ``settings``."""
    if settings.steps_per_epoch is not None:
        raise ValueError(
            f"steps_per_epoch={settings.steps_per_epoch} is for streams, but a {kind} is "
            f"read by index: an epoch is its {access.num_rows} rows; omit steps_per_epoch"
        )
    native, batch_size = access.batch_size, settings.batch_size
    if batch_size is not None and native is not None and batch_size != native:
        raise ValueError(
            f"the {kind} yields batches of {native} but batch_size={batch_size}; omit "
            f"batch_size, or build the {kind} with batch size {batch_size}"
        )
    batch_size = batch_size or native
    if batch_size is None:
        raise ValueError(f"a {kind} yields single rows; pass batch_size= to batch them")
    drop = settings.drop_remainder or access.drop_remainder
    if drop and batch_size * settings.process_count > access.num_rows:
        return Epochs(lambda epoch, start: iter(()), 0, batch_size, access.num_rows)
    try:
        sampler = Sampler(
            num_examples=access.num_rows,
            batch_size=batch_size,
            seed=settings.seed,
            shuffle=access.shuffled if settings.shuffle is None else settings.shuffle,
            drop_remainder=drop,
            process_index=settings.process_index,
            process_count=settings.process_count,
        )
    except ValueError as error:
        raise ValueError(f"the wrapped {kind}: {error}") from None

    def batches(epoch: int, start: int) -> Iterator[Any]:
        # Only a batch's own rows are read (a short last batch is padded after
        # collation, by WrappedSource): a loader never sees another batch's row.
        # A process with no row of the last global batch reads one, all masked.
        plan = sampler.epoch_plan(epoch, start)
        return access.read(epoch, [indices[: max(valid, 1)] for indices, valid in plan])

    return Epochs(batches, sampler.num_batches, batch_size, access.num_rows, sampler)


def stack(records: Sequence[Any]) -> Any:
    """Records (nested dicts / tuples of arrays or scalars) as one batch:
    every leaf stacked along a new leading axis."""
    return map_leaves(lambda *leaves: np.stack([np.asarray(x) for x in leaves]), *records)


def class_names(obj: Any) -> set[str]:
    return {c.__name__ for c in type(obj).__mro__}


def read_records(read: Callable[[int], Any], rows: Sequence[int], epoch: int, kind: str) -> list:
    """``[read(row) for row in rows]``, an error named as `read_record` names
    it; one ``map``, not a call per row (a small row's read costs little more)."""
    left = iter(rows)
    try:
        return list(map(read, left))
    except Exception as error:
        row = rows[len(rows) - operator.length_hint(left) - 1]  # (the row map stopped at)
        error.add_note(f"(raised reading row {row} of epoch {epoch} of the wrapped {kind})")
        raise


def read_record(read: Callable[[int], Any], row: int, epoch: int, kind: str) -> Any:
    """``read(row)``; an error it raises gets a note naming the row and epoch
    (the type and message stay the user's own)."""
    try:
        return read(row)
    except Exception as error:
        error.add_note(f"(raised reading row {row} of epoch {epoch} of the wrapped {kind})")
        raise

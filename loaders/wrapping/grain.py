"""Grain for `wrap`: a ``MapDataset``, a ``DataLoader`` or an ``IterDataset``.

A ``MapDataset`` (``.batch()``-ed last or not) and a ``DataLoader`` with an
``IndexSampler`` are read in the shared sampler's order: records at index
``epoch * N + row`` of the chain's ``.repeat()``, Grain's own view of the
epoch, so a ``random_map`` draws anew each epoch and the same epoch draws the
same; a loader's ``worker_count`` workers make the batches (``mp_prefetch``).
What cannot be (a chain with holes or batched early, another sampler, an
``IterDataset``) keeps its own order and resumes with the iterator's
``get_state()`` / ``set_state()``, taken after every batch.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from jaxfeed.loaders.workers.spawn import children_ignore_stop_signals
from jaxfeed.loaders.wrapping.epochs import Epochs, WrapSettings
from jaxfeed.loaders.wrapping.random_access import (
    RandomAccess,
    Read,
    class_names,
    read_record,
    sampled_epochs,
    stack,
)
from jaxfeed.loaders.wrapping.raw_batches import map_leaves
from jaxfeed.loaders.wrapping.streams import (
    IterCursor,
    one_process,
    own_order,
    stream_epochs,
)


def wrap_map_dataset(dataset: Any, settings: WrapSettings, **_: Any) -> Epochs:
    """A ``MapDataset``: in the shared sampler's order when its chain allows."""
    access = _map_access(dataset)
    if isinstance(access, RandomAccess):
        return sampled_epochs("grain.MapDataset", access, settings)
    return _map_stream(dataset, settings, access)


def wrap_loader(loader: Any, settings: WrapSettings, **_: Any) -> Epochs:
    """A ``DataLoader``: in the shared sampler's order with an ``IndexSampler``."""
    access = _loader_access(loader)
    if isinstance(access, RandomAccess):
        return sampled_epochs("grain.DataLoader", access, settings)
    return _loader_stream(loader, settings, access)


# --- random access: read in the shared sampler's order --------------------------------


def _map_access(dataset: Any) -> RandomAccess | str:
    """A Grain ``MapDataset``, ``.batch()``-ed last or not.

    The records of the un-batched chain are read at index ``epoch * N + row``
    of its ``.repeat()``: Grain's own view of epoch ``epoch``, so a
    ``random_map`` draws anew each epoch (and a ``.shuffle()`` reorders anew),
    and the same epoch draws the same. A batched chain's ``batch_fn`` (default:
    stack every leaf) makes the batch.

    Returns:
      The reader, or why the dataset keeps its own order (a sentence).
    """
    rows, batch_size, drop, batch_fn = _unbatched(dataset)
    below = _ancestors(rows)
    if "BatchMapDataset" in below:
        return "it is batched before its last step: put .batch() last"
    sparse = below & {"FilterMapDataset", "FlatMapMapDataset"}
    if sparse:
        return f"its {sorted(sparse)[0]} leaves holes in its rows"
    num_rows = len(rows)
    if num_rows >= sys.maxsize:
        return "it repeats forever (.repeat())"
    epochs = rows.repeat()

    def read(epoch: int, plan: Sequence[np.ndarray]) -> Iterator[Any]:
        offset = epoch * num_rows

        def record(row: int) -> Any:
            return epochs[offset + row]

        for indices in plan:
            rows = [read_record(record, int(i), epoch, "grain.MapDataset") for i in indices]
            yield batch_fn(rows)

    return RandomAccess(num_rows, "ShuffleMapDataset" in below, read, batch_size, drop)


def _unbatched(dataset: Any) -> tuple[Any, int | None, bool, Callable]:
    """``(rows, batch_size, drop_remainder, batch_fn)`` of a chain ending in
    ``.batch()``, else ``(dataset, None, False, stack)``.

    grain 0.2.18 keeps a BatchMapDataset's settings in private fields
    (``_batch_size``, ``_drop_remainder``, ``_batch_fn``); its parent is public.
    """
    if type(dataset).__name__ != "BatchMapDataset":
        return dataset, None, False, stack
    (rows,) = dataset.parents
    return rows, dataset._batch_size, dataset._drop_remainder, dataset._batch_fn


def _ancestors(dataset: Any) -> set[str]:
    """Class names of ``dataset`` and everything it reads from (public ``parents``)."""
    names, todo = set(), [dataset]
    while todo:
        node = todo.pop()
        names.add(type(node).__name__)
        todo.extend(getattr(node, "parents", ()))
    return names


def _loader_access(loader: Any) -> RandomAccess | str:
    """A ``grain.DataLoader`` with an ``IndexSampler``: its data source and
    operations as a ``MapDataset`` (``MapDataset.source(...).seed(sampler
    seed).apply(operations)``), read as `_map_access` reads; with
    ``worker_count > 0`` the batches are made in that many Grain worker
    processes (``mp_prefetch``), in order.

    grain 0.2.18 has no public accessor for what a DataLoader was built with:
    ``_data_source``, ``_operations`` and the sampler's ``_seed`` / ``_shuffle``
    are read here, and only here.
    """
    import grain

    sampler = loader._sampler
    if type(sampler).__name__ != "IndexSampler":
        return f"it has its own sampler ({type(sampler).__name__})"
    dataset = grain.MapDataset.source(loader._data_source)
    if sampler._seed is not None:
        dataset = dataset.seed(sampler._seed)
    try:
        dataset = dataset.apply(list(loader._operations))
    except ValueError as error:  # e.g. Batch after Filter
        return f"its operations do not form a MapDataset ({error})"
    access = _map_access(dataset)
    if isinstance(access, str):
        return access
    options = loader.multiprocessing_options
    read = access.read
    if options.num_workers > 0:
        read = _in_grain_workers(access.read, options)
    return dataclasses.replace(access, shuffled=bool(sampler._shuffle), read=read)


def _in_grain_workers(read: Read, options: Any) -> Read:
    """``read`` with each batch made in Grain worker processes, in order."""
    import grain
    from jaxfeed.loaders.backends.grain import mark_absl_flags_parsed

    def read_in_workers(epoch: int, plan: Sequence[np.ndarray]) -> Iterator[Any]:
        def one(indices: np.ndarray) -> Any:
            return next(read(epoch, [indices]))

        mark_absl_flags_parsed()  # mp_prefetch reads an absl flag (see there)
        batches = iter(grain.MapDataset.source(list(plan)).map(one).to_iter_dataset()
                       .mp_prefetch(options))  # fmt: skip
        while True:
            with children_ignore_stop_signals():  # Grain starts its workers at the first read
                batch = next(batches, None)
            if batch is None:
                return
            # Workers hand batches over in shared memory: a copy frees it now.
            yield map_leaves(np.array, batch)

    return read_in_workers


# --- streams: the dataset's own order, resumed with Grain's iterator state ---------------


class GrainCursor(IterCursor):
    """A Grain iterator per pass (``iter(make(pass_))``); its own state."""

    per_batch = True

    def begin(self, pass_: int, state: Any, in_pass: int) -> None:
        self._close()
        self._batches = iter(self._make(pass_))
        if state is not None:
            self._batches.set_state(state)

    def state(self) -> Any:
        return self._batches.get_state()


def _map_stream(dataset: Any, settings: WrapSettings, why: str) -> Epochs:
    """A Grain ``MapDataset`` that keeps its own order (``why``): Grain's
    view of epoch ``e`` (``.repeat()``'s rows ``[e*N, (e+1)*N)``) per pass."""
    kind = "grain.MapDataset"
    fix = "Shard it with dataset[process_index::process_count], and pass process_count=1"
    own_order(kind, settings, why)
    one_process(kind, settings, why, fix)
    endless = len(dataset) >= sys.maxsize
    batched = "BatchMapDataset" in _ancestors(dataset)
    if not batched and settings.batch_size is None:
        raise ValueError(f"this {kind} yields single records; pass batch_size= to batch them")
    length = len(dataset)

    def one_pass(epoch: int) -> Any:
        # Grain's own view of epoch `epoch` (new random_map draws), minus holes.
        view = dataset if endless else dataset.repeat()[epoch * length : (epoch + 1) * length]
        stream = view.to_iter_dataset()
        if not batched:
            stream = stream.batch(settings.batch_size, drop_remainder=settings.drop_remainder)
        return stream

    cursor = GrainCursor(one_pass)
    return stream_epochs(kind, cursor, settings, endless=endless, batch_size=settings.batch_size)


def wrap_iter_dataset(dataset: Any, settings: WrapSettings, **_: Any) -> Epochs:
    kind = "grain.IterDataset"
    fix = (
        "Shard the MapDataset it comes from before .to_iter_dataset() "
        "(dataset[process_index::process_count]) and pass process_count=1, or wrap the "
        "MapDataset itself: wrap reads it in the shared order, one slice per process"
    )
    own_order(kind, settings, "it is a stream")
    one_process(kind, settings, "it is a stream", fix)
    batch_size = settings.batch_size
    native = _batch_size_of(dataset)
    if native is not None and batch_size not in (None, native):
        raise ValueError(
            f"the grain.IterDataset yields batches of {native} but batch_size={batch_size}; "
            f"omit batch_size, or build it with .batch({batch_size})"
        )
    if native is None and batch_size is not None:
        dataset = dataset.batch(batch_size, drop_remainder=settings.drop_remainder)
    endless = _endless(dataset)
    cursor = GrainCursor(lambda pass_: dataset)
    return stream_epochs(kind, cursor, settings, endless=endless, batch_size=batch_size or native)


def _loader_stream(loader: Any, settings: WrapSettings, why: str) -> Epochs:
    """A Grain ``DataLoader`` whose sampler is not an ``IndexSampler``."""
    kind = "grain.DataLoader"
    fix = "Build it with grain.samplers.IndexSampler(...) so wrap reads it in the shared order"
    own_order(kind, settings, why)
    one_process(kind, settings, why, fix)
    return stream_epochs(kind, GrainCursor(lambda pass_: loader), settings, endless=False)


def _batch_size_of(dataset: Any) -> int | None:
    """The batch size of a Grain ``IterDataset`` that ends in ``.batch()``,
    else None (grain 0.2.18 keeps it in the private ``_batch_size``)."""
    if type(dataset).__name__ != "BatchIterDataset":
        return None
    return dataset._batch_size


def _endless(dataset: Any) -> bool:
    """Whether a Grain dataset reads a ``MapDataset`` that repeats forever."""
    todo = [dataset]
    while todo:
        node = todo.pop()
        if "MapDataset" in class_names(node) and len(node) >= sys.maxsize:
            return True
        todo.extend(getattr(node, "parents", ()))
    return False

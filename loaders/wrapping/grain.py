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
from jaxfeed.loaders._doors import grain as grain_door
from jaxfeed.loaders._workers.spawn import children_ignore_stop_signals
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
    _refuse_finite_repeat(dataset, "grain.MapDataset", settings)
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

    A BatchMapDataset's settings are private (read by the grain door); its
    parent is public.
    """
    if type(dataset).__name__ != "BatchMapDataset":
        return dataset, None, False, stack
    (rows,) = dataset.parents
    return rows, *grain_door.batch_settings(dataset)


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

    Grain has no public accessor for what a DataLoader was built with: the
    grain door reads it.
    """
    import grain

    sampler = grain_door.loader_sampler(loader)
    if type(sampler).__name__ != "IndexSampler":
        return f"it has its own sampler ({type(sampler).__name__})"
    dataset = grain.MapDataset.source(grain_door.loader_data_source(loader))
    seed = grain_door.sampler_seed(sampler)
    if seed is not None:
        dataset = dataset.seed(seed)
    try:
        dataset = dataset.apply(list(grain_door.loader_operations(loader)))
    except ValueError as error:  # e.g. Batch after Filter
        return f"its operations do not form a MapDataset ({error})"
    access = _map_access(dataset)
    if isinstance(access, str):
        return access
    options = loader.multiprocessing_options
    read = access.read
    if options.num_workers > 0:
        read = _in_grain_workers(access.read, options)
    return dataclasses.replace(access, shuffled=grain_door.sampler_shuffles(sampler), read=read)


def _in_grain_workers(read: Read, options: Any) -> Read:
    """``read`` with each batch made in Grain worker processes, in order."""
    import grain

    def read_in_workers(epoch: int, plan: Sequence[np.ndarray]) -> Iterator[Any]:
        def one(indices: np.ndarray) -> Any:
            return next(read(epoch, [indices]))

        grain_door.mark_absl_flags_parsed()  # mp_prefetch reads an absl flag (see there)
        batches = iter(grain.MapDataset.source(list(plan)).map(one).to_iter_dataset()
                       .mp_prefetch(options))  # fmt: skip
        while True:
            with children_ignore_stop_signals("grain"):  # Grain starts workers at the first read
                batch = next(batches, None)
            if batch is None:
                return
            # Workers hand batches over in shared memory: a copy frees it now.
            yield map_leaves(lambda leaf: np.asarray(grain_door.out_of_shared_memory(leaf)), batch)

    return read_in_workers


# --- streams: the dataset's own order, resumed with Grain's iterator state ---------------


class GrainCursor(IterCursor):
    """A Grain iterator per pass (``iter(make(pass_))``); its own state."""

    per_batch = True

    def begin(self, pass_: int, state: Any, in_pass: int) -> int:
        self._close()
        self._batches = iter(self._make(pass_))
        if state is None:
            return 0
        self._batches.set_state(state)
        return in_pass

    def next(self) -> Any:
        # Workers (mp_prefetch, a loader's) hand batches over in shared memory.
        return map_leaves(grain_door.out_of_shared_memory, next(self._batches))

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
    _refuse_finite_repeat(dataset, kind, settings)
    # The user's own mp_prefetch reads an absl flag too; its node is not named
    # in the public parents (grain 0.2.18 builds it from an interleave).
    grain_door.mark_absl_flags_parsed()
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
    return stream_epochs(
        kind,
        cursor,
        settings,
        endless=endless,
        num_batches=None if endless else _counted_batches(dataset, settings.drop_remainder),
        batch_size=batch_size or native,
    )


# IterDataset steps that yield one element per element read (and no other kind).
_ONE_FOR_ONE = {"MapIterDataset", "PrefetchIterDataset", "ThreadPrefetchIterDataset"}


def _counted_batches(dataset: Any, drop_remainder: bool) -> int | None:
    """Batches per pass of ``map_dataset...to_iter_dataset()[.map()...].batch(B)``
    (what ``keras.utils.image_dataset_from_directory(format="grain")`` builds):
    the MapDataset's length, batched; None for any other chain (a filter, a
    MapDataset with holes), whose length only reading it would tell. A short
    last batch is not counted when either ``.batch()`` or wrap's
    ``drop_remainder`` drops it.
    """
    if type(dataset).__name__ != "BatchIterDataset":
        return None
    batch_size, drop = grain_door.iter_batch_settings(dataset)
    drop = drop or drop_remainder
    (node,) = dataset.parents
    while type(node).__name__ in _ONE_FOR_ONE and "MapDataset" not in class_names(node):
        parents = getattr(node, "parents", ())
        if len(parents) != 1:
            return None
        (node,) = parents
    if "MapDataset" not in class_names(node) or isinstance(_map_access(node), str):
        return None  # an IterDataset step of another kind, or a MapDataset with holes
    rows = len(node)
    return rows // batch_size if drop else -(-rows // batch_size)


def _loader_stream(loader: Any, settings: WrapSettings, why: str) -> Epochs:
    """A Grain ``DataLoader`` whose sampler is not an ``IndexSampler``."""
    kind = "grain.DataLoader"
    fix = "Build it with grain.samplers.IndexSampler(...) so wrap reads it in the shared order"
    own_order(kind, settings, why)
    one_process(kind, settings, why, fix)
    return stream_epochs(kind, GrainCursor(lambda pass_: loader), settings, endless=False)


def _batch_size_of(dataset: Any) -> int | None:
    """The batch size of a Grain ``IterDataset`` that ends in ``.batch()``,
    else None (private: read by the grain door)."""
    if type(dataset).__name__ != "BatchIterDataset":
        return None
    return grain_door.batch_size(dataset)


def _refuse_finite_repeat(dataset: Any, kind: str, settings: WrapSettings) -> None:
    """Refuses a chain with a finite ``.repeat(n)`` (Grain's tutorials have one)
    unless ``steps_per_epoch`` says what an epoch is: one jaxfeed epoch would
    be all n passes, so ``fit(epochs=2)`` would train 2n.

    Raises:
      ValueError: naming the repeat, the passes, and the two fixes.
    """
    todo = [dataset]
    while todo:
        node = todo.pop()
        passes = _finite_passes(node)
        if passes is not None and settings.steps_per_epoch is None:
            raise ValueError(
                f"the {kind}'s chain has a finite .repeat() ({passes} passes of its "
                f"{len(node.parents[0])} records), so one epoch of it would be all {passes} "
                "passes and fit(epochs=k) would train on k times as many; drop the "
                ".repeat() (jaxfeed's epochs repeat the data, each in a new order), or, for "
                "a stream, pass steps_per_epoch= to say how many batches an epoch is"
            )
        todo.extend(getattr(node, "parents", ()))


def _finite_passes(node: Any) -> int | None:
    """The passes of a ``.repeat(n)`` step of a Grain chain, else None (also
    for an endless ``.repeat()``)."""
    if type(node).__name__ != "RepeatMapDataset" or len(node) >= sys.maxsize:
        return None
    (parent,) = node.parents
    return len(node) // max(len(parent), 1)


def _endless(dataset: Any) -> bool:
    """Whether a Grain dataset reads a ``MapDataset`` that repeats forever."""
    todo = [dataset]
    while todo:
        node = todo.pop()
        if "MapDataset" in class_names(node) and len(node) >= sys.maxsize:
            return True
        todo.extend(getattr(node, "parents", ()))
    return False

"""Random-access objects that `wrap` reads in the shared sampler's order.

Each reader here says how many rows the user's object has, what
``shuffle=None`` means for it, and how to read one raw batch per index
batch of an epoch plan through the object's own framework: the user's
collate function, transforms and workers still run, only the order is the
sampler's (`loaders.wrap_kinds` builds the `Sampler` and the epochs).

What ``shuffle=None`` means, per kind (``shuffle=True/False`` overrides it):
a torch ``DataLoader`` keeps its own (``RandomSampler``: shuffled), a Grain
``DataLoader`` its ``IndexSampler``'s; a Grain ``MapDataset`` is shuffled
when its chain has a ``.shuffle()``, an HF ``Dataset`` when its rows were
reordered (``.shuffle()`` leaves a non-increasing indices mapping); a torch
``Dataset`` and a TFDS data source have no order of their own: not shuffled.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from loaders.wrap_batch import map_leaves

# Reads ``(epoch, index batches)`` -> one raw batch per index batch, in order.
Read = Callable[[int, Sequence[np.ndarray]], Iterator[Any]]


@dataclasses.dataclass(frozen=True)
class RandomAccess:
    """How `wrap` reads a random-access object in sampler order.

    Attributes:
      num_rows: rows of one epoch.
      shuffled: what ``shuffle=None`` means for this object.
      read: ``(epoch, index_batches) -> iterator`` of raw batches, one per
        index batch (each ``batch_size`` long), read through the framework.
      batch_size: the object's own batch size, if it has one.
      drop_remainder: the object drops a short last batch itself.
    """

    num_rows: int
    shuffled: bool
    read: Read
    batch_size: int | None = None
    drop_remainder: bool = False


def stack(records: Sequence[Any]) -> Any:
    """Records (nested dicts / tuples of arrays or scalars) as one batch:
    every leaf stacked along a new leading axis."""
    return map_leaves(lambda *leaves: np.stack([np.asarray(x) for x in leaves]), *records)


def class_names(obj: Any) -> set[str]:
    return {c.__name__ for c in type(obj).__mro__}


# --- torch -----------------------------------------------------------------


def torch_dataset(dataset: Any, collate_fn: Callable | None) -> RandomAccess:
    """A map-style torch ``Dataset``: read by a ``DataLoader`` in this
    process, collated by ``collate_fn`` (default: torch's ``default_collate``)."""
    from torch.utils.data import default_collate

    kwargs = {"collate_fn": collate_fn or default_collate}
    return RandomAccess(_length(dataset, "torch Dataset"), False, _torch_reader(dataset, kwargs))


def torch_loader(loader: Any, context: Any) -> RandomAccess | str:
    """A ``DataLoader`` over a map-style dataset with torch's own
    ``RandomSampler`` or ``SequentialSampler``: the same loader (dataset,
    collate_fn, workers, ...) fed the plan as its ``batch_sampler``, its
    workers started with ``context`` (see `worker_context`).

    Returns:
      The reader, or why the loader keeps its own order (a sentence).
    """
    if "IterableDataset" in class_names(loader.dataset):
        return "it reads an IterableDataset (a stream)"
    if loader.batch_sampler is None:
        return "it was built with batch_size=None (its dataset yields whole batches)"
    inner = getattr(loader.batch_sampler, "sampler", None)
    if type(loader.batch_sampler).__name__ != "BatchSampler" or inner is not loader.sampler:
        return f"it has its own batch_sampler ({type(loader.batch_sampler).__name__})"
    sampler = type(loader.sampler).__name__
    if sampler == "RandomSampler":
        rows = _length(loader.dataset, "DataLoader's dataset")
        if loader.sampler.replacement or loader.sampler.num_samples != rows:
            return "its RandomSampler draws with replacement or a different number of rows"
        shuffled = True
    elif sampler == "SequentialSampler":
        shuffled = False
    else:
        return f"it has its own sampler ({sampler})"
    kwargs = {**loader_options(loader), "multiprocessing_context": context}
    return RandomAccess(
        _length(loader.dataset, "DataLoader's dataset"),
        shuffled,
        _torch_reader(loader.dataset, kwargs),
        batch_size=loader.batch_size,
        drop_remainder=loader.drop_last,
    )


def _length(obj: Any, what: str) -> int:
    try:
        return len(obj)
    except TypeError:
        raise TypeError(
            f"a {what} without __len__ cannot be read in sampler order; give "
            f"{type(obj).__name__} a __len__, or wrap it as a stream (an IterableDataset)"
        ) from None


def loader_options(loader: Any) -> dict[str, Any]:
    """The ``DataLoader`` arguments that are not about order: what `wrap`
    keeps when it builds an equivalent loader."""
    names = [
        "num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn",
        "multiprocessing_context", "generator", "prefetch_factor", "persistent_workers",
        "pin_memory_device", "in_order",
    ]  # fmt: skip
    return {name: getattr(loader, name) for name in names if hasattr(loader, name)}


def rebuilt_loader(loader: Any, context: Any, cls: type | None = None) -> Any:
    """``loader``'s dataset, order and options as a new ``cls`` (torch's
    ``DataLoader`` by default, or torchdata's ``StatefulDataLoader``), its
    workers started with ``context``. The user's sampler objects are reused,
    so a ``set_epoch`` on them still reaches the new loader; a plain
    ``BatchSampler`` over its sampler is rebuilt from its parts (which a
    ``StatefulDataLoader`` can checkpoint)."""
    if cls is None:
        from torch.utils.data import DataLoader as cls
    kwargs = {**loader_options(loader), "multiprocessing_context": context}
    dataset, batches = loader.dataset, loader.batch_sampler
    iterable = "IterableDataset" in class_names(dataset)
    if iterable or (type(batches).__name__ == "BatchSampler" and batches.sampler is loader.sampler):
        sampler = None if iterable else loader.sampler
        return cls(
            dataset,
            batch_size=loader.batch_size,
            sampler=sampler,
            drop_last=loader.drop_last,
            **kwargs,
        )
    if batches is not None:
        return cls(dataset, batch_sampler=batches, **kwargs)
    return cls(dataset, batch_size=None, sampler=loader.sampler, **kwargs)


def _torch_reader(dataset: Any, kwargs: dict[str, Any]) -> Callable[..., Iterator[Any]]:
    """Reads plans through DataLoaders built like the user's (`EpochLoaders`)."""
    from loaders.torch_backend import EpochLoaders

    read = EpochLoaders(dataset, **kwargs)
    # Python ints, as torch's own samplers give.
    return lambda epoch, plan: read([indices.tolist() for indices in plan])


# --- Grain -----------------------------------------------------------------


def grain_map(dataset: Any) -> RandomAccess | str:
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
    below = ancestors(rows)
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
        for indices in plan:
            yield batch_fn([epochs[offset + int(i)] for i in indices])

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


def ancestors(dataset: Any) -> set[str]:
    """Class names of ``dataset`` and everything it reads from (public ``parents``)."""
    names, todo = set(), [dataset]
    while todo:
        node = todo.pop()
        names.add(type(node).__name__)
        todo.extend(getattr(node, "parents", ()))
    return names


def grain_batch_size(dataset: Any) -> int | None:
    """The batch size of a Grain ``IterDataset`` that ends in ``.batch()``,
    else None (grain 0.2.18 keeps it in the private ``_batch_size``)."""
    if type(dataset).__name__ != "BatchIterDataset":
        return None
    return dataset._batch_size


def grain_endless(dataset: Any) -> bool:
    """Whether a Grain dataset reads a ``MapDataset`` that repeats forever."""
    todo = [dataset]
    while todo:
        node = todo.pop()
        if "MapDataset" in class_names(node) and len(node) >= sys.maxsize:
            return True
        todo.extend(getattr(node, "parents", ()))
    return False


def grain_loader(loader: Any) -> RandomAccess | str:
    """A ``grain.DataLoader`` with an ``IndexSampler``: its data source and
    operations as a ``MapDataset`` (``MapDataset.source(...).seed(sampler
    seed).apply(operations)``), read as `grain_map` reads; with
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
    access = grain_map(dataset)
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

    from loaders.grain_backend import _mark_absl_flags_parsed

    def read_in_workers(epoch: int, plan: Sequence[np.ndarray]) -> Iterator[Any]:
        def one(indices: np.ndarray) -> Any:
            return next(read(epoch, [indices]))

        _mark_absl_flags_parsed()  # mp_prefetch reads an absl flag (see there)
        batches = grain.MapDataset.source(list(plan)).map(one).to_iter_dataset()
        for batch in batches.mp_prefetch(options):
            # Workers hand batches over in shared memory: a copy frees it now.
            yield map_leaves(np.array, batch)

    return read_in_workers


# --- Hugging Face, TFDS ------------------------------------------------------


def hf_table(dataset: Any, columns: Sequence[str] | None) -> RandomAccess:
    """A ``datasets.Dataset``: rows gathered per index batch, in numpy format
    with the stored dtypes. A batch that starts with a run of consecutive rows
    (unshuffled) reads the run as one slice, ~5x faster than a gather."""
    # dtype=None keeps the stored dtypes; the numpy formatter otherwise widens
    # every integer column to int64 (uint8 images: 8x the bytes). datasets 5.2.
    table = dataset.with_format("numpy", columns=columns, dtype=None)

    def read(epoch: int, plan: Sequence[np.ndarray]) -> Iterator[Any]:
        for indices in plan:
            first, run = int(indices[0]), _contiguous_run(indices)
            if run == len(indices):
                yield table[first : first + run]
            elif run > 1:  # e.g. an unshuffled last batch, then the plan's padding rows
                # The padding repeats one row: each distinct row is read once.
                rows, repeats = np.unique(indices[run:], return_inverse=True)
                head, rest = table[first : first + run], table[rows.tolist()]
                yield {key: _joined(head[key], rest[key], repeats) for key in head}
            else:
                yield table[indices.tolist()]

    return RandomAccess(len(dataset), _hf_reordered(dataset), read)


def _contiguous_run(indices: np.ndarray) -> int:
    """How many leading indices are consecutive (``i, i+1, ...``)."""
    breaks = np.flatnonzero(np.diff(indices) != 1)
    return int(breaks[0]) + 1 if len(breaks) else len(indices)


def _joined(head: Any, rest: Any, order: np.ndarray) -> Any:
    """A column's ``head`` rows, then ``rest``'s rows in ``order`` (rows on axis 0)."""
    if isinstance(head, np.ndarray) and isinstance(rest, np.ndarray):
        return np.concatenate([head, rest[order]])
    return list(head) + [rest[i] for i in order]


def _hf_reordered(dataset: Any) -> bool:
    """Whether ``dataset``'s rows were reordered (``.shuffle()``, ``.sort()``).

    datasets 5.2 keeps such an order as an indices mapping in the private
    ``_indices`` (None when rows are in storage order, also after a
    contiguous ``select``).
    """
    indices = getattr(dataset, "_indices", None)
    if indices is None:
        return False
    order = indices.column(0).to_numpy().astype(np.int64)  # stored as uint64
    return bool(np.any(np.diff(order) <= 0))


def tfds_source(source: Any) -> RandomAccess:
    """A TFDS data source (``tfds.data_source(...)``, ``builder.as_data_source``):
    records read with ``__getitems__`` per index batch, every leaf stacked."""

    def getitems(keys: list[int]) -> Sequence[Any]:
        if hasattr(source, "__getitems__"):
            return source.__getitems__(keys)
        return [source[key] for key in keys]

    def read(epoch: int, plan: Sequence[np.ndarray]) -> Iterator[Any]:
        for indices in plan:
            yield stack(getitems(indices.tolist()))

    return RandomAccess(len(source), False, read)

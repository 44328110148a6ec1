"""Hugging Face `datasets` for `wrap`: a ``Dataset`` (a table) or an ``IterableDataset``.

A ``Dataset`` is read in the shared sampler's order, rows gathered per index
batch in numpy format with the stored dtypes, or through its own formatting
transform (``set_transform`` / ``with_transform``) when it has one. An ``IterableDataset`` keeps
its own order: ``state_dict()`` / ``load_state_dict()`` after every batch,
with ``set_epoch`` first; with a shuffle buffer, whose rows that state does
not hold, the epoch's start and the batches read again. On several processes
each reads its share from ``datasets.distributed.split_dataset_by_node``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from jaxfeed.loaders._doors.hf import examples_iterable, indices_mapping, row_reader
from jaxfeed.loaders.wrapping.epochs import Epochs, WrapSettings
from jaxfeed.loaders.wrapping.random_access import (
    RandomAccess,
    sampled_epochs,
)
from jaxfeed.loaders.wrapping.seeded import GlobalDraws
from jaxfeed.loaders.wrapping.streams import (
    IterCursor,
    own_order,
    stream_epochs,
)


def wrap_table(dataset: Any, settings: WrapSettings, columns: Any = None) -> Epochs:
    """A ``datasets.Dataset``, in the shared sampler's order."""
    if settings.batch_size is None:
        raise ValueError("a datasets.Dataset is a table of rows; pass batch_size= to batch it")
    access = _table_access(dataset, columns, settings.seed)
    return sampled_epochs("datasets.Dataset", access, settings)


def _table_access(dataset: Any, columns: Sequence[str] | None, seed: int) -> RandomAccess:
    """A ``datasets.Dataset``: rows gathered per index batch. A batch of
    consecutive rows (unshuffled) is read as one slice, ~5x faster than a
    gather.

    Without a formatting transform, the rows come in numpy format with the
    stored dtypes. With one (``set_transform`` / ``with_transform``: the
    user's augmentation and normalisation), each batch goes through it, with
    the global generators seeded by the batch once it draws (`GlobalDraws`), and
    ``columns`` picks from what it returns.
    """
    custom = dataset.format["type"] == "custom"
    draws = GlobalDraws(seed)
    if custom:
        get = functools.partial(_transformed, row_reader(dataset), columns)
    else:
        # dtype=None keeps the stored dtypes; the numpy formatter otherwise widens
        # every integer column to int64 (uint8 images: 8x the bytes). datasets 5.2.
        get = row_reader(dataset.with_format("numpy", columns=columns, dtype=None))

    def read(epoch: int, plan: Sequence[np.ndarray]) -> Iterator[Any]:
        for indices in plan:
            first = int(indices[0])
            consecutive = np.array_equal(indices, np.arange(first, first + len(indices)))
            rows = slice(first, first + len(indices)) if consecutive else indices.tolist()
            # (the seeding is the transform's, not the reader's: it ends before the yield)
            yield draws.read(epoch, indices, functools.partial(get, rows)) if custom else get(rows)

    return RandomAccess(len(dataset), _reordered(dataset), read)


def _transformed(
    read: Callable[[Any], Any], columns: Sequence[str] | None, rows: Any
) -> dict[str, Any]:
    """Rows through the dataset's own formatting transform (``read``), each
    returned column made one array (a transform returns lists of per-row
    arrays or tensors as often as batched ones)."""
    batch = read(rows)
    if columns is not None:
        missing = [name for name in columns if name not in batch]
        if missing:
            raise ValueError(
                f"columns={list(columns)}: the dataset's transform returns {sorted(batch)}, "
                f"not {missing}; pick columns from what it returns"
            )
        batch = {name: batch[name] for name in columns}
    return {name: _one_array(value) for name, value in batch.items()}


def _one_array(value: Any) -> Any:
    """A transform's column as one array; rows of different lengths (a
    tokenizer without padding) as one object per row, for ``pad_to=`` to pad
    or the checks to name."""
    if not isinstance(value, list):
        return value
    rows = [np.asarray(v) for v in value]
    if len({row.shape for row in rows}) <= 1:
        return np.stack(rows)
    ragged = np.empty(len(rows), object)
    for i, row in enumerate(rows):
        ragged[i] = row
    return ragged


def _reordered(dataset: Any) -> bool:
    """Whether ``dataset``'s rows were reordered (``.shuffle()``, ``.sort()``).

    Such an order is kept as an indices mapping (read by the hf door; None
    when rows are in storage order, also after a contiguous ``select``).
    """
    indices = indices_mapping(dataset)
    if indices is None:
        return False
    order = indices.column(0).to_numpy().astype(np.int64)  # stored as uint64
    return bool(np.any(np.diff(order) <= 0))


# --- streams: a datasets.IterableDataset, resumed with its state_dict() ------------------


class HfCursor(IterCursor):
    """An HF ``IterableDataset``'s pass ``p``: ``set_epoch(p)``, then its
    ``state_dict`` when ``exact`` (no shuffle buffer), else none."""

    def __init__(self, dataset: Any, batch_size: int, drop: bool, exact: bool):
        super().__init__()
        self._dataset, self._batch_size, self._drop = dataset, batch_size, drop
        self.per_batch = exact
        self._dtypes = _declared_dtypes(dataset.features)

    def begin(self, pass_: int, state: Any, in_pass: int) -> int:
        self._close()
        self._dataset.set_epoch(pass_)  # first: a state loads only into its own epoch
        self._dataset.load_state_dict(state)  # None: the pass's start
        self._batches = self._dataset.iter(self._batch_size, drop_last_batch=self._drop)
        return 0 if state is None else in_pass

    def next(self) -> Any:
        batch = next(self._batches)
        # The numpy format takes no dtype=: the declared ones, cast back.
        return {k: v.astype(self._dtypes.get(k, v.dtype), copy=False) for k, v in batch.items()}

    def state(self) -> Any:
        return self._dataset.state_dict() if self.per_batch else None


def wrap_iterable_dataset(dataset: Any, settings: WrapSettings, columns: Any = None) -> Epochs:
    """A ``datasets.IterableDataset``, in its own order; on several processes
    each reads its share from ``datasets.distributed.split_dataset_by_node``."""
    kind = "datasets.IterableDataset"
    own_order(kind, settings, "it is a stream")
    batch_size, drop_remainder = settings.batch_size, settings.drop_remainder
    if batch_size is None:
        raise ValueError("a datasets.IterableDataset streams rows; pass batch_size= to batch it")
    if columns is not None:
        dataset = dataset.select_columns(list(columns))
    if settings.process_count > 1:
        from datasets.distributed import split_dataset_by_node

        dataset = split_dataset_by_node(
            dataset, rank=settings.process_index, world_size=settings.process_count
        )
    exact = not _buffer_shuffled(dataset)
    cursor = HfCursor(dataset.with_format("numpy"), batch_size, drop_remainder, exact)
    return stream_epochs(kind, cursor, settings, endless=False, batch_size=batch_size)


def _buffer_shuffled(dataset: Any) -> bool:
    """Whether a stream's chain holds a shuffle buffer, whose rows HF's
    ``state_dict`` leaves out ("examples from shuffle buffers are lost when
    resuming", its docs say).

    datasets shows no public view of the chain: its first step (read by the
    hf door) and each step's ``ex_iterable(s)`` are walked; a layout not found
    counts as shuffled (resumed by reading again, always exact).
    """
    todo = [examples_iterable(dataset)]
    if todo[0] is None:
        return True
    while todo:
        node = todo.pop()
        if type(node).__name__ == "BufferShuffledExamplesIterable":
            return True
        todo.extend(getattr(node, "ex_iterables", ()))
        if getattr(node, "ex_iterable", None) is not None:
            todo.append(node.ex_iterable)
    return False


def _declared_dtypes(features: Mapping[str, Any] | None) -> dict[str, np.dtype]:
    """Numeric dtypes the user declared per column (Value, ArrayND, nested List)."""
    out = {}
    for name, feature in (features or {}).items():
        while getattr(feature, "dtype", None) is None and hasattr(feature, "feature"):
            feature = feature.feature
        try:
            dtype = np.dtype(getattr(feature, "dtype", None) or "O")
        except TypeError:  # "string", "timestamp[s]", PIL images, ...
            continue
        if dtype.kind in "biuf":
            out[name] = dtype
    return out

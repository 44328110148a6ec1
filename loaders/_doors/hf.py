"""Hugging Face ``datasets``' door: a table's row order and a stream's chain.

Checked against datasets 5.2.0 (the pin in ``constraints.txt``).
"""

from __future__ import annotations

from collections.abc import Callable
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


def row_reader(dataset: Any) -> Callable[[Any], Any]:
    """``dataset[rows]`` (a slice or a list of row numbers), read as
    ``Dataset.iter`` reads: the dataset's formatter made once (``__getitem__``
    makes one per call: ~15 µs a batch, the features parsed again), a slice of
    rows in storage order cut from the Arrow table at once (``query_table``'s
    slice takes ~18 µs; ``Dataset.iter`` cuts its batches so), and the columns
    not picked when the format keeps them all (picking all costs ~13 µs).
    Gathers and reordered rows go through ``datasets.formatting``'s
    ``query_table``, with the row order from the private ``_indices``
    (`indices_mapping`)."""
    from datasets.formatting import format_table, get_formatter, query_table

    form = dataset.format
    formatter = get_formatter(form["type"], features=dataset.features, **form["format_kwargs"])
    table, indices = dataset.data, indices_mapping(dataset)
    columns = None if form["columns"] == dataset.column_names else form["columns"]
    all_columns = form["output_all_columns"]

    def read(rows: Any) -> Any:
        if isinstance(rows, slice) and indices is None:
            subtable = table.table.slice(rows.start, rows.stop - rows.start)
        else:
            subtable = query_table(table, rows, indices=indices)
        return format_table(
            subtable, rows, formatter=formatter, format_columns=columns,
            output_all_columns=all_columns,
        )  # fmt: skip

    return read

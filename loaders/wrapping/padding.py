"""``wrap``'s ``pad_to=``: each field's lengths (one, or several: buckets), a
batch's fields right-padded to the shortest of them that holds every row, and
`PaddingReport`, what the padding has cost so far.

Fields given the same lengths form one group and share the length chosen for
a batch (``input_ids`` and ``attention_mask`` stay aligned).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from jaxfeed.loaders.checks import check_int
from jaxfeed.loaders.protocol import Batch

Lengths = tuple[int, ...]  # ascending, distinct


def check_pad_to(
    pad_to: Mapping[str, Any] | None, host_fields: Sequence[str]
) -> dict[str, Lengths]:
    """``pad_to`` checked: each field's lengths, an int or a sequence of ints,
    as an ascending tuple."""
    if pad_to is not None and not isinstance(pad_to, Mapping):
        raise TypeError(
            f"pad_to must be a dict like {{'tokens': 128}} or {{'tokens': (32, 64, 128)}}, "
            f"got {pad_to!r}"
        )
    checked = {}
    for name, given in (pad_to or {}).items():
        if isinstance(given, tuple | list):
            if not given:
                raise ValueError(
                    f"pad_to[{name!r}] is empty; give one length (128) or several, "
                    f"e.g. (32, 64, 128)"
                )
            lengths = [check_int(f"pad_to[{name!r}][{i}]", n, 1) for i, n in enumerate(given)]
        else:
            lengths = [check_int(f"pad_to[{name!r}]", given, 1)]
        checked[name] = tuple(sorted(set(lengths)))
        if name in host_fields:
            raise ValueError(
                f"{name!r} is in both host_fields and pad_to; pad_to pads device fields: "
                f"pad a host field in transform="
            )
    return checked


def groups(pad_to: Mapping[str, Lengths]) -> list[tuple[Lengths, tuple[str, ...]]]:
    """The fields of ``pad_to`` grouped by their lengths: one length per group per batch."""
    by_lengths: dict[Lengths, list[str]] = {}
    for name, lengths in pad_to.items():
        by_lengths.setdefault(lengths, []).append(name)
    return [(lengths, tuple(names)) for lengths, names in by_lengths.items()]


def pad_group(batch: Batch, lengths: Lengths, keys: Sequence[str], where: str) -> None:
    """Pads ``batch``'s fields ``keys`` (in place) to the shortest of
    ``lengths`` that holds the longest row of any of them.

    Raises:
      ValueError: a row longer than every length (never cut), naming the
        field; a leaf with no axis to pad.
    """
    rows = {key: _rows(batch[key], key, where) for key in keys}
    key, (_, longest) = max(rows.items(), key=lambda item: item[1][1])
    length = next((n for n in lengths if n >= longest), None)
    if length is None:
        if len(lengths) == 1:
            limit, fix = f"pad_to[{key!r}]={lengths[0]}", "raise it"
        else:
            limit = f"the longest of pad_to[{key!r}]={lengths}"
            fix = f"add a length of {longest} or more"
        raise ValueError(
            f"{where}: {key!r} has a row of length {longest}, longer than {limit}; {fix}, "
            f"or cut the rows in transform= (wrap never cuts them)"
        )
    for key, (array, _) in rows.items():
        batch[key] = _padded(array, length)


def _rows(array: np.ndarray, key: str, where: str) -> tuple[np.ndarray | list, int]:
    """``array`` as padding takes it (rows of different lengths, an object
    array, as a list of 1-D rows) and the length of its longest row."""
    if array.dtype == object and array.ndim == 1:
        rows = [np.asarray(row) for row in array]
        if any(row.ndim != 1 for row in rows):
            raise ValueError(
                f"{where}: pad_to pads sequences, but the rows of {key!r} are not all 1-D"
            )
        return rows, max((len(row) for row in rows), default=0)
    if array.ndim < 2:
        raise ValueError(
            f"{where}: pad_to pads the last axis of {key!r}, but it is {array.shape}: only "
            f"the batch axis; remove {key!r} from pad_to"
        )
    return array, array.shape[-1]


def _padded(array: np.ndarray | list, length: int) -> np.ndarray:
    """Rows right-padded with zeros to ``length`` on the last axis; rows of
    different lengths become one array."""
    if isinstance(array, np.ndarray):
        missing = length - array.shape[-1]
        return np.pad(array, [(0, 0)] * (array.ndim - 1) + [(0, missing)]) if missing else array
    dtypes = {row.dtype for row in array if row.size}  # np.asarray([]) is float64
    out = np.zeros((len(array), length), np.result_type(*dtypes) if dtypes else np.int32)
    for i, row in enumerate(array):
        out[i, : len(row)] = row
    return out


@dataclasses.dataclass
class PaddingReport:
    """What a wrapped source's batches carried, from the first (read by
    ``wrap()``) to the last one padded (docs/wrap.md).

    Attributes:
      batches: batches served.
      rows: real rows (``mask`` True); ``padding_rows``: rows added to fill
        ``batch_size`` (``mask`` False).
      real: per ``pad_to`` field, the values of real rows up to each row's
        last non-zero (padding is zeros at the end of a row).
      served: per ``pad_to`` field, every value served, padding included.
      shapes: each distinct set of shapes of the ``pad_to`` fields, as
        ``((field, shape), ...)``: a jitted step compiles once for each.
    """

    batches: int = 0
    rows: int = 0
    padding_rows: int = 0
    real: dict[str, int] = dataclasses.field(default_factory=dict)
    served: dict[str, int] = dataclasses.field(default_factory=dict)
    shapes: set[tuple[tuple[str, tuple[int, ...]], ...]] = dataclasses.field(default_factory=set)

    def padding_fraction(self, field: str | None = None) -> float:
        """The share of ``field``'s served values that are padding (of every
        ``pad_to`` field's together for None); 0.0 before any."""
        fields = self.served if field is None else [field]
        served = sum(self.served.get(f, 0) for f in fields)
        return 1 - sum(self.real.get(f, 0) for f in fields) / served if served else 0.0

    def add(self, batch: Batch, keys: Sequence[str], rows: int, size: int) -> None:
        """Counts one padded batch of ``rows`` real rows out of ``size``."""
        self.batches += 1
        self.rows += rows
        self.padding_rows += size - rows
        for key in keys:
            array = batch[key]
            self.real[key] = self.real.get(key, 0) + _values_to_last_nonzero(array[:rows])
            self.served[key] = self.served.get(key, 0) + array.size
        self.shapes.add(tuple((key, batch[key].shape) for key in keys))

    def __str__(self) -> str:
        fields = "".join(
            f"; {key!r}: {self.padding_fraction(key):.1%} padding "
            f"({self.served[key] - self.real[key]:,} of {self.served[key]:,} values)"
            for key in self.served
        )
        return (
            f"{self.batches} batches, {self.rows:,} rows + {self.padding_rows:,} padding rows"
            f"{fields}; {len(self.shapes)} distinct shape(s)"
        )


def _values_to_last_nonzero(array: np.ndarray) -> int:
    """The values of each row (last axis) up to its last non-zero, summed."""
    if array.size == 0:
        return 0
    nonzero = array != 0
    last = nonzero.shape[-1] - np.argmax(nonzero[..., ::-1], axis=-1)
    return int(np.where(nonzero.any(axis=-1), last, 0).sum())

"""Fields ``make`` keeps on the host: ``make(..., host_fields=("text",))``.

A string or ``bytes`` field that is not an image (a Parquet string column, an
Example bytes feature holding text) or any field the step does not take rides
along with each batch as numpy, never placed on a device, as ``wrap``'s
``host_fields`` do: the backend reads the other fields, and each batch gains
these fields' rows at the batch's indices in the shared sampler's order, so
they are the same on every backend. A bytes field arrives as an object array
of ``bytes`` (``b""`` in padded rows); a numeric one as its rows (zeros in
padded rows). They are not in ``element_spec`` and not passed to ``transform``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from jaxfeed.loaders.array_dataset import ArrayDataset
from jaxfeed.loaders.bytes_field import BytesField
from jaxfeed.loaders.protocol import Batch
from jaxfeed.loaders.rows import pad_rows
from jaxfeed.loaders.sampler import Sampler

__all__ = ["HostFieldSource", "split_host_fields"]


def split_host_fields(
    data: ArrayDataset, names: Sequence[str]
) -> tuple[ArrayDataset, dict[str, np.ndarray | BytesField]]:
    """``data`` without the fields ``names`` (what the backend reads), and those fields.

    Raises:
      ValueError: ``names`` is a string, names a field ``data`` lacks, or all of them.
    """
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise ValueError(
            f"host_fields must be a sequence of field names like ('text',), got {names!r}"
        )
    missing = [n for n in names if n not in data.arrays]
    if missing:
        raise ValueError(
            f"host_fields {missing} are not fields of {data.name}; it has {list(data.arrays)}"
        )
    kept = {k: v for k, v in data.arrays.items() if k not in names}
    if not kept:
        raise ValueError(
            f"host_fields={tuple(names)!r} leave no field of {data.name} for the device"
        )
    # Not its files read in place: they hold the host fields too.
    rest = ArrayDataset(
        data.name,
        kept,
        transform=data.transform,
        classes=data.classes,
        units=data.units,
        origin=data.origin,
    )
    return rest, {n: data.arrays[n] for n in dict.fromkeys(names)}


class HostFieldSource:
    """A backend's source whose batches gain ``fields``' rows (see the module
    docstring); every other attribute is the source's."""

    def __init__(
        self, source: Any, fields: Mapping[str, np.ndarray | BytesField], sampler: Sampler
    ):
        self._source, self._fields, self._sampler = source, dict(fields), sampler

    @property
    def host_fields(self) -> tuple[str, ...]:
        return tuple(self._fields)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._source, name)

    def iter_epoch(self, epoch: int = 0, *, start: int = 0) -> Iterator[Batch]:
        batches = self._source.iter_epoch(epoch, start=start)  # checks epoch and start
        return self._with_fields(batches, self._sampler.epoch_plan(epoch, start))

    def _with_fields(self, batches: Iterator[Batch], plan: Iterator) -> Iterator[Batch]:
        try:
            for batch, (indices, num_valid) in zip(batches, plan, strict=False):
                rows = indices[:num_valid]
                yield {
                    **batch,
                    **{k: _rows(f, rows, len(indices)) for k, f in self._fields.items()},
                }
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()

    def __iter__(self) -> Iterator[Batch]:
        return self.iter_epoch(0)

    def __len__(self) -> int:
        return len(self._source)

    def close(self) -> None:
        close = getattr(self._source, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> HostFieldSource:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{self._source!r} + host_fields={self.host_fields}"


def _rows(field: np.ndarray | BytesField, rows: np.ndarray, size: int) -> np.ndarray:
    if isinstance(field, BytesField) or field.dtype == object:  # a store's read in place too
        out = np.full(size, b"", dtype=object)
        out[: len(rows)] = list(field[rows])
        return out
    return pad_rows(np.asarray(field[rows]), size)

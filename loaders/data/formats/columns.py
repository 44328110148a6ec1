"""The columnar copy every format is read through: each field one file in
jaxfeed's cache, written once by streaming the user's records, then
memory-mapped: a numeric field as an array of rows, a bytes field as a
`BytesField` over one data file and its offsets, a field whose rows differ
in length as a `RaggedField` over one values file and its offsets.

Row ``i`` of every field is then a fixed place on disk, so every backend
reads every format in the shared sampler's order (random access, exact
``start``) without holding the data in memory, and worker processes get the
fields by path (`jaxfeed.loaders._io.mapped_files`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
from jaxfeed.loaders.bytes_field import BytesField
from jaxfeed.loaders.ragged_field import RaggedField

__all__ = [
    "FIELDS_FILE",
    "ColumnWriter",
    "RowError",
    "common_dtype",
    "open_columns",
    "write_columns",
]

FIELDS_FILE = "fields.json"


class RowError(ValueError):
    """A record that does not fit the columns (its message names the field)."""


def common_dtype(first: np.dtype | str, second: np.dtype | str) -> np.dtype | None:
    """The dtype that holds every value of both exactly, of their own family:
    ints widen to a wider int (``uint8`` and ``int16``: ``int16``), floats to
    a wider float; None for bool and a number, an int and a float (an int64
    need not fit a float64), or ``uint64`` and a signed int."""
    first, second = np.dtype(first), np.dtype(second)
    family = {"b": "bool", "i": "int", "u": "int", "f": "float"}
    both = np.promote_types(first, second)
    kinds = {family.get(dtype.kind) for dtype in (first, second, both)}
    return both if len(kinds) == 1 and None not in kinds else None


class ColumnWriter:
    """Appends batches of rows to one file per field in ``directory``.

    The first batch fixes each field's kind (bytes, or numbers of one dtype
    and row shape); a later row that differs is refused by field name (a
    number the first dtype holds exactly, `common_dtype`, is kept). A batch
    may give a field as a `RaggedField` (rows of different lengths); a field
    whose earlier rows had one length then becomes ragged too, its rows so
    far rows of that length (their values are already back to back).
    """

    def __init__(self, directory: Path):
        self.directory = directory
        self.rows = 0
        self._fields: dict[str, dict[str, Any]] = {}
        self._files: dict[str, Any] = {}
        self._ends: dict[str, int] = {}
        self._open = contextlib.ExitStack()

    def add(self, batch: dict[str, list[bytes] | np.ndarray | RaggedField]) -> None:
        """Appends rows: per field a list of ``bytes``, an array ``[k, *shape]``
        or a `RaggedField` of ``k`` rows.

        Raises:
          RowError: a field missing, added, or of another kind, dtype or shape
            than in the first rows.
        """
        if not self._fields:
            self._start(batch)
        if batch.keys() != self._fields.keys():
            missing = sorted(self._fields.keys() - batch.keys())
            extra = sorted(batch.keys() - self._fields.keys())
            raise RowError(f"fields {missing} missing" if missing else f"new fields {extra}")
        count = None
        for name, values in batch.items():
            spec = self._fields[name]
            if spec["kind"] == "bytes":
                if isinstance(values, np.ndarray) and values.dtype != object:
                    raise RowError(f"field {name!r} holds numbers, not bytes as before")
                count = len(values)
                sizes = np.fromiter((len(v) for v in values), np.int64, len(values))
                ends = self._ends[name] + np.cumsum(sizes)
                self._files[name + ".offsets"].write(ends.tobytes())
                self._files[name].write(b"".join(values))
                self._ends[name] = int(ends[-1]) if len(ends) else self._ends[name]
            else:
                if isinstance(values, RaggedField) or spec["kind"] == "ragged":
                    values, lengths = self._ragged(name, values)
                    count = len(lengths)
                    ends = self._ends[name] + np.cumsum(lengths)
                    self._files[name + ".offsets"].write(ends.tobytes())
                    self._ends[name] = int(ends[-1]) if len(ends) else self._ends[name]
                array = np.asarray(values)
                if array.dtype.kind not in "biuf":
                    raise RowError(f"field {name!r} holds {array.dtype}, not numbers as before")
                dtype = np.dtype(spec["dtype"])
                if array.dtype != dtype and common_dtype(array.dtype, dtype) != dtype:
                    raise RowError(
                        f"field {name!r} holds {array.dtype} where earlier rows hold {dtype}: "
                        f"{dtype} does not hold every value exactly; write them as one type"
                    )
                if list(array.shape[1:]) != spec["shape"]:
                    raise RowError(
                        f"field {name!r} has {_values(array.shape[1:])} per row where earlier "
                        f"rows have {_values(spec['shape'])}"
                    )
                count = len(array) if spec["kind"] == "array" else count
                self._files[name].write(np.ascontiguousarray(array, dtype).tobytes())
        self.rows += count or 0

    def _ragged(self, name: str, values: np.ndarray | RaggedField) -> tuple[np.ndarray, np.ndarray]:
        """A ragged field's values and lengths from ``values`` (rows of one
        length given as an array: ``[k, n, *frame]``, or ``[k]`` for rows of
        one value, as an Example's one-value feature reads); the field made
        ragged first if its earlier rows had one length."""
        spec = self._fields[name]
        frame = list(values.frame_shape) if isinstance(values, RaggedField) else None
        if spec["kind"] == "array":  # earlier rows of one length: now ragged
            shape = spec["shape"]
            if shape[1:] != frame:
                raise RowError(
                    f"field {name!r} has rows of {_values(frame or ())} steps where earlier "
                    f"rows have {_values(shape)}: rows may differ only in their length"
                )
            self._become_ragged(name, shape[0] if shape else 1, frame)
        if isinstance(values, RaggedField):
            return values.values, values.lengths
        array = np.asarray(values)
        if array.ndim == 1 and not spec["shape"]:
            return array, np.ones(len(array), np.int64)
        if array.ndim < 2 or list(array.shape[2:]) != spec["shape"]:
            raise RowError(
                f"field {name!r} has {_values(array.shape[1:])} per row where earlier rows "
                f"have rows of {_values(spec['shape'])} steps"
            )
        return array.reshape(-1, *array.shape[2:]), np.full(len(array), array.shape[1], np.int64)

    def _become_ragged(self, name: str, length: int, frame: list[int]) -> None:
        """An array field's rows so far as ragged rows of ``length`` steps of
        ``frame``: its file holds their values back to back already."""
        spec = self._fields[name]
        spec.update(kind="ragged", shape=frame)
        offsets = spec["file"].replace(".array", ".offsets")
        self._files[name + ".offsets"] = self._create(offsets)
        for start in range(0, self.rows + 1, 1 << 20):
            stop = min(self.rows + 1, start + (1 << 20))
            self._files[name + ".offsets"].write((np.arange(start, stop) * length).tobytes())
        self._ends[name] = self.rows * length

    def _start(self, batch: dict[str, list[bytes] | np.ndarray | RaggedField]) -> None:
        for i, (name, values) in enumerate(batch.items()):
            if isinstance(values, RaggedField):
                frame = [*values.frame_shape]
                spec = {"kind": "ragged", "dtype": values.dtype.str, "shape": frame}
                self._files[name + ".offsets"] = self._create(f"{i}.offsets")
                self._files[name + ".offsets"].write(np.zeros(1, np.int64).tobytes())
                self._ends[name] = 0
            elif isinstance(values, np.ndarray) and values.dtype.kind in "biuf":
                spec = {"kind": "array", "dtype": values.dtype.str, "shape": [*values.shape[1:]]}
            else:
                spec = {"kind": "bytes"}
                self._files[name + ".offsets"] = self._create(f"{i}.offsets")
                self._files[name + ".offsets"].write(np.zeros(1, np.int64).tobytes())
                self._ends[name] = 0
            spec["file"] = f"{i}.{spec['kind']}"
            self._files[name] = self._create(spec["file"])
            self._fields[name] = spec

    def _create(self, name: str) -> Any:
        return self._open.enter_context(open(self.directory / name, "wb"))

    def close(self, **meta: Any) -> None:
        """Closes the files and writes the fields' description (with ``meta``)."""
        self._open.close()
        description = {"rows": self.rows, "fields": self._fields, **meta}
        (self.directory / FIELDS_FILE).write_text(json.dumps(description))


def write_columns(
    directory: Path, batches: Iterable[dict[str, Any]], where: Callable[[int], str], **meta: Any
) -> None:
    """Streams ``batches`` into ``directory``; a bad row's error starts with
    ``where(row)`` (its file and record)."""
    writer = ColumnWriter(directory)
    try:
        for batch in batches:
            try:
                writer.add(batch)
            except RowError as err:
                raise ValueError(f"{where(writer.rows)}: {err}") from None
    finally:
        writer.close(**meta)


def open_columns(
    directory: Path,
) -> tuple[dict[str, np.ndarray | BytesField | RaggedField], dict[str, Any]]:
    """The fields written by `ColumnWriter`, memory-mapped read-only, and the
    description (``rows``, ``fields`` and the meta given to ``close``)."""
    description = json.loads((directory / FIELDS_FILE).read_text())
    rows = description["rows"]
    fields: dict[str, np.ndarray | BytesField | RaggedField] = {}
    for name, spec in description["fields"].items():
        path = directory / spec["file"]
        if spec["kind"] == "array":
            fields[name] = _mapped(path, np.dtype(spec["dtype"]), (rows, *spec["shape"]))
        elif spec["kind"] == "ragged":
            offsets = _mapped(path.with_suffix(".offsets"), np.dtype(np.int64), (rows + 1,))
            total = int(offsets[-1])
            values = _mapped(path, np.dtype(spec["dtype"]), (total, *spec["shape"]))
            fields[name] = RaggedField(values, offsets)
        else:
            offsets = _mapped(path.with_suffix(".offsets"), np.dtype(np.int64), (rows + 1,))
            fields[name] = BytesField(offsets, _mapped(path, np.dtype(np.uint8), (-1,)))
    return fields, description


def _mapped(path: Path, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    if not path.stat().st_size:  # an empty file cannot be mapped
        return np.zeros(tuple(0 if s == -1 else s for s in shape), dtype)
    return np.memmap(path, dtype, mode="r", shape=None if shape == (-1,) else shape)


def _values(shape: tuple[int, ...] | list[int]) -> str:
    return f"shape {tuple(shape)}"

"""`ArrayDataset`: any in-memory dataset, as named numeric arrays with one row axis."""

from __future__ import annotations

import dataclasses
import json
import threading
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
from jaxfeed.loaders._io.mapped_files import memmap_of
from jaxfeed.loaders.bytes_field import BytesField
from jaxfeed.loaders.protocol import MASK_KEY
from jaxfeed.loaders.ragged_field import RaggedField
from jaxfeed.loaders.remote_field import RemoteField

__all__ = ["ArrayDataset", "InPlaceFiles", "Origin", "RemoteField"]

NUMERIC_KINDS = "biuf"  # bool, signed, unsigned, float: what every backend stores


@dataclasses.dataclass(frozen=True)
class InPlaceFiles:
    """The user's files a dataset read from them is read in place from, by the
    backend that opens them with its own framework (the others read its fields).

    Attributes:
      arrow: Arrow IPC files, in order, which the hf backend opens with
        `datasets` itself (no Arrow copy); () when none.
      arrayrecord: ArrayRecord files that hold records, in order, which the
        grain backend reads through Grain's own source; () when none.
      examples: whether those ArrayRecord files hold Examples (else raw records).
      arrays: the fields themselves are read where they are (in memory or
        on disk), never copied into a framework's own format first: a ragged
        field's values, one row per value, which a per-row store (TFDS
        records) would only slow down.
    """

    arrow: tuple[str, ...] = ()
    arrayrecord: tuple[str, ...] = ()
    examples: bool = False
    arrays: bool = False


class Origin(Protocol):
    """Where a dataset's files were fetched from (a store's objects), checked
    at every epoch's start as local files are."""

    def check(self) -> None:
        """Raises ValueError, naming the object, when one changed since the
        dataset was made."""


class ArrayDataset(Mapping[str, np.ndarray]):
    """One split held in memory: a flat dict of arrays that share a row axis.

    Any names, dtypes and per-row shapes: ``{"image": uint8 [N, 28, 28, 1],
    "label": int32 [N]}`` for MNIST, ``{"x": float32 [N, 3, 32, 32], "y":
    int64 [N], "meta": float32 [N, 8]}`` for your own data, or encoded
    records: ``{"png": [b"\\x89PNG...", ...], "label": ...}``, a field of
    variable-length ``bytes`` per row (a list of them, a numpy object array
    of them, or a `BytesField`), held as one buffer plus offsets; ``make``
    then needs a ``transform`` that decodes it into numbers. Every backend
    builds its native pipeline (TFDS features, HF features, a torch
    ``Dataset``, a Grain source) from these names, dtypes and shapes, and
    every source's ``element_spec`` is ``[batch_size, *row_shape]`` of them.

    A 64-bit field is stored as JAX holds it on a device: 32-bit unless
    ``jax_enable_x64`` is on, so ``element_spec`` is what the step receives;
    an integer that does not fit is refused, never wrapped around. Arrays are
    C-contiguous, read-only views (copied only when the input is not
    contiguous or must be cast); the caller's own arrays are not frozen.

    Args:
      name: a readable name, conventionally ``"<dataset>/<split>"``; it names
        native-format cache entries and appears in errors.
      arrays: field name -> array with the rows on axis 0.
      transform: the per-record transform ``make`` runs when it is given
        none (a named encoded dataset's own augmentation); None: none.
      classes, units, in_place, origin: what a dataset read from files knows
        of them, kept as the attributes of these names (below); none by default.

    Raises:
      TypeError: ``arrays`` is not a mapping of names to arrays.
      ValueError: no fields; a field named ``"mask"``; a field that is not
        numbers or bytes (strings, other objects); a scalar field; a field
        of empty rows (``(N, 0)``); fields with different row counts; no
        rows; a 64-bit integer that does not fit in 32 bits without x64; a
        file-mapped field in the other byte order (an in-memory one is
        served in this machine's order). Each message names the field.

    Example:
      >>> ds = ArrayDataset("toy/train", {"x": np.zeros((10, 3), np.float32),
      ...                                 "y": np.arange(10)})
      >>> len(ds), sorted(ds), ds["y"].dtype
      (10, ['x', 'y'], dtype('int32'))
    """

    classes: tuple[str, ...]
    """The class names of a labelled dataset read from files (an image folder's
    subdirectories, a TFDS or HF ``ClassLabel``), by label; () when unknown."""

    units: tuple[int, ...]
    """The rows of each unit a dataset read from files came from, in order (a
    TFRecord/ArrayRecord shard, a Parquet row group, an Arrow record batch):
    ``shuffle="blocks"`` keeps its blocks inside them; () when none."""

    in_place: InPlaceFiles | None
    """The user's files a backend reads in place of the fields; None: none."""

    origin: Origin | None
    """The remote objects its files were fetched from; None: local or in memory."""

    _build: Callable[[], Mapping[str, Any]] | None = None  # of a `deferred` dataset

    def __init__(
        self,
        name: str,
        arrays: Mapping[str, np.ndarray],
        transform: Any = None,
        *,
        classes: Sequence[str] = (),
        units: Sequence[int] = (),
        in_place: InPlaceFiles | None = None,
        origin: Origin | None = None,
        deferred: tuple[int, Callable[[], Mapping[str, Any]]] | None = None,
    ):
        if not isinstance(arrays, Mapping):
            raise TypeError(
                f"dataset {name!r}: arrays must be a dict of field name -> array, "
                f"got {type(arrays).__name__}"
            )
        if not arrays:
            raise ValueError(f"dataset {name!r} has no fields; pass a dict of arrays")
        fields = {}
        for key, value in arrays.items():
            fields[key] = _field(name, key, value)
        rows = {key: len(value) for key, value in fields.items()}
        if len(set(rows.values())) > 1:
            raise ValueError(
                f"dataset {name!r}: fields disagree on the number of rows: {rows}; "
                "every field needs one row per example on axis 0"
            )
        if not next(iter(rows.values())):
            raise ValueError(f"dataset {name!r} has no rows")
        self.name = name
        self.transform = transform
        self.classes, self.units = tuple(classes), tuple(units)
        self.in_place, self.origin = in_place, origin
        self._arrays: Mapping[str, np.ndarray | BytesField] | None = types.MappingProxyType(fields)
        self._rows = len(next(iter(fields.values())))
        self.head = types.MappingProxyType({key: value[:1] for key, value in fields.items()})
        """Row 0 of every field (its dtype and row shape), known without the fields."""
        if deferred is not None:  # `arrays` was the head: see `deferred`
            (self._rows, self._build), self._arrays = deferred, None
            self._building = threading.Lock()

    @classmethod
    def deferred(
        cls,
        name: str,
        head: Mapping[str, Any],
        rows: int,
        build: Callable[[], Mapping[str, Any]],
        *,
        classes: Sequence[str] = (),
        units: Sequence[int] = (),
        in_place: InPlaceFiles | None = None,
    ) -> ArrayDataset:
        """A dataset whose fields are built by ``build()`` on first use of
        `arrays`: a backend that reads the user's files itself (grain over
        ArrayRecord, ``in_place``) needs only ``head`` (row 0 of each field,
        as `ArrayDataset` would hold it) and ``rows``, and never builds them.
        ``classes``, ``units``, ``in_place``: as `ArrayDataset` takes them.

        Raises:
          ValueError: (at the build) fields that disagree with ``head`` or ``rows``.
        """
        return cls(
            name, head, classes=classes, units=units, in_place=in_place, deferred=(rows, build)
        )

    @property
    def arrays(self) -> Mapping[str, np.ndarray | BytesField]:
        """Field name -> its rows (built now, the first time, for a `deferred` dataset)."""
        if self._arrays is None:
            with self._building:
                if self._arrays is None:
                    self._arrays = self._built(sequences=False).arrays
        return self._arrays

    def with_fields(self) -> ArrayDataset:
        """This dataset as one that holds its fields: itself, or a `deferred`
        one's built, each as its files hold it. Row 0, which a deferred one is
        made from, cannot tell a field whose rows differ in length, which the
        built one holds as a `RaggedField` (what ``pad=``/``pack=`` plan)."""
        if self._build is None:
            return self
        return self._built(sequences=True)

    def _built(self, sequences: bool) -> ArrayDataset:
        built = ArrayDataset(
            self.name,
            self._build(),
            self.transform,
            classes=self.classes,
            units=self.units,
            origin=self.origin,
        )
        ragged = [key for key in built.ragged_fields() if key not in self.ragged_fields()]
        if ragged and not sequences:
            raise ValueError(found_ragged(self.name, ragged))
        same = list(built.head) == list(self.head) and len(built) == self._rows
        if not same or any(
            built.head[key].dtype != want.dtype
            or (built.head[key].shape != want.shape and key not in ragged)
            for key, want in self.head.items()
        ):
            raise ValueError(
                f"dataset {self.name!r}: its files now hold {built!r}, not the "
                f"{self._rows} rows of {self!r} they held when it was made: a file changed; "
                "make the source again"
            )
        return built

    def __getitem__(self, key: str) -> np.ndarray | BytesField:
        return self.arrays[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.head)

    def __len__(self) -> int:
        """Rows (examples), not fields: ``len(ds)`` is what a sampler covers."""
        return self._rows

    def __eq__(self, other: object) -> bool:
        return self is other

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}: {v.dtype} {list(v.shape[1:])}" for k, v in self.head.items())
        return f"ArrayDataset({self.name!r}, {len(self)} rows, {{{fields}}})"

    def content(self) -> tuple[np.ndarray, ...]:
        """The field names (as bytes) and every array, in order: what a cache
        key or a fingerprint hashes, so two datasets agree only if both match."""
        names = np.frombuffer(json.dumps(list(self.arrays)).encode(), np.uint8)
        arrays = []
        for array in self.arrays.values():
            # A bytes or ragged field (a store's read in place too) is its defining arrays.
            arrays.extend(array.content() if hasattr(array, "content") else (array,))
        return (names, *arrays)

    def ragged_fields(self) -> list[str]:
        """The fields whose rows differ in length, which only ``pad=``,
        ``bucket=`` or ``pack=`` can batch."""
        return [key for key, array in self.head.items() if isinstance(array, RaggedField)]

    def bytes_fields(self) -> list[str]:
        """The fields of encoded bytes, which only a transform can feed a device."""
        return [key for key, array in self.head.items() if isinstance(array, BytesField)]


def found_ragged(dataset: str, fields: Sequence[str]) -> str:
    """What to say of ``fields`` of a dataset read from files that turn out to
    hold rows of different lengths, where its row 0 alone had been read."""
    return (
        f"dataset {dataset}: field(s) {list(fields)} hold rows of different lengths (row 0 "
        "alone was read when it was made); pass pad=L, bucket=(64, 128, ...) or pack=L to "
        "make to batch them (docs/sequences.md); dataset.with_fields() holds them as read"
    )


def _field(dataset: str, key: object, value: object) -> np.ndarray | BytesField:
    """One field, checked and made a read-only, contiguous array (or a `BytesField`)."""
    if not isinstance(key, str) or not key:
        raise TypeError(f"dataset {dataset!r}: field names must be non-empty str, got {key!r}")
    where = f"dataset {dataset!r}, field {key!r}"
    if key == MASK_KEY:
        raise ValueError(
            f"{where}: the name {MASK_KEY!r} is reserved for the row mask jaxfeed adds to "
            "padded batches; rename the field (e.g. 'attention_mask')"
        )
    if isinstance(value, BytesField) or (
        isinstance(value, RemoteField) and not isinstance(value, np.ndarray)
    ):
        return value
    if isinstance(value, RaggedField):
        return _ragged_field(value, where)
    if _is_bytes_rows(value):
        try:
            return BytesField.from_values(value)
        except TypeError as err:
            raise ValueError(f"{where}: {err}; a bytes field holds bytes in every row") from None
    if _is_ragged_rows(value):  # rows of numbers that differ in length: a sequence field
        try:
            return _ragged_field(RaggedField.from_rows(value), where)
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None
    try:
        array = np.asarray(value)
    except ValueError:  # numpy's "setting an array element with a sequence"
        if not isinstance(value, list | tuple):
            raise
        raise ValueError(_ragged(where, value)) from None
    if array.dtype.kind == "O" and array.ndim == 1 and len({_shape(r) for r in array}) > 1:
        raise ValueError(_ragged(where, array))  # an object array of rows
    if array.dtype.kind not in NUMERIC_KINDS:
        raise ValueError(
            f"{where} is {array.dtype} ({array.dtype.kind!r} kind); datasets hold numbers, "
            "bools or encoded bytes (a list of bytes per row) only: encode it as numbers "
            "(token ids, class ids) or bytes first, or leave it out"
        )
    if array.ndim == 0:
        raise ValueError(f"{where} is a scalar; every field needs one row per example on axis 0")
    if 0 in array.shape[1:]:
        raise ValueError(
            f"{where} has empty rows (shape {array.shape}): a row of no values cannot be "
            "batched by every backend; leave the field out"
        )
    if not array.dtype.isnative:
        array = _native_byte_order(array, where)
    array = as_device_dtype(array, where)
    view = np.ascontiguousarray(array).view()
    view.flags.writeable = False
    return view


def _ragged_field(field: RaggedField, where: str) -> RaggedField:
    """``field`` with its values as the device holds them (64-bit narrowed as
    for any field) and in this machine's byte order (the same rules)."""
    values = field.values
    if isinstance(values, RemoteField) and not isinstance(values, np.ndarray):
        return field  # a store's values: served in the device's dtype already
    if not values.dtype.isnative:
        values = _native_byte_order(values, where)
    values = as_device_dtype(values, where)
    return field if values is field.values else RaggedField(values, field.offsets)


def _is_ragged_rows(value: object) -> bool:
    """A list, tuple or 1-D object array of numeric arrays (or lists) of at
    least one axis whose first axes differ: a `RaggedField`."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind != "O" or value.ndim != 1:
            return False
    elif not isinstance(value, list | tuple):
        return False
    if len(value) < 2 or not all(isinstance(r, np.ndarray | list | tuple) for r in value):
        return False
    shapes = [_shape(r) for r in value]
    if "ragged" in shapes or any(len(s) < 1 for s in shapes):
        return False
    kinds = {np.asarray(r).dtype.kind for r in value if len(r)}
    return (
        len({s[0] for s in shapes}) > 1
        and len({s[1:] for s in shapes}) == 1
        and kinds <= set(NUMERIC_KINDS)
    )


def _shape(row: object) -> tuple[int, ...] | str:
    try:
        return np.shape(row)
    except ValueError:  # itself ragged
        return "ragged"


def _ragged(where: str, rows: Any) -> str:
    """What to say of a field whose rows have different shapes."""
    shapes = [_shape(row) for row in rows]
    other = next((i for i, shape in enumerate(shapes) if shape != shapes[0]), None)
    which = "" if other is None else f" (row 0: {shapes[0]}, row {other}: {shapes[other]})"
    return (
        f"{where} has rows of different shapes{which}; rows may differ only in their first "
        f"axis (a sequence's length; then pass pad=, bucket= or pack= to make): pad or cut "
        f"them to one shape first"
    )


def _native_byte_order(array: np.ndarray, where: str) -> np.ndarray:
    """A field stored in the other byte order (a ``.npy`` written big-endian) in
    this machine's order. One rule at the boundary: the hf and tf stores keep a
    field's raw bytes under its native dtype, so a swapped field would otherwise
    reach them as other numbers (``1.0`` as ``4.6e-41``).

    Raises:
      ValueError: the field is mapped from a file, which is read in place (a
        native copy could be bigger than memory); the message gives the fix.
    """
    native = array.dtype.newbyteorder("=")
    if (mapped := memmap_of(array)) is not None:
        raise ValueError(
            f"{where} is stored as {array.dtype.str}, the other byte order than this "
            f"machine's, in {mapped.filename}, which is read in place; rewrite that file once "
            f"in native order: np.save(path, np.load(path).astype({native.str!r}))"
        )
    return array.astype(native)


def _is_bytes_rows(value: object) -> bool:
    """A list, tuple or object array whose first row is ``bytes``: a bytes field."""
    if isinstance(value, np.ndarray):
        return (
            value.dtype.kind == "O"
            and value.ndim == 1
            and len(value) > 0
            and (isinstance(value[0], bytes))
        )
    return isinstance(value, list | tuple) and len(value) > 0 and isinstance(value[0], bytes)


def as_device_dtype(
    array: np.ndarray, where: str, fix: str = "map the values into range"
) -> np.ndarray:
    """``array`` in the dtype JAX gives it on a device: 64-bit becomes 32-bit
    unless ``jax_enable_x64`` (JAX's own rule). `ArrayDataset` and `wrap` both
    use it, so ``element_spec`` is what a jitted step receives.

    Raises:
      ValueError: an integer that would not fit (JAX would wrap it silently);
        the message starts with ``where`` and ends with ``fix``.
    """
    return narrowed(array, device_dtype(array.dtype), where, fix)


def device_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype JAX holds ``dtype`` as on a device (`as_device_dtype`)."""
    if dtype.kind not in "iufc" or dtype.itemsize < 8:
        return dtype
    import jax  # only for 64-bit fields: JAX's own rule reads its x64 flag

    return np.dtype(jax.dtypes.canonicalize_dtype(dtype))


def narrowed(
    array: np.ndarray, dtype: np.dtype, where: str, fix: str = "map the values into range"
) -> np.ndarray:
    """``array`` as ``dtype``, the device dtype `as_device_dtype` chose (known
    already, so no JAX import: Grain's workers call this per batch).

    Raises:
      ValueError: an integer that does not fit ``dtype`` (a cast would wrap it).
    """
    if dtype == array.dtype:
        return array
    if dtype.kind in "iu" and array.dtype.kind in "iu" and array.size:
        info, low, high = np.iinfo(dtype), array.min(), array.max()
        if low < info.min or high > info.max:
            raise ValueError(
                f"{where} holds {low}..{high}, which does not fit the {dtype} JAX makes of "
                f"{array.dtype} without x64; enable jax_enable_x64, or {fix}"
            )
    return array.astype(dtype)

"""One batch of a wrapped loader, leaf by leaf: flattened to named numpy
arrays, checked as numbers JAX can hold, padded, cast as JAX would cast them.

`wrapped_source.WrappedSource` strings these together; each raises a
``ValueError`` that names the batch (``where``) and the field. `check_fields`
checks ``wrap``'s ``host_fields=`` / ``pad_to=`` before any batch is read.

``pad_to=`` gives each field one length or several (buckets): `pad_group`
pads a batch's fields to the shortest that holds every row, fields given the
same lengths sharing it (``input_ids`` and ``attention_mask`` stay aligned);
`PaddingReport` counts what the padding has cost.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from jaxfeed.loaders.array_dataset import as_device_dtype
from jaxfeed.loaders.checks import check_int
from jaxfeed.loaders.protocol import ArraySpec, Batch
from jaxfeed.loaders.rows import pad_rows

DEFAULT_KEYS = ("image", "label")  # the names of a 2-tuple batch's parts
Lengths = tuple[int, ...]  # a pad_to field's lengths: ascending, distinct


def map_leaves(fn: Callable[..., Any], tree: Any, *rest: Any) -> Any:
    """``fn`` over the leaves of a raw batch's structure (nested dicts,
    tuples, lists and namedtuples), in order, keeping the structure; ``rest``
    are trees of the same structure whose leaves are passed along."""
    if isinstance(tree, Mapping):
        return {k: map_leaves(fn, v, *(r[k] for r in rest)) for k, v in tree.items()}
    if isinstance(tree, tuple | list):
        parts = [map_leaves(fn, *branch) for branch in zip(tree, *rest, strict=True)]
        return type(tree)(*parts) if hasattr(tree, "_fields") else type(tree)(parts)
    return fn(tree, *rest)


DIGEST_VALUES = 4096  # values of each leaf a digest reads, spread over it


def digest(raw: Any) -> str:
    """A short digest of a raw batch: its leaves' dtypes and shapes and up to
    `DIGEST_VALUES` values of each, spread evenly over it (all of a small
    leaf), so it costs microseconds for any batch size. Another batch (other
    rows, other random draws) almost surely has another digest."""
    hasher = hashlib.blake2b(digest_size=8)

    def add(leaf: Any) -> None:
        try:
            array = to_numpy(leaf)
        except (TypeError, ValueError):
            hasher.update(repr(leaf).encode())
            return
        hasher.update(f"{array.dtype.str}{array.shape}".encode())
        flat = array.reshape(-1)
        values = flat[:: max(1, flat.size // DIGEST_VALUES)]
        objects = values.dtype.hasobject  # (their bytes would be addresses)
        hasher.update(repr(values.tolist()).encode() if objects else values.tobytes())

    map_leaves(add, raw)
    return hasher.hexdigest()


def flatten(raw: Any, keys: tuple[str, ...] | None) -> Batch:
    """A raw batch (dict, tuple/list, or one array) as a flat dict of numpy
    arrays; ``keys`` names the parts of a tuple (default `DEFAULT_KEYS`)."""
    if isinstance(raw, Mapping):
        if keys is not None:
            raise ValueError(
                f"keys={keys} names the parts of tuple batches, but the batches are dicts "
                f"with keys {sorted(map(str, raw))}; omit keys, or rename with transform="
            )
        items = list(raw.items())
    elif isinstance(raw, tuple | list):
        names = keys or getattr(raw, "_fields", None) or DEFAULT_KEYS
        if len(names) != len(raw):
            raise ValueError(
                f"batches have {len(raw)} parts but the keys are {tuple(names)}; "
                f"pass keys= with {len(raw)} names"
            )
        items = list(zip(names, raw, strict=True))
    elif hasattr(raw, "shape"):
        items = [((keys or DEFAULT_KEYS)[0], raw)]
    else:
        hint = ""
        if isinstance(raw, bytes):  # e.g. an ArrayRecord / TFRecord source read raw
            hint = (
                ": each item is one serialized record, not a batch; parse and batch the "
                "records first, e.g. grain.MapDataset.source(records).map(parse).batch(32) "
                "with parse = tf.train.Example.FromString (or your own decoder), and wrap that"
            )
        raise TypeError(
            f"a batch must be a dict, a tuple/list or an array, got {type(raw).__name__}{hint}"
        )
    out: Batch = {}
    for key, value in items:
        _add(out, str(key), value)
    return out


def with_positional_names(
    error: ValueError, raw: Any, keys: tuple[str, ...] | None, wanted: Sequence[str] = ()
) -> str | None:
    """``error``'s message, saying how to name the fields, when it names a field
    that is a part of a tuple batch (or a bare array) named by its position
    (`DEFAULT_KEYS`, for want of ``keys``); else None. ``wanted``: the names
    ``pad_to`` / ``host_fields`` give that the batch lacks, which the example
    ``keys=`` uses first."""
    if keys is not None or isinstance(raw, Mapping) or hasattr(raw, "_fields"):
        return None
    parts = len(raw) if isinstance(raw, tuple | list) else 1
    names = DEFAULT_KEYS[:parts]
    if not any(repr(name) in str(error) for name in names):
        return None
    what = "tuple" if isinstance(raw, tuple | list) else "bare array"
    named = ", ".join(f"{name!r} is part {i}" for i, name in enumerate(names))
    example = [*dict.fromkeys(wanted)][:parts]
    example += ["input_ids", "label"][len(example) : parts]
    return (
        f"{error} (the batches are {what}s, whose parts are named by position: {named}; "
        f"name them with keys=, e.g. keys={tuple(example)!r})"
    )


def _add(out: Batch, key: str, value: Any) -> None:
    """Nested dicts and tuples/lists of arrays become "/"-joined keys."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            _add(out, f"{key}/{k}", v)
    elif isinstance(value, tuple | list) and value and all(map(_has_arrays, value)):
        for i, v in enumerate(value):
            _add(out, f"{key}/{i}", v)
    elif key in out:
        raise ValueError(f"two leaves of a batch flatten to the same key {key!r}")
    else:
        out[key] = to_numpy(value)


def _has_arrays(value: Any) -> bool:
    if isinstance(value, Mapping):
        return True
    if isinstance(value, tuple | list):
        return bool(value) and all(map(_has_arrays, value))
    return hasattr(value, "shape")


def to_numpy(value: Any) -> np.ndarray:
    """One leaf as numpy, without a copy where the framework allows."""
    if isinstance(value, np.ndarray):
        return value
    if type(value).__module__.partition(".")[0] == "torch" and hasattr(value, "numpy"):
        # .numpy() shares a CPU tensor's memory; copy only when it must.
        if value.requires_grad:
            value = value.detach()
        if value.device.type != "cpu":
            value = value.cpu()
        return value.numpy()
    try:
        return np.asarray(value)  # jax / tf tensors, Python lists, scalars
    except ValueError:
        if not isinstance(value, list | tuple):
            raise
    # Rows of different lengths: one object per row, for pad_to= to pad (or
    # for the non-numeric check to name).
    ragged = np.empty(len(value), object)
    for i, row in enumerate(value):
        ragged[i] = row
    return ragged


_NON_NUMERIC = {
    "U": "strings",
    "S": "bytes",
    "O": "Python objects",
    "M": "datetimes",
    "m": "timedeltas",
    "V": "raw bytes or records",
}


def check_numeric(arrays: Mapping[str, np.ndarray], where: str) -> None:
    """Raises for leaves JAX cannot hold, naming the ways out: every field
    whose rows differ in length (each needs ``pad_to``) in one message, else
    the first that is not numbers."""
    ragged = [key for key, array in arrays.items() if _rows_differ(array)]
    if ragged:
        fields = ", ".join(map(repr, ragged))
        fields = f"field {fields} is" if len(ragged) == 1 else f"fields {fields} are"
        raise ValueError(
            f"{where}: {fields} object (rows of different lengths); pad them to a fixed "
            f"length with {_pad_to(ragged)}, or carry them as numpy with "
            f"host_fields={tuple(ragged)!r}{_buckets(ragged)}"
        )
    for key, array in arrays.items():
        dtype = array.dtype
        if dtype.kind in "biufc" or dtype.type.__module__ == "ml_dtypes":  # bfloat16, float8
            continue
        name = dtype.str if dtype.kind in "US" else dtype.name
        if _encoded(array):
            raise ValueError(
                f"{where}: field {key!r} is {name} (encoded bytes, e.g. image files); JAX "
                f"arrays hold numbers only: decode them with transform= (an image: "
                f"np.asarray(PIL.Image.open(io.BytesIO(data)))), or pass host_fields=({key!r},) "
                f"to carry them with the batch as numpy"
            )
        raise ValueError(
            f"{where}: field {key!r} is {name} ({_NON_NUMERIC.get(dtype.kind, 'not numbers')}); "
            f"JAX arrays hold numbers only: drop it with transform=, tokenize it, or pass "
            f"host_fields=({key!r},) to carry it with the batch as numpy"
        )


def _encoded(array: np.ndarray) -> bool:
    """Whether ``array`` holds encoded bytes: objects that are bytes (a file read
    whole, a tf.data string tensor) or ``{"bytes": ...}`` (an undecoded
    ``datasets`` image)."""
    if array.dtype.kind != "O" or array.size == 0:
        return False
    first = array.flat[0]
    if isinstance(first, Mapping):
        first = first.get("bytes")
    return isinstance(first, bytes | bytearray)


def _rows_differ(array: np.ndarray) -> bool:
    """Whether ``array`` holds one object per row: rows of different lengths."""
    return (
        array.dtype.kind == "O"
        and array.size > 0
        and isinstance(array.flat[0], np.ndarray | list | tuple)
    )


def _pad_to(keys: Sequence[str]) -> str:
    """``pad_to={'a': N, 'b': N}``: the option that pads ``keys``."""
    return "pad_to={" + ", ".join(f"{key!r}: N" for key in keys) + "}"


def _buckets(keys: Sequence[str]) -> str:
    """How ``pad_to`` pads ``keys`` less: to one of a few lengths per batch."""
    lengths = "{" + ", ".join(f"{key!r}: (64, 128, 256)" for key in keys) + "}"
    return (
        f"; or pad each batch to the shortest of a few lengths that fits, e.g. "
        f"pad_to={lengths}: a jitted step then compiles for at most 3 shapes"
    )


def pad_batch_rows(array: np.ndarray, size: int) -> np.ndarray:
    """``array`` padded to ``size`` rows (zeros; None for an object array)."""
    if array.dtype != object:
        return pad_rows(array, size)
    out = np.empty((size, *array.shape[1:]), object)  # None, not 0, on padding rows
    out[: len(array)] = array
    return out


def as_on_device(array: np.ndarray, key: str, where: str) -> np.ndarray:
    """``array`` in the dtype JAX gives it on a device (`as_device_dtype`)."""
    return as_device_dtype(array, f"{where}: {key!r}", "map the values into range with transform=")


def count_rows(batch: Batch, where: str) -> int:
    """The rows every leaf of ``batch`` has; raises for a scalar or a disagreement."""
    if not batch:
        raise ValueError(f"{where} is empty (no arrays)")
    rows = {k: v.shape[0] if v.ndim else None for k, v in batch.items()}
    for key, n in rows.items():
        if n is None:
            raise ValueError(
                f"{where}: {key!r} is a scalar; every leaf needs a batch axis "
                f"(does the loader batch? e.g. grain's .batch(n), DataLoader(batch_size=n))"
            )
    if len(set(rows.values())) > 1:
        raise ValueError(f"{where}: leaves disagree on the number of rows: {rows}")
    return next(iter(rows.values()))


def raise_mismatch(
    expected: dict[str, ArraySpec], got: dict[str, ArraySpec], where: str, spec_from: str
) -> None:
    """Raises for a batch whose spec differs from the first one's, naming
    every field that differs."""

    def describe(spec: ArraySpec | None) -> str:
        return "missing" if spec is None else f"{spec.dtype} {spec.shape}"

    keys = [k for k in sorted(expected.keys() | got.keys()) if expected.get(k) != got.get(k)]
    fix = "make them agree with transform="
    # Only the last axis differs: a length that varies, which pad_to fixes.
    lengths = [k for k in keys if _length_varies(expected.get(k), got.get(k))]
    if lengths:
        fields = ", ".join(map(repr, lengths))
        fix = f"pad {fields} to a fixed length with {_pad_to(lengths)}, or " + fix
    differences = "; ".join(
        f"{key!r} is {describe(got.get(key))}, but {spec_from} had {describe(expected.get(key))}"
        for key in keys
    )
    raise ValueError(
        f"{where}: {differences}; every batch needs the same keys, shapes and dtypes ({fix})"
        + (_buckets(lengths) if lengths else "")
    )


def _length_varies(old: ArraySpec | None, new: ArraySpec | None) -> bool:
    """Whether two specs differ in their last axis only: a length that varies."""
    if old is None or new is None or old.dtype != new.dtype:
        return False
    return len(old.shape) == len(new.shape) > 1 and old.shape[:-1] == new.shape[:-1]


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


def check_fields(
    host_fields: Sequence[str], pad_to: Mapping[str, Any] | None
) -> tuple[tuple[str, ...], dict[str, Lengths]]:
    """``host_fields`` and ``pad_to`` checked: a tuple, and each field's
    lengths (an int or a sequence of ints) as an ascending tuple."""
    if isinstance(host_fields, str) or not all(isinstance(n, str) for n in host_fields):
        raise TypeError(
            f"host_fields must be a sequence of field names like ('text',), got {host_fields!r}"
        )
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
    return tuple(dict.fromkeys(host_fields)), checked

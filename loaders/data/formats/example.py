"""``tf.train.Example`` read from (and written as) its protobuf wire bytes,
without TensorFlow.

An Example is ``features {feature {key: name, value: one of bytes_list /
float_list / int64_list}}``. Decoding the few message types by hand keeps
the record readers free of a TensorFlow import (seconds, and gigabytes of
address space in every worker) for a format TFDS, tf.data and ArrayRecord
users all write.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
from jaxfeed.loaders.ragged_field import RaggedField

__all__ = [
    "Feature",
    "Record",
    "example_batch",
    "example_batches",
    "example_schema",
    "parse_example",
    "serialize_example",
    "serialize_examples",
]

Record = tuple[str, int, bytes]
"""A serialized record and where it lies: ``(file, index in the file, bytes)``."""

Feature = tuple[str, list[bytes] | np.ndarray]
"""``("bytes", [b"..."])``, ``("float", float32 [k])``, ``("int64", int64 [k])``
or ``("none", [])`` for a feature with no list set."""

_VARINT, _FIXED64, _LEN, _FIXED32 = 0, 1, 2, 5
_KINDS = {1: "bytes", 2: "float", 3: "int64"}  # Feature's oneof field numbers
_BATCH_BYTES = 64 << 20  # a batch's records: large images make fewer rows, not more memory


def parse_example(buf: bytes) -> dict[str, Feature]:
    """Each feature of one serialized Example, by name.

    Raises:
      ValueError: the bytes are not a well-formed Example.
    """
    features: dict[str, Feature] = {}
    for number, wire, start, end in _fields(buf, 0, len(buf)):
        if number != 1 or wire != _LEN:  # Example.features
            continue
        for number, wire, s, e in _fields(buf, start, end):
            if number != 1 or wire != _LEN:  # Features.feature: a map entry
                continue
            name, feature = None, ("none", [])
            for field, kind, fs, fe in _fields(buf, s, e):
                if field == 1 and kind == _LEN:
                    name = bytes(buf[fs:fe]).decode("utf-8")
                elif field == 2 and kind == _LEN:
                    feature = _feature(buf, fs, fe)
            if name is None:
                raise ValueError("a feature without a name")
            features[name] = feature
    return features


def _feature(buf: bytes, start: int, end: int) -> Feature:
    feature: Feature = ("none", [])
    for number, wire, s, e in _fields(buf, start, end):
        if number not in _KINDS or wire != _LEN:
            continue
        kind = _KINDS[number]
        if kind == "bytes":
            feature = (kind, [bytes(buf[vs:ve]) for n, _, vs, ve in _fields(buf, s, e) if n == 1])
        elif kind == "float":
            feature = (kind, _floats(buf, s, e))
        else:
            feature = (kind, _ints(buf, s, e))
    return feature


def _floats(buf: bytes, start: int, end: int) -> np.ndarray:
    parts = []
    for number, wire, s, e in _fields(buf, start, end):
        if number == 1 and wire in (_LEN, _FIXED32):  # packed (what writers emit) or not
            parts.append(np.frombuffer(buf[s:e], "<f4"))
    return np.concatenate(parts).astype(np.float32) if parts else np.zeros(0, np.float32)


def _ints(buf: bytes, start: int, end: int) -> np.ndarray:
    values = []
    for number, wire, s, e in _fields(buf, start, end):
        if number == 1 and wire == _LEN:  # packed varints
            pos = s
            while pos < e:
                value, pos = _varint(buf, pos)
                values.append(value)
        elif number == 1 and wire == _VARINT:
            values.append(s)
    # Negative int64s are ten-byte two's complement varints.
    return np.array([v - (1 << 64) if v >= 1 << 63 else v for v in values], np.int64)


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    if pos + 1 < len(buf) and buf[pos + 1] < 0x80 <= buf[pos]:  # two bytes: most lengths
        return (buf[pos] & 0x7F) | buf[pos + 1] << 7, pos + 2
    result = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("a varint runs past the end of the record")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def _fields(buf: bytes, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """``(field number, wire type, start, end)`` of each field in ``buf[start:end]``;
    for a varint, ``start`` is its value."""
    pos = start
    while pos < end:
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            value, pos = _varint(buf, pos)
            yield number, wire, value, pos
            continue
        if wire == _LEN:
            size, pos = _varint(buf, pos)
        elif wire in (_FIXED32, _FIXED64):
            size = 4 if wire == _FIXED32 else 8
        else:
            raise ValueError(f"wire type {wire} is not in an Example")
        if pos + size > end:
            raise ValueError("a field runs past the end of its message")
        yield number, wire, pos, pos + size
        pos += size


def example_batches(records: Iterable[Record], batch_rows: int = 1024) -> Iterator[dict]:
    """Batches of rows (`ColumnWriter` input) from serialized Examples: a
    ``bytes`` feature of one value is a bytes field, an int64 or float
    feature of ``k`` values an array of ``k`` per row (a scalar for 1), and
    one whose records hold different numbers of values (a ``VarLenFeature``:
    token ids) a `RaggedField` in a batch where they differ (`ColumnWriter`
    makes the whole field ragged then).

    Each batch is read by `_fast_batch` when its records are laid out as
    writers lay them out (the features in the first record's order, packed
    number lists), else record by record, which also names what is wrong.

    Raises:
      ValueError: a record that is not an Example, or a feature that is
        missing, of another kind, or holds other than one bytes value; the
        message names the feature, the record and its file.
    """
    schema: dict[str, tuple[str, int]] | None = None
    pending: list[Record] = []
    size = 0
    for record in records:
        if schema is None:
            schema = example_schema(record)
        pending.append(record)
        size += len(record[2])
        if len(pending) == batch_rows or size >= _BATCH_BYTES:
            yield example_batch(pending, schema)
            pending, size = [], 0
    if pending:
        yield example_batch(pending, schema)


def example_batch(records: list[Record], schema: dict[str, tuple[str, int]]) -> dict:
    """One batch of `example_batches` from ``records``, whose features must be
    ``schema`` (`example_schema` of the first record).

    Raises:
      ValueError: as `example_batches`, naming the record and its file.
    """
    return _fast_batch(records, schema) or _checked_batch(records, schema)


def _parsed(record: Record) -> dict[str, Feature]:
    file, index, buf = record
    try:
        return parse_example(buf)
    except ValueError as err:
        raise ValueError(
            f"{file}, record {index} is not a readable tf.train.Example ({err}): the file is "
            "damaged or holds other records; pass format= to say what it holds"
        ) from None


def example_schema(record: Record) -> dict[str, tuple[str, int]]:
    """The features of the first record, ``name -> (kind, values)``, which
    every other record must have.

    Raises:
      ValueError: it is no Example, has no features, or one that is empty
        or holds several bytes values (named).
    """
    features = _parsed(record)
    schema = {name: (kind, len(values)) for name, (kind, values) in features.items()}
    where = f"{record[0]}, record {record[1]}"
    if not schema:
        raise ValueError(f"{where} is an Example with no features")
    for name, (kind, length) in schema.items():
        _check_first(where, name, kind, length)
    return schema


def _checked_batch(records: list[Record], schema: dict[str, tuple[str, int]]) -> dict:
    rows = []
    for record in records:
        features = _parsed(record)
        _check_same(f"{record[0]}, record {record[1]}", schema, features)
        rows.append(features)
    return _batch(rows, schema)


_NUMBERS = {"bytes": 1, "float": 2, "int64": 3}  # Feature's oneof field numbers, by kind


def _fast_batch(records: list[Record], schema: dict[str, tuple[str, int]]) -> dict | None:
    """The batch `_checked_batch` gives, without an object per feature: each
    record's features are found by `_scan` and checked against the schema as
    one tuple, the numbers decoded for the whole batch at once. None when
    any record is laid out otherwise or breaks the schema (the checked path
    then reads the batch and names the record)."""
    layout = tuple((name.encode(), _NUMBERS[kind]) for name, (kind, _) in schema.items())
    columns: list[list[bytes]] = [[] for _ in layout]
    for _, _, buf in records:
        found = _scan(buf)
        if found is None or found[0] != layout:
            return None
        for column, payload in zip(columns, found[1], strict=True):
            column.append(payload)
    batch: dict[str, list[bytes] | np.ndarray] = {}
    for (name, (kind, length)), payloads in zip(schema.items(), columns, strict=True):
        if kind == "bytes":
            batch[name] = payloads
            continue
        if kind == "float":
            counts = np.fromiter(map(len, payloads), np.int64, len(payloads))
            if np.any(counts % 4):
                return None
            values = np.frombuffer(b"".join(payloads), "<f4").astype(np.float32, copy=False)
            counts //= 4
        else:
            decoded = _packed_varints(payloads)
            if decoded is None:
                return None
            values, counts = decoded
        batch[name] = _numbers(values, counts, length)
    return batch


def _numbers(values: np.ndarray, counts: np.ndarray, length: int) -> np.ndarray | RaggedField:
    """A number feature's batch: ``[k, length]`` (``[k]`` for one value) when
    every record holds the first record's ``length`` values, else ragged."""
    if np.any(counts != length):
        return RaggedField.from_lengths(values, counts)
    values = values.reshape(len(counts), length)
    return values[:, 0] if length == 1 else values


def _packed_varints(payloads: list[bytes]) -> tuple[np.ndarray, np.ndarray] | None:
    """The payloads' packed varints as int64 (ten-byte two's complement for
    negatives), all decoded at once, and each payload's count of them; None
    when a payload holds a malformed varint."""
    data = np.frombuffer(b"".join(payloads), np.uint8)
    sizes = np.fromiter(map(len, payloads), np.int64, len(payloads))
    ends = data < 0x80  # the last byte of each varint
    if np.all(ends):  # one byte each: small numbers, the common case
        return data.astype(np.int64), sizes
    bounds = np.cumsum(sizes)
    if np.any(sizes == 0) or not np.all(ends[bounds - 1]):
        return None
    counts = np.add.reduceat(ends.astype(np.int64), bounds - sizes)
    last = np.flatnonzero(ends)
    first = np.concatenate(([0], last[:-1] + 1))
    # Over ten bytes, or a tenth byte beyond bit 63: the record-by-record path refuses it.
    if np.any(last - first >= 10) or np.any(data[last[last - first == 9]] > 1):
        return None
    position = np.arange(len(data)) - np.repeat(first, last - first + 1)
    parts = (data & 0x7F).astype(np.uint64) << (7 * position).astype(np.uint64)
    return np.bitwise_or.reduceat(parts, first).view(np.int64), counts


def _scan(buf: bytes) -> tuple[tuple[tuple[bytes, int], ...], list[bytes]] | None:
    """An Example's features as ``((name, kind's field number), ...)`` in
    wire order and each one's payload (the one bytes value, the packed
    floats or varints), for the layout TensorFlow and `serialize_example`
    write; None for any other (`parse_example` reads it, or says what is
    wrong). One pass, no generators, each length read inline when it is one
    byte: this is the per-record cost of a copy."""
    layout: list[tuple[bytes, int]] = []
    payloads: list[bytes] = []
    try:
        if buf[0] != 0x0A:  # Example.features
            return None
        size, pos = buf[1], 2
        if size >= 0x80:
            size, pos = _varint(buf, 1)
        total = len(buf)
        if pos + size != total:
            return None
        while pos < total:
            if buf[pos] != 0x0A:  # Features.feature: a map entry
                return None
            size, pos = buf[pos + 1], pos + 2
            if size >= 0x80:
                size, pos = _varint(buf, pos - 1)
            end = pos + size
            if buf[pos] != 0x0A:  # the entry's key: the name
                return None
            size, pos = buf[pos + 1], pos + 2
            if size >= 0x80:
                size, pos = _varint(buf, pos - 1)
            name, pos = buf[pos : pos + size], pos + size
            if buf[pos] != 0x12:  # the entry's value: a Feature
                return None
            size, pos = buf[pos + 1], pos + 2
            if size >= 0x80:
                size, pos = _varint(buf, pos - 1)
            tag = buf[pos]
            if pos + size != end or tag not in (0x0A, 0x12, 0x1A):  # bytes/float/int64 list
                return None
            size, pos = buf[pos + 1], pos + 2
            if size >= 0x80:
                size, pos = _varint(buf, pos - 1)
            if not size or pos + size != end or buf[pos] != 0x0A:  # the list's one value
                return None
            size, pos = buf[pos + 1], pos + 2
            if size >= 0x80:
                size, pos = _varint(buf, pos - 1)
            if pos + size != end:
                return None
            layout.append((name, tag >> 3))
            payloads.append(buf[pos:end])
            pos = end
    except (IndexError, ValueError):
        return None
    return tuple(layout), payloads


def _check_first(where: str, name: str, kind: str, length: int) -> None:
    if kind == "none" or (kind == "bytes" and not length):
        raise ValueError(
            f"{where}: feature {name!r} holds no values; jaxfeed reads features of a fixed "
            "length in every record; write a value in every record, or leave the feature out"
        )
    if kind == "bytes" and length > 1:
        raise ValueError(
            f"{where}: feature {name!r} holds {length} bytes values; a bytes feature is one "
            "value per record (an encoded image, a serialized tensor); write one per record"
        )


def _check_same(where: str, schema: dict[str, tuple[str, int]], features: dict) -> None:
    for name, (kind, length) in schema.items():
        if name not in features:
            raise ValueError(
                f"{where} has no feature {name!r}, which the first record has; jaxfeed "
                "reads the same features from every record: write it in every record"
            )
        got_kind, values = features[name]
        if got_kind not in (kind, "none"):  # another shard's writer: one kind per feature
            raise ValueError(
                f"{where}: feature {name!r} holds {got_kind} values where the first record "
                f"holds {kind}: jaxfeed reads a feature as one kind in every record (an "
                "int64 read as float, or a float as int64, would change values); write it "
                "as one kind in every file"
            )
        if kind == "bytes" and (got_kind != kind or len(values) != length):
            raise ValueError(
                f"{where}: feature {name!r} holds {len(values)} {got_kind} values where the "
                f"first record holds {length} {kind}: a bytes feature is one value per record "
                "(an encoded image, a serialized tensor); write one in every record"
            )
    extra = sorted(features.keys() - schema.keys())
    if extra:
        raise ValueError(
            f"{where} has feature(s) {extra} that the first record lacks; jaxfeed reads "
            "the same features from every record"
        )


def _batch(rows: list[dict[str, Feature]], schema: dict[str, tuple[str, int]]) -> dict:
    batch: dict[str, list[bytes] | np.ndarray] = {}
    for name, (kind, length) in schema.items():
        if kind == "bytes":
            batch[name] = [row[name][1][0] for row in rows]
        else:  # a record without the list ("none") holds none of its values
            dtype = np.float32 if kind == "float" else np.int64
            parts = [np.asarray(row[name][1], dtype) for row in rows]
            counts = np.fromiter(map(len, parts), np.int64, len(parts))
            batch[name] = _numbers(np.concatenate(parts), counts, length)
    return batch


def serialize_example(row: dict[str, bytes | np.ndarray]) -> bytes:
    """One record as a serialized Example, the wire bytes TensorFlow writes
    (packed number lists): ``bytes`` values become a one-value ``bytes_list``,
    integers and booleans an ``int64_list``, floats a ``float_list`` (float32,
    the only float an Example holds); an array of any shape is written
    flattened (an Example has no shapes)."""
    entries = []
    for name, value in row.items():
        if isinstance(value, bytes | bytearray | memoryview):
            feature = _length_field(1, _length_field(1, bytes(value)))
        else:
            values = np.asarray(value).reshape(-1)
            if values.dtype.kind == "f":
                feature = _length_field(2, _length_field(1, values.astype("<f4").tobytes()))
            else:  # negative int64s: ten-byte two's complement varints
                packed = b"".join(_varint_bytes(int(v) & _U64) for v in values.tolist())
                feature = _length_field(3, _length_field(1, packed))
        entries.append(
            _length_field(1, _length_field(1, name.encode()) + _length_field(2, feature))
        )
    return _length_field(1, b"".join(entries))


def serialize_examples(
    columns: dict[str, Sequence[bytes] | np.ndarray | RaggedField],
) -> list[bytes]:
    """`serialize_example` of each row of ``columns`` (per field a sequence
    of ``bytes``, an array ``[rows, *shape]`` or a `RaggedField`, whose rows
    become number lists of their lengths), the same bytes, made a
    batch at a time: the numbers of a field encoded at once, and each
    feature's framing (its name and the lengths around its values) built
    once per value length, not per row."""
    fields = []
    for name, values in columns.items():
        if isinstance(values, RaggedField):
            frame = int(np.prod(values.frame_shape))
            payloads = _number_payloads(values.values.reshape(-1), values.lengths * frame)
            number = 2 if values.dtype.kind == "f" else 3
        elif isinstance(values, np.ndarray) and values.dtype.kind in "biuf":
            flat = values.reshape(len(values), -1)
            payloads = _number_payloads(flat.reshape(-1), np.full(len(values), flat.shape[1]))
            number = 2 if values.dtype.kind == "f" else 3
        else:
            payloads, number = [bytes(v) for v in values], 1
        fields.append((_Framing(name, number), payloads))
    rows = len(fields[0][1]) if fields else 0
    sizes = np.zeros(rows, np.int64)  # each Example's bytes inside its outer length
    parts: list[list[bytes]] = []
    for framing, payloads in fields:
        lengths = np.fromiter(map(len, payloads), np.int64, rows)
        heads = list(map(framing, lengths.tolist()))
        sizes += lengths + np.fromiter(map(len, heads), np.int64, rows)
        parts += (heads, payloads)
    starts = [b"\n" + _varint_bytes(size) for size in sizes.tolist()]  # Example.features
    return [b"".join(row) for row in zip(starts, *parts, strict=True)]


class _Framing:
    """The bytes before a feature's values (the map entry, its name, the
    Feature and the list around them), by the values' length."""

    def __init__(self, name: str, number: int):
        self._name, self._number = name.encode(), number
        self._known: dict[int, bytes] = {}

    def __call__(self, length: int) -> bytes:
        framing = self._known.get(length)
        if framing is None:
            values = _varint_bytes(1 << 3 | _LEN) + _varint_bytes(length)  # the list's field 1
            feature = _varint_bytes(self._number << 3 | _LEN) + _varint_bytes(len(values) + length)
            body = _length_field(1, self._name) + _varint_bytes(2 << 3 | _LEN)
            body += _varint_bytes(len(feature) + len(values) + length) + feature + values
            framing = _varint_bytes(1 << 3 | _LEN) + _varint_bytes(len(body) + length) + body
            if len(self._known) < 4096:  # bytes values of many lengths: keep the first few
                self._known[length] = framing
        return framing


def _number_payloads(values: np.ndarray, counts: np.ndarray) -> list[bytes]:
    """Each row's packed values (``values``: the rows' back to back, ``counts``
    of them each): float32 little-endian, or (integers and booleans) varints
    of the two's complement uint64."""
    bounds = np.concatenate(([0], np.cumsum(counts)))  # each row's first value, and the end
    if values.dtype.kind == "f":
        blob, ends = values.astype("<f4").tobytes(), (4 * bounds).tolist()
        return [blob[start:end] for start, end in itertools.pairwise(ends)]
    numbers = values.astype(np.uint64) if values.dtype.kind == "u" else values.astype(np.int64)
    numbers = numbers.view(np.uint64)
    sizes = np.ones(len(numbers), np.int64)  # bytes per varint: one per 7 bits, at least one
    for shift in range(7, 64, 7):
        sizes += numbers >= np.uint64(1 << shift)
    starts = np.cumsum(sizes) - sizes
    encoded = np.empty(int(sizes.sum()), np.uint8)
    for byte in range(int(sizes.max(initial=0))):  # the byte-th 7 bits of every number at once
        has = sizes > byte
        digits = ((numbers[has] >> np.uint64(7 * byte)) & np.uint64(0x7F)).astype(np.uint8)
        encoded[starts[has] + byte] = digits | np.where(sizes[has] > byte + 1, 0x80, 0).astype(
            np.uint8
        )
    ends = np.concatenate(([0], np.cumsum(sizes)))[bounds].tolist()  # each row's bytes
    blob = encoded.tobytes()
    return [blob[start:end] for start, end in itertools.pairwise(ends)]


_U64 = (1 << 64) - 1


def _varint_bytes(value: int) -> bytes:
    if value < 0x80:  # one and two bytes: lengths and small numbers, without the loop
        return bytes((value,))
    if value < 0x4000:
        return bytes((value & 0x7F | 0x80, value >> 7))
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _length_field(number: int, payload: bytes) -> bytes:
    return _varint_bytes(number << 3 | _LEN) + _varint_bytes(len(payload)) + payload

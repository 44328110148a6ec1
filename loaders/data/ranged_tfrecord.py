"""A store's TFRecord shards read in place, by ranged reads: how a TFRecord
split bigger than the cache trains.

A TFRecord object has no index, so each is streamed once (ranged reads of
`STREAM_BYTES` through `RemoteObjects.read`, retried and never short), its
framing checked as the local reader checks it (`tfrecord.framed_records`:
each length's and each record's CRC) and its Examples parsed as the columnar
copy parses them, into an **index**: where each record lies, and the
features the copy would make of it. The index is saved in jaxfeed's cache
(`INDEX_DIR`), keyed by the object's identity (URL, size and version, as
`object_cache.entry_key` keys an entry) and built atomically
(`cache.build_once`), so a second ``make``, or another process, loads it
without reading the object again, and a changed object gets a new one.

Rows are then read a block of consecutive records at a time (one ranged
read) and parsed by jaxfeed's own Example parser into the fields the local
copy holds (same fields, kinds, dtypes and order), through a `BlockCache` as
`ranged_npy` reads rows: a number feature of one length in every record an
array (`RangedExamples`), a bytes feature (an encoded image) a
`ranged_values.RangedBytes`, a number feature whose records hold different
numbers of values a `RaggedField` over `ranged_values.RangedValues`, its
offsets from the index (which records each record's values per feature).
A block holds as many records as fit a quarter of the block cache, parsed.
gzip-compressed shards are not read in place (a gzip stream has no random
access): refused by name under ``JAXFEED_READ=ranges``, fetched whole under
``auto``.
"""

from __future__ import annotations

import concurrent.futures
import json
import struct
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path, PurePosixPath

import numpy as np
from jaxfeed.loaders.array_dataset import device_dtype
from jaxfeed.loaders.bytes_field import BytesField
from jaxfeed.loaders.data.cache import build_once, cache_root
from jaxfeed.loaders.data.formats.detect import named_split
from jaxfeed.loaders.data.formats.example import (
    Record,
    example_batch,
    example_batches,
    example_schema,
)
from jaxfeed.loaders.data.formats.tfrecord import GZIP_MAGIC, framed_records, masked_crc32c
from jaxfeed.loaders.data.object_cache import entry_key
from jaxfeed.loaders.data.on_disk import MissingSplitError
from jaxfeed.loaders.data.ranged_npy import (
    BLOCK_BYTES,
    READ_ENV,
    BatchFields,
    Block,
    BlockCache,
    RangedRows,
    read_mode,
)
from jaxfeed.loaders.data.ranged_values import (
    FieldBlock,
    RangedBytes,
    RangedValues,
    block_indices,
    blocks_for,
    gather_rows,
    gather_values,
    ragged_parts,
)
from jaxfeed.loaders.data.remote import CACHE_BYTES_ENV, FETCH_THREADS, RemoteObjects, cache_bytes
from jaxfeed.loaders.ragged_field import RaggedField

__all__ = [
    "INDEX_DIR",
    "RangedExamples",
    "cached_index",
    "example_dtype",
    "indexed",
    "split_shards",
    "tfrecord_fields",
]

INDEX_DIR = "tfrecord-index"  # under jaxfeed's cache: one entry per object version
LAYOUT = "v2"  # of an index entry: bumping it builds them again (v2: each record's sizes)
STREAM_BYTES = 8 << 20  # one ranged read of the pass that builds an index
_HEADER, _FRAMING = 12, 16  # length + its CRC; and the data's CRC after the data
_ROOT = PurePosixPath("/jaxfeed-remote")  # stands for the URL in `named_split`'s messages


def tfrecord_fields(
    objects: RemoteObjects, split: str, splits: tuple[str, ...]
) -> tuple[dict, list[int]] | None:
    """``split``'s fields as `RangedExamples` and its rows per shard (the
    dataset's ``units``), or None where its objects are fetched whole: as
    `ranged_npy.npy_fields` chooses (``JAXFEED_READ``), or they are no
    TFRecord shards, or (under ``auto``) shards the index cannot read in place.

    Raises:
      ValueError: an unknown ``JAXFEED_READ``; under ``ranges``, shards that cannot be read in
        place (gzip-compressed, shards of other features), naming the object
        and the fix; a damaged object (named, with the record and byte), as
        the local reader says; a record past the block cache's bound.
      MissingSplitError: the shards hold other splits but not ``split``.
    """
    kept = indexed(objects, split, splits, "tfrecord", _index, lambda made: _refusal(objects, made))
    if kept is None:
        return None
    reader = _Shards(objects, kept, BlockCache(cache_bytes() // 4))
    return reader.fields(), [i["records"] for i in kept.values()]


def indexed(
    objects: RemoteObjects,
    split: str,
    splits: tuple[str, ...],
    kind: str,
    index: Callable[[RemoteObjects, str], dict],
    refusal: Callable[[dict[str, dict]], str | None],
) -> dict[str, dict] | None:
    """Each of ``split``'s objects' index (``index``, built or loaded,
    `FETCH_THREADS` at once) by its relative path, the objects without
    records left out; None where they are fetched whole: as `read_mode`
    chooses, or they are not all shards of ``kind`` (`split_shards`), or
    (under ``auto``) ``refusal`` says one is not read in place.

    Raises:
      ValueError: under ``ranges``, the refusal, with the fix.
      MissingSplitError: the objects hold other splits but not ``split``.
    """
    mode = read_mode(objects)
    relatives = None if mode is None else split_shards(objects, split, splits, kind)
    if relatives is None:
        return None
    with concurrent.futures.ThreadPoolExecutor(FETCH_THREADS, "jaxfeed-index") as pool:
        made = dict(zip(relatives, pool.map(lambda r: index(objects, r), relatives), strict=True))
    refused = refusal(made)
    if refused is not None:
        if mode == "auto":
            return None
        raise ValueError(
            f"{READ_ENV}=ranges: {refused}, which is not read in place: set {READ_ENV}=whole "
            "to fetch the objects into the cache (JAXFEED_CACHE_BYTES must hold them)"
        )
    return {r: i for r, i in made.items() if i["records"]}


def split_shards(
    objects: RemoteObjects, split: str, splits: tuple[str, ...], kind: str
) -> list[str] | None:
    """The objects of ``split`` (relative paths, in reading order) when every
    object under the URL is a shard of format ``kind`` (``"tfrecord"``,
    ``"arrayrecord"``: by name, as `detect.file_format` tells) laid out as
    the local reader reads a directory (files, or ``train/`` and ``test/`` of
    them) or named by a list or glob; None otherwise (the local reader decides)."""
    listed = objects.made_from
    names = [PurePosixPath(r or objects.path) for r in listed]
    if not names or not all(_named_as(n.name, kind) for n in names):
        return None
    if "" in listed or objects.members is not None:
        names = {r: r or PurePosixPath(objects.path).name for r in listed}
        files = sorted((_ROOT / n for n in names.values()), key=lambda p: p.name)
        relative = {_ROOT / n: r for r, n in names.items()}
        return [relative[p] for p in _named(objects, files, split, splits)]
    if any(PurePosixPath(r).name.startswith(".") for r in listed):
        return None  # the local reader leaves hidden files out
    laid_out = [s for s in splits if any(r.startswith(f"{s}/") for r in listed)]
    if laid_out:
        if any(r.count("/") != 1 or r.split("/")[0] not in laid_out for r in listed):
            return None  # other files beside the split directories: the local reader warns
        if split not in laid_out:
            raise MissingSplitError(
                f"{objects.url} has no {split!r} split: its file splits are {laid_out}; add "
                f"{split} data beside them"
            )
        files = sorted(_ROOT / r for r in listed if r.startswith(f"{split}/"))
        return [str(p.relative_to(_ROOT)) for p in _named(objects, files, split, (split,))]
    if any("/" in r for r in listed):
        return None
    files = sorted(_ROOT / r for r in listed)
    return [str(p.relative_to(_ROOT)) for p in _named(objects, files, split, splits)]


def _named_as(name: str, kind: str) -> bool:
    """Whether a file named ``name`` is of format ``kind`` by its name, as
    `detect.file_format` tells it (never its bytes: an object is no local file)."""
    name = name.lower()
    if kind == "tfrecord":
        return ".tfrecord" in name
    return ".tfrecord" not in name and (".array_record" in name or name.endswith(".arrayrecord"))


def _named(objects: RemoteObjects, files: list, split: str, splits: tuple[str, ...]) -> list:
    try:
        return named_split(files, split, splits)
    except ValueError as error:  # name the URL, not the stand-in root
        raise type(error)(str(error).replace(str(_ROOT), objects.url.rstrip("/"))) from None


def _index(objects: RemoteObjects, relative: str) -> dict:
    """One object's index, built by streaming it once unless the cache holds
    it: ``records``, ``frames`` (int64 ``[n, 2]``: where each record's frame
    starts, its data's length), ``sizes`` (int64 ``[n, features]``: each
    record's values of each number feature, bytes of each bytes feature),
    ``schema`` (the features, as `example_batch` takes them) and
    ``refused`` (why it is not read in place, or None)."""
    meta, path = cached_index(objects, relative, f"{INDEX_DIR}/{{key}}-{LAYOUT}", _write_index)
    return {**meta, "path": str(path / "frames.npy"), "sizes": str(path / "sizes.npy")}


def cached_index(
    objects: RemoteObjects,
    relative: str,
    entry: str,
    write: Callable[[RemoteObjects, str, int, Path], None],
) -> tuple[dict, Path]:
    """One object's index entry in jaxfeed's cache, ``entry`` (a path with
    ``{key}``, the object version's `entry_key`), built by ``write(objects,
    relative, size, scratch)`` once per object version: its ``index.json``
    (``schema`` as `example_batch` takes it) and the entry's directory."""
    listed = objects.made_from[relative]
    key = entry_key(objects.object_url(relative), listed.size, listed.identity)
    path = build_once(
        cache_root() / entry.format(key=key),
        lambda scratch: write(objects, relative, listed.size, scratch),
    )
    meta = json.loads((path / "index.json").read_text())
    meta["schema"] = {name: (kind, length) for name, kind, length in meta["schema"]}
    return meta, path


def _write_index(objects: RemoteObjects, relative: str, size: int, scratch: Path) -> None:
    url = objects.object_url(relative)
    lengths: list[int] = []
    sizes: list[np.ndarray] = []  # per batch: [k, features]
    schema: dict[str, tuple[str, int]] = {}
    refused = None
    if objects.read(relative, 0, min(size, 2)) == GZIP_MAGIC:
        refused = "it is gzip-compressed (a gzip stream has no random access)"
    else:
        starts = range(0, size, STREAM_BYTES)
        chunks = (objects.read(relative, s, min(s + STREAM_BYTES, size)) for s in starts)

        def counted() -> Iterator[Record]:
            for record in framed_records(chunks, url, size):
                if not lengths:
                    schema.update(example_schema(record))
                lengths.append(len(record[2]))
                yield record

        for batch in example_batches(counted()):  # every record: the copy's errors, named
            sizes.append(np.stack([_sizes(values) for values in batch.values()], axis=1))
    frames = np.zeros((len(lengths), 2), np.int64)
    frames[:, 1] = lengths
    frames[1:, 0] = np.cumsum(frames[:-1, 1] + _FRAMING)
    np.save(scratch / "frames.npy", frames)
    every = np.concatenate(sizes) if sizes else np.zeros((0, len(schema)), np.int64)
    np.save(scratch / "sizes.npy", every.astype(np.int64))
    listed = [[name, kind, length] for name, (kind, length) in schema.items()]
    meta = {"url": url, "records": len(lengths), "schema": listed, "refused": refused}
    (scratch / "index.json").write_text(json.dumps(meta))


def _sizes(values: np.ndarray | RaggedField | list[bytes]) -> np.ndarray:
    """Each record's values of one feature of a parsed batch (`example_batch`):
    its number of values, or a bytes feature's bytes."""
    if isinstance(values, RaggedField):
        return values.lengths
    if isinstance(values, np.ndarray):
        return np.full(len(values), int(np.prod(values.shape[1:])), np.int64)
    return np.fromiter(map(len, values), np.int64, len(values))


def _refusal(objects: RemoteObjects, indexes: Mapping[str, dict]) -> str | None:
    """Why the shards are not read in place (naming the object), or None."""
    for relative, index in indexes.items():
        if index["refused"] is not None:
            return f"{objects.object_url(relative)}: {index['refused']}"
    first = next((r for r, i in indexes.items() if i["records"]), None)
    if first is None:
        return f"{objects.url} holds no records"
    kinds = {name: kind for name, (kind, _) in indexes[first]["schema"].items()}
    for relative, index in indexes.items():
        if index["records"] and {n: k for n, (k, _) in index["schema"].items()} != kinds:
            return (
                f"{objects.object_url(relative)} holds features {index['schema']}, "
                f"{objects.object_url(first)} {indexes[first]['schema']}"
            )
    return None


class _Shards:
    """A split's shards, their indexes and blocks, read and parsed together:
    one block's read serves every field (see the module)."""

    def __init__(self, objects: RemoteObjects, indexes: Mapping[str, dict], cache: BlockCache):
        self.objects, self.cache = objects, cache
        self.relatives = list(indexes)
        self.paths = [i["path"] for i in indexes.values()]  # what a worker loads again
        self.size_paths = [i["sizes"] for i in indexes.values()]
        first = next(iter(indexes.values()))["schema"]
        self.schema = first  # name -> (kind, values of the first record): `example_batch` takes it
        self.rows = sum(i["records"] for i in indexes.values())
        sizes = [np.load(i["sizes"]) for i in indexes.values()]
        every = np.concatenate(sizes)
        # Each feature: ("array", dtype, row shape), ("bytes", ...) or ("ragged", dtype, ()),
        # as the local copy makes it: ragged where any record holds another number
        # of values than the split's first record.
        self.fields_spec: dict[str, tuple[str, np.dtype, tuple[int, ...]]] = {}
        self.offsets: dict[str, np.ndarray] = {}
        self.nbytes: dict[str, int] = {}
        for column, (name, (kind, length)) in enumerate(first.items()):
            counts = every[:, column]
            self.nbytes[name] = int(counts.sum())
            if kind == "bytes":
                self.fields_spec[name] = ("bytes", np.dtype(object), ())
            elif np.all(counts == length):
                row = (length,) if length > 1 else ()
                self.fields_spec[name] = ("array", example_dtype(kind), row)
            else:
                self.fields_spec[name] = ("ragged", example_dtype(kind), ())
                self.offsets[name] = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        # What each record takes parsed: the block cache's blocks are planned by it.
        self._parsed = [self._parsed_bytes(s) for s in sizes]
        self._blocks: tuple[np.ndarray, ...] | None = None
        self._fields = BatchFields(cache.max_bytes)
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        # Into a worker: the index paths, not their block plan (made there again).
        return {**self.__dict__, "_blocks": None, "_lock": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _lock=threading.Lock())

    def _parsed_bytes(self, sizes: np.ndarray) -> np.ndarray:
        """Each record's bytes parsed (``sizes``: its index's), as a block holds them."""
        out = np.zeros(len(sizes), np.int64)
        for column, (kind, dtype, _) in enumerate(self.fields_spec.values()):
            item = 1 if kind == "bytes" else dtype.itemsize
            out += sizes[:, column] * item + (8 if kind != "array" else 0)  # + an offset
        return out

    def fields(self) -> dict:
        """Each feature as the local copy holds it (see the module)."""
        url = self.objects.url.rstrip("/")
        out: dict = {}
        for name, (kind, dtype, _) in self.fields_spec.items():
            if kind == "array":
                out[name] = RangedExamples(self, name)
            elif kind == "bytes":
                out[name] = RangedBytes(self, name, self.rows, self.nbytes[name], f"{url}#{name}")
            else:
                offsets = self.offsets[name]
                total = int(offsets[-1])
                values = RangedValues(self, name, total, (), device_dtype(dtype), f"{url}#{name}")
                out[name] = RaggedField(values, offsets)
        return out

    def blocks(self) -> tuple[np.ndarray, ...]:
        """Per block: its first row of the split, its shard, and the byte range
        and first record of its run of records in that shard."""
        with self._lock:
            if self._blocks is None:
                self._blocks = self._plan()
            return self._blocks

    def _plan(self) -> tuple[np.ndarray, ...]:
        """Runs of records, each at most `BLOCK_BYTES` to read and a quarter of
        the block cache parsed (taken greedily, in order).

        Raises:
          ValueError: a record that alone takes more than that parsed.
        """
        bound = min(BLOCK_BYTES, max(1, self.cache.max_bytes // 4))
        first_rows, shards, starts, ends, firsts = [], [], [], [], []
        row = 0
        for shard, path in enumerate(self.paths):
            frames = np.load(path)
            parsed = self._parsed[shard]
            big = np.flatnonzero(parsed > bound)
            if len(big):
                record = int(big[0])
                raise ValueError(
                    f"{self.objects.object_url(self.relatives[shard])}, record {record} takes "
                    f"{parsed[record]} bytes parsed, past the {bound} bytes of a block read in "
                    f"place (a quarter of a quarter of {CACHE_BYTES_ENV}); raise "
                    f"{CACHE_BYTES_ENV} to at least {16 * int(parsed[record])}"
                )
            at = frames[:, 0]
            window = (at // bound).tolist()
            new, held, opened = [], 0, -1
            for i, size in enumerate(parsed.tolist()):  # greedy: a record per step
                if i == 0 or window[i] != opened or held + size > bound:
                    new.append(i)
                    held, opened = 0, window[i]
                held += size
            first = np.asarray(new, np.int64)
            last = np.concatenate((first[1:], [len(frames)])) - 1
            first_rows.append(row + first)
            shards.append(np.full(len(first), shard))
            starts.append(at[first])
            ends.append(at[last] + frames[last, 1] + _FRAMING)
            firsts.append(first)
            row += len(frames)
        return tuple(map(np.concatenate, (first_rows, shards, starts, ends, firsts)))

    def gather(self, rows: np.ndarray, name: str) -> np.ndarray:
        """Feature ``name``'s ``rows`` (as parsed; a bytes feature's as an
        object array of ``bytes``), a block of records at a time: a batch's
        rows of one block come from one read, the reads in the block cache's
        sliding window; every field of a batch from one gather (`BatchFields`)."""
        return self._fields.field(name, rows, self._gather)

    def rows_of(self, name: str, rows: np.ndarray) -> np.ndarray:
        """`gather`, as `ranged_values`' fields ask for it."""
        return self.gather(rows, name)

    def _gather(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        fields = {n: f for n, f in self.fields_spec.items() if f[0] != "ragged"}
        return gather_rows(self.cache, self.block, self.blocks()[0], rows, fields)

    def values_of(self, name: str, values: np.ndarray) -> np.ndarray:
        """The ragged feature ``name``'s ``values`` (indices into its values
        back to back, as parsed), a block of records at a time."""
        _, dtype, frame = self.fields_spec[name]
        starts = self.offsets[name][self.blocks()[0]]
        return gather_values(self.cache, self.block, starts, values, name, dtype, frame)

    def value_blocks(self, name: str, values: np.ndarray) -> list[Block]:
        """The blocks `values_of` reads for ``values``."""
        return blocks_for(self.block, self.offsets[name][self.blocks()[0]], values)

    def block_of(self, rows: np.ndarray) -> np.ndarray:
        """The block each of ``rows`` is in."""
        return block_indices(self.blocks()[0], rows)

    def block(self, block: int) -> Block:
        """Block ``block``: its rows' every field, parsed as the local copy
        parses them (`example_batch`)."""
        first_rows, shards, starts, ends, firsts = self.blocks()
        row = int(first_rows[block])
        count = (first_rows[block + 1] if block + 1 < len(first_rows) else self.rows) - row
        relative = self.relatives[shards[block]]
        start, end, first = int(starts[block]), int(ends[block]), int(firsts[block])
        nbytes = int(self._parsed[shards[block]][first : first + count].sum())

        def read() -> FieldBlock:
            url = self.objects.object_url(relative)
            records = _records(url, self.objects.read(relative, start, end), start)
            batch = example_batch(
                [(url, first + i, r) for i, (_, r) in enumerate(records)], self.schema
            )
            parsed = FieldBlock()
            for name, values in batch.items():
                kind = self.fields_spec[name][0]
                if kind == "bytes":
                    parsed[name] = BytesField.from_values(values)
                elif kind == "ragged":
                    parsed[name] = ragged_parts(values, ())
                    want = self.offsets[name][row : row + count + 1]
                    if not np.array_equal(parsed[name].offsets, want - want[0]):
                        parsed[name] = None
                else:
                    parsed[name] = values if isinstance(values, np.ndarray) else None
            if len(records) != count or any(v is None for v in parsed.values()):
                raise ValueError(
                    f"{url} bytes {start}-{end - 1} no longer hold the records it was indexed "
                    "with: it changed; make the source again"
                )
            return parsed

        return Block(("tfrecord", block), "big", nbytes, read)


def example_dtype(kind: str) -> np.dtype:
    """The dtype an Example's number feature is parsed as (`example_batch`)."""
    return np.dtype(np.float32 if kind == "float" else np.int64)


_LENGTH = struct.Struct("<QI")


def _records(url: str, data: bytes, offset: int) -> list[tuple[str, bytes]]:
    """The records of ``data`` (a run of whole frames read from ``offset``),
    each length's and data's CRC checked (the object may have changed)."""
    records, pos = [], 0
    while pos < len(data):
        length, check = _LENGTH.unpack_from(data, pos)
        stop = pos + _HEADER + length
        if masked_crc32c(data[pos : pos + 8]) != check or stop + 4 > len(data):
            raise ValueError(
                f"{url}: the length header at byte {offset + pos} is damaged, or the object "
                "changed since it was indexed; make the source again"
            )
        record = data[pos + _HEADER : stop]
        if masked_crc32c(record) != struct.unpack_from("<I", data, stop)[0]:
            raise ValueError(
                f"{url}: the record at byte {offset + pos} fails its checksum: the object is "
                "damaged or changed since it was indexed; make the source again"
            )
        records.append((url, record))
        pos = stop + 4
    return records


class RangedExamples(RangedRows):
    """One numeric feature of a split's TFRecord shards, read in place (a
    `RemoteField`; see the module)."""

    def __init__(self, shards: _Shards, name: str):
        self._shards, self._name = shards, name
        kind, width = shards.schema[name]
        self.url = f"{shards.objects.url.rstrip('/')}#{name}"
        self._stored = example_dtype(kind)
        self.shape = (shards.rows, width) if width > 1 else (shards.rows,)
        self.dtype = device_dtype(self._stored)
        self.nbytes = shards.rows * width * self.dtype.itemsize

    def __repr__(self) -> str:
        return f"RangedExamples({self.url!r}, {self.dtype} {list(self.shape)})"

    @property
    def cache(self) -> BlockCache:
        return self._shards.cache

    def _gather(self, rows: np.ndarray) -> np.ndarray:
        return self._shards.gather(rows, self._name)

    def _blocks_of(self, rows: np.ndarray) -> list[Block]:
        return [self._shards.block(int(b)) for b in np.unique(self._shards.block_of(rows))]

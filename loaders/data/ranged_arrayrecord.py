"""A store's ArrayRecord files read in place, by ranged reads: how an
ArrayRecord split bigger than the cache trains (``array_record``'s own reader
opens local paths only).

Each object is parsed from its bytes (`formats.riegeli`): its postscript and
footer by ranged reads of its tail, then its data chunks streamed once
(ranged reads of about `STREAM_BYTES`, whole chunks each), every header's and
chunk's hash checked and every record parsed as the columnar copy parses it,
into an **index**: each chunk's byte range, record count and the CRC-32 of
its bytes (checked at every later read, in place of the chunk's HighwayHash,
which pure Python computes at ~3 MB/s), and the features the copy would make
of the records. The index is saved in jaxfeed's
cache (`INDEX_DIR`), keyed by the object's identity (URL, size and version)
and built atomically (`cache.build_once`), so a second ``make``, a worker or
another process loads it without reading the object again, and a changed
object gets a new one.

Rows are then read a block at a time: a run of consecutive chunks (one
ranged read; a chunk is never split), decoded, and parsed by jaxfeed's own
Example parser into the arrays the local copy holds (same fields, dtypes and
order), through a `BlockCache` as `ranged_tfrecord` reads records. Only what
is read identically is read in place: simple chunks, uncompressed or of the
compressions Riegeli writes (zstd, ArrayRecord's default; brotli; snappy:
decoded by pyarrow), whose records are Examples of numbers of one length in
every record. Transposed chunks, raw (non-Example) records, bytes or ragged
features, and compressed chunks without pyarrow are refused by name under
``JAXFEED_READ=ranges`` and fetched whole under ``auto``. The dataset's units
are the objects' record counts, as the local copy's are its files'.
"""

from __future__ import annotations

import functools
import json
import threading
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
from jaxfeed.loaders.data.formats.arrayrecord import holds_examples
from jaxfeed.loaders.data.formats.example import (
    Record,
    example_batch,
    example_batches,
    example_schema,
)
from jaxfeed.loaders.data.formats.riegeli import (
    BLOCK_SIZE,
    NotParsed,
    RiegeliError,
    chunk_data,
    chunk_records,
    footer,
    postscript_footer_offset,
)
from jaxfeed.loaders.data.ranged_npy import (
    BLOCK_BYTES,
    BatchFields,
    Block,
    BlockCache,
)
from jaxfeed.loaders.data.ranged_tfrecord import (
    RangedExamples,
    cached_index,
    example_dtype,
    indexed,
)
from jaxfeed.loaders.data.ranged_values import block_indices, gather_rows
from jaxfeed.loaders.data.remote import (
    CACHE_BYTES_ENV,
    RemoteObjects,
    cache_bytes,
)

__all__ = ["INDEX_DIR", "RangedArrayRecords", "arrayrecord_fields"]

INDEX_DIR = "arrayrecord-index"  # under jaxfeed's cache: one entry per object version
LAYOUT = "v2"  # of an index entry: bumping it builds them again
STREAM_BYTES = 8 << 20  # about one ranged read of the pass that builds an index


def arrayrecord_fields(
    objects: RemoteObjects, split: str, splits: tuple[str, ...]
) -> tuple[dict, list[int]] | None:
    """``split``'s fields as `RangedArrayRecords` and its rows per object (the
    dataset's ``units``), or None where its objects are fetched whole: as
    `ranged_npy.npy_fields` chooses (``JAXFEED_READ``), or they are no
    ArrayRecord files, or (under ``auto``) files the index cannot read in place.

    Raises:
      ValueError: an unknown ``JAXFEED_READ``; under ``ranges``, files that
        cannot be read in place (see the module), naming the object and the
        fix; a damaged object, or one that is no ArrayRecord file (named,
        with the byte).
      MissingSplitError: the files hold other splits but not ``split``.
    """
    bound = cache_bytes() // 4
    refusal = functools.partial(_refusal, objects, bound=bound)
    kept = indexed(objects, split, splits, "arrayrecord", _index, refusal)
    if kept is None:
        return None
    reader = _Files(objects, kept, BlockCache(bound))
    fields = {name: RangedArrayRecords(reader, name) for name in reader.schema}
    return fields, [i["records"] for i in kept.values()]


def _index(objects: RemoteObjects, relative: str) -> dict:
    """One object's index, built by reading it once unless the cache holds
    it: ``records``, ``chunks`` (int64 ``[n, 4]``: each chunk's first byte,
    the end of its data, its records, the CRC-32 of its stored bytes),
    ``schema`` (as `example_batch` takes
    it) and ``refused`` (why it is not read in place, or None)."""
    meta, path = cached_index(objects, relative, f"{INDEX_DIR}/{{key}}-{LAYOUT}", _write_index)
    return {**meta, "path": str(path / "chunks.npy")}


def _write_index(objects: RemoteObjects, relative: str, size: int, scratch: Path) -> None:
    url = objects.object_url(relative)
    chunks: list[tuple[int, int, int]] = []
    schema: dict[str, tuple[str, int]] = {}
    refused = None
    try:
        tail_at = max(0, size - BLOCK_SIZE)
        footer_at = postscript_footer_offset(objects.read(relative, tail_at, size), size, url)
        if not 0 < footer_at <= tail_at:
            raise RiegeliError(f"{url}: its postscript puts the footer at byte {footer_at}")
        listed = footer(objects.read(relative, footer_at, tail_at), footer_at, url)
    except NotParsed as error:  # its footer is compressed as its chunks are
        listed, refused = None, error.reason
    except RiegeliError as error:
        raise ValueError(
            f"{error}: it is not a readable ArrayRecord file; pass format= to say what it is, "
            "or write it again"
        ) from None
    if listed is not None and "transpose:true" in listed.writer_options.split(","):
        refused = "its chunks are transposed (written with transpose:true)"
    elif listed is not None:

        def records() -> Iterator[Record]:
            nonlocal refused
            row = 0
            for begin, end, count, data, offset in _runs(objects, relative, listed, footer_at):
                header, body, data_end = chunk_data(data, offset, begin, url)
                try:
                    found = chunk_records(header, body, url)
                except NotParsed as error:
                    refused = error.reason
                    return
                if len(found) != count or data_end > end:
                    raise RiegeliError(
                        f"{url}: the chunk at byte {begin} holds {len(found)} records, its "
                        f"footer says {count}"
                    )
                chunks.append((begin, data_end, count, _crc(data, offset, begin, data_end)))
                for record in found:
                    if row == 0:
                        if not holds_examples(record):
                            refused = "its records are not tf.train.Example (raw bytes)"
                            return
                        schema.update(example_schema((url, 0, record)))
                    yield url, row, record
                    row += 1

        try:
            for batch in example_batches(records()):  # every record: the copy's errors, named
                for name, values in batch.items():
                    if refused is None and not isinstance(values, np.ndarray):
                        what = "bytes" if isinstance(values, list) else "rows of different lengths"
                        refused = f"its feature {name!r} holds {what}"
        except RiegeliError as error:
            raise ValueError(f"{error}: the ArrayRecord file is damaged; write it again") from None
    np.save(scratch / "chunks.npy", np.asarray(chunks, np.int64).reshape(-1, 4))
    meta = {
        "url": url,
        "records": sum(c[2] for c in chunks),
        "most_records": max((c[2] for c in chunks), default=0),  # in one chunk
        "schema": [[name, kind, length] for name, (kind, length) in schema.items()],
        "refused": refused,
    }
    (scratch / "index.json").write_text(json.dumps(meta))


def _runs(
    objects: RemoteObjects, relative: str, listed, footer_at: int
) -> Iterator[tuple[int, int, int, bytes, int]]:
    """Each data chunk as (its first byte, the next chunk's, its records, the
    bytes of the run of chunks it was read with, where they start): runs of
    whole chunks of about `STREAM_BYTES`, one ranged read each."""
    begins = list(listed.offsets)
    ends = [*begins[1:], footer_at]
    i = 0
    while i < len(begins):
        j = i + 1
        while j < len(begins) and ends[j] - begins[i] <= STREAM_BYTES:
            j += 1
        data = objects.read(relative, begins[i], ends[j - 1])
        for k in range(i, j):
            yield begins[k], ends[k], listed.records[k], data, begins[i]
        i = j


def _refusal(objects: RemoteObjects, indexes: Mapping[str, dict], bound: int) -> str | None:
    """Why the files are not read in place (naming the object), or None;
    ``bound``: the block cache's, which a chunk's parsed rows must fit (a
    chunk is read whole)."""
    for relative, index in indexes.items():
        if index["refused"] is not None:
            return f"{objects.object_url(relative)}: {index['refused']}"
    first = next((r for r, i in indexes.items() if i["records"]), None)
    if first is None:
        return f"{objects.url} holds no records"
    for relative, index in indexes.items():
        if index["records"] and index["schema"] != indexes[first]["schema"]:
            return (
                f"{objects.object_url(relative)} holds features {index['schema']}, "
                f"{objects.object_url(first)} {indexes[first]['schema']}"
            )
    schema = indexes[first]["schema"]
    row_bytes = sum(n * (4 if k == "float" else 8) for k, n in schema.values())
    for relative, index in indexes.items():
        if index["most_records"] * row_bytes > bound:
            return (
                f"{objects.object_url(relative)}: a chunk of {index['most_records']} records "
                f"parses to {index['most_records'] * row_bytes:,} bytes, more than the block "
                f"cache's bound of {bound:,} (a quarter of {CACHE_BYTES_ENV}; a chunk is read "
                f"whole): raise {CACHE_BYTES_ENV}, or write smaller chunks (group_size:)"
            )
    return None


class _Files:
    """A split's ArrayRecord objects, their indexes and blocks (runs of
    chunks), read and parsed together: one block's read serves every field."""

    def __init__(self, objects: RemoteObjects, indexes: Mapping[str, dict], cache: BlockCache):
        self.objects, self.cache = objects, cache
        self.relatives = list(indexes)
        self.paths = [i["path"] for i in indexes.values()]  # what a worker loads again
        first = next(iter(indexes.values()))["schema"]
        self.schema = first  # name -> (kind, values per record): `example_batch` takes it
        self.rows = sum(i["records"] for i in indexes.values())
        self.row_bytes = sum(n * (4 if k == "float" else 8) for k, n in first.values())
        self._blocks: tuple[np.ndarray, ...] | None = None
        self._chunks: list[np.ndarray] | None = None
        self._fields = BatchFields(cache.max_bytes)
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        # Into a worker: the index paths, not their arrays (loaded there again).
        return {**self.__dict__, "_blocks": None, "_chunks": None, "_lock": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _lock=threading.Lock())

    def blocks(self) -> tuple[tuple[np.ndarray, ...], list[np.ndarray]]:
        """Per block: its first row of the split, its object, and its first
        and last-but-one chunk (of that object's index); and each object's chunks."""
        with self._lock:
            if self._blocks is None:
                self._chunks = [np.load(p) for p in self.paths]
                self._blocks = self._plan(self._chunks)
            return self._blocks, self._chunks

    def _plan(self, chunks: list[np.ndarray]) -> tuple[np.ndarray, ...]:
        """Runs of whole chunks, each at most ``bound`` bytes read and parsed
        (a chunk alone may be more read, never more parsed: `_refusal`)."""
        bound = min(BLOCK_BYTES, max(1, self.cache.max_bytes // 4))
        most_rows = max(1, bound // max(1, self.row_bytes))
        first_rows, files, firsts, stops = [], [], [], []
        row = 0
        for file, held in enumerate(chunks):
            begins, ends, counts = (held[:, k].tolist() for k in range(3))
            first, rows = 0, 0
            for k, count in enumerate(counts):
                if k > first and (rows + count > most_rows or ends[k] - begins[first] > bound):
                    first_rows.append(row)
                    files.append(file)
                    firsts.append(first)
                    stops.append(k)
                    row, first, rows = row + rows, k, 0
                rows += count
            if counts:
                first_rows.append(row)
                files.append(file)
                firsts.append(first)
                stops.append(len(counts))
                row += rows
        return tuple(np.asarray(a, np.int64) for a in (first_rows, files, firsts, stops))

    def block_of(self, rows: np.ndarray) -> np.ndarray:
        return block_indices(self.blocks()[0][0], rows)

    def gather(self, rows: np.ndarray, name: str) -> np.ndarray:
        """Field ``name``'s ``rows`` (as parsed), a block of chunks at a time:
        a batch's rows of one block come from one read, the reads in the block
        cache's sliding window; every field of a batch from one gather."""
        return self._fields.field(name, rows, self._gather)

    def _gather(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        fields = {
            name: ("array", example_dtype(kind), (n,) if n > 1 else ())
            for name, (kind, n) in self.schema.items()
        }
        return gather_rows(self.cache, self.block, self.blocks()[0][0], rows, fields)

    def block(self, block: int) -> Block:
        """Block ``block``: its chunks' rows, every field (as parsed), as one
        structured array (the block cache holds arrays)."""
        (_, files, firsts, stops), chunks = self.blocks()
        held = chunks[files[block]][firsts[block] : stops[block]]
        relative = self.relatives[files[block]]
        start, end, count = int(held[0, 0]), int(held[-1, 1]), int(held[:, 2].sum())
        first_record = int(chunks[files[block]][: firsts[block], 2].sum())  # in its object

        def read() -> np.ndarray:
            url = self.objects.object_url(relative)
            data = self.objects.read(relative, start, end)
            records: list[bytes] = []
            try:
                for begin, data_end, records_in, crc in held.tolist():
                    if _crc(data, start, begin, data_end) != crc:
                        raise RiegeliError(f"{url}: the chunk at byte {begin} changed")
                    # Its HighwayHash was checked when it was indexed (pure Python:
                    # ~3 MB/s); the CRC (zlib, GB/s) says these are the same bytes.
                    header, body, _ = chunk_data(data, start, begin, url, check_data=False)
                    found = chunk_records(header, body, url)
                    if len(found) != records_in:
                        raise RiegeliError(f"{url}: the chunk at byte {begin} changed")
                    records += found
            except RiegeliError as error:
                raise ValueError(
                    f"{url} bytes {start}-{end - 1} no longer hold the chunks it was indexed "
                    f"with ({error}): it is damaged or changed; make the source again"
                ) from None
            batch = example_batch(
                [(url, first_record + i, r) for i, r in enumerate(records)], self.schema
            )
            if not all(isinstance(v, np.ndarray) for v in batch.values()):
                raise ValueError(
                    f"{url} bytes {start}-{end - 1} no longer hold the records it was indexed "
                    "with: it changed; make the source again"
                )
            parsed = np.empty(count, [(k, v.dtype, v.shape[1:]) for k, v in batch.items()])
            for k, v in batch.items():
                parsed[k] = v
            return parsed

        return Block(("arrayrecord", block), "big", count * self.row_bytes, read)


def _crc(data: bytes, offset: int, begin: int, end: int) -> int:
    """CRC-32 of file bytes ``begin:end`` (``data`` holds the file from ``offset``)."""
    return zlib.crc32(memoryview(data)[begin - offset : end - offset])


class RangedArrayRecords(RangedExamples):
    """One numeric feature of a split's ArrayRecord files, read in place (a
    `RemoteField`; see the module)."""

    def __repr__(self) -> str:
        return f"RangedArrayRecords({self.url!r}, {self.dtype} {list(self.shape)})"

"""Variable-length rows through any backend: ``make(..., pad= | bucket= | pack=)``.

The batch plan (`jaxfeed.loaders.sequence_plan`) says, from the shuffled
order and the rows' lengths alone, which values land where in every static
``[B, L]`` batch. The backend then reads those values through its own
framework (a torch DataLoader, tf.data, Grain, Arrow, Ray tasks, their
workers): a ragged field's values are one array of fixed-shape steps, so a
batch is a gather of ``B * L`` of them, which every backend already reads
byte for byte alike. The batches are assembled here from what it read, so
they are identical on every backend, and a resume plans again instead of
replaying.

The backend reads *chunks* of each process's value stream (the batches'
gathers back to back), ``span_chunks`` chunks per backend epoch: an epoch of
the source is one or more backend epochs (spans), so the backend's index
tables stay bounded for a corpus bigger than memory.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import Any

import numpy as np
import tqdm
from jaxfeed.loaders.array_dataset import ArrayDataset, InPlaceFiles
from jaxfeed.loaders.checks import check_position
from jaxfeed.loaders.protocol import MASK_KEY, ArraySpec, Batch
from jaxfeed.loaders.ragged_field import RaggedField
from jaxfeed.loaders.sampler import Sampler
from jaxfeed.loaders.sequence_plan import (
    POSITIONS,
    SEGMENT_IDS,
    Bucket,
    EpochPlan,
    Layout,
    Pack,
    check_lengths,
    plan_epoch,
)

SPANS_PER_EPOCH = 1 << 12
"""Backend epochs one source epoch may use: the backend's epoch number is
``epoch * SPANS_PER_EPOCH + span``."""
SPAN_VALUES = 1 << 24
"""Values a span reads at most: bounds the index tables a backend holds."""
LAYOUT_BATCHES = 64
"""Batches whose places are worked out in one vectorised pass."""


class Planner:
    """The epoch plans of one source, and each process's batches in them.
    Picklable (it travels into Grain's workers with `ChunkReads`); the last
    epoch's plan is kept. Each epoch's rows come in ``order(epoch)`` (by
    default the sampler's permutation; a mixture's order otherwise)."""

    def __init__(
        self,
        layout: Layout,
        lengths: np.ndarray,
        offsets: np.ndarray,
        sampler: Sampler,
        order: Callable[[int], np.ndarray] | None = None,
    ):
        self.layout, self.lengths, self.offsets, self.sampler = layout, lengths, offsets, sampler
        self.order = sampler.permutation if order is None else order
        self._last: tuple[int, EpochPlan] | None = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_last": None, "_lock": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _lock=threading.Lock())

    def plan(self, epoch: int) -> EpochPlan:
        with self._lock:
            if self._last is None or self._last[0] != epoch:
                s = self.sampler
                plan = plan_epoch(
                    self.layout,
                    self.order(epoch),
                    self.lengths,
                    s.global_batch_size,
                    s.drop_remainder,
                )
                self._last = (epoch, plan)
            return self._last[1]

    def layouts(self, plan: EpochPlan, batches: range) -> dict[str, np.ndarray]:
        """This process's ``batches`` of ``plan``, back to back, in one pass:
        ``index`` (the values read, in place order: padding is never read)
        and ``place`` (where each lands among its batch's ``B * L`` places),
        ``segment_ids`` and ``positions`` (flat, every place), ``row`` (each
        batch row's first row; 0 when empty) and ``mask`` (``B`` a batch),
        ``starts`` and ``reads``: where each batch's places and values begin."""
        b = self.sampler.batch_size
        length = plan.batch_length[batches.start : batches.stop]
        firsts, counts, piece = self._pieces(plan, batches)
        size = plan.size[piece]
        starts = np.concatenate([[0], np.cumsum(length * b)])
        slot_place = np.repeat(starts[:-1], b) + np.tile(np.arange(b), len(length)) * np.repeat(
            length, b
        )
        within = _within(size)
        place = np.repeat(np.repeat(slot_place, counts) + plan.offset[piece], size) + within
        segment = np.zeros(int(starts[-1]), np.int32)
        ordinal = np.arange(len(piece)) - np.repeat(np.cumsum(counts) - counts, counts) + 1
        segment[place] = np.repeat(ordinal, size)
        positions = np.zeros(len(segment), np.int32)
        positions[place] = within
        return {
            "index": self._values_of(plan, piece, size, within),
            "place": place,
            SEGMENT_IDS: segment,
            POSITIONS: positions,
            "row": self._first_rows(plan, firsts, counts),
            MASK_KEY: counts > 0,
            "starts": starts,
            "reads": np.concatenate([[0], np.cumsum(self.real_values(plan, batches))]),
        }

    def reads(self, plan: EpochPlan, batches: range, rows: bool) -> np.ndarray:
        """What a backend reads for ``batches``: the values' indices (or, with
        ``rows``, each batch row's row), without the places."""
        firsts, counts, piece = self._pieces(plan, batches)
        if rows:
            return self._first_rows(plan, firsts, counts)
        size = plan.size[piece]
        return self._values_of(plan, piece, size, _within(size))

    def _pieces(self, plan: EpochPlan, batches: range) -> tuple[np.ndarray, ...]:
        """Each of this process's slots of ``batches``: its first piece and
        its count; and the pieces, in slot order."""
        s = self.sampler
        ks = np.arange(batches.start, batches.stop)
        first = ks * s.global_batch_size + s.process_index * s.batch_size
        slots = (first[:, None] + np.arange(s.batch_size)).reshape(-1)
        firsts = plan.slot_pieces[slots]
        counts = plan.slot_pieces[slots + 1] - firsts
        piece = np.repeat(firsts - (np.cumsum(counts) - counts), counts) + np.arange(
            int(counts.sum())
        )
        return firsts, counts, piece

    def _values_of(
        self, plan: EpochPlan, piece: np.ndarray, size: np.ndarray, within: np.ndarray
    ) -> np.ndarray:
        return np.repeat(self.offsets[plan.row[piece]] + plan.start[piece], size) + within

    @staticmethod
    def _first_rows(plan: EpochPlan, firsts: np.ndarray, counts: np.ndarray) -> np.ndarray:
        row = np.zeros(len(firsts), np.int64)
        row[counts > 0] = plan.row[firsts[counts > 0]]
        return row

    def real_values(self, plan: EpochPlan, batches: range) -> np.ndarray:
        """The values this process reads for each of ``batches`` (its pieces' sizes)."""
        s = self.sampler
        first = (
            np.arange(batches.start, batches.stop) * s.global_batch_size
            + s.process_index * s.batch_size
        )
        ends = plan.value_ends()
        return ends[plan.slot_pieces[first + s.batch_size]] - ends[plan.slot_pieces[first]]


def _within(size: np.ndarray) -> np.ndarray:
    """0, 1, ... within each run of ``size`` values, the runs back to back."""
    return np.arange(int(size.sum())) - np.repeat(np.cumsum(size) - size, size)


class ChunkReads:
    """The index plan a backend reads through, in the `Sampler`'s shape: the
    backend's epoch ``v`` is span ``v % SPANS_PER_EPOCH`` of source epoch
    ``v // SPANS_PER_EPOCH``; its batches are ``chunk`` indices each (values,
    or rows with ``rows=True``), past the stream's end all 0 (read, never used).
    """

    shuffle = True
    drop_remainder = True
    process_index, process_count = 0, 1  # the planner has taken this process's part
    units = block_rows = window_blocks = None

    def __init__(self, planner: Planner, chunk: int, span_chunks: int, rows: bool, examples: int):
        self.planner, self.batch_size, self.num_batches = planner, chunk, span_chunks
        self.rows, self.num_examples, self.seed = rows, examples, planner.sampler.seed

    def check_position(self, epoch: object, start: object) -> tuple[int, int]:
        return check_position(epoch, start, self.num_batches)

    def epoch_seed(self, epoch: int) -> int:
        return self.planner.sampler.epoch_seed(epoch)

    def stream(self, epoch: int, batches: range) -> np.ndarray:
        """The indices this process reads for ``batches`` of ``epoch``, back to back."""
        return self.planner.reads(self.planner.plan(epoch), batches, self.rows)

    def epoch_plan(self, epoch: int, start: int = 0) -> Iterator[tuple[np.ndarray, int]]:
        epoch, start = self.check_position(epoch, start)
        source_epoch, span = divmod(epoch, SPANS_PER_EPOCH)
        plan = self.planner.plan(source_epoch)
        sizes = self._sizes(plan)
        ends = np.cumsum(sizes)
        first_chunk = span * self.num_batches + start
        stop_chunk = (span + 1) * self.num_batches
        lo, hi = first_chunk * self.batch_size, stop_chunk * self.batch_size
        batches = range(
            int(np.searchsorted(ends, lo, side="right")),
            int(min(len(sizes), np.searchsorted(ends, hi, side="left") + 1)),
        )
        stream = self.stream(source_epoch, batches)
        base = int(ends[batches.start - 1]) if batches.start > 0 else 0
        window = np.zeros(hi - lo, np.int64)
        part = stream[max(0, lo - base) : hi - base]
        window[: len(part)] = part
        for i in range(len(window) // self.batch_size):
            yield window[i * self.batch_size : (i + 1) * self.batch_size], self.batch_size

    def _sizes(self, plan: EpochPlan) -> np.ndarray:
        """Indices each of this process's batches of ``plan`` reads."""
        if self.rows:
            return np.full(plan.num_batches, self.planner.sampler.batch_size, np.int64)
        return self.planner.real_values(plan, range(plan.num_batches))


class SequenceSource:
    """A `BatchSource` of padded, bucketed or packed batches of a dataset with
    `RaggedField` fields (see the module, and `jaxfeed.loaders.sequence_plan`).

    Each batch holds every ragged field as ``[B, L, *frame]`` (0 on padding),
    ``segment_ids`` and ``positions`` int32 ``[B, L]``, the dataset's other
    fields ``[B, ...]`` (pad and bucket only: one row per slot) and ``mask``
    bool ``[B]`` (a row holding any value) unless ``drop_remainder``.
    ``shapes`` lists the lengths a step sees (one per bucket).
    """

    def __init__(
        self,
        module: ModuleType,
        dataset: ArrayDataset,
        sampler: Sampler,
        layout: Layout,
        options: Mapping[str, Any],
        order: Callable[[int], np.ndarray] | None = None,
    ):
        ragged = {k: v for k, v in dataset.arrays.items() if isinstance(v, RaggedField)}
        fixed = {k: v for k, v in dataset.arrays.items() if k not in ragged}
        name = dataset.name
        lengths = next(iter(ragged.values())).lengths
        for key, field in ragged.items():
            if not np.array_equal(field.lengths, lengths):
                row = int(np.flatnonzero(field.lengths != lengths)[0])
                first = next(iter(ragged))
                raise ValueError(
                    f"dataset {name}: ragged fields {first!r} and {key!r} differ in length at row "
                    f"{row} ({lengths[row]} and {field.lengths[row]}); fields padded or packed "
                    "together need equal lengths in every row"
                )
        taken = sorted({SEGMENT_IDS, POSITIONS} & set(dataset.arrays))
        if taken:
            raise ValueError(
                f"dataset {name}: {taken} name the fields a sequence batch adds; rename yours"
            )
        if isinstance(layout, Pack) and fixed:
            raise ValueError(
                f"dataset {name}: pack= puts several rows in one, so per-row field(s) "
                f"{sorted(fixed)} have no place in a packed batch; leave them out, or use "
                "bucket= / pad= (one row per batch row)"
            )
        if isinstance(layout, Bucket):
            layout = layout.resolved(lengths)
        check_lengths(layout, lengths, f"dataset {name}")
        first_field = next(iter(ragged.values()))
        self.layout, self.sampler, self.dataset = layout, sampler, dataset
        self.planner = Planner(layout, lengths, first_field.offsets, sampler, order)
        self._ragged = {k: (v.frame_shape, v.dtype) for k, v in ragged.items()}
        self._fixed = {k: (v.shape[1:], v.dtype) for k, v in fixed.items()}
        plan0 = self.planner.plan(0)
        self.shapes = tuple(sorted({int(n) for n in plan0.batch_length}))
        self.batch_size = sampler.batch_size
        self.process_index, self.process_count = sampler.process_index, sampler.process_count
        self.num_batches = None if isinstance(layout, Pack) else plan0.num_batches
        longest = max(layout.lengths) if isinstance(layout, Bucket) else layout.length
        chunk = self.batch_size * longest
        read0 = int(self.planner.real_values(plan0, range(plan0.num_batches)).sum())
        epoch0 = -(-read0 // chunk)  # chunks of epoch 0
        slack = max(2, epoch0 // 50) if isinstance(layout, Pack) else 0  # pack counts vary a little
        values_span = max(1, min(SPAN_VALUES // chunk, epoch0 + slack))
        values = {k: v.values for k, v in ragged.items()}
        self._values = module.build(
            # Read where they are: one row per value, a per-row store would only slow it.
            ArrayDataset(f"{name} values", values, in_place=InPlaceFiles(arrays=True)),
            ChunkReads(self.planner, chunk, values_span, False, len(first_field.values)),
            **options,
        )
        self._rows = None
        if fixed:
            rows_span = max(1, min(SPAN_VALUES // self.batch_size, plan0.num_batches))
            self._rows = module.build(
                ArrayDataset(name, fixed),
                ChunkReads(self.planner, self.batch_size, rows_span, True, len(dataset)),
                **options,
            )

    def batches_in(self, epoch: int) -> int:
        """The batches of ``epoch`` (with ``pack=``, each epoch's own count)."""
        return self.planner.plan(epoch).num_batches

    def padding_fraction(self, epoch: int = 0) -> float:
        """The share of the ragged values' places in ``epoch`` that are padding."""
        plan = self.planner.plan(epoch)
        places = int(plan.batch_length.sum()) * self.sampler.global_batch_size
        return 1.0 - plan.real_values() / places

    @property
    def element_spec(self) -> Mapping[str, ArraySpec]:
        """The longest shape (with ``bucket=``, each batch is one of `shapes`)."""
        b, length = self.batch_size, max(self.shapes)
        spec = {k: ArraySpec((b, length, *f), d) for k, (f, d) in self._ragged.items()}
        spec[SEGMENT_IDS] = spec[POSITIONS] = ArraySpec((b, length), np.dtype(np.int32))
        spec.update({k: ArraySpec((b, *s), d) for k, (s, d) in self._fixed.items()})
        if not self.sampler.drop_remainder:
            spec[MASK_KEY] = ArraySpec((b,), np.dtype(np.bool_))
        return spec

    def iter_epoch(self, epoch: int = 0, *, start: int = 0) -> Iterator[Batch]:
        epoch, _ = check_position(epoch, 0, 1)
        plan = self.planner.plan(epoch)
        epoch, start = check_position(epoch, start, plan.num_batches)
        return self._batches(epoch, plan, start)

    def _batches(self, epoch: int, plan: EpochPlan, start: int) -> Iterator[Batch]:
        b = self.batch_size
        before = int(self.planner.real_values(plan, range(start)).sum())
        values = _Chunks(self._values, epoch, before)
        rows = None if self._rows is None else _Chunks(self._rows, epoch, start * b)
        try:
            for first in range(start, plan.num_batches, LAYOUT_BATCHES):
                block = range(first, min(first + LAYOUT_BATCHES, plan.num_batches))
                layouts = self.planner.layouts(plan, block)
                for i, k in enumerate(block):
                    yield self._batch(plan, k, layouts, i, values, rows)
            values.drain()
            if rows is not None:
                rows.drain()
        finally:
            values.close()
            if rows is not None:
                rows.close()

    def _batch(
        self,
        plan: EpochPlan,
        k: int,
        layouts: Mapping[str, np.ndarray],
        i: int,
        values: _Chunks,
        rows: _Chunks | None,
    ) -> Batch:
        """Batch ``k``, the ``i``-th of ``layouts``, from the next values (and rows) read."""
        b, length = self.batch_size, int(plan.batch_length[k])
        at = slice(int(layouts["starts"][i]), int(layouts["starts"][i + 1]))
        segment = layouts[SEGMENT_IDS][at].reshape(b, length)
        mask = layouts[MASK_KEY][i * b : (i + 1) * b]
        got = slice(int(layouts["reads"][i]), int(layouts["reads"][i + 1]))
        place = layouts["place"][got] - at.start
        read = values.take(got.stop - got.start)
        batch: Batch = {}
        for key, (frame, dtype) in self._ragged.items():
            field = np.zeros((b * length, *frame), dtype)
            field[place] = read[key]
            batch[key] = field.reshape(b, length, *frame)
        batch[SEGMENT_IDS] = segment
        batch[POSITIONS] = layouts[POSITIONS][at].reshape(b, length)
        if rows is not None:
            for key, value in rows.take(b).items():
                value = value.astype(self._fixed[key][1], copy=False)
                value[~mask] = 0
                batch[key] = value
        if not self.sampler.drop_remainder:
            batch[MASK_KEY] = mask
        return batch

    def __iter__(self) -> Iterator[Batch]:
        return self.iter_epoch(0)

    def __len__(self) -> int:
        return self.batches_in(0) if self.num_batches is None else self.num_batches

    def close(self) -> None:
        for source in (self._values, self._rows):
            close = getattr(source, "close", None)
            if close is not None:
                close()

    def __enter__(self) -> SequenceSource:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        s = self.sampler
        return (
            f"SequenceSource({self.dataset.name}, {self.layout}, batch_size={s.batch_size}, "
            f"shapes={self.shapes}, seed={s.seed}, process={s.process_index}/{s.process_count}, "
            f"backend={type(self._values).__name__})"
        )


class _Chunks:
    """A backend source's chunks of one epoch's stream from value ``first``:
    `take` the next ``n`` values of every field, span after span."""

    def __init__(self, source: Any, epoch: int, first: int):
        reads: ChunkReads = source.sampler
        self.source, self.epoch, self.chunk = source, epoch, reads.batch_size
        self.span_chunks = reads.num_batches
        chunk, self._skip = divmod(first, self.chunk)
        self._span, start = divmod(chunk, self.span_chunks)
        self._iter = self._open(start)
        self._held: list[Mapping[str, np.ndarray]] = []
        self._have = 0

    def _open(self, start: int) -> Iterator[Mapping[str, np.ndarray]]:
        epoch = self.epoch * SPANS_PER_EPOCH + self._span
        return self.source.iter_epoch(epoch, start=start)

    def _next(self) -> Mapping[str, np.ndarray]:
        while True:
            chunk = next(self._iter, None)
            if chunk is not None:
                return chunk
            self._iter.close()
            self._span += 1
            self._iter = self._open(0)

    def take(self, n: int) -> dict[str, np.ndarray]:
        while self._have - self._skip < n:
            chunk = self._next()
            self._held.append(chunk)
            self._have += self.chunk
        joined = {
            key: np.concatenate([c[key] for c in self._held])
            if len(self._held) > 1
            else self._held[0][key]
            for key in self._held[0]
        }
        out = {key: value[self._skip : self._skip + n] for key, value in joined.items()}
        used = self._skip + n
        whole, self._skip = divmod(used, self.chunk)
        self._held = self._held[whole:]
        self._have -= whole * self.chunk
        return {
            key: np.array(value) for key, value in out.items()
        }  # its own memory: zeroed in place

    def drain(self) -> None:
        """Reads the rest of the current span (all padding), so a backend that
        keeps its workers across epochs (Grain) continues at the next span."""
        for _ in self._iter:
            pass

    def close(self) -> None:
        self._iter.close()


def transformed(data: ArrayDataset, fn: Any, seed: int) -> ArrayDataset:
    """``data`` after ``fn(record, rng)`` on every row, once, with epoch 0's
    generator of each row: a transform that tokenizes or crops decides the
    lengths the plan needs, so it runs before planning, not per epoch. An
    output field whose rows differ in length becomes a `RaggedField`.

    Raises:
      TransformError: ``fn`` fails, or returns other fields on some row (named).
    """
    from jaxfeed.loaders.transform import TransformError

    arrays = data.arrays
    out: dict[str, list[np.ndarray]] = {}
    for row in tqdm.trange(len(data), desc=f"transform {data.name}", leave=False, disable=None):
        record = {key: array[row] for key, array in arrays.items()}
        try:
            result = fn(record, np.random.default_rng((seed, 0, row)))
        except Exception as err:
            raise TransformError(f"the transform failed on row {row}: {err!r}") from err
        if not isinstance(result, Mapping) or (out and set(result) != set(out)):
            got = sorted(result) if isinstance(result, Mapping) else type(result).__name__
            raise TransformError(
                f"the transform returned {got} on row {row}; it must return a dict with the "
                f"same fields on every row ({sorted(out) or 'any'})"
            )
        for key, value in result.items():
            out.setdefault(key, []).append(np.asarray(value))
    return ArrayDataset(data.name, out, classes=data.classes)

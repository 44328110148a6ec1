"""`wrap`: a loader the user already has, as a `BatchSource`.

Which loaders are accepted, and how each one's epochs are read, lives in
`jaxfeed.loaders.wrapping.kinds`; this module turns their batches into protocol batches.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from jaxfeed.loaders.checks import (
    check_batch_size,
    check_bool,
    check_int,
    check_position,
    check_seed,
)
from jaxfeed.loaders.protocol import MASK_KEY, ArraySpec, Batch, BatchSource
from jaxfeed.loaders.wrapping import raw_batches
from jaxfeed.loaders.wrapping.kinds import KINDS, REPLAYABLE, Epochs, WrapSettings


class WrappedSource:
    """A user's loader as a `BatchSource`; made by `wrap`, which documents it.

    Reads epoch 0's first batch when made (so a bad loader fails in `wrap`,
    and ``batch_size`` / ``element_spec`` are plain attributes that read
    nothing); the first ``iter_epoch(0)`` serves that batch, not a re-read.
    ``data_state`` / ``restore_data_state`` carry a position, and a stream's
    own state, to a fresh process (docs/resuming.md).

    Attributes:
      host_fields: names of the leaves that stay numpy on the host (see
        `wrap`); ``element_spec`` holds the device leaves only.

    A field ``pad_to`` gives several lengths (buckets) has, in
    ``element_spec``, the longest: each batch has one of those lengths.
    """

    def __init__(
        self,
        kind: str,
        epochs: Epochs,
        *,
        batch_size: int | None,
        keys: tuple[str, ...] | None,
        drop_remainder: bool,
        transform: Callable[[Batch], Batch] | None,
        host_fields: tuple[str, ...] = (),
        pad_to: Mapping[str, raw_batches.Lengths] | None = None,
    ):
        self.kind = kind
        self.drop_remainder = drop_remainder
        self.host_fields = host_fields
        self._epochs = epochs
        self._batch_size = batch_size or epochs.batch_size
        self._keys = keys
        self._transform = transform
        self._pad_to = dict(pad_to or {})
        self._pad_groups = raw_batches.groups(self._pad_to)
        # Fields whose last axis varies from batch to batch: the spec holds the longest.
        self._bucketed = {k: v for k, v in self._pad_to.items() if len(v) > 1}
        self._report = raw_batches.PaddingReport()
        self._spec: dict[str, ArraySpec] = {}
        self._spec_from = ""  # where the spec was read, for mismatch messages
        self._all_rows: np.ndarray | None = None  # the shared all-True mask
        self._dropped: dict[int, list[int]] = {}  # per epoch: short batches dropped
        batches = self._batches(0, 0)
        try:
            first = next(batches)
        except BaseException:
            batches.close()
            raise
        # Epoch 0, from its second batch on, kept for the first iter_epoch(0).
        self._held: tuple[Batch, Iterator[Batch]] | None = (first, batches)

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def num_batches(self) -> int | None:
        return self._epochs.num_batches

    @property
    def element_spec(self) -> Mapping[str, ArraySpec]:
        return dict(self._spec)

    def iter_epoch(self, epoch: int = 0, *, start: int = 0) -> Iterator[Batch]:
        return self._iter_epoch(epoch, start, keep_state=True)

    def padding_report(self) -> raw_batches.PaddingReport:
        """A copy of what the batches padded so far carried: real and padding
        rows, real and served values of each ``pad_to`` field, and the distinct
        shapes (docs/wrap.md). The first batch is counted by ``wrap()``."""
        # A feed's thread may be adding to it: dict() and set() copy in one step.
        report = self._report
        return dataclasses.replace(
            report, real=dict(report.real), served=dict(report.served), shapes=set(report.shapes)
        )

    def without_data_state(self) -> BatchSource:
        """This source's batches, keeping no stream state (see `SkipsDataState`):
        a tf.data pipeline then takes no checkpoint at each epoch's start."""
        return _WithoutDataState(self)

    def _iter_epoch(self, epoch: int, start: int, keep_state: bool) -> Iterator[Batch]:
        # Checked now, not at the first batch (a past-the-end start is caught
        # only when the length is known).
        epoch, start = check_position(epoch, start, self.num_batches)
        held, self._held = self._held, None
        if held is not None:
            if (epoch, start) == (0, 0):
                return _chain(*held)
            held[1].close()  # another position first: the held batch is not needed
        return self._batches(epoch, start, keep_state)

    def data_state(self, epoch: int, next_batch: int) -> dict[str, Any]:
        """Where the source stood when batch ``next_batch - 1`` of ``epoch``
        had been produced, as JSON values (see `BatchSource`): the position,
        and a stream's own state (docs/resuming.md).

        Raises:
          ValueError: a stream that cannot come back to that position exactly,
            saying why and what to use instead.
        """
        epoch, next_batch = check_position(epoch, next_batch, self.num_batches)
        state: dict[str, Any] = {"kind": self.kind, "epoch": epoch, "next_batch": next_batch}
        stream = self._epochs.stream
        if stream is not None:
            raw = self._raw(epoch, next_batch)
            state["stream"] = stream.state(epoch, raw)
            state["dropped"] = [i for i in self._dropped.get(epoch, ()) if i < raw]
        return state

    def restore_data_state(self, state: Mapping[str, Any]) -> None:
        """Restores what `data_state` returned (in this or a fresh process);
        call ``iter_epoch`` at that position next.

        Raises:
          ValueError: the state is another kind of loader's, or one this
            stream cannot come back to.
        """
        kind = state.get("kind") if isinstance(state, Mapping) else None
        if kind != self.kind or ("stream" in state) != (self._epochs.stream is not None):
            raise ValueError(
                f"this data state was taken from a wrapped {kind!r}, but this source wraps "
                f"{self.kind!r}; resume with the loader the checkpoint was written with"
            )
        dropped = []
        if self._epochs.stream is not None:
            try:  # checked before anything is restored
                dropped = [int(i) for i in state["dropped"]]
            except (KeyError, TypeError, ValueError) as error:
                raise ValueError(
                    f"not a data state of a wrapped stream ({error!r}); pass what "
                    f"data_state() returned, unchanged"
                ) from None
        held, self._held = self._held, None
        if held is not None:
            held[1].close()
        if self._epochs.stream is not None:
            epoch, _ = self._epochs.stream.restore(state["stream"])
            self._dropped = {epoch: dropped}

    def _raw(self, epoch: int, start: int) -> int:
        """The loader's own index of ``epoch``'s batch ``start``: short batches
        dropped before it (``drop_remainder``) count there, not here."""
        for index in sorted(self._dropped.get(epoch, ())):
            if index <= start:
                start += 1
        return start

    def _batches(self, epoch: int, start: int, keep_state: bool = True) -> Iterator[Batch]:
        start = self._raw(epoch, start)
        stream = self._epochs.stream  # (a stream refuses a position now, at the call)
        if stream is None:
            raws = self._epochs.batches(epoch, start)
        else:
            raws = stream(epoch, start, keep_state)
        return self._finished(raws, epoch, start)

    def _finished(self, raws: Iterator[Any], epoch: int, start: int) -> Iterator[Batch]:
        yielded, short_rows = 0, []
        sampler = self._epochs.sampler
        valid = (
            itertools.repeat(None)
            if sampler is None
            else map(sampler.num_valid, range(start, sampler.num_batches))
        )
        dropped = self._dropped.setdefault(epoch, [])
        for old in sorted(self._dropped)[:-3]:  # recent epochs only: those a resume asks for
            if old != epoch:
                del self._dropped[old]
        pairs = zip(raws, valid, strict=sampler is not None)
        for index, (raw, num_valid) in enumerate(pairs, start):
            batch, rows = self._finish(raw, f"batch {index} of epoch {epoch}", num_valid)
            if batch is None:
                short_rows.append(rows)
                if index not in dropped:
                    dropped.append(index)
            else:
                yielded += 1
                yield batch
        if yielded or start:
            return
        # An empty epoch would divide by zero in whatever averages over it.
        if not short_rows:
            raise ValueError(f"the wrapped {self.kind} yielded no batches in epoch {epoch}")
        rows = (
            f"its {short_rows[0]} rows are"
            if len(short_rows) == 1
            else f"each of its {len(short_rows)} batches (rows {short_rows[:8]}) is"
        )
        raise ValueError(
            f"epoch {epoch} of the wrapped {self.kind} has no full batch: {rows} fewer "
            f"than batch_size {self._batch_size}, and drop_remainder=True drops them; pass "
            f"a smaller batch_size or drop_remainder=False"
        )

    def _finish(
        self, raw: Any, where: str, num_valid: int | None = None
    ) -> tuple[Batch | None, int]:
        """Flattens, converts, transforms, checks, pads. Returns the batch
        (None: dropped) and its rows before padding. ``num_valid``: a
        sampler-ordered batch's real rows; the rest are zeroed, as in `make`."""
        batch = raw_batches.flatten(raw, self._keys)
        if self._transform is not None:  # the fields are the transform's
            batch = {k: raw_batches.to_numpy(v) for k, v in self._transform(batch).items()}
            return self._checked(batch, where, num_valid)
        try:
            return self._checked(batch, where, num_valid)
        except ValueError as err:
            wanted = [n for n in (*self._pad_to, *self.host_fields) if n not in batch]
            said = raw_batches.with_positional_names(err, raw, self._keys, wanted)
            if said is None:
                raise
            raise ValueError(said) from None

    def _checked(self, batch: Batch, where: str, num_valid: int | None) -> tuple[Batch | None, int]:
        if self._like_the_first(batch, num_valid):
            size = self._batch_size
            if not self.drop_remainder:
                batch[MASK_KEY] = self._full_mask(size)
            self._report.add(batch, (), size, size)
            return batch, size
        self._check_names(batch, where)
        for lengths, keys in self._pad_groups:
            raw_batches.pad_group(batch, lengths, keys, where)
        device = {k: v for k, v in batch.items() if k not in self.host_fields}
        raw_batches.check_numeric(device, where)  # every field refused, in one message
        for key, value in device.items():
            batch[key] = raw_batches.as_on_device(value, key, where)
        rows = raw_batches.count_rows(batch, where)
        if num_valid is not None and num_valid < rows:
            batch = {k: v[:num_valid] for k, v in batch.items()}
            rows = num_valid
        if self._batch_size is None:
            self._batch_size = rows
        size = self._batch_size
        if rows > size:
            raise ValueError(
                f"{where} has {rows} rows, more than batch_size {size}; pass the largest "
                f"batch the loader makes as batch_size= (for batches of several sizes, "
                f"e.g. tf.data's bucket_by_sequence_length, the largest of its "
                f"bucket_batch_sizes): a smaller batch gets padding rows, False in "
                f"{MASK_KEY!r}"
            )
        if rows < size:
            if self.drop_remainder:
                return None, rows
            batch = {k: raw_batches.pad_batch_rows(v, size) for k, v in batch.items()}
        if not self.drop_remainder:
            batch[MASK_KEY] = self._full_mask(size) if rows == size else np.arange(size) < rows
        if not self._spec_from:
            self._spec, self._spec_from = self._spec_of(batch), where
        elif not self._matches_spec(batch):
            raw_batches.raise_mismatch(self._spec, self._spec_of(batch), where, self._spec_from)
        self._report.add(batch, list(self._pad_to), rows, size)
        return batch, rows

    def _like_the_first(self, batch: Batch, num_valid: int | None) -> bool:
        """Whether ``batch`` is a full batch of the first batch's fields,
        dtypes and shapes, nothing to pad or convert: every check below holds
        for it as it held for the first (~5 µs a batch less)."""
        spec = self._spec
        if not self._spec_from or self._pad_groups or self.host_fields or MASK_KEY in batch:
            return False
        if len(batch) + (not self.drop_remainder) != len(spec):
            return False
        for key, value in batch.items():
            want = spec.get(key)
            if (
                want is None
                or type(value) is not np.ndarray
                or value.dtype != want.dtype
                or value.shape != want.shape
            ):
                return False
        return num_valid is None or num_valid == self._batch_size

    def _spec_of(self, batch: Batch) -> dict[str, ArraySpec]:
        return {
            k: ArraySpec(self._longest(k, v.shape), v.dtype)
            for k, v in batch.items()
            if k not in self.host_fields
        }

    def _longest(self, key: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        """``shape`` with a bucketed field's last axis at its longest length."""
        lengths = self._bucketed.get(key)
        return shape if lengths is None else (*shape[:-1], lengths[-1])

    def _matches_spec(self, batch: Batch) -> bool:
        # Per batch, so field by field without building a new spec.
        if len(batch) - len(self.host_fields) != len(self._spec):
            return False
        for key, value in batch.items():
            spec = self._spec.get(key)
            if spec is None:
                if key not in self.host_fields:
                    return False
            elif self._longest(key, value.shape) != spec.shape or value.dtype != spec.dtype:
                return False
        return True

    def _full_mask(self, size: int) -> np.ndarray:
        """The all-True mask, made once and read-only, shared by full batches."""
        if self._all_rows is None or len(self._all_rows) != size:
            self._all_rows = np.ones(size, np.bool_)
            self._all_rows.flags.writeable = False
        return self._all_rows

    def _check_names(self, batch: Batch, where: str) -> None:
        if MASK_KEY in batch:
            raise ValueError(
                f"{where}: the loader's batches have a field {MASK_KEY!r}, the name wrap gives "
                f"its row mask (False on padding rows); rename yours, e.g. "
                f"transform=lambda b: {{'attention_mask' if k == 'mask' else k: v "
                f"for k, v in b.items()}}, or keys=(...) for tuple batches"
            )
        for option, names in (("host_fields", self.host_fields), ("pad_to", self._pad_to)):
            missing = [name for name in names if name not in batch]
            if missing:
                raise ValueError(
                    f"{where} has no field {missing[0]!r}, which {option}= names; its "
                    f"fields are {sorted(batch)}"
                )

    def __repr__(self) -> str:
        host = f", host_fields={self.host_fields}" if self.host_fields else ""
        return (
            f"WrappedSource({self.kind}, batch_size={self._batch_size}, "
            f"num_batches={self.num_batches}, drop_remainder={self.drop_remainder}{host})"
        )


class _WithoutDataState:
    """`WrappedSource.without_data_state`: the same batches, no stream state kept."""

    def __init__(self, source: WrappedSource):
        self._source = source

    batch_size = property(lambda self: self._source.batch_size)
    num_batches = property(lambda self: self._source.num_batches)
    element_spec = property(lambda self: self._source.element_spec)
    host_fields = property(lambda self: self._source.host_fields)
    padding_report = property(lambda self: self._source.padding_report)

    def iter_epoch(self, epoch: int = 0, *, start: int = 0) -> Iterator[Batch]:
        return self._source._iter_epoch(epoch, start, keep_state=False)

    def __repr__(self) -> str:
        return f"{self._source!r}.without_data_state()"


def _chain(first: Batch, rest: Iterator[Batch]) -> Iterator[Batch]:
    try:
        yield first
        yield from rest
    finally:
        rest.close()


def wrap(
    obj: Any,
    *,
    batch_size: int | None = None,
    keys: Sequence[str] | None = None,
    drop_remainder: bool = False,
    transform: Callable[[Batch], Batch] | None = None,
    seed: int = 0,
    shuffle: bool | None = None,
    process_index: int | None = None,
    process_count: int | None = None,
    steps_per_epoch: int | None = None,
    host_fields: Sequence[str] = (),
    pad_to: Mapping[str, int | Sequence[int]] | None = None,
    resume: str | None = None,
    **options: Any,
) -> BatchSource:
    """A `BatchSource` over a loader you already have (docs/wrap.md).

    Takes a torch ``DataLoader``, map-style ``Dataset`` or ``IterableDataset``,
    a ``tf.data.Dataset``, a TFDS data source, a Grain ``MapDataset``,
    ``IterDataset`` or ``DataLoader``, a ``datasets.Dataset`` or
    ``IterableDataset``, a re-iterable of batches, or a zero-argument callable
    returning an iterator of batches. Random-access objects are read in the
    shared sampler's order (a new permutation per epoch, a slice per process,
    an exact ``start``), as ``make`` reads; streams keep their own order and
    are sharded with their framework's tool on several processes, or refused
    (docs/wrap.md). Batches become flat numpy dicts (a tuple
    ``(x, y)`` becomes ``{"image": x, "label": y}``, nested keys join with "/");
    a short batch is padded and masked, or dropped with ``drop_remainder``.
    64-bit leaves become 32-bit on the host, as JAX would make them on the
    device (unless ``jax_enable_x64``), so ``element_spec`` is what the step
    receives; an integer that does not fit is refused, not wrapped around.
    Epoch 0's first batch is read here, checked, and served by the first
    ``iter_epoch(0)``. Every batch must match it (docs/wrap.md).

    Args:
      obj: the loader.
      batch_size: rows per batch (an int >= 1); required for ``datasets``
        objects, torch ``Dataset``s, TFDS data sources, unbatched Grain
        ``MapDataset``s and unbatched tf.data, else the loader's or the first
        batch's.
      keys: names for the parts of tuple batches.
      drop_remainder: drop short batches instead of padding them.
      transform: applied to each flat numpy batch before the checks.
      seed: with the epoch, the order of a random-access dataset (read in the
        shared sampler's order, as ``make`` reads).
      shuffle: None keeps the object's own meaning (a DataLoader built with
        ``shuffle=True`` stays shuffled, now seeded per epoch); True/False
        overrides it for random-access datasets (refused for streams: shuffle
        them with their framework's own tool).
      process_index, process_count: this process's share on several hosts;
        default ``jax.process_index()`` / ``jax.process_count()``.
      steps_per_epoch: batches per epoch of a stream (required for an endless
        one; refused for random-access objects, whose epoch is their rows).
      host_fields: leaves that stay numpy on the host (e.g. a text column):
        padded with the rows, never checked as numbers nor placed on a
        device, not in ``element_spec`` but in the source's ``host_fields``.
      pad_to: ``{name: length}``: right-pads that leaf's last axis with zeros
        to ``length`` (rows of different lengths become one array); a longer
        row is refused. ``{name: (32, 64, 128)}`` pads each batch to the
        shortest of those lengths that holds its rows (fields given the same
        lengths share it); ``padding_report()`` says what padding cost.
      resume: ``"replay"`` says a callable or custom re-iterable yields the
        same batches every time, so it may restart mid-epoch by reading them
        again (docs/resuming.md); None refuses that.
      **options: ``columns=[...]`` for ``datasets`` objects; ``collate_fn=``
        for a torch ``Dataset`` or ``IterableDataset``.

    Raises:
      TypeError: an unsupported object or option; a non-int batch size; a
        ``drop_remainder`` that is not a bool.
      ValueError: bad arguments; a loader with no batch in an epoch; a first
        batch JAX cannot take (a non-numeric leaf, a field named ``mask``),
        naming the field. While iterating: a batch unlike the first, naming
        the field, both shapes and the batch.
    """
    if all(hasattr(type(obj), name) for name in ("batch_size", "element_spec", "iter_epoch")):
        given = (batch_size, keys, transform, process_index, process_count, steps_per_epoch)
        given += (shuffle, pad_to, resume)
        if any(v is not None for v in given) or options or drop_remainder or seed or host_fields:
            raise TypeError(f"{type(obj).__name__} is already a BatchSource; wrap takes no options")
        return obj
    if batch_size is not None:
        batch_size = check_batch_size(batch_size)
    drop_remainder = check_bool("drop_remainder", drop_remainder)
    if isinstance(keys, str) or (keys is not None and not keys):
        raise ValueError(f"keys must be a sequence of names like ('image', 'label'), got {keys!r}")
    host_fields, pad_to = raw_batches.check_fields(host_fields, pad_to)
    if shuffle is not None and not isinstance(shuffle, bool):
        raise TypeError(f"shuffle must be None, True or False, got {shuffle!r}")
    kind = next((k for k in KINDS if k.match(obj)), None)
    if kind is None:
        received = f"{type(obj).__module__}.{type(obj).__qualname__}"
        hint = ""
        if isinstance(obj, Iterator):
            hint = " (an iterator is single-use: pass the function that makes it instead)"
        raise TypeError(
            f"wrap() got a {received}{hint}; it supports: {', '.join(k.name for k in KINDS)}"
        )
    if resume not in (None, "replay") or (resume and kind.name not in REPLAYABLE):
        raise ValueError(
            f"resume={resume!r}: only resume='replay' exists, for callables and custom "
            f"re-iterables, whose repeating wrap cannot check; a {kind.name} resumes with "
            f"its own state or position: omit resume"
        )
    unknown = sorted(set(options) - set(kind.options))
    if unknown:
        routes = "".join(f"; {kind.routes[o]}" for o in unknown if o in kind.routes)
        raise TypeError(
            f"wrap() for a {kind.name} takes options {list(kind.options)}, got {unknown}{routes}"
        )
    if process_index is None or process_count is None:
        import jax  # the default share: this JAX process's

        process_index = jax.process_index() if process_index is None else process_index
        process_count = jax.process_count() if process_count is None else process_count
    settings = WrapSettings(
        batch_size=batch_size,
        drop_remainder=drop_remainder,
        seed=check_seed(seed),
        shuffle=shuffle,
        process_index=check_int("process_index", process_index, 0),
        process_count=check_int("process_count", process_count, 1),
        steps_per_epoch=None
        if steps_per_epoch is None
        else check_int("steps_per_epoch", steps_per_epoch, 1),
        resume=resume,
    )
    if settings.process_index >= settings.process_count:
        raise ValueError(
            f"process_index={process_index} is not in [0, process_count={process_count})"
        )
    epochs = kind.adapt(obj, settings, **options)
    if epochs.num_batches == 0:
        size = batch_size or epochs.batch_size
        if size is None:
            raise ValueError(f"the wrapped {kind.name} is empty: it has no batches")
        rows = "fewer rows" if epochs.num_rows is None else f"{epochs.num_rows} rows, fewer"
        raise ValueError(
            f"the wrapped {kind.name} has no batches in an epoch: {rows} than one batch "
            f"of {size}, and short batches are dropped "
            f"(drop_remainder=True or the loader's own drop_last); pass a smaller "
            f"batch_size, or keep short batches"
        )
    return WrappedSource(
        kind.name,
        epochs,
        batch_size=batch_size,
        keys=None if keys is None else tuple(keys),
        drop_remainder=drop_remainder,
        transform=transform,
        host_fields=host_fields,
        pad_to=pad_to,
    )

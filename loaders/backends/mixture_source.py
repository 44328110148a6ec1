"""A `Mixture` through any backend: ``make(backend, dataset=Mixture(...))``.

Each component is read by a backend source of its own, over its own data
(any format), with its own transform, in its framework and workers. Its
reads are *passes*: the backend's epoch ``q * spans + s`` is span ``s`` of
the component's pass ``q`` (its shared-sampler shuffle of epoch ``q``),
holding the rows this process takes from it, in order (``spans`` is 1
unless a pass is longer than `SPAN_ROWS`, so a backend that keeps its
workers across epochs goes on from one pass to the next). A record's
generator is that of its pass, ``default_rng((component seed, q, row))``, so
an augmentation is new each time a small component comes round again, and
the same on every backend and process count.

The batches are assembled here: the plan (`jaxfeed.loaders.mixture_plan`)
says which component fills each of this process's slots, and each slot takes
the next row read from that component.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import ModuleType
from typing import Any

import numpy as np
from jaxfeed.loaders.array_dataset import ArrayDataset
from jaxfeed.loaders.checks import check_position
from jaxfeed.loaders.mixture_plan import COMPONENT, Mixture, MixturePlan, Phase, component_seed
from jaxfeed.loaders.protocol import MASK_KEY, ArraySpec, Batch
from jaxfeed.loaders.sampler import Sampler
from jaxfeed.loaders.transform import RecordTransform

SPANS_PER_PASS = 1 << 8
"""Backend epochs one pass of a component may use at most."""
SPAN_ROWS = 1 << 22
"""Rows of a pass a span holds at least (a pass is cut into spans only when it
is longer): bounds the index tables a backend holds."""


class PassTransform(RecordTransform):
    """A component's transform, with each record's generator of its pass (the
    backend's epoch counts ``spans`` a pass)."""

    def __init__(self, fn: Any, seed: int, dataset: ArrayDataset, spans: int):
        super().__init__(fn, seed, dataset)
        self.spans = spans

    def batch(self, rows, indices, epoch, out=None):
        return super().batch(rows, indices, epoch // self.spans, out)


class Composed:
    """``then(first(record, rng), rng)``: a component's transform, then `make`'s."""

    def __init__(self, first: Any, then: Any):
        self.first, self.then = first, then

    def __call__(self, record: Mapping[str, Any], rng: np.random.Generator) -> Any:
        return self.then(self.first(record, rng), rng)


class PassReads:
    """One component's reads in the `Sampler`'s shape (see the module): its
    backend epoch ``v`` reads span ``v % spans`` of pass ``v // spans``,
    ``num_batches`` chunks of ``batch_size`` rows, past
    this process's rows all row 0 (read, never used)."""

    shuffle = True
    drop_remainder = True
    process_index, process_count = 0, 1  # the plan has taken this process's part
    units = block_rows = window_blocks = None

    def __init__(
        self, plan: MixturePlan, c: int, order: Sampler, chunk: int, process: int, local_batch: int
    ):
        self.plan, self.c, self.order, self.batch_size = plan, c, order, chunk
        self.process, self.local_batch = process, local_batch
        self.num_examples = order.num_examples
        self.span = min(self.num_examples, max(SPAN_ROWS, -(-self.num_examples // SPANS_PER_PASS)))
        self.spans = -(-self.num_examples // self.span)
        self.num_batches = -(-self.span // chunk)
        self.seed = order.seed
        self._last: tuple[int, np.ndarray] | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_last": None}

    def check_position(self, epoch: object, start: object) -> tuple[int, int]:
        return check_position(epoch, start, self.num_batches)

    def epoch_seed(self, epoch: int) -> int:
        return self.order.epoch_seed(epoch // self.spans)

    def positions(self, epoch: int) -> np.ndarray:
        """This process's stream positions in backend epoch ``epoch``."""
        if self._last is None or self._last[0] != epoch:
            q, s = divmod(epoch, self.spans)
            lo = q * self.num_examples + s * self.span
            hi = min(lo + self.span, (q + 1) * self.num_examples)
            mine = self.plan.slots_of(self.c, lo, hi, self.process, self.local_batch)
            self._last = (epoch, mine)
        return self._last[1]

    def epoch_plan(self, epoch: int, start: int = 0) -> Iterator[tuple[np.ndarray, int]]:
        epoch, start = self.check_position(epoch, start)
        q = epoch // self.spans
        rows = self.order.permutation(q)[self.positions(epoch) - q * self.num_examples]
        window = np.zeros(self.num_batches * self.batch_size, np.int64)
        window[: len(rows)] = rows
        b = self.batch_size
        for i in range(start, self.num_batches):
            yield window[i * b : (i + 1) * b], b


class _Stream:
    """This process's rows of one component from stream position ``first`` on:
    `take` the next ``n``, span after span."""

    def __init__(self, source: Any, first: int):
        self.source, self.reads = source, source.sampler
        q, within = divmod(first, self.reads.num_examples)
        self._epoch = q * self.reads.spans + within // self.reads.span
        mine = self.reads.positions(self._epoch)
        at = int(np.searchsorted(mine, first))
        self._left = len(mine) - at  # this span's rows not yet read
        chunk, self._skip = divmod(at, self.reads.batch_size)
        self._iter = self.source.iter_epoch(self._epoch, start=chunk) if self._left else None
        self._buf: dict[str, np.ndarray] = {}
        self._have = 0

    def _next_span(self) -> None:
        if self._iter is not None:
            self._iter.close()  # its padding chunks are never read
        self._left = 0
        while not self._left:
            self._epoch += 1  # the pass's next span, or the next pass's first
            self._left = len(self.reads.positions(self._epoch))
        self._skip = 0
        self._iter = self.source.iter_epoch(self._epoch)

    def take(self, n: int) -> dict[str, np.ndarray]:
        parts = []
        while n:
            if not self._have:
                if not self._left:
                    self._next_span()
                chunk = next(self._iter)
                real = min(self.reads.batch_size - self._skip, self._left)
                self._buf = {k: v[self._skip : self._skip + real] for k, v in chunk.items()}
                self._have, self._left, self._skip = real, self._left - real, 0
            got = min(n, self._have)
            parts.append({k: v[:got] for k, v in self._buf.items()})
            self._buf = {k: v[got:] for k, v in self._buf.items()}
            self._have, n = self._have - got, n - got
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    def close(self) -> None:
        if self._iter is not None:
            self._iter.close()


class MixtureSource:
    """A `BatchSource` of a `Mixture`: each batch holds the components'
    fields and ``component`` int32 ``[B]`` (each row's index in
    ``names``); no ``mask`` (every row is real). `Resumable`: its state holds
    the weights of each phase, so a resume with other weights is refused
    unless the mixture says ``reweight=True``.
    """

    def __init__(
        self,
        module: ModuleType,
        mixture: Mixture,
        datasets: Mapping[str, ArrayDataset],
        transforms: Mapping[str, Any],
        sampler: Sampler,
        orders: Mapping[str, Sampler],
        options: Mapping[str, Any],
    ):
        self.mixture, self.sampler = mixture, sampler
        self.datasets = dict(datasets)  # name -> its data, in the mixture's order
        self.names = mixture.names
        self.batch_size = sampler.batch_size
        self.process_index, self.process_count = sampler.process_index, sampler.process_count
        name = "+".join(self.names)
        sizes = tuple(len(datasets[n]) for n in self.names)
        self.plan = MixturePlan(mixture, sizes, sampler.global_batch_size, sampler.seed, name)
        self._sources = []
        for c, key in enumerate(self.names):
            data, order = datasets[key], orders[key]
            reads = PassReads(
                self.plan, c, order, self.batch_size, self.process_index, self.batch_size
            )
            opts = dict(options)
            if transforms.get(key) is not None:
                opts["transform"] = PassTransform(transforms[key], order.seed, data, reads.spans)
            self._sources.append(module.build(data, reads, **opts))
        self._spec = self._common_spec()
        self._epoch_slots: tuple | None = None

    def _common_spec(self) -> dict[str, ArraySpec]:
        specs = [{k: v for k, v in s.element_spec.items() if k != MASK_KEY} for s in self._sources]
        first = specs[0]
        for key, spec in zip(self.names[1:], specs[1:], strict=True):
            if spec != first:
                diff = sorted(k for k in set(first) | set(spec) if first.get(k) != spec.get(k))
                raise ValueError(
                    f"mixture components {self.names[0]!r} and {key!r} give other fields: "
                    f"{diff} ({ {k: first.get(k) for k in diff} } vs "
                    f"{ {k: spec.get(k) for k in diff} }); every component must give the same "
                    "fields, row shapes and dtypes (a component's transform can make them so)"
                )
        if COMPONENT in first:
            raise ValueError(
                f"the mixture's components have a field {COMPONENT!r}, the name of the field "
                "a mixture adds (each row's component); rename yours"
            )
        spec = dict(first)
        spec[COMPONENT] = ArraySpec((self.batch_size,), np.dtype(np.int32))
        return spec

    @property
    def element_spec(self) -> Mapping[str, ArraySpec]:
        return self._spec

    @property
    def num_batches(self) -> int:
        """Batches of the latest epoch's phase (`batches_in` for any epoch)."""
        return self.plan.shape(len(self.plan.phases) - 1)[0]

    def batches_in(self, epoch: int) -> int:
        return self.plan.num_batches(epoch)

    def positions(self, epoch: int, batch: int) -> dict[str, int]:
        """Where each component's stream stands before ``batch`` of ``epoch``:
        rows read, over all its passes."""
        return dict(zip(self.names, self.plan.position(epoch, batch).tolist(), strict=True))

    def proportions(self, epoch: int, batches: range | None = None) -> dict[str, float]:
        """The share of each component in ``batches`` of ``epoch`` (all of it
        by default), from the plan: what a step sees, without reading."""
        nb = self.batches_in(epoch)
        batches = range(nb) if batches is None else batches
        got = self.plan.position(epoch, batches.stop) - self.plan.position(epoch, batches.start)
        total = max(1, int(got.sum()))
        return {n: int(g) / total for n, g in zip(self.names, got, strict=True)}

    def iter_epoch(self, epoch: int = 0, *, start: int = 0) -> Iterator[Batch]:
        epoch, _ = check_position(epoch, 0, 1)
        epoch, start = check_position(epoch, start, self.batches_in(epoch))
        return self._batches(epoch, start)

    def _batches(self, epoch: int, start: int) -> Iterator[Batch]:
        first = self.plan.position(epoch, start).tolist()
        streams: dict[int, _Stream] = {}
        fields = {k: v for k, v in self._spec.items() if k != COMPONENT}
        try:
            for k in range(start, self.batches_in(epoch)):
                labels, slots, ends = self._slots(epoch, k)
                batch = {key: np.empty(spec.shape, spec.dtype) for key, spec in fields.items()}
                for c in np.flatnonzero(ends[1:] - ends[:-1]).tolist():
                    at = slots[ends[c] : ends[c + 1]]
                    if c not in streams:
                        streams[c] = _Stream(self._sources[c], first[c])
                    for key, value in streams[c].take(len(at)).items():
                        batch[key][at] = value
                batch[COMPONENT] = labels
                yield batch
        finally:
            for stream in streams.values():
                stream.close()

    def _slots(self, epoch: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Batch ``k``'s labels (this process's slots), the slots grouped by
        component, and where each component's group ends: worked out for the
        whole epoch (under the phase in force) at once."""
        phase = self.plan.phase_of(epoch, k)
        if self._epoch_slots is None or self._epoch_slots[0] != (epoch, phase):
            b, p = self.batch_size, self.process_index
            mine = self.plan.labels(phase, epoch)[:, p * b : (p + 1) * b].astype(np.int32)
            order = np.argsort(mine, axis=1, kind="stable")
            n = len(self.names)
            counts = np.zeros((len(mine), n + 1), np.int64)
            np.add.at(counts, (np.arange(len(mine))[:, None], mine + 1), 1)
            self._epoch_slots = ((epoch, phase), mine, order, np.cumsum(counts, axis=1))
        _, mine, order, ends = self._epoch_slots
        return mine[k], order[k], ends[k]

    def data_state(self, epoch: int, next_batch: int) -> dict[str, Any]:
        return {
            "mixture": {
                "names": list(self.names),
                "phases": [p.as_json() for p in self.plan.phases],
                "epoch": int(epoch),
                "next_batch": int(next_batch),
            }
        }

    def restore_data_state(self, state: Mapping[str, Any]) -> None:
        """Takes the saved phases; with other weights than the last of them, a
        new phase from the saved batch on (``Mixture(reweight=True)`` only).

        Raises:
          ValueError: the state is not a mixture's, names other components,
            or other weights without ``reweight=True``.
        """
        saved = state.get("mixture") if isinstance(state, Mapping) else None
        if not isinstance(saved, Mapping):
            raise ValueError(
                "this data state is not a mixture's; resume with the source it came from"
            )
        names = list(saved["names"])
        if names != list(self.names):
            raise ValueError(
                f"the checkpoint's mixture has components {names}, this one {list(self.names)}: "
                "adding, removing, renaming or reordering components at a resume is not "
                "supported (each component's position belongs to its name and index); resume "
                "with the same components, weight 0 to leave one out"
            )
        phases = [
            Phase(p["epoch"], p["batch"], tuple(p["weights"]), tuple(p["base"]))
            for p in saved["phases"]
        ]
        now = self.mixture.weight_vector()
        had = np.array(phases[-1].weights)
        changed = not np.allclose(now, had, rtol=0, atol=1e-12)
        if changed and not self.mixture.reweight:
            raise ValueError(
                f"the checkpoint's mixture weights are "
                f"{dict(zip(names, had.round(6).tolist(), strict=True))}, this one's "
                f"{dict(zip(names, now.round(6).tolist(), strict=True))}; to continue "
                "with the new weights on purpose, pass Mixture(..., reweight=True) "
                "(every component goes on from where it stood)"
            )
        self.plan.set_phases(phases)
        if changed:
            self.plan.add_phase(int(saved["epoch"]), int(saved["next_batch"]), now)
        self.close()  # workers started with the old plan stop; the next epoch starts new ones

    def __iter__(self) -> Iterator[Batch]:
        return self.iter_epoch(0)

    def __len__(self) -> int:
        return self.num_batches

    def close(self) -> None:
        for source in self._sources:
            close = getattr(source, "close", None)
            if close is not None:
                close()

    def __enter__(self) -> MixtureSource:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        w = dict(zip(self.names, np.round(self.plan.phases[-1].weights, 4).tolist(), strict=True))
        s = self.sampler
        return (
            f"MixtureSource({w}, by={self.mixture.by!r}, batch_size={s.batch_size}, "
            f"seed={s.seed}, process={s.process_index}/{s.process_count}, "
            f"backend={type(self._sources[0]).__name__})"
        )


def mixture_source(
    module: ModuleType,
    mixture: Mixture,
    load: Any,
    transform: Any,
    sampler_args: Mapping[str, Any],
    options: Mapping[str, Any],
) -> MixtureSource:
    """The components loaded (``load(dataset)``), each with its shuffle and
    transform, and the source over them.

    Raises:
      ValueError: a component with rows of different lengths (not yet
        mixable), or too few rows for ``sampler_args``' batch.
    """
    args = {k: v for k, v in sampler_args.items() if k not in SHUFFLE_ARGS}
    sampler = Sampler(num_examples=args["batch_size"] * args["process_count"], **args)
    datasets, transforms, orders = {}, {}, {}
    for key, dataset in mixture.components.items():
        data = load(dataset)
        if data.ragged_fields():
            raise ValueError(
                f"mixture component {key!r} ({data.name}) has rows of different lengths "
                f"({data.ragged_fields()}); pass pad=, bucket= or pack= to batch them"
            )
        transforms[key] = composed(mixture.transforms.get(key, data.transform), transform)
        datasets[key], orders[key] = data, component_order(data, key, sampler_args)
    return MixtureSource(module, mixture, datasets, transforms, sampler, orders, options)


SHUFFLE_ARGS = ("shuffle", "block_rows", "window_blocks")


def composed(own: Any, then: Any) -> Any:
    """A component's transform (its own, or its dataset's), then `make`'s."""
    return own if then is None else then if own is None else Composed(own, then)


def component_order(data: ArrayDataset, name: str, sampler_args: Mapping[str, Any]) -> Sampler:
    """Component ``name``'s passes: the shared sampler's shuffles of its rows,
    with its own seed."""
    shuffle, rows = sampler_args["shuffle"], sampler_args["block_rows"]
    if shuffle == "blocks" and rows is None:
        from jaxfeed.loaders.sampler import default_block_rows

        rows = default_block_rows(sum(a.nbytes for a in data.head.values()))
    return Sampler(
        num_examples=len(data),
        batch_size=1,
        seed=component_seed(sampler_args["seed"], name),
        shuffle=shuffle,
        block_rows=rows,
        window_blocks=sampler_args["window_blocks"],
        units=(data.units or None) if shuffle == "blocks" else None,
    )

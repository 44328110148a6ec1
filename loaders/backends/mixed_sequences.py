"""A `Mixture` of corpora with rows of different lengths, padded, bucketed or
packed: ``make(backend, dataset=Mixture(...), pack=L)``.

The mixture decides the rows' order, the sequence plan lays them out. Epoch
``e``'s order is the mixture plan's labels of ``e`` read as one stream of
rows (every ``G`` consecutive rows hold the proportions ``by`` promises),
each label taking the next row of its component's own passes, as the rows of
a fixed-length mixture do. That order goes to the sequence plan in place of
the shared sampler's permutation, so the batches, an exact resume and
process slices follow as for one corpus, on every backend.

The components' fields are joined into one dataset (their values copied
together once, in memory); each row carries its component, per value with
``pack=`` (``component`` ``[B, L]``: a packed row holds rows of several
components) and per row with ``pad=``/``bucket=`` (``[B]``).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import Any

import numpy as np
from jaxfeed.loaders.array_dataset import ArrayDataset
from jaxfeed.loaders.backends.mixture_source import component_order, composed
from jaxfeed.loaders.backends.sequence_source import SequenceSource, transformed
from jaxfeed.loaders.mixture_plan import COMPONENT, Mixture, MixturePlan, component_seed
from jaxfeed.loaders.ragged_field import RaggedField
from jaxfeed.loaders.sampler import Sampler
from jaxfeed.loaders.sequence_plan import Layout, Pack


class MixedOrder:
    """Epoch ``e``'s rows of the joined dataset, in mixture order (see the
    module). Picklable: it travels into workers with the sequence plan."""

    def __init__(self, plan: MixturePlan, orders: list[Sampler], starts: np.ndarray):
        self.plan, self.orders, self.starts = plan, orders, starts

    def __call__(self, epoch: int) -> np.ndarray:
        labels = self.plan.labels(0, epoch).reshape(-1)
        before = self.plan.position(epoch, 0)
        rows = np.empty(len(labels), np.int64)
        for c, order in enumerate(self.orders):
            at = np.flatnonzero(labels == c)
            passes, within = np.divmod(before[c] + np.arange(len(at)), order.num_examples)
            for q in np.unique(passes).tolist():
                this = passes == q
                rows[at[this]] = self.starts[c] + order.permutation(q)[within[this]]
        return rows


class MixedSequenceSource(SequenceSource):
    """A `SequenceSource` over a mixture's joined components in `MixedOrder`;
    its data state holds the mixture's names and weights, and a resume with
    others is refused."""

    def __init__(self, module, dataset, sampler, layout, options, *, mixture, order):
        super().__init__(module, dataset, sampler, layout, options, order=order)
        self.mixture = mixture

    def data_state(self, epoch: int, next_batch: int) -> dict[str, Any]:
        return {
            "mixture": {
                "names": list(self.mixture.names),
                "weights": self.mixture.weight_vector().tolist(),
                "epoch": int(epoch),
                "next_batch": int(next_batch),
            }
        }

    def restore_data_state(self, state: Mapping[str, Any]) -> None:
        """Checks the saved mixture is this one (the plan needs nothing else).

        Raises:
          ValueError: another mixture's state (other names or weights).
        """
        saved = state.get("mixture") if isinstance(state, Mapping) else None
        if not isinstance(saved, Mapping) or "weights" not in saved:
            raise ValueError(
                "this data state is not a padded, bucketed or packed mixture's; resume with "
                "the source it came from"
            )
        names, weights = list(self.mixture.names), self.mixture.weight_vector()
        had = dict(zip(saved["names"], saved["weights"], strict=True))
        now = dict(zip(names, weights.tolist(), strict=True))
        if list(had) != names or not np.allclose(list(had.values()), weights, rtol=0, atol=1e-12):
            raise ValueError(
                f"the checkpoint's mixture is {had}, this one {now}; a padded, bucketed or "
                "packed mixture resumes with the same components and weights (reweight=True "
                "is for fixed-length rows only, so far)"
            )


def mixed_sequence_source(
    module: ModuleType,
    mixture: Mixture,
    load: Any,
    transform: Any,
    sampler_args: Mapping[str, Any],
    layout: Layout,
    options: Mapping[str, Any],
) -> MixedSequenceSource:
    """The components loaded (``load(dataset)``), each transformed once with
    its own seed (a transform that tokenizes decides the lengths), joined,
    and laid out in mixture order.

    Raises:
      ValueError: ``reweight=True``; components whose fields, dtypes or frames
        differ; a component without rows of different lengths.
    """
    if mixture.reweight:
        raise ValueError(
            f"{layout} of a Mixture keeps its weights: reweight=True is for fixed-length "
            "rows only, so far; leave it out"
        )
    args = dict(sampler_args)
    seed = args["seed"]
    datasets, orders = {}, []
    for key, dataset in mixture.components.items():
        data = load(dataset).with_fields()
        fn = composed(mixture.transforms.get(key, data.transform), transform)
        if fn is not None:
            data = transformed(data, fn, component_seed(seed, key))
        if not data.ragged_fields():
            raise ValueError(
                f"mixture component {key!r} ({data.name}) has no field of rows of different "
                f"lengths for {layout} to batch; leave pad=/bucket=/pack= out"
            )
        datasets[key] = data
        orders.append(component_order(data, key, args))
    joined = _joined(datasets, per_value=isinstance(layout, Pack))
    sizes = tuple(len(d) for d in datasets.values())
    global_batch = args["batch_size"] * args["process_count"]
    plan = MixturePlan(mixture, sizes, global_batch, seed, joined.name)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    sampler = Sampler(
        num_examples=len(joined),
        batch_size=args["batch_size"],
        seed=seed,
        drop_remainder=args["drop_remainder"],
        process_index=args["process_index"],
        process_count=args["process_count"],
    )
    return MixedSequenceSource(
        module,
        joined,
        sampler,
        layout,
        options,
        mixture=mixture,
        order=MixedOrder(plan, orders, starts),
    )


def _joined(datasets: Mapping[str, ArrayDataset], per_value: bool) -> ArrayDataset:
    """One dataset of the components' rows, one after another, and their
    ``component`` (per value with ``per_value``, else per row)."""
    names = list(datasets)
    first = datasets[names[0]]
    arrays: dict[str, Any] = {}
    for field, array in first.arrays.items():
        parts = []
        for key, data in datasets.items():
            part = data.arrays.get(field)
            same = (
                part is not None
                and type(part) is type(array)
                and part.dtype == array.dtype
                and _frame(part) == _frame(array)
            )
            if not same or set(data.arrays) != set(first.arrays):
                raise ValueError(
                    f"mixture components {names[0]!r} and {key!r} give other fields "
                    f"({_fields(first)} and {_fields(data)}); every component must give the "
                    "same fields, dtypes and shapes"
                )
            parts.append(part)
        if isinstance(array, RaggedField):
            ends = np.cumsum([len(p.values) for p in parts])[:-1]
            offsets = np.concatenate(
                [parts[0].offsets]
                + [p.offsets[1:] + e for p, e in zip(parts[1:], ends, strict=True)]
            )
            arrays[field] = RaggedField(np.concatenate([p.values for p in parts]), offsets)
        else:
            arrays[field] = np.concatenate([np.asarray(p) for p in parts])
    if COMPONENT in arrays:
        raise ValueError(f"a mixture adds the field {COMPONENT!r}; rename yours")
    ids = np.repeat(np.arange(len(names), dtype=np.int32), [len(d) for d in datasets.values()])
    if per_value:
        ragged = next(a for a in arrays.values() if isinstance(a, RaggedField))
        arrays[COMPONENT] = RaggedField(np.repeat(ids, ragged.lengths), ragged.offsets)
    else:
        arrays[COMPONENT] = ids
    return ArrayDataset(f"mixture of {'+'.join(names)}", arrays)


def _frame(array: Any) -> tuple[int, ...]:
    return tuple(array.frame_shape if isinstance(array, RaggedField) else array.shape[1:])


def _fields(data: ArrayDataset) -> dict[str, str]:
    return {k: f"{v.dtype}{list(_frame(v))}" for k, v in data.arrays.items()}

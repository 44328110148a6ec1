"""Several datasets in one stream by weight: `Mixture` and its plan.

A mixture epoch is ``num_batches`` global batches of ``G`` rows. Its plan,
``labels(epoch)``, says which component fills each slot of every global
batch, from the weights, the seed and the epoch alone:

- ``by="row"``: each epoch holds a fixed number of rows of each component
  (the weights times the epoch's rows, largest remainders rounded up) in a
  random arrangement, so a batch's share of a component varies as seeded
  draws do, and the epoch's share does not.
- ``by="batch"``: every batch holds ``floor(w * G)`` or ``floor(w * G) + 1``
  rows of each component (the remainders go to the components furthest
  behind their share), in a random arrangement within the batch.

Each component is a stream of its own epochs ("passes"), each a shuffle of
the shared `Sampler` with the component's own seed. A batch takes the next
rows of each component's stream, so where every component stands at any
batch is a count from the plan (``position``), never a replay, and it is the
same for every process count (process ``p`` reads its slots of each global
batch). A resume with new weights starts a new *phase* at that batch: every
component continues from where it stood.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import threading
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np
from jaxfeed.loaders.checks import check_int

__all__ = ["COMPONENT", "Mixture"]

COMPONENT = "component"
"""The batch field naming each row's component (its index in the mixture)."""
BY = ("row", "batch")
MAX_EPOCH_ROWS = 1 << 28
"""Rows one mixture epoch may hold: its plan is an array of that many labels."""


@dataclasses.dataclass(frozen=True)
class Mixture:
    """Datasets drawn together by weight, as one dataset of `make`.

    Args:
      components: name -> dataset (anything ``make(dataset=...)`` takes: a
        name, a path, your files, an `ArrayDataset`, a dict of arrays), in
        the order their indices take in the ``component`` field. Every
        component must give the same fields (after its transform).
      weights: name -> weight (>= 0, not all 0); normalised to sum to 1.
      by: ``"row"`` (each row's component drawn, seeded) or ``"batch"`` (exact
        proportions in every batch); see the module.
      epoch_rows: rows in a mixture epoch (rounded up to whole global
        batches). Give it or ``until``.
      until: a component's name: the epoch ends when that component has been
        read once (it takes exactly its rows in every epoch).
      transforms: name -> ``fn(record, rng)``, that component's transform (a
        component's dataset may carry its own); `make`'s ``transform`` runs
        after it, on every component.
      reweight: at a resume, continue with these weights although the
        checkpoint was taken with others (each component goes on from where
        it stood); without it, other weights are refused.

    Raises:
      ValueError: no component, a weight that is negative or not a number,
        weights of other names than the components, both or neither of
        ``epoch_rows`` and ``until``, an unknown ``by``.
    """

    components: Mapping[str, Any]
    weights: Mapping[str, float]
    by: str = "row"
    epoch_rows: int | None = None
    until: str | None = None
    transforms: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    reweight: bool = False

    def __post_init__(self) -> None:
        names = list(self.components)
        if not names or not all(isinstance(n, str) and n for n in names):
            raise ValueError(
                f"Mixture needs components as a dict of name -> dataset, got {names!r}"
            )
        if set(self.weights) != set(names):
            raise ValueError(
                f"Mixture weights name {sorted(self.weights)}, the components are {sorted(names)}; "
                "give one weight per component"
            )
        for name, w in self.weights.items():
            if (
                isinstance(w, bool)
                or not isinstance(w, (int, float))
                or not w >= 0
                or w == math.inf
            ):
                raise ValueError(f"Mixture weight of {name!r} is {w!r}; weights are numbers >= 0")
        if not sum(self.weights.values()) > 0:
            raise ValueError("Mixture weights are all 0; give at least one a weight > 0")
        if self.by not in BY:
            raise ValueError(f"Mixture by={self.by!r}; use one of {BY}")
        if (self.epoch_rows is None) == (self.until is None):
            raise ValueError(
                "a Mixture's epoch is ambiguous: give epoch_rows=N (rows a mixture epoch holds) "
                f"or until=NAME (the epoch ends when that component has been read once), not "
                f"{'both' if self.until is not None else 'neither'}"
            )
        if self.epoch_rows is not None:
            check_int("epoch_rows", self.epoch_rows, 1)
        if self.until is not None:
            if self.until not in self.components:
                raise ValueError(f"Mixture until={self.until!r} is not one of {names}")
            if self.weights[self.until] <= 0:
                raise ValueError(f"Mixture until={self.until!r} has weight 0: it never ends")
        unknown = sorted(set(self.transforms) - set(names))
        if unknown:
            raise ValueError(f"Mixture transforms name {unknown}, not components {names}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.components)

    def weight_vector(self) -> np.ndarray:
        w = np.array([float(self.weights[n]) for n in self.names])
        return w / w.sum()


def component_seed(seed: int, name: str) -> int:
    """The seed of a component's own passes: from the mixture's seed and its name."""
    return int(np.random.SeedSequence((seed, zlib.crc32(name.encode()))).generate_state(1)[0])


def apportion(total: int, weights: np.ndarray) -> np.ndarray:
    """``total`` split by ``weights`` (summing to 1): floors, then the largest
    remainders (first index on ties) one more each."""
    exact = weights * total
    counts = np.floor(exact).astype(np.int64)
    short = total - int(counts.sum())
    if short > 0:
        counts[np.argsort(-(exact - counts), kind="stable")[:short]] += 1
    return counts


def stratified_counts(totals: np.ndarray, num_batches: int, global_batch: int) -> np.ndarray:
    """``[num_batches, n]`` rows of each component per batch: each batch sums to
    ``global_batch``, each component's running count stays within one row of
    its even share, and the columns sum to ``totals``."""
    rate = totals / num_batches
    counts = np.empty((num_batches, len(totals)), np.int64)
    have = np.zeros(len(totals), np.int64)
    for k in range(num_batches):
        due = rate * (k + 1) - have
        take = np.clip(np.floor(due).astype(np.int64), 0, None)
        short = global_batch - int(take.sum())
        if short > 0:
            take[np.argsort(-(due - take), kind="stable")[:short]] += 1
        elif short < 0:  # floors above a batch: only by float rounding, take from the least due
            for i in np.argsort(due - take, kind="stable"):
                cut = min(int(take[i]), -short)
                take[i] -= cut
                short += cut
                if not short:
                    break
        counts[k] = take
        have += take
    counts[-1] += totals - have  # float rounding only: exact totals
    return counts


@dataclasses.dataclass(frozen=True)
class Phase:
    """Weights in force from batch ``batch`` of ``epoch`` on, and where each
    component stood there (its rows read before, over all passes)."""

    epoch: int
    batch: int
    weights: tuple[float, ...]
    base: tuple[int, ...]

    def as_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class MixturePlan:
    """The labels of every mixture epoch and every component's position in
    its stream, for a global batch of ``global_batch`` rows. Picklable: it
    travels into workers with each component's reads."""

    def __init__(
        self, mixture: Mixture, sizes: tuple[int, ...], global_batch: int, seed: int, name: str
    ):
        self.names, self.sizes, self.by = mixture.names, sizes, mixture.by
        self.epoch_rows, self.global_batch, self.seed = mixture.epoch_rows, global_batch, seed
        self.until = None if mixture.until is None else self.names.index(mixture.until)
        self.name = name
        self.phases = [Phase(0, 0, tuple(mixture.weight_vector().tolist()), (0,) * len(sizes))]
        self._cache: dict[tuple, Any] = {}
        self._shapes = [self._epoch_shape(0)]  # each phase's, made when its phase is set
        self._lock = threading.RLock()

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_cache": {}, "_lock": None}  # the shapes travel along

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _lock=threading.RLock())

    def _epoch_shape(self, phase: int) -> tuple[int, np.ndarray, np.ndarray | None]:
        """``(num_batches, totals, counts)`` of every epoch of ``phase``
        (``counts``: the per-batch table of ``by="batch"``)."""
        w, g = np.array(self.phases[phase].weights), self.global_batch
        if self.until is None:
            nb = -(-self.epoch_rows // g)
            totals = apportion(nb * g, w)
        else:
            n = self.sizes[self.until]
            nb = max(-(-n // g), round(n / (w[self.until] * g)))  # nearest its share
            rest = w.copy()
            rest[self.until] = 0
            if rest.sum() == 0:  # only the named one: whole batches of it
                nb = -(-n // g)
                totals = np.zeros(len(w), np.int64)
                totals[self.until] = nb * g
            else:
                totals = apportion(nb * g - n, rest / rest.sum())  # nb * g >= n
                totals[self.until] = n
        if nb * g > MAX_EPOCH_ROWS:
            raise ValueError(
                f"mixture {self.name}: an epoch of {nb * g} rows is more than the plan holds "
                f"({MAX_EPOCH_ROWS}); use a smaller epoch_rows (epochs are cheap: each "
                "component runs on through its own)"
            )
        counts = stratified_counts(totals, nb, g) if self.by == "batch" else None
        return nb, totals, counts

    def set_phases(self, phases: list[Phase]) -> None:
        """The phases of a saved state (its weights' history)."""
        with self._lock:
            self.phases = list(phases)
            self._shapes = [self._epoch_shape(i) for i in range(len(self.phases))]
            self._cache.clear()

    def add_phase(self, epoch: int, batch: int, weights: np.ndarray) -> None:
        """New weights from batch ``batch`` of ``epoch`` on."""
        base = tuple(self.position(epoch, batch).tolist())
        self.set_phases([*self.phases, Phase(epoch, batch, tuple(weights.tolist()), base)])

    def phase_of(self, epoch: int, batch: int) -> int:
        return max(i for i, p in enumerate(self.phases) if (p.epoch, p.batch) <= (epoch, batch))

    def shape(self, phase: int) -> tuple[int, np.ndarray, np.ndarray | None]:
        return self._shapes[phase]

    def num_batches(self, epoch: int) -> int:
        """Batches of ``epoch``: those of the phase in force at its end."""
        later = [i for i, p in enumerate(self.phases) if p.epoch == epoch]
        phase = later[-1] if later else self.phase_of(epoch, 0)
        return self.shape(phase)[0]

    def _cached(self, key: tuple, make: Any) -> Any:
        """``make()``, kept for the last few ``key``s (an epoch's plan is read
        batch after batch, and by every component's reads)."""
        with self._lock:
            if key not in self._cache:
                if len(self._cache) >= 16:
                    self._cache.pop(next(iter(self._cache)))
                self._cache[key] = make()
            return self._cache[key]

    def labels(self, phase: int, epoch: int) -> np.ndarray:
        """``[num_batches, G]`` component indices of ``epoch`` under ``phase``."""
        return self._cached(("labels", phase, epoch), lambda: self._labels(phase, epoch))

    def _labels(self, phase: int, epoch: int) -> np.ndarray:
        nb, totals, counts = self.shape(phase)
        rng = np.random.default_rng((self.seed, 0x6D6978, phase, epoch))
        ids = np.arange(len(totals), dtype=np.int16)
        if counts is None:
            return rng.permutation(np.repeat(ids, totals)).reshape(nb, self.global_batch)
        table = np.repeat(np.tile(ids, nb), counts.reshape(-1)).reshape(nb, self.global_batch)
        return rng.permuted(table, axis=1)

    def before(self, phase: int, epoch: int) -> np.ndarray:
        """``[num_batches + 1, n]``: rows of each component in the batches
        before each batch of ``epoch`` under ``phase``."""
        return self._cached(("before", phase, epoch), lambda: self._before(phase, epoch))

    def _before(self, phase: int, epoch: int) -> np.ndarray:
        nb, _, counts = self.shape(phase)
        if counts is None:
            labels = self.labels(phase, epoch).astype(np.int64)
            n = len(self.sizes)
            flat = (np.arange(nb)[:, None] * n + labels).reshape(-1)
            counts = np.bincount(flat, minlength=nb * n).reshape(nb, n)
        return np.concatenate([np.zeros((1, len(self.sizes)), np.int64), np.cumsum(counts, 0)])

    def position(self, epoch: int, batch: int) -> np.ndarray:
        """Each component's rows read before batch ``batch`` of ``epoch``."""
        i = self.phase_of(epoch, batch)
        p = self.phases[i]
        _, totals, _ = self.shape(i)
        at = self.before(i, epoch)[batch]
        if epoch == p.epoch:
            return np.array(p.base) + at - self.before(i, p.epoch)[p.batch]
        done = totals - self.before(i, p.epoch)[p.batch] + (epoch - p.epoch - 1) * totals
        return np.array(p.base) + done + at

    def slots_of(self, c: int, lo: int, hi: int, process: int, local_batch: int) -> np.ndarray:
        """The stream positions in ``[lo, hi)`` of component ``c`` that
        ``process`` reads (its slots of the global batches), in order."""
        out = []
        for i, p in enumerate(self.phases):
            start = p.base[c]
            stop = self.phases[i + 1].base[c] if i + 1 < len(self.phases) else hi
            first, last = max(lo, start), min(hi, stop)  # this phase's part of [lo, hi)
            t = int(self.shape(i)[1][c])
            if first >= last or t == 0:
                continue
            skip = int(self.before(i, p.epoch)[p.batch][c])  # its rows before the phase began
            for epoch in range(
                p.epoch + (first - start + skip) // t, p.epoch + (last - 1 - start + skip) // t + 1
            ):
                mine = self._cached(
                    ("mine", i, epoch, c, process, local_batch),
                    functools.partial(self._ordinals, i, epoch, c, process, local_batch),
                )
                g = start + (epoch - p.epoch) * t - skip + mine
                out.append(g[(g >= first) & (g < last)])
        return np.concatenate(out) if out else np.zeros(0, np.int64)

    def _ordinals(self, phase: int, epoch: int, c: int, process: int, local_batch: int):
        """Which of component ``c``'s rows of ``epoch`` (0, 1, ... in slot
        order) fall in ``process``'s slots."""
        slots = np.flatnonzero(self.labels(phase, epoch).reshape(-1) == c)
        return np.flatnonzero((slots % self.global_batch) // local_batch == process)

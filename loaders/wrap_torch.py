"""torch streams for `wrap`: a ``DataLoader`` with its own sampler or over an
``IterableDataset``, and an ``IterableDataset`` itself, read through
torchdata's ``StatefulDataLoader`` built like the user's loader.

Its ``state_dict()`` is taken with every batch. On resume it restores the
dataset's and sampler's own state when they have one (torchdata's
``Stateful``: ``state_dict`` / ``load_state_dict``), else it reads the
epoch's batches again up to the position (after ``set_epoch``), which is
exact when the dataset yields the same batches for the same epoch.
"""

from __future__ import annotations

import base64
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from loaders import wrap_sampled
from loaders.wrap_epochs import Epochs, WrapSettings
from loaders.wrap_streams import (
    SHARD_YOURSELF,
    IterCursor,
    length,
    one_process,
    own_order,
    stream_epochs,
)


class TorchCursor(IterCursor):
    """A torch loader's pass ``p``: every ``set_epoch(p)``, then the loader,
    a torchdata ``StatefulDataLoader`` whose state is taken with each batch.

    A sampler or dataset may draw a pass's order from a torch generator (its
    own, the loader's, or torch's global one) without saying so in its
    state: their states at the pass's start are part of the cursor's, and
    restored with it. So a pass is not restartable from nothing.

    Args:
      loader: the ``StatefulDataLoader``, or the user's loader without torchdata.
      setters: the ``set_epoch`` methods of its sampler, dataset, ...
      generators: the torch generators its order may draw from.
    """

    restartable = False

    def __init__(self, loader: Any, setters: list[Callable[[int], Any]], generators: list[Any]):
        super().__init__()
        self._loader, self._setters, self._generators = loader, setters, generators
        self.per_batch = hasattr(loader, "state_dict")
        if not self.per_batch:
            self.refusal = (
                "torchdata is not installed, and without its StatefulDataLoader a torch "
                "loader has no state to restart from; pip install torchdata"
            )
        self._start: list[str] = []  # the generators' states at this pass's start
        self._state: Any = None  # the loader's, after the last batch

    def begin(self, pass_: int, state: Any, in_pass: int) -> None:
        import torch

        from loaders.torch_backend import iterate  # imports torch, which the user has

        self._close()
        for set_epoch in self._setters:
            set_epoch(pass_)
        if state is not None:
            if len(state["generators"]) != len(self._generators):
                raise ValueError(
                    f"this data state holds {len(state['generators'])} torch generator "
                    f"state(s), but this loader draws from {len(self._generators)} (its "
                    f"sampler's, loader's and dataset's generator); resume with a loader "
                    f"built like the one the state was taken from"
                )
            for generator, saved in zip(self._generators, state["generators"], strict=True):
                data = np.frombuffer(base64.b64decode(saved), np.uint8).copy()
                generator.set_state(torch.from_numpy(data))
        self._start = [
            base64.b64encode(g.get_state().numpy().tobytes()).decode("ascii")
            for g in self._generators
        ]
        self._state = None if state is None else state["loader"]
        if self._state is not None:
            self._loader.load_state_dict(self._state)
        # `iterate` turns a dead worker into an error on any thread, not a hang.
        self._batches = iterate(_WithStates(self._loader) if self.per_batch else self._loader)

    def next(self) -> Any:
        if not self.per_batch:
            return next(self._batches)
        batch, self._state = next(self._batches)
        return batch

    def state(self) -> Any:
        return {"loader": self._state, "generators": self._start}


def _generators(*owners: Any) -> list[Any]:
    """torch's global generator and those of ``owners`` (a loader, its samplers)."""
    import torch

    found = {id(torch.default_generator): torch.default_generator}
    for owner in owners:
        generator = getattr(owner, "generator", None)
        if isinstance(generator, torch.Generator):
            found.setdefault(id(generator), generator)
    return list(found.values())


class _WithStates:
    """A ``StatefulDataLoader`` whose iterator yields ``(batch, state after
    it)``: `iterate` may read a batch ahead on its own thread, so the state
    is taken with the batch, not when it is served."""

    def __init__(self, loader: Any):
        self._loader, self.num_workers = loader, loader.num_workers

    def __iter__(self) -> _Pairs:
        return _Pairs(self._loader)


class _Pairs:
    def __init__(self, loader: Any):
        self._loader, self._batches = loader, iter(loader)
        # torch_backend's worker watch reads the workers from the iterator.
        self._workers = getattr(self._batches, "_workers", ())

    def __iter__(self) -> _Pairs:
        return self

    def __next__(self) -> tuple[Any, Any]:
        batch = next(self._batches)
        return batch, self._loader.state_dict()


def stateful_loader(loader: Any, context: Any) -> Any:
    """A torchdata ``StatefulDataLoader`` reading like ``loader`` (its dataset,
    sampler, collate_fn, workers...), its workers started with ``context``;
    ``loader`` itself (rebuilt for ``context``) without torchdata."""
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError:  # then reading is all it does: TorchCursor refuses to restart
        if context is loader.multiprocessing_context:
            return loader
        return wrap_sampled.rebuilt_loader(loader, context)
    with warnings.catch_warnings():
        # torchdata 0.11 calls torch.set_vital, deprecated in torch 2.13.
        warnings.filterwarnings("ignore", message=".*set_vital", category=UserWarning)
        return wrap_sampled.rebuilt_loader(loader, context, StatefulDataLoader)


def torch_loader(loader: Any, settings: WrapSettings, why: str, context: Any) -> Epochs:
    """A torch ``DataLoader`` that keeps its own order (``why``)."""
    kind = "torch DataLoader"
    batch_size, drop_remainder = settings.batch_size, settings.drop_remainder
    native = loader.batch_size  # None when a batch_sampler decides
    if batch_size is not None and native is not None and batch_size != native:
        raise ValueError(
            f"the DataLoader yields batches of {native} but batch_size={batch_size}; "
            f"omit batch_size, or build the DataLoader with batch_size={batch_size}"
        )
    # DistributedSampler-style objects reshuffle per epoch only when told.
    candidates = (loader.sampler, loader.batch_sampler, loader.dataset)
    candidates += (getattr(loader.batch_sampler, "sampler", None),)
    setters = {id(c): c.set_epoch for c in candidates if callable(getattr(c, "set_epoch", None))}
    own_order(kind, settings, why)
    if "IterableDataset" in wrap_sampled.class_names(loader.dataset):
        fix = SHARD_YOURSELF.replace("Shard it yourself", "Shard it in the dataset's __iter__")
    else:
        fix = (
            "Give each process its own rows with torch's DistributedSampler(dataset, "
            "num_replicas=process_count, rank=process_index), or build the DataLoader "
            "with shuffle=True/False (no sampler) so wrap slices it"
        )
    if not _sharded_by_torch(candidates, settings):
        one_process(kind, settings, why, fix)
    num = length(loader)
    if drop_remainder and not loader.drop_last:
        rows = length(loader.sampler) if native else None
        num = None if rows is None else rows // native
    generators = _generators(loader, *candidates)
    cursor = TorchCursor(stateful_loader(loader, context), list(setters.values()), generators)
    return stream_epochs(kind, cursor, settings, endless=False, num_batches=num, batch_size=native)


def _sharded_by_torch(candidates: tuple[Any, ...], settings: WrapSettings) -> bool:
    """Whether a DistributedSampler already gives this process its share."""
    return settings.process_count > 1 and any(
        type(c).__name__ == "DistributedSampler"
        and (c.num_replicas, c.rank) == (settings.process_count, settings.process_index)
        for c in candidates
    )


def torch_iterable(dataset: Any, settings: WrapSettings, collate_fn: Any = None) -> Epochs:
    """A torch ``IterableDataset``, read by a ``DataLoader`` that batches its
    rows when ``batch_size`` is given, else passes its items (batches) on."""
    from torch.utils.data import DataLoader

    kind = "torch IterableDataset"
    own_order(kind, settings, "it is a stream")
    one_process(kind, settings, "it is a stream", SHARD_YOURSELF)
    batch_size = settings.batch_size
    options = {} if collate_fn is None else {"collate_fn": collate_fn}
    num = None
    if batch_size is None:  # its items are batches: passed on as they are
        options = {"collate_fn": collate_fn or _as_is}
        num = None if settings.drop_remainder else length(dataset)
    else:
        options["drop_last"] = settings.drop_remainder
    loader = DataLoader(dataset, batch_size=batch_size, **options)
    setters = [dataset.set_epoch] if callable(getattr(dataset, "set_epoch", None)) else []
    cursor = TorchCursor(stateful_loader(loader, None), setters, _generators(dataset))
    return stream_epochs(
        kind, cursor, settings, endless=False, num_batches=num, batch_size=batch_size
    )


def _as_is(item: Any) -> Any:
    return item

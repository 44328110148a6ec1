"""torch for `wrap`: a ``DataLoader``, a map-style ``Dataset`` or an ``IterableDataset``.

A map-style dataset (alone or behind a ``DataLoader`` with torch's own
``RandomSampler`` / ``SequentialSampler``) is read in the shared sampler's
order: a ``DataLoader`` built like the user's is fed the epoch's plan as its
``batch_sampler``, so the user's collate function, workers and transforms
still run. Anything else keeps its own order and is read through torchdata's
``StatefulDataLoader`` built like the user's loader; its ``state_dict()`` is
taken with every batch. On resume it restores the dataset's and sampler's own
state when they have one (torchdata's ``Stateful``), else it reads the
epoch's batches again up to the position (after ``set_epoch``), exact when
the dataset yields the same batches for the same epoch.

Workers are spawned, not forked, under JAX: forking a process that runs
JAX's threads can deadlock (the threads are copied mid-work). `wrap`
switches a loader whose workers would fork to spawn when spawning works,
and otherwise warns once, naming the fix. Read in the sampler's order,
spawned workers are persistent: they start once (seconds: each imports torch
and the dataset's modules) and serve every epoch; and they skip running the
main script again when nothing they unpickle comes from it (its imports,
JAX among them, would cost each worker seconds more). A loader that keeps
its own order (torchdata's ``StatefulDataLoader``) keeps its own
``persistent_workers``: forced on there, a worker was seen to abort at
shutdown (1 run in 7).
"""

from __future__ import annotations

import base64
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from jaxfeed.loaders._doors.torch import default_collate_is_torchs, loader_workers
from jaxfeed.loaders._workers.main_script import main_script_uses, rerun_problem
from jaxfeed.loaders._workers.spawn import SPAWN, SPAWN_WITHOUT_MAIN, reported_start, start_method
from jaxfeed.loaders._workers.torch_epochs import EpochLoaders, iterate
from jaxfeed.loaders.wrapping.epochs import Epochs, WrapSettings
from jaxfeed.loaders.wrapping.numpy_collate import collate_numpy
from jaxfeed.loaders.wrapping.random_access import (
    RandomAccess,
    class_names,
    read_records,
    sampled_epochs,
)
from jaxfeed.loaders.wrapping.seeded import GlobalDraws
from jaxfeed.loaders.wrapping.streams import (
    MIXTURE,
    SHARD_YOURSELF,
    IterCursor,
    length,
    one_process,
    own_order,
    stream_epochs,
)


def wrap_loader(loader: Any, settings: WrapSettings, **_: Any) -> Epochs:
    """A ``DataLoader``: in the shared sampler's order when it shuffles (or
    not) with torch's own samplers, else in its own order."""
    why = _own_order(loader)
    context = worker_context(loader, sampled=why is None)
    if why is None:
        return sampled_epochs(
            "torch DataLoader", _loader_access(loader, context, settings.seed), settings
        )
    return _loader_stream(loader, settings, why, context)


def wrap_dataset(dataset: Any, settings: WrapSettings, collate_fn: Any = None) -> Epochs:
    """A map-style ``Dataset``, in the shared sampler's order."""
    access = _dataset_access(dataset, collate_fn, settings.seed)
    return sampled_epochs("torch Dataset", access, settings)


# --- random access: read in the shared sampler's order --------------------------------


def _dataset_access(dataset: Any, collate_fn: Callable | None, seed: int) -> RandomAccess:
    """A map-style torch ``Dataset``: read by a ``DataLoader`` in this
    process, collated by ``collate_fn`` (default: torch's ``default_collate``)."""
    from torch.utils.data import default_collate

    kwargs = {"collate_fn": collate_fn or default_collate}
    read = _torch_reader(dataset, kwargs, seed)
    return RandomAccess(_length(dataset, "torch Dataset"), False, read)


def _own_order(loader: Any) -> str | None:
    """Why ``loader`` keeps its own order (a sentence), or None: a map-style
    dataset behind torch's own ``RandomSampler`` or ``SequentialSampler``,
    read in the shared sampler's order."""
    if "IterableDataset" in class_names(loader.dataset):
        return "it reads an IterableDataset (a stream)"
    if loader.batch_sampler is None:
        return "it was built with batch_size=None (its dataset yields whole batches)"
    inner = getattr(loader.batch_sampler, "sampler", None)
    if type(loader.batch_sampler).__name__ != "BatchSampler" or inner is not loader.sampler:
        return f"it has its own batch_sampler ({type(loader.batch_sampler).__name__})"
    sampler = type(loader.sampler).__name__
    if sampler == "RandomSampler":
        rows = _length(loader.dataset, "DataLoader's dataset")
        if loader.sampler.replacement or loader.sampler.num_samples != rows:
            return "its RandomSampler draws with replacement or a different number of rows"
    elif sampler != "SequentialSampler":
        return f"it has its own sampler ({sampler})"
    return None


def _loader_access(loader: Any, context: Any, seed: int) -> RandomAccess:
    """A ``DataLoader`` that `_own_order` lets wrap read in the sampler's
    order: the same loader (dataset, collate_fn, workers, ...) fed the plan
    as its ``batch_sampler``, its workers started with ``context`` (see
    `worker_context`)."""
    return RandomAccess(
        _length(loader.dataset, "DataLoader's dataset"),
        type(loader.sampler).__name__ == "RandomSampler",
        _torch_reader(loader.dataset, rebuilt_options(loader, context, persistent=True), seed),
        batch_size=loader.batch_size,
        drop_remainder=loader.drop_last,
    )


def _length(obj: Any, what: str) -> int:
    try:
        return len(obj)
    except TypeError:
        raise TypeError(
            f"a {what} without __len__ cannot be read in sampler order; give "
            f"{type(obj).__name__} a __len__, or wrap it as a stream (an IterableDataset)"
        ) from None


def loader_options(loader: Any) -> dict[str, Any]:
    """The ``DataLoader`` arguments that are not about order: what `wrap`
    keeps when it builds an equivalent loader."""
    names = [
        "num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn",
        "multiprocessing_context", "generator", "prefetch_factor", "persistent_workers",
        "pin_memory_device", "in_order",
    ]  # fmt: skip
    return {name: getattr(loader, name) for name in names if hasattr(loader, name)}


def rebuilt_options(loader: Any, context: Any, persistent: bool = False) -> dict[str, Any]:
    """`loader_options`, the workers started with ``context``; with
    ``persistent``, spawned (or forkserver) workers persistent, whatever the
    loader said: their start costs seconds, which every epoch would pay again."""
    options = {**loader_options(loader), "multiprocessing_context": context}
    if persistent and loader.num_workers and start_method(context) != "fork":
        options["persistent_workers"] = True
    return options


def rebuilt_loader(loader: Any, context: Any, cls: type | None = None) -> Any:
    """``loader``'s dataset, order and options as a new ``cls`` (torch's
    ``DataLoader`` by default, or torchdata's ``StatefulDataLoader``), its
    workers started with ``context``. The user's sampler objects are reused,
    so a ``set_epoch`` on them still reaches the new loader; a plain
    ``BatchSampler`` over its sampler is rebuilt from its parts (which a
    ``StatefulDataLoader`` can checkpoint)."""
    if cls is None:
        from torch.utils.data import DataLoader as cls
    kwargs = rebuilt_options(loader, context)
    dataset, batches = loader.dataset, loader.batch_sampler
    iterable = "IterableDataset" in class_names(dataset)
    if iterable or (type(batches).__name__ == "BatchSampler" and batches.sampler is loader.sampler):
        sampler = None if iterable else loader.sampler
        return cls(
            dataset,
            batch_size=loader.batch_size,
            sampler=sampler,
            drop_last=loader.drop_last,
            **kwargs,
        )
    if batches is not None:
        return cls(dataset, batch_sampler=batches, **kwargs)
    return cls(dataset, batch_size=None, sampler=loader.sampler, **kwargs)


def _torch_reader(dataset: Any, kwargs: dict[str, Any], seed: int) -> Callable[..., Iterator[Any]]:
    """Reads plans through DataLoaders built like the user's (`EpochLoaders`),
    each batch's ``__getitem__`` and collate calls drawing from torch's RNG
    seeded by the batch (see `_SeededBatches`)."""
    from torch.utils.data import default_collate

    user_collate = kwargs.pop("collate_fn", None) or default_collate
    seeded = _SeededBatches(dataset, user_collate, seed)
    read = EpochLoaders(seeded, **kwargs, collate_fn=_collated)
    # Python ints, as torch's own samplers give.
    return lambda epoch, plan: read([_Rows(indices.tolist(), epoch) for indices in plan])


class _Rows(list):
    """One batch's row indices, and its epoch: the batch sampler's item."""

    def __init__(self, rows: list[int], epoch: int):
        super().__init__(rows)
        self.epoch = epoch


class _SeededBatches:
    """The user's map-style dataset and collate function, a batch at a time,
    with torch's, numpy's and Python's global generators seeded by ``(seed,
    epoch, the batch's rows)`` and restored after (`seeded_globals`), once
    the reading is seen to draw from them (`GlobalDraws`): a ``__getitem__``
    or collate that draws random numbers (an augmentation) draws the same for
    the same batch in any process, worker or resume, and a new draw every epoch.
    torch's ``default_collate`` of numpy records is made in numpy
    (`collate_numpy`) in the training process."""

    def __init__(self, dataset: Any, collate: Callable, seed: int):
        self.dataset, self.collate, self.draws = dataset, collate, GlobalDraws(seed)
        from torch.utils.data import default_collate

        self._default = collate is default_collate

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    def __getitems__(self, rows: _Rows) -> _Collated:
        return _Collated(self.draws.read(rows.epoch, rows, lambda: self._collated(rows)))

    def _collated(self, rows: _Rows) -> Any:
        getitems = getattr(self.dataset, "__getitems__", None)
        if getitems:
            records = getitems(list(rows))
        else:
            records = read_records(self.dataset.__getitem__, rows, rows.epoch, "torch Dataset")
        if self._default and _in_this_process() and default_collate_is_torchs():
            batch = collate_numpy(records)
            if batch is not None:
                return batch
        return self.collate(records)


def _in_this_process() -> bool:
    """Whether the DataLoader reads in this process, not in one of its workers."""
    from torch.utils.data import get_worker_info

    return get_worker_info() is None


class _Collated:
    """A batch already collated by `_SeededBatches` (DataLoader's collate unwraps it)."""

    def __init__(self, batch: Any):
        self.batch = batch


def _collated(done: _Collated) -> Any:
    return done.batch


# --- streams: the loader's own order, resumed with torchdata's state ----------------------


class TorchCursor(IterCursor):
    """A torch loader's pass ``p``: every ``set_epoch(p)``, then the loader,
    a torchdata ``StatefulDataLoader`` whose state is taken with each batch.

    A sampler or dataset may draw a pass's order from a torch generator (its
    own, the loader's, or torch's global one) without saying so in its
    state: their states at the pass's start are part of the cursor's, and
    restored with it. So a pass is not restartable from nothing.

    An ``IterableDataset`` with no state of its own (not torchdata's
    ``Stateful``) is resumed by reading its pass again up to the position,
    as torchdata would, but by the stream, which checks the batches it reads
    again (`jaxfeed.loaders.wrapping.stream_state`).

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
        self._read_again = self.per_batch and _keeps_no_state(loader.dataset)
        if not self.per_batch:
            self.refusal = (
                "torchdata is not installed, and without its StatefulDataLoader a torch "
                "loader has no state to restart from; pip install torchdata"
            )
        self._start: list[str] = []  # the generators' states at this pass's start
        self._state: Any = None  # the loader's, after the last batch
        self._reported = False  # the workers' first start

    def begin(self, pass_: int, state: Any, in_pass: int) -> int:
        import torch

        began = time.perf_counter()  # (torchdata's state_dict() below may start the workers)
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
        self._state = None if state is None or self._read_again else state["loader"]
        loaded = self._state is not None
        if loaded:
            self._loader.load_state_dict(self._state)
        elif self.per_batch:
            # The pass's start is a state too: a dataset that is its own iterator,
            # read ahead since, is set back by it on resume (torchdata's iterator,
            # made here, is the one the pass then reads).
            self._state = self._loader.state_dict()
        # `iterate` turns a dead worker into an error on any thread, not a hang.
        self._batches = iterate(_WithStates(self._loader) if self.per_batch else self._loader)
        loader = self._loader
        if loader.num_workers and not self._reported:
            self._reported = True
            what, context = f"{loader.num_workers} torch workers", loader.multiprocessing_context
            persistent = loader.persistent_workers
            self._batches = reported_start(self._batches, what, context, persistent, began)
        return in_pass if loaded else 0  # else the stream reads up to in_pass again

    def next(self) -> Any:
        if not self.per_batch:
            return next(self._batches)
        batch, self._state = next(self._batches)
        return batch

    def state(self) -> Any:
        return {"loader": self._state, "generators": self._start}


def _keeps_no_state(dataset: Any) -> bool:
    """Whether ``dataset`` is an ``IterableDataset`` without a state of its
    own (torchdata's ``Stateful``), which torchdata resumes by reading it again."""
    from torchdata.stateful_dataloader import Stateful

    return "IterableDataset" in class_names(dataset) and not isinstance(dataset, Stateful)


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
        # The torch backend's worker watch (backends/torch.py) reads them here too.
        self._workers = loader_workers(self._batches)

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
        return rebuilt_loader(loader, context)
    with warnings.catch_warnings():
        # torchdata 0.11 calls torch.set_vital, deprecated in torch 2.13.
        warnings.filterwarnings("ignore", message=".*set_vital", category=UserWarning)
        return rebuilt_loader(loader, context, StatefulDataLoader)


def _loader_stream(loader: Any, settings: WrapSettings, why: str, context: Any) -> Epochs:
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
    if "IterableDataset" in class_names(loader.dataset):
        fix = SHARD_YOURSELF.replace("Shard it yourself", "Shard it in the dataset's __iter__")
    else:
        fix = (
            "Give each process its own rows with torch's DistributedSampler(dataset, "
            "num_replicas=process_count, rank=process_index), or build the DataLoader "
            "with shuffle=True/False (no sampler) so wrap slices it"
        )
        if type(loader.sampler).__name__ == "WeightedRandomSampler":
            fix += (
                f"; for a weighted mix of datasets (a WeightedRandomSampler over a "
                f"ConcatDataset), jaxfeed's own mixture gives each process its share: {MIXTURE}"
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


def wrap_iterable_dataset(dataset: Any, settings: WrapSettings, collate_fn: Any = None) -> Epochs:
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


# --- workers: spawned, not forked, under JAX ----------------------------------------------


def worker_context(loader: Any, sampled: bool = False) -> Any:
    """The multiprocessing context `wrap` gives ``loader``'s workers.

    Forking a process that runs JAX's threads can deadlock, so workers that
    would fork by default are spawned instead when spawning works (the
    dataset, collate_fn and worker_init_fn pickle, and a script re-run by
    spawn starts no work). Otherwise, and for an explicit ``"fork"``, the
    loader keeps its context and one warning names the fix. Spawned workers
    fed only wrap's own index batches (``sampled``: read in the sampler's
    order) skip re-running the main script when nothing they unpickle is
    defined there (`SPAWN_WITHOUT_MAIN`).
    """
    context = loader.multiprocessing_context
    if not loader.num_workers:
        return context
    method = start_method(context)
    if method == "spawn" and not sampled:
        return SPAWN  # spawn, its workers leaving Ctrl-C to this process
    if method not in ("spawn", "fork"):
        return context
    problem = None
    if method == "fork" and context is not None:
        problem = "it was built with multiprocessing_context='fork'"
    else:
        parts = ("dataset", "collate_fn", "worker_init_fn")
        problem, from_main = main_script_uses({name: getattr(loader, name) for name in parts})
        if problem is None and not from_main and sampled:
            return SPAWN_WITHOUT_MAIN
        problem = problem or rerun_problem(from_main, "wrap()")
    if problem is None or method == "spawn":  # (spawn: torch's own errors, as the user's loader)
        return SPAWN
    warnings.warn(
        f"the wrapped DataLoader starts its {loader.num_workers} workers with fork, which "
        f"can deadlock a process that runs JAX (JAX's threads are copied mid-work), and "
        f"wrap cannot switch them to spawn: {problem}. Build the DataLoader with "
        f"multiprocessing_context='spawn' and a picklable dataset, collate_fn and "
        f"worker_init_fn (defined at module level of an importable file), and start the "
        f"work under `if __name__ == '__main__':`",
        RuntimeWarning,
        stacklevel=4,  # wrap()'s caller (through torch.wrap_loader)
    )
    return context

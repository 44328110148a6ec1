"""The kinds of user loader `wrap` accepts, told apart without importing them.

Kinds are recognised by the names of their classes (top-level package and
class name anywhere in the MRO), so wrapping never imports a framework.

Two families. A random-access object (torch map-style ``Dataset`` or a
``DataLoader`` over one, Grain ``MapDataset`` / ``DataLoader``, HF
``Dataset``, TFDS data source) is read in the shared sampler's order
(`loaders.wrap_sampled` says how): a new permutation per epoch, a contiguous
slice per process, a padded and masked last batch, an exact ``start``. A
stream (tf.data, Grain ``IterDataset``, HF ``IterableDataset``, torch
``IterableDataset``, iterables, generators) keeps its own order and resumes
with its framework's own state (`loaders.wrap_streams`, `loaders.wrap_torch`,
`loaders.wrap_tf`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from loaders import torch_workers, wrap_sampled, wrap_streams, wrap_torch
from loaders.sampler import Sampler
from loaders.wrap_epochs import Epochs, WrapSettings
from loaders.wrap_sampled import RandomAccess
from loaders.wrap_tf import tf_stream

__all__ = ["KINDS", "REPLAYABLE", "Epochs", "WrapSettings"]


# --- random access: the shared sampler's order --------------------------------


def _sampled(kind: str, access: RandomAccess, settings: WrapSettings) -> Epochs:
    """Epochs of ``access`` in the order of a `Sampler` built from ``settings``."""
    if settings.steps_per_epoch is not None:
        raise ValueError(
            f"steps_per_epoch={settings.steps_per_epoch} is for streams, but a {kind} is "
            f"read by index: an epoch is its {access.num_rows} rows; omit steps_per_epoch"
        )
    native, batch_size = access.batch_size, settings.batch_size
    if batch_size is not None and native is not None and batch_size != native:
        raise ValueError(
            f"the {kind} yields batches of {native} but batch_size={batch_size}; omit "
            f"batch_size, or build the {kind} with batch size {batch_size}"
        )
    batch_size = batch_size or native
    if batch_size is None:
        raise ValueError(f"a {kind} yields single rows; pass batch_size= to batch them")
    drop = settings.drop_remainder or access.drop_remainder
    if drop and batch_size * settings.process_count > access.num_rows:
        return Epochs(lambda epoch, start: iter(()), 0, batch_size, access.num_rows)
    try:
        sampler = Sampler(
            num_examples=access.num_rows,
            batch_size=batch_size,
            seed=settings.seed,
            shuffle=access.shuffled if settings.shuffle is None else settings.shuffle,
            drop_remainder=drop,
            process_index=settings.process_index,
            process_count=settings.process_count,
        )
    except ValueError as error:
        raise ValueError(f"the wrapped {kind}: {error}") from None

    def batches(epoch: int, start: int) -> Iterator[Any]:
        return access.read(epoch, [indices for indices, _ in sampler.epoch_plan(epoch, start)])

    return Epochs(batches, sampler.num_batches, batch_size, access.num_rows, sampler)


# --- dispatch: random access when the object allows, else a stream ------------------


def _torch(loader: Any, settings: WrapSettings, **_: Any) -> Epochs:
    """A torch ``DataLoader``: in sampler order when it shuffles (or not) with
    torch's own samplers (`wrap_sampled.torch_loader`), else in its own order."""
    context = torch_workers.worker_context(loader)
    access = wrap_sampled.torch_loader(loader, context)
    if isinstance(access, RandomAccess):
        return _sampled("torch DataLoader", access, settings)
    return wrap_torch.torch_loader(loader, settings, access, context)


def _torch_dataset(dataset: Any, settings: WrapSettings, collate_fn: Any = None) -> Epochs:
    return _sampled("torch Dataset", wrap_sampled.torch_dataset(dataset, collate_fn), settings)


def _tfds_source(source: Any, settings: WrapSettings, **_: Any) -> Epochs:
    return _sampled("TFDS data source", wrap_sampled.tfds_source(source), settings)


def _grain_map(dataset: Any, settings: WrapSettings, **_: Any) -> Epochs:
    access = wrap_sampled.grain_map(dataset)
    if isinstance(access, RandomAccess):
        return _sampled("grain.MapDataset", access, settings)
    return wrap_streams.grain_map(dataset, settings, access)


def _grain_loader(loader: Any, settings: WrapSettings, **_: Any) -> Epochs:
    access = wrap_sampled.grain_loader(loader)
    if isinstance(access, RandomAccess):
        return _sampled("grain.DataLoader", access, settings)
    return wrap_streams.grain_loader(loader, settings, access)


def _hf_table(dataset: Any, settings: WrapSettings, columns: Any = None) -> Epochs:
    if settings.batch_size is None:
        raise ValueError("a datasets.Dataset is a table of rows; pass batch_size= to batch it")
    return _sampled("datasets.Dataset", wrap_sampled.hf_table(dataset, columns), settings)


def _named(*names: str, but: tuple[str, ...] = ()) -> Callable[[Any], bool]:
    """Matches objects whose MRO has a class ``"package.Name"`` (top-level
    package) among ``names`` and none among ``but``."""
    wanted, unwanted = set(names), set(but)

    def match(obj: Any) -> bool:
        mro = {f"{c.__module__.partition('.')[0]}.{c.__qualname__}" for c in type(obj).__mro__}
        return bool(mro & wanted) and not mro & unwanted

    return match


def _reiterable(obj: Any) -> bool:
    return (
        isinstance(obj, Iterable)
        and not isinstance(obj, Iterator | str | bytes | Mapping)
        and not hasattr(obj, "shape")  # an array iterates rows, not batches
    )


@dataclasses.dataclass(frozen=True)
class _Kind:
    name: str
    match: Callable[[Any], bool]
    adapt: Callable[..., Epochs]
    options: tuple[str, ...] = ()


# First match wins. Hugging Face comes before torch: its IterableDataset
# subclasses torch's when torch is imported; torch's IterableDataset
# subclasses its Dataset.
KINDS: tuple[_Kind, ...] = (
    _Kind("datasets.Dataset", _named("datasets.Dataset"), _hf_table, ("columns",)),
    _Kind(
        "datasets.IterableDataset",
        _named("datasets.IterableDataset"),
        wrap_streams.hf_stream,
        ("columns",),
    ),
    _Kind("torch.utils.data.DataLoader", _named("torch.DataLoader"), _torch),
    _Kind(
        "torch.utils.data.IterableDataset",
        _named("torch.IterableDataset"),
        wrap_torch.torch_iterable,
        ("collate_fn",),
    ),
    _Kind("torch.utils.data.Dataset", _named("torch.Dataset"), _torch_dataset, ("collate_fn",)),
    _Kind("tf.data.Dataset", _named("tensorflow.DatasetV2"), tf_stream),
    _Kind("TFDS data source", _named("tensorflow_datasets.BaseDataSource"), _tfds_source),
    _Kind("grain.MapDataset", _named("grain.MapDataset"), _grain_map),
    _Kind("grain.IterDataset", _named("grain.IterDataset"), wrap_streams.grain_iter),
    _Kind("grain.DataLoader", _named("grain.DataLoader"), _grain_loader),
    _Kind(
        "a re-iterable of batches (list, tuple, custom class)",
        _reiterable,
        wrap_streams.reiterable,
    ),
    _Kind(
        "a zero-argument callable returning an iterator of batches", callable, wrap_streams.factory
    ),
)

# The kinds whose repeating wrap cannot check: resume="replay" vouches for it.
REPLAYABLE = tuple(kind.name for kind in KINDS[-2:])

"""The kinds of user loader `wrap` accepts, told apart without importing them.

Kinds are recognised by the names of their classes (top-level package and
class name anywhere in the MRO), so wrapping never imports a framework; each
kind is read by its framework's module (`torch`, `tf`, `grain`, `hf`,
`ray`, `python`). A random-access object is read in the shared sampler's order
(`random_access`); a stream keeps its own order and resumes with its
framework's own state (`streams`, `stream_state`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from jaxfeed.loaders.wrapping import grain, hf, python, ray, tf, torch
from jaxfeed.loaders.wrapping.epochs import Epochs, WrapSettings

__all__ = ["KINDS", "REPLAYABLE", "Epochs", "WrapSettings"]


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
    # Whether resume="replay" may vouch that it repeats its batches when
    # iterated again: wrap cannot check that for a user's own iterable.
    replayable: bool = False
    # {option it refuses: the route that does that job}, for its refusal.
    routes: Mapping[str, str] = dataclasses.field(default_factory=dict)


# An HF dataset batches its own rows: a collate_fn belongs to a DataLoader over it.
_HF_ROUTES = {
    "collate_fn": (
        "to batch with your collate_fn, wrap a torch DataLoader over the dataset: "
        "wrap(DataLoader(hf_dataset, batch_size=B, collate_fn=fn)), renaming its fields "
        "with transform= if needed; or format each row with hf_dataset.set_transform(fn) "
        "(with_transform), which wrap applies"
    )
}


# First match wins. Hugging Face comes before torch: its IterableDataset
# subclasses torch's when torch is imported; torch's IterableDataset
# subclasses its Dataset.
KINDS: tuple[_Kind, ...] = (
    _Kind(
        "datasets.Dataset",
        _named("datasets.Dataset"),
        hf.wrap_table,
        ("columns",),
        routes=_HF_ROUTES,
    ),
    _Kind(
        "datasets.IterableDataset",
        _named("datasets.IterableDataset"),
        hf.wrap_iterable_dataset,
        ("columns",),
        routes=_HF_ROUTES,
    ),
    _Kind("torch.utils.data.DataLoader", _named("torch.DataLoader"), torch.wrap_loader),
    _Kind(
        "torch.utils.data.IterableDataset",
        _named("torch.IterableDataset"),
        torch.wrap_iterable_dataset,
        ("collate_fn",),
    ),
    _Kind("torch.utils.data.Dataset", _named("torch.Dataset"), torch.wrap_dataset, ("collate_fn",)),
    _Kind("tf.data.Dataset", _named("tensorflow.DatasetV2"), tf.wrap_dataset),
    _Kind("TFDS data source", _named("tensorflow_datasets.BaseDataSource"), tf.wrap_tfds_source),
    _Kind("grain.MapDataset", _named("grain.MapDataset"), grain.wrap_map_dataset),
    _Kind("grain.IterDataset", _named("grain.IterDataset"), grain.wrap_iter_dataset),
    _Kind("grain.DataLoader", _named("grain.DataLoader"), grain.wrap_loader),
    _Kind("ray.data.Dataset", _named("ray.Dataset"), ray.wrap_dataset),
    _Kind("ray.data.DataIterator", _named("ray.DataIterator"), ray.wrap_iterator),
    _Kind(
        "a re-iterable of batches (list, tuple, custom class)",
        _reiterable,
        python.wrap_reiterable,
        replayable=True,
    ),
    _Kind(
        "a zero-argument callable returning an iterator of batches",
        callable,
        python.wrap_factory,
        replayable=True,
    ),
)

# The kinds whose repeating wrap cannot check: resume="replay" vouches for it.
REPLAYABLE = tuple(kind.name for kind in KINDS if kind.replayable)

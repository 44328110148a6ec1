"""Ray Data for `wrap`: a ``ray.data.Dataset`` (the user's own pipeline:
``read_parquet``, ``read_images``, ``map_batches``, ...) or a ``DataIterator``.

Both are streams read in their own order with
``iter_batches(batch_size=..., batch_format="numpy")``, one execution of the
pipeline per epoch (so a shuffling pipeline reshuffles every epoch). A
position inside an epoch is reached by reading the epoch again up to it,
which is exact only when the pipeline's order is fixed: the dataset's
context keeps ``preserve_order`` and every random step has a fixed seed.
Anything else is refused for resume by name. On several processes each reads
its share from ``Dataset.split(n, equal=True)``; a ``DataIterator`` (from
``streaming_split``) already is one process's share.
"""

from __future__ import annotations

from typing import Any

from jaxfeed.loaders._doors.ray import random_steps
from jaxfeed.loaders.wrapping.epochs import Epochs, WrapSettings
from jaxfeed.loaders.wrapping.streams import (
    IterCursor,
    one_process,
    own_order,
    stream_epochs,
)

# A random step's name in the logical plan -> the call that made it.
_CALLS = {"RandomShuffle": "random_shuffle", "RandomizeBlockOrder": "randomize_block_order"}


def wrap_dataset(dataset: Any, settings: WrapSettings, **_: Any) -> Epochs:
    """A ``ray.data.Dataset``, one execution per epoch; split per process."""
    kind = "ray.data.Dataset"
    own_order(kind, settings, "it is a Ray Data pipeline")
    batch_size = _batch_size(kind, settings)
    refusal = unordered(dataset)
    if settings.process_count > 1:
        if refusal is not None:
            raise ValueError(
                f"wrap gives each of the {settings.process_count} processes its share of the "
                f"{kind} with Dataset.split(n, equal=True), which needs the same order in every "
                f"process, and {refusal}"
            )
        dataset = dataset.split(settings.process_count, equal=True)[settings.process_index]
    cursor = IterCursor(_passes(dataset, batch_size, settings.drop_remainder), refusal)
    return stream_epochs(kind, cursor, settings, endless=False, batch_size=batch_size)


def wrap_iterator(iterator: Any, settings: WrapSettings, **_: Any) -> Epochs:
    """A ``ray.data.DataIterator``: one process's share, one pass per epoch."""
    kind = "ray.data.DataIterator"
    own_order(kind, settings, "it is a Ray Data stream")
    one_process(
        kind,
        settings,
        "it is already one share of a dataset",
        "Give each process its own iterator (Dataset.streaming_split(n)), and pass "
        "process_index=0, process_count=1 to say each process's stream is its own",
    )
    batch_size = _batch_size(kind, settings)
    refusal = (
        "a DataIterator's blocks go to its consumers as they finish (streaming_split), so a "
        "pass read again may hold other rows. Wrap the Dataset itself, with a fixed order "
        "(preserve_order and seeded random steps), to resume inside an epoch"
    )
    cursor = IterCursor(_passes(iterator, batch_size, settings.drop_remainder), refusal)
    return stream_epochs(kind, cursor, settings, endless=False, batch_size=batch_size)


def unordered(dataset: Any) -> str | None:
    """Why reading ``dataset`` again may give its rows in another order, or
    None when its order is fixed."""
    fix = "ds.context.execution_options.preserve_order = True"
    if not dataset.context.execution_options.preserve_order:
        return (
            "its context's execution_options.preserve_order is False, so Ray hands out "
            f"blocks as they finish. Set {fix} before wrapping to resume inside an epoch"
        )
    steps = random_steps(dataset)
    if steps is None:
        return "its pipeline's steps cannot be read here (ray changed?), so its order is unknown"
    for step in steps:
        call = _CALLS.get(step.name, step.name)
        if step.seed is None:
            return (
                f"its {call}() has no seed, so every pass draws a new order. Pass "
                f"{call}(seed=N) to resume inside an epoch"
            )
        if step.reseeded:
            return (
                f"its {call}() reseeds after every execution, so a pass's order depends on "
                f"how many passes this process made before. Pass {call}(seed=N) to resume "
                "inside an epoch"
            )
    return None


def _batch_size(kind: str, settings: WrapSettings) -> int:
    if settings.batch_size is None:
        raise ValueError(f"a {kind} streams rows; pass batch_size= to batch it")
    return settings.batch_size


def _passes(source: Any, batch_size: int, drop_remainder: bool) -> Any:
    """``pass_ -> iterator`` of numpy batches: one execution of the pipeline."""

    def make(pass_: int) -> Any:
        return iter(
            source.iter_batches(
                batch_size=batch_size, batch_format="numpy", drop_last=drop_remainder
            )
        )

    return make

"""The small checks of user input shared across `jaxfeed.loaders`: an int in
range, a bool, a `BatchSource`, a batch size, a seed, a position in an epoch,
a backend's worker count.

Each raises the same ``TypeError`` / ``ValueError`` wherever the value is
given (a backend, `wrap`, the sampler), naming the argument and the fix.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from jaxfeed.loaders.protocol import BatchSource

if TYPE_CHECKING:
    from jaxfeed.loaders.transform import RecordTransform

MAX_SEED = 2**32 - 1
"""Seeds and epochs are 32-bit: every backend takes them as they are, and
``jax.random.key`` (without x64) would fold a larger seed onto a smaller one."""


def check_int(name: str, value: object, low: int, high: int | None = None, fix: str = "") -> int:
    """``value`` as a Python int, if it is an int (a numpy integer, not a bool)
    in ``[low, high]``.

    Raises:
      TypeError: not an int (the message names ``name`` and the value).
      ValueError: out of range.
    """
    expected = f"an int >= {low}" if high is None else f"an int in [{low}, {high}]"
    message = f"{name} must be {expected}, got {value!r}"
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{message} ({type(value).__name__}){fix}")
    if value < low or (high is not None and value > high):
        raise ValueError(message + fix)
    return int(value)


def check_bool(name: str, value: object) -> bool:
    """``value`` as a Python bool, if it is one (or a numpy bool): a truthy
    string such as ``'no'`` would otherwise mean True.

    Raises:
      TypeError: anything else (the message names ``name`` and the value).
    """
    if not isinstance(value, bool | np.bool_):
        raise TypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")
    return bool(value)


def check_source(name: str, value: object) -> None:
    """Raises unless ``value`` is a `BatchSource`, naming ``name`` and what it got.

    Raises:
      TypeError: not a `BatchSource` (a loader not yet wrapped, a path, None).
    """
    if not isinstance(value, BatchSource):
        raise TypeError(
            f"{name} must be a BatchSource (from jaxfeed.make or jaxfeed.wrap), got "
            f"{value!r:.80} ({type(value).__name__}); wrap a loader first: jaxfeed.wrap(loader)"
        )


def check_batch_size(batch_size: object) -> int:
    return check_int("batch_size", batch_size, 1)


def check_seed(seed: object) -> int:
    return check_int("seed", seed, 0, MAX_SEED, "; pick a seed in that 32-bit range")


def check_position(epoch: object, start: object, num_batches: int | None) -> tuple[int, int]:
    """``(epoch, start)`` as ints, if batch ``start`` of ``epoch`` can be read.

    Every source checks its ``iter_epoch`` arguments here, so a bad epoch or a
    start past the end fails the same way in every backend and order.
    ``num_batches=None`` (an unknown length) leaves ``start`` unbounded.

    Raises:
      TypeError: not ints. ValueError: ``epoch`` outside ``[0, 2**32 - 1]``
        or ``start`` outside ``[0, num_batches]``.
    """
    epoch = check_int("epoch", epoch, 0, MAX_SEED)
    start = check_int("start", start, 0)
    if num_batches is not None and start > num_batches:
        raise ValueError(
            f"start={start} is outside [0, {num_batches}], the batches of one epoch; "
            f"resume with 0 <= start <= num_batches"
        )
    return epoch, start


def check_workers(backend: str, num_workers: object, transform: RecordTransform | None) -> int:
    """``num_workers`` of a backend whose workers run the transform only.

    Raises:
      ValueError: not an int >= 0, or > 0 without a transform.
    """
    if type(num_workers) is not int or num_workers < 0:
        raise ValueError(f"the {backend} option num_workers must be an int >= 0, "
                         f"got {num_workers!r}")  # fmt: skip
    if num_workers and transform is None:
        raise ValueError(
            f"the {backend} backend's workers run a transform, and there is none: a plain "
            "gather is fastest in this process; pass transform=fn or drop num_workers"
        )
    return num_workers

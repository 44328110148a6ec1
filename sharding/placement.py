"""Placing process-local host batches as global, NamedSharding'd `jax.Array`s."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding
from jaxfeed.loaders.protocol import ProcessSlice
from jaxfeed.sharding.mesh import data_axis_size


def check_global_batch_divides_mesh(batch_size: int, sharding: NamedSharding) -> None:
    """Raises before any data moves if the global batch cannot be split.

    Args:
      batch_size: the process-local batch size.
      sharding: the batch sharding.

    Raises:
      ValueError: the global batch does not divide over the data axis, or
        this process's devices are not part of the sharding's mesh.
    """
    if not sharding.addressable_devices:
        raise ValueError(
            f"process {jax.process_index()} of {jax.process_count()} owns none of the "
            f"mesh's devices {sharding.mesh.devices.ravel().tolist()}; build the mesh "
            f"from jax.devices() (all processes), not another process's devices"
        )
    processes = jax.process_count()
    ways = data_axis_size(sharding)
    global_batch = batch_size * processes
    if global_batch % ways == 0:
        return
    # Valid local batches are multiples of the per-process share of the axis.
    step = ways // np.gcd(ways, processes)
    lower, upper = (batch_size // step) * step, (batch_size // step + 1) * step
    nearest = f"{lower} or {upper}" if lower > 0 else f"{upper}"
    axis = sharding.spec[0]
    raise ValueError(
        f"global batch {global_batch} (batch_size {batch_size} x {processes} process"
        f"{'es' if processes > 1 else ''}) does not divide over {ways} devices on mesh "
        f"axis {axis!r}. Pick a batch_size that is a multiple of {step} (e.g. {nearest}), "
        f"or use fewer devices"
    )


def check_process(source: object) -> None:
    """Raises if a source was made for another process layout than this job's.

    Sources that know their slice (``process_index``/``process_count``, as
    every built-in one does) must match ``jax.process_index()`` and
    ``jax.process_count()``; otherwise the global batches would silently
    repeat or skip rows.
    """
    if not isinstance(source, ProcessSlice):
        return
    made_for = (source.process_index, source.process_count)
    actual = (jax.process_index(), jax.process_count())
    if made_for != actual:
        raise ValueError(
            f"the source was made for process {made_for[0]} of {made_for[1]}, but this is "
            f"process {actual[0]} of {actual[1]}; pass process_index=jax.process_index(), "
            f"process_count=jax.process_count() to loaders.make"
        )


def place_batch(batch: Mapping[str, np.ndarray], sharding: NamedSharding) -> dict[str, jax.Array]:
    """One host batch -> global `jax.Array`s sharded along the batch axis.

    Each process passes its own rows; the global batch is their concatenation
    in process order (``global = local * process_count`` rows along the
    sharded axis: axis 0, or axis 1 for `DeviceFeed`'s ``[k, B, ...]``
    stacks). Works the same on one device, many devices and many hosts.
    """
    processes = jax.process_count()
    if processes == 1:
        # Global == local: one device_put of the whole batch is ~1.8x faster
        # than assembling each leaf from process-local data.
        with naming_the_field([batch]):
            return jax.device_put(dict(batch), sharding)
    axis = next(i for i, name in enumerate(sharding.spec) if name is not None)
    placed = {}
    for key, value in batch.items():
        global_shape = list(value.shape)
        global_shape[axis] *= processes
        with naming_the_field([{key: value}]):
            placed[key] = jax.make_array_from_process_local_data(
                sharding, value, tuple(global_shape)
            )
    return placed


def place_local(
    batches: Sequence[Mapping[str, Any]], sharding: NamedSharding
) -> list[dict[str, jax.Array]]:
    """Host batches of a one-process job, placed with ``sharding``.

    On CPU, small numpy batches are placed one by one through a jitted
    identity: the placement of its arguments runs in JAX's compiled dispatch,
    not in ``jax.device_put``'s Python, and the identity's copy of so few
    bytes is cheap. Larger ones, and anything else (an accelerator, a batch
    holding jax arrays), take one asynchronous ``jax.device_put``, which on
    CPU aliases the host buffer instead of copying it. The arrays are the same.
    """
    with naming_the_field(batches):
        if sharding.mesh.devices.flat[0].platform != "cpu":
            return jax.device_put(list(batches), sharding)
        pairs = [(batch, _identity_placed(batch)) for batch in batches]
        large = [batch for batch, small in pairs if not small]
        placed = iter(jax.device_put(large, sharding) if large else ())
        place = _identity(sharding)
        return [place(batch) if small else next(placed) for batch, small in pairs]


# Above this many bytes a batch the identity's copy costs more than
# device_put's Python (host time per step of train_step.py's loop, jaxlib
# 0.10.2, 2 cores): 807 KB (1,024 digits) 31-38 µs by the identity against
# 70 by device_put; 1.6 MB 103-115 against 72; 6.5 MB (8 stacked batches of
# 1,024) 110-124 against 32 (device_put aliases an aligned host buffer).
_IDENTITY_MAX_BYTES = 1 << 20


def _identity_placed(batch: Mapping[str, Any]) -> bool:
    """Whether the jitted identity places ``batch``: plain numpy, and small."""
    values = batch.values()
    return (
        all(_plain(value) for value in values)
        and sum(value.nbytes for value in values) <= _IDENTITY_MAX_BYTES
    )


def _plain(value: Any) -> bool:
    """A numpy array of numbers in this machine's byte order: what the jitted
    identity takes (anything else goes to ``device_put``, whose error
    `naming_the_field` explains)."""
    return isinstance(value, np.ndarray) and value.dtype.isnative and value.dtype.kind in "biufc"


@functools.lru_cache(maxsize=32)
def _identity(sharding: NamedSharding) -> Callable[[Any], Any]:
    """A jitted identity from and to ``sharding``; one per sharding, so its
    compilations (one per batch structure) are kept across feeds."""
    return jax.jit(_same, in_shardings=sharding, out_shardings=sharding)


def _same(batch: Any) -> Any:
    return batch


@contextlib.contextmanager
def naming_the_field(batches: Sequence[Mapping[str, Any]]) -> Iterator[None]:
    """JAX's dtype error for a batch (``Dtype >f4 is not a valid JAX array
    type``) says neither which field nor what to do; this one says both.
    Looked for only after the error, so placement costs nothing more."""
    try:
        yield
    except TypeError as error:
        for key, value in batches[0].items():
            dtype = np.asarray(value).dtype
            try:
                jax.device_put(np.empty((0,), dtype))
            except TypeError:
                fix = (
                    f".astype({dtype.newbyteorder('=').str!r}) (this machine's byte order)"
                    if dtype.kind in "biufc"
                    else " to numbers, or declare it a host field (HostFields)"
                )
                raise TypeError(
                    f"batch field {key!r} is {dtype.str}, which JAX cannot place on a device "
                    f"({error}); convert it in the loader, e.g. with a transform: {fix}"
                ) from error
        raise

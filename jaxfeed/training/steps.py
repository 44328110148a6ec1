"""The step contract of `jaxfeed.fit`: ``step(state, batch) -> (state, sums)``.

Metric sums are scalars over a batch's real rows (`batch_mask` weighs out the
padding) with a ``count`` entry; a step is traced on an abstract batch before
any data moves, so a broken contract is reported at once; an epoch's sums are
accumulated on the device and read back as means.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxfeed.loaders.protocol import MASK_KEY, BatchSource
from jaxfeed.sharding import DeviceFeed, batch_sharding, data_mesh

Sums = dict[str, jax.Array]

Step = Callable[[Any, Mapping[str, jax.Array]], tuple[Any, Sums]]

EvalStep = Callable[[Any, Mapping[str, jax.Array]], Sums]

MeshLike = Mesh | NamedSharding | Sequence[jax.Device] | None


def batch_mask(batch: Mapping[str, jax.Array]) -> jax.Array:
    """float32 ``[B]``: 1 for a real row, 0 for a padding row.

    A padded batch carries ``mask``; a batch without one is all real rows.
    Multiply per-row values by it before summing them into a step's metrics.
    """
    if MASK_KEY in batch:
        return batch[MASK_KEY].astype(jnp.float32)
    rows = next(iter(batch.values())).shape[0]
    return jnp.ones((rows,), jnp.float32)


def _add_sums(a: Sums, b: Sums) -> Sums:
    return jax.tree.map(jnp.add, a, b)


def serialize_steps(sharding: NamedSharding) -> bool:
    """Whether each step must finish before the next is dispatched.

    On CPU, a step over several devices all-reduces across one thread per
    device. With steps dispatched ahead, queued executions can hold the small
    CPU thread pool while a running all-reduce waits for its last device
    thread: XLA aborts after 40 s ("only 7 of 8 arrived"; seen with jaxlib
    0.10.2 on 2 cores, 8 simulated devices, and across processes with gloo).
    GPU/TPU and single-device CPU keep asynchronous dispatch.
    """
    return sharding.mesh.devices.flat[0].platform == "cpu" and sharding.mesh.devices.size > 1


def to_host(sums: Sums) -> dict[str, float]:
    """Replicated scalars to floats; reads this process's copy, so it also
    works for multi-host arrays that are not fully addressable."""
    return {k: float(v.addressable_data(0)) for k, v in sums.items()}


def means(sums: Mapping[str, float], prefix: str = "") -> dict[str, float]:
    count = sums["count"]
    return {
        prefix + k: v / count if count else float("nan") for k, v in sums.items() if k != "count"
    }


def _abstract_batch(source: BatchSource) -> dict[str, jax.ShapeDtypeStruct]:
    """The global batch as the step sees it (the local batch of every process)."""
    processes = jax.process_count()
    return {
        key: jax.ShapeDtypeStruct((spec.shape[0] * processes, *spec.shape[1:]), spec.dtype)
        for key, spec in source.element_spec.items()
    }


def _check_sums(sums: Any, who: str) -> None:
    if not isinstance(sums, Mapping) or "count" not in sums:
        raise TypeError(
            f"{who} must return metric sums as a dict with a 'count' entry (the number of "
            f"real rows, e.g. jnp.sum(batch_mask(batch))); got {jax.tree.structure(sums)}"
        )
    shapes = {k: getattr(v, "shape", None) for k, v in sums.items()}
    wrong = {k: shape for k, shape in sorted(shapes.items()) if shape != ()}
    if wrong:
        raise TypeError(
            f"{who}'s metric sums must be scalars (summed over the batch), got shapes {wrong}"
        )


def _zeros(sums: Mapping[str, jax.ShapeDtypeStruct]) -> Sums:
    return {k: jnp.zeros(v.shape, v.dtype) for k, v in sums.items()}


def trace_step(step: Step, state: Any, source: BatchSource) -> Sums:
    """Traces ``step`` once on an abstract batch, so that a broken contract is
    reported before any data moves; returns zero sums of its metrics."""
    out = jax.eval_shape(step, state, _abstract_batch(source))
    if not (isinstance(out, tuple) and len(out) == 2):
        raise TypeError(f"step must return (state, metric sums), got {jax.tree.structure(out)}")
    want, got = jax.tree.structure(state), jax.tree.structure(out[0])
    if want != got:
        raise TypeError(f"step must return a state of the structure it took: {want} != {got}")
    _check_sums(out[1], "step")
    return _zeros(out[1])


def compile_eval(
    eval_step: EvalStep, state: Any, source: BatchSource, replicated: NamedSharding
) -> tuple[Callable, Sums]:
    """``(state, totals, batch) -> totals``, jitted, and the placed zero sums
    it starts from; ``eval_step`` is traced first, so a broken one is
    reported before any data moves."""
    sums = jax.eval_shape(eval_step, state, _abstract_batch(source))
    _check_sums(sums, "eval_step")
    run = jax.jit(lambda s, t, b: _add_sums(t, eval_step(s, b)), out_shardings=replicated)
    return run, jax.device_put(_zeros(sums), replicated)


def compile_step(step: Step, k: int, replicated: NamedSharding) -> Callable:
    """``(state, totals, batch) -> (state, totals)``, jitted; for k > 1 it runs a
    ``[k', B, ...]`` stack of batches as k' steps in one `jax.lax.scan`."""

    def one(carry, batch):
        state, totals = carry
        state, sums = step(state, batch)
        return (state, _add_sums(totals, sums)), None

    # The state is donated: XLA updates it in place instead of allocating a
    # new copy every step (the MLP's step on CPU: 5.3 ms without, 3.6 ms with).
    if k == 1:
        return jax.jit(
            lambda s, t, b: one((s, t), b)[0], out_shardings=replicated, donate_argnums=0
        )
    return jax.jit(
        lambda s, t, b: jax.lax.scan(one, (s, t), b)[0],
        out_shardings=replicated,
        donate_argnums=0,
    )


def evaluate_metrics(
    eval_step: EvalStep, state: Any, source: BatchSource, mesh: MeshLike = None
) -> dict[str, float]:
    """One pass of ``source`` through ``eval_step``; the mean of each metric
    (its sum over the pass divided by the summed ``count``).

    Args:
      eval_step: ``(state, batch) -> sums``, the convention of `fit`.
      state: a pytree of arrays; replicated on the mesh.
      source: the batches.
      mesh: a `Mesh`, a batch `NamedSharding`, devices, or None for all devices.
    """
    sharding = batch_sharding_of(mesh)
    replicated = NamedSharding(sharding.mesh, PartitionSpec())
    state = jax.device_put(state, replicated)
    run, zeros = compile_eval(eval_step, state, source, replicated)
    return means(eval_pass(run, state, zeros, source, sharding))


def device_part(batch: dict, host: Collection[str]) -> dict:
    """The placed leaves of a batch: a source's ``host_fields`` (numpy, e.g.
    text; a feed's ``host_fields``) ride along in the feed's batches but never
    reach a jitted step."""
    return {k: v for k, v in batch.items() if k not in host} if host else batch


def eval_pass(run: Callable, state: Any, totals: Sums, source: BatchSource, sharding) -> dict:
    serialize = serialize_steps(sharding)
    with DeviceFeed(source, sharding) as feed:
        for batch in feed:
            totals = run(state, totals, device_part(batch, feed.host_fields))
            if serialize:
                jax.block_until_ready(totals)
    return to_host(totals)


def batch_sharding_of(mesh: MeshLike) -> NamedSharding:
    """`fit`'s ``mesh=`` as the batch sharding; a list of devices becomes their mesh."""
    if isinstance(mesh, Sequence) and not isinstance(mesh, str):  # "mesh" is no device list
        if not all(isinstance(device, jax.Device) for device in mesh):
            raise TypeError(f"mesh, given as a list, must list jax devices, got {mesh!r:.80}")
        mesh = data_mesh(list(mesh))
    return batch_sharding(mesh, argument="mesh")

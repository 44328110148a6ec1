"""Rows for a user's own loader: through `loaders.wrap`, and under Keras ``fit``.

For each framework the user object is the one its tutorial loop iterates
(`jaxfeed.compare.workloads.copy.baselines`), so four rows see the same object: the
tutorial row (bare), ``wrap-<framework>`` (``loaders.wrap(obj)``: loader
alone and through `DeviceFeed` in this process, then ``jaxfeed.mnist.train``),
``keras-fit-<framework>`` (Keras 3 ``model.fit(obj)`` on the JAX backend) and
``keras-fit-jaxfeed-<framework>`` (``model.fit(jaxfeed.keras_data(wrap(obj)))``).
The trainings run in fresh processes under the same conditions
(`jaxfeed.compare.workloads.copy.fresh`), so Keras is always on JAX.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from jaxfeed.compare.workloads.copy import fresh
from jaxfeed.compare.workloads.copy.baselines import Baseline
from jaxfeed.compare.workloads.copy.rows import Row
from jaxfeed.sharding import DeviceFeed


def rows(
    loops: list[Baseline],
    *,
    mesh: jax.sharding.Mesh,
    keras: bool,
    track: Callable,
    **settings: Any,
) -> list[Row]:
    """Wrap rows (each followed by its two Keras rows with ``keras``) for the loops in `fresh.BARE`.

    Args:
      track: ``track(figures)``, a context manager recording peak memory.
      settings: `fresh.spec`'s ``dataset``, ``data_dir``, ``batch_size``, ``seed``.
    """
    out: list[Row] = []
    for loop in loops:
        if fresh.BARE.get(loop.framework) != loop.name:
            continue
        row = Row(
            f"wrap-{loop.framework}",
            "wrap",
            loop.framework,
            f"loaders.wrap(the {loop.name} row's object); training: jaxfeed.mnist.train on "
            "one device, in a fresh process",
            None,
            None,
            bare=loop.name,
        )
        with track(row.memory):
            source = loop.wrap(settings["batch_size"])
        row.host = source.iter_epoch
        row.device = lambda e, s=source: DeviceFeed(s, mesh, epoch=e)
        row.fit = _fit("jaxfeed", loop.framework, settings)
        out.append(row)
        if keras:
            out.append(
                Row(
                    f"keras-fit-{loop.framework}",
                    "keras",
                    loop.framework,
                    f"Keras 3 model.fit on the {loop.name} row's object (JAX backend, one "
                    "device, in a fresh process)",
                    None,
                    None,
                    fit=_fit("keras", loop.framework, settings),
                    bare=loop.name,
                )
            )
            out.append(
                Row(
                    f"keras-fit-jaxfeed-{loop.framework}",
                    "keras",
                    loop.framework,
                    f"Keras 3 model.fit(jaxfeed.keras_data(wrap(the {loop.name} row's object))) "
                    "(JAX backend, one device, in a fresh process)",
                    None,
                    None,
                    fit=_fit("keras-jaxfeed", loop.framework, settings),
                    bare=loop.name,
                )
            )
    return out


def _fit(side: str, framework: str, settings: dict[str, Any]) -> Callable:
    def measure(epochs: int, max_batches: int | None) -> dict[str, Any]:
        what = fresh.spec(side, framework, epochs=epochs, max_batches=max_batches, **settings)
        return fresh.measure(what)

    return measure

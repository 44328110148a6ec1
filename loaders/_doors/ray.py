"""Ray's door: which steps of a Ray Data pipeline draw random numbers.

Checked against ray 2.60.0 (the pin in ``constraints.txt``).
"""

from __future__ import annotations

from typing import Any, NamedTuple


class RandomStep(NamedTuple):
    """A step of a pipeline that draws random numbers (``random_shuffle``,
    ``randomize_block_order``).

    Attributes:
      name: the logical operator's name (``"RandomShuffle"``).
      seed: its base seed, None when Ray picks one per run.
      reseeded: whether the seed changes with every execution (a
        ``RandomSeedConfig(reseed_after_execution=True)``): a new order per
        pass that depends on how many passes this process made before.
    """

    name: str
    seed: int | None
    reseeded: bool


def random_steps(dataset: Any) -> list[RandomStep] | None:
    """The random steps of a ``ray.data.Dataset``'s pipeline, or None when its
    plan cannot be read. Ray shows no public view of a pipeline's steps: its
    logical plan (private ``_logical_plan``; ``dag`` and ``post_order_iter``
    are that class's public API) and each operator's ``seed_config``."""
    plan = getattr(dataset, "_logical_plan", None)
    if plan is None:
        return None
    steps = []
    for op in plan.dag.post_order_iter():
        config = getattr(op, "seed_config", None)
        if config is not None:
            seed = config.seed
            steps.append(
                RandomStep(op.name, seed, seed is not None and config.reseed_after_execution)
            )
    return steps

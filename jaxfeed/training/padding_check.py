"""A warning for the quiet trap of padded batches: a step whose metric sums
count the padding rows (a plain ``mean`` loss instead of one weighed by
`jaxfeed.batch_mask`) trains on zero rows without a word.

`fit` checks once, at the first padded batch: it runs the step (without
keeping its new state) on that batch and on a copy whose padding rows hold
a real row's values. Sums that ignore the mask differ between the two. The
cost is one extra compilation of the step; ``fit(check_mask=False)`` skips it.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from jaxfeed.loaders.protocol import MASK_KEY
from jaxfeed.loaders.sequence_plan import SEGMENT_IDS
from jaxfeed.training.steps import Step, to_host

__all__ = ["PaddingCountedWarning", "padding_changes_sums", "warn_if_padding_counts"]

# Fields that mark padding themselves: kept, as the mask is (a sequence step
# weighs its tokens by segment_ids, 0 on every padding row's tokens).
_MARKS = (MASK_KEY, SEGMENT_IDS)

RELATIVE = 1e-5  # float32 sums of the same rows in another order differ by far less


class PaddingCountedWarning(UserWarning):
    """A step's metric sums changed with the values of a batch's padding rows."""


def padding_changes_sums(step: Step, state: Any, batch: Mapping[str, jax.Array]) -> list[str]:
    """The metrics whose sums change when the padding rows of ``batch`` hold a
    real row's values instead of zeros (none for a batch without padding)."""
    if MASK_KEY not in batch:
        return []

    @jax.jit
    def both(state: Any, batch: Mapping[str, jax.Array]) -> tuple[Any, Any]:
        mask = batch[MASK_KEY]
        first = jnp.argmax(mask)  # a real row

        def refill(values: jax.Array) -> jax.Array:
            real = mask.reshape(-1, *([1] * (values.ndim - 1)))
            return jnp.where(real, values, values[first])

        other = {k: v if k in _MARKS else refill(v) for k, v in batch.items()}
        # Each call gets its own copy: a step that updates its state in place (Flax
        # NNX objects passed as the state) would show the second call the first's update.
        copy = jax.tree.map(lambda leaf: leaf, state)
        return step(copy, batch)[1], step(state, other)[1]

    if _all_real(batch[MASK_KEY]):
        return []
    zeros, refilled = (to_host(sums) for sums in both(state, batch))
    return [
        name
        for name in zeros
        if abs(zeros[name] - refilled[name])
        > RELATIVE * max(1.0, abs(zeros[name]), abs(refilled[name]))
    ]


def _all_real(mask: jax.Array) -> bool:
    """Whether a (global, maybe multi-process) mask has no padding row."""
    return bool(jax.jit(jnp.all)(mask).addressable_data(0))


def warn_if_padding_counts(step: Step, state: Any, batch: Mapping[str, jax.Array]) -> bool:
    """Warns (`PaddingCountedWarning`) if ``batch``'s padding rows change the
    step's sums; returns whether ``batch`` had padding (so the check is done)."""
    if MASK_KEY not in batch or _all_real(batch[MASK_KEY]):
        return False
    changed = padding_changes_sums(step, state, batch)
    if changed:
        warnings.warn(
            f"the step's {', '.join(changed)} sum(s) change with the values of the padding "
            "rows of a short batch, so padding counts as data; weigh each row by "
            "jaxfeed.batch_mask(batch) (0 on padding), e.g. loss = (per_row * mask).sum() / "
            "mask.sum() and sums {'loss': (per_row * mask).sum(), 'count': mask.sum()}; or "
            "drop short batches (drop_remainder=True)",
            PaddingCountedWarning,
            stacklevel=4,  # the caller of fit
        )
    return True

"""fit on padded, bucketed and packed sequences: the step's compiles are
counted, and a run stopped mid-epoch resumes bit-identically."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxfeed import Callback, Checkpointing, Logging, Mixture, fit, make


def _rows(seed: int = 7, rows: int = 200) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 50, n).astype(np.int32) for n in rng.integers(1, 61, rows)]


def _mixture(weights=(0.6, 0.4)) -> Mixture:
    """Two token corpora, the small one coming round several times an epoch."""
    corpora = {"big": {"input_ids": _rows()}, "small": {"input_ids": _rows(8, 30)}}
    return Mixture(corpora, weights=dict(zip(corpora, weights, strict=True)), until="big")


def _step(state, batch):
    # A weight per token id, fitted to each token's position: depends on every
    # value, segment id and position, and on the order of the batches.
    real = batch["segment_ids"] > 0
    ids = batch["input_ids"]
    err = jnp.where(real, state[ids] - batch["positions"] / 60.0, 0.0)
    grad = jnp.zeros_like(state).at[ids].add(err)
    return state - 0.1 * grad, {"loss": jnp.sum(err**2), "count": jnp.sum(real)}


def _fit(directory, epochs, layout, stop_at=None, dataset=None, **kwargs):
    class Stop(Callback):
        def on_step(self, info):
            if info["step"] == stop_at:
                raise RuntimeError("stopped by the test")

    dataset = {"input_ids": _rows()} if dataset is None else dataset
    source = make("numpy", dataset=dataset, batch_size=8, seed=2, **layout)
    return fit(_step, jnp.zeros(50, jnp.float32), source, epochs=epochs, mesh=jax.devices()[:1],
               checkpoint=Checkpointing(directory, every=3), log=Logging(progress=False),
               callbacks=[Stop()], **kwargs)  # fmt: skip


@pytest.mark.parametrize("layout", [{"pack": 64}, {"bucket": (16, 32, 64)}], ids=str)
def test_stopped_mid_epoch_then_resumed_equals_one_run(tmp_path, layout):
    whole = _fit(tmp_path / "whole", 2, layout)
    with pytest.raises(RuntimeError, match="stopped by the test"):
        _fit(tmp_path / "parts", 2, layout, stop_at=whole.history[0]["step"] + 4)
    resumed = _fit(tmp_path / "parts", 2, layout, resume=True)
    np.testing.assert_array_equal(np.asarray(resumed.state), np.asarray(whole.state))
    assert resumed.history[-1]["loss"] == whole.history[-1]["loss"]
    shapes = whole.history[-1].get("batch_shapes", 1)
    assert shapes == (3 if "bucket" in layout else 1)


def test_a_packed_mixture_stopped_mid_epoch_resumes_bit_identically_and_keeps_its_weights(
    tmp_path,
):
    layout = {"pack": 64}
    whole = _fit(tmp_path / "whole", 2, layout, dataset=_mixture())
    with pytest.raises(RuntimeError, match="stopped by the test"):
        _fit(
            tmp_path / "parts", 2, layout, stop_at=whole.history[0]["step"] + 4, dataset=_mixture()
        )
    resumed = _fit(tmp_path / "parts", 2, layout, resume=True, dataset=_mixture())
    np.testing.assert_array_equal(np.asarray(resumed.state), np.asarray(whole.state))
    with pytest.raises(ValueError, match="resumes with the same components and weights"):
        _fit(tmp_path / "parts", 3, layout, resume=True, dataset=_mixture((0.9, 0.1)))

"""The MNIST MLP of the JAX tutorial (784-512-512-10, ReLU, log-softmax), in pure JAX."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp

Params = list[tuple[jax.Array, jax.Array]]
LAYER_SIZES = (784, 512, 512, 10)


def init_params(key: jax.Array, sizes: tuple[int, ...] = LAYER_SIZES) -> Params:
    """He-normal weights and zero biases for each dense layer."""
    params = []
    keys = jax.random.split(key, len(sizes) - 1)
    for k, (n_in, n_out) in zip(keys, itertools.pairwise(sizes), strict=True):
        w = jax.random.normal(k, (n_in, n_out), jnp.float32) * jnp.sqrt(2.0 / n_in)
        params.append((w, jnp.zeros((n_out,), jnp.float32)))
    return params


def predict(params: Params, images: jax.Array) -> jax.Array:
    """Log-probabilities [B, 10] for images [B, ...] of ``sizes[0]`` values.

    MNIST images arrive as uint8 (4x fewer bytes over the host-to-device
    link) and are scaled to [0, 1] here, on device; float images (an
    augmentation's normalised output) are used as they come.
    """
    x = images.reshape(images.shape[0], -1).astype(jnp.float32)
    if jnp.issubdtype(images.dtype, jnp.integer):
        x = x / 255.0
    for w, b in params[:-1]:
        x = jax.nn.relu(x @ w + b)
    w, b = params[-1]
    return jax.nn.log_softmax(x @ w + b)

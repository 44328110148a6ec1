"""A small decoder-only Transformer LM in Flax NNX that reads packed rows.

A packed row holds several sequences one after another (``segment_ids`` 1, 2,
..., 0 on padding; ``positions`` restart at 0 in each). Three things keep the
sequences apart, so a packed row trains exactly as its sequences would one
per row: the position embedding reads ``positions``, not the column; a token
attends only to earlier tokens of its own segment; and the loss counts a
next-token prediction only inside one segment.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxfeed.training.steps import Sums, batch_mask


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The Transformer's sizes; ``max_len`` bounds ``positions`` (a sequence's length)."""

    vocab_size: int = 2048
    max_len: int = 256
    d_model: int = 64
    num_heads: int = 4
    num_layers: int = 2


def attention_mask(segment_ids: jax.Array) -> jax.Array:
    """bool ``[B, 1, L, L]``: query i sees key j iff j <= i, both in one segment, not padding."""
    seg_q, seg_k = segment_ids[:, :, None], segment_ids[:, None, :]
    length = segment_ids.shape[1]
    causal = jnp.tril(jnp.ones((length, length), bool))
    return (causal & (seg_q == seg_k) & (seg_k != 0))[:, None]


class SelfAttention(nnx.Module):
    def __init__(self, d_model: int, num_heads: int, *, rngs: nnx.Rngs):
        self.num_heads = num_heads
        self.qkv = nnx.Linear(d_model, 3 * d_model, rngs=rngs)
        self.out = nnx.Linear(d_model, d_model, rngs=rngs)

    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        batch, length, d_model = x.shape
        qkv = self.qkv(x).reshape(batch, length, 3, self.num_heads, d_model // self.num_heads)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # [B, L, H, D]
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(q.shape[-1]).astype(x.dtype)
        # Masked keys get weight exp(min - max) == 0 exactly: a padded key adds nothing.
        # A padding query sees no key; its output is ignored (and finite).
        weights = jax.nn.softmax(jnp.where(mask, logits, jnp.finfo(x.dtype).min), axis=-1)
        return self.out(jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(x.shape))


class Block(nnx.Module):
    def __init__(self, d_model: int, num_heads: int, *, rngs: nnx.Rngs):
        self.norm1 = nnx.LayerNorm(d_model, rngs=rngs)
        self.attention = SelfAttention(d_model, num_heads, rngs=rngs)
        self.norm2 = nnx.LayerNorm(d_model, rngs=rngs)
        self.up = nnx.Linear(d_model, 4 * d_model, rngs=rngs)
        self.down = nnx.Linear(4 * d_model, d_model, rngs=rngs)

    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        x = x + self.attention(self.norm1(x), mask)
        return x + self.down(jax.nn.gelu(self.up(self.norm2(x))))


class TransformerLM(nnx.Module):
    """Pre-norm decoder-only Transformer: token + learned position embeddings."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        if config.d_model % config.num_heads:
            raise ValueError(
                f"d_model ({config.d_model}) must be a multiple of num_heads ({config.num_heads})"
            )
        self.tokens = nnx.Embed(config.vocab_size, config.d_model, rngs=rngs)
        self.positions = nnx.Embed(config.max_len, config.d_model, rngs=rngs)
        self.blocks = nnx.List(
            [Block(config.d_model, config.num_heads, rngs=rngs) for _ in range(config.num_layers)]
        )
        self.norm = nnx.LayerNorm(config.d_model, rngs=rngs)
        self.head = nnx.Linear(config.d_model, config.vocab_size, rngs=rngs)

    def __call__(
        self, input_ids: jax.Array, segment_ids: jax.Array, positions: jax.Array
    ) -> jax.Array:
        """Logits ``[B, L, vocab_size]`` for the next token at every column."""
        x = self.tokens(input_ids.astype(jnp.int32)) + self.positions(positions)
        mask = attention_mask(segment_ids)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.norm(x))


def token_losses(
    model: TransformerLM, batch: Mapping[str, jax.Array]
) -> tuple[jax.Array, jax.Array]:
    """Next-token losses float32 ``[B, L-1]`` and where they count, float32 ``[B, L-1]``.

    Column t predicts token t+1 only if both are in one segment (not padding),
    and the row is real (`jaxfeed.batch_mask`: a padding row may hold any values).
    """
    ids, segments = batch["input_ids"], batch["segment_ids"]
    logits = model(ids, segments, batch["positions"])
    losses = optax.softmax_cross_entropy_with_integer_labels(
        logits[:, :-1], ids[:, 1:].astype(jnp.int32)
    )
    same = (segments[:, 1:] == segments[:, :-1]) & (segments[:, 1:] != 0)
    return losses, same * batch_mask(batch)[:, None]


def loss_sums(model: TransformerLM, batch: Mapping[str, jax.Array]) -> Sums:
    """Fit's sums: ``loss`` summed over the predicted tokens, and their ``count``
    (so fit's ``loss`` is the mean per token, and its ``samples_per_second`` tokens per second)."""
    losses, counted = token_losses(model, batch)
    return {"loss": jnp.sum(losses * counted), "count": jnp.sum(counted)}

"""The text example (jaxfeed.textlm, docs/text.md): its corpus is real and the same every
call, a packed batch trains exactly as its sequences padded one per row, and the loss falls.

`pack` and `pad` below build ``make(pack=L)``'s and ``make(pad=L)``'s batches by hand, so
that the comparison sees which row went where; the make sources are compared too.
"""

import functools
import time

import jax
import numpy as np
from flax import nnx

import jaxfeed
from jaxfeed.textlm import ModelConfig, TrainConfig, TransformerLM, load_corpus, loss_sums, train
from jaxfeed.textlm.model import token_losses


def pack(rows: list[np.ndarray], length: int) -> dict[str, np.ndarray]:
    """Rows laid one after another, a new packed row when the next does not fit."""
    packed = [[]]
    for row in rows:
        assert len(row) <= length
        if sum(map(len, packed[-1])) + len(row) > length:
            packed.append([])
        packed[-1].append(row)
    out = {
        "input_ids": np.zeros((len(packed), length), rows[0].dtype),
        "segment_ids": np.zeros((len(packed), length), np.int32),
        "positions": np.zeros((len(packed), length), np.int32),
    }
    for i, segments in enumerate(packed):
        start = 0
        for segment, row in enumerate(segments, start=1):
            end = start + len(row)
            out["input_ids"][i, start:end] = row
            out["segment_ids"][i, start:end] = segment
            out["positions"][i, start:end] = np.arange(len(row))
            start = end
    return out


def pad(rows: list[np.ndarray], length: int) -> dict[str, np.ndarray]:
    """One row per row, padded to ``length`` (``pad=length``: segment 1 on every real token)."""
    return {key: np.concatenate([pack([row], length)[key] for row in rows]) for key in PACKED}


PACKED = ("input_ids", "segment_ids", "positions")


@functools.cache
def corpus() -> tuple[list[np.ndarray], int]:
    data, tokenizer = load_corpus(vocab_size=1024, max_tokens=128)
    return data["input_ids"], tokenizer.get_vocab_size()


def test_the_corpus_is_real_text_the_same_every_call():
    rows, vocab = corpus()
    again, tokenizer = load_corpus(vocab_size=1024, max_tokens=128)
    assert vocab == 1024 and len(rows) > 1000
    assert all(np.array_equal(a, b) for a, b in zip(rows, again["input_ids"], strict=True))
    lengths = [len(row) for row in rows]
    assert min(lengths) >= 5 and max(lengths) == 128 and len(set(lengths)) > 100
    assert all(row.dtype == np.uint16 and row.min() > 0 for row in rows)  # 0 is padding
    assert "assert" in tokenizer.decode(rows[0].tolist())  # the first topic: "assert"


def test_a_packed_batch_has_the_loss_of_its_rows_padded_one_per_row():
    rows, vocab = corpus()
    rows = rows[:12]
    model = TransformerLM(ModelConfig(vocab_size=vocab, max_len=128), rngs=nnx.Rngs(0))
    packed, padded = pack(rows, 128), pad(rows, 128)
    assert len(packed["input_ids"]) < len(rows) and packed["segment_ids"].max() > 2  # it packs
    # Plus a padding row (mask False) holding a real row's values: it must count for nothing.
    packed = {k: np.concatenate([v, v[:1]]) for k, v in packed.items()}
    packed["mask"] = np.arange(len(packed["input_ids"])) < len(packed["input_ids"]) - 1

    @jax.jit
    def losses(model, batch):
        return loss_sums(model, batch), token_losses(model, batch)

    (sums, (per_token, counted)), (padded_sums, (padded_per_token, padded_counted)) = (
        jax.device_get(losses(model, batch)) for batch in (packed, padded)
    )
    assert sums["count"] == padded_sums["count"] == sum(len(row) - 1 for row in rows)
    # float32, the same tokens: a key outside a token's segment gets weight exactly 0 and
    # every token meets the same numbers, so only the order of additions may differ
    # (matmuls over rows of another length, the sum over [6, 127] or [12, 127] losses). The
    # losses are positive, so reordering their sum errs relative to it: ~1e-7 per level of
    # XLA's tree of additions, 3e-7 seen here (421 tokens; the per-token losses came out
    # bit-identical). rtol 1e-5 is 30x that, and 100x below what a mistake costs: a mask
    # without seg_q == seg_k moves the sum by 6e-3, positions from the column by 2.6e-3.
    np.testing.assert_allclose(sums["loss"], padded_sums["loss"], rtol=1e-5)
    # Token by token too: each packed segment's losses are its padded row's, in order.
    np.testing.assert_allclose(
        per_token[counted > 0], padded_per_token[padded_counted > 0], rtol=1e-5
    )

    # And an epoch of make(pack=)'s batches against one of make(pad=)'s (one batch shape:
    # one compilation), rows in another order and another grouping: the same sums.
    def epoch(**layout):
        source = jaxfeed.make("numpy", dataset={"input_ids": rows}, batch_size=4, **layout)
        batches = [jax.device_get(losses(model, batch)[0]) for batch in source]
        return {key: sum(float(sums[key]) for sums in batches) for key in ("loss", "count")}

    packed_epoch, padded_epoch = epoch(pack=128), epoch(pad=128)
    assert packed_epoch["count"] == padded_epoch["count"] == sums["count"]
    np.testing.assert_allclose(packed_epoch["loss"], padded_epoch["loss"], rtol=1e-5)
    np.testing.assert_allclose(packed_epoch["loss"], sums["loss"], rtol=1e-5)


def test_training_lowers_the_loss():
    rows, vocab = corpus()
    source = jaxfeed.make(
        "numpy", dataset={"input_ids": rows[:1000]}, batch_size=4, seed=0, pack=128
    )
    config = TrainConfig(model=ModelConfig(vocab_size=vocab, max_len=128), record_every=20)
    start = time.perf_counter()
    _, history = train(source, config, mesh=jax.devices()[:1])
    seconds = time.perf_counter() - start
    losses = [record["loss"] for record in history]
    print(f"{history[-1]['step']} steps, {seconds:.1f} s: loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    assert history[-1]["step"] == source.batches_in(0) > 80 and losses[-1] < losses[0] - 0.5

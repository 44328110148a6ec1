"""Real English text, offline: the documentation inside CPython, tokenized by a small BPE.

``pydoc_data.topics.topics`` is the text of ``help("assert")`` and friends
(the language reference's topics, about 0.5 MB); every CPython carries it,
so the example needs no download. Its paragraphs are the rows: prose, grammar
and code, from a few tokens to a few hundred. The topics differ between
Python versions, and so do the rows; for one Python they are the same on
every call.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from tokenizers import Tokenizer

PAD = "<pad>"  # id 0: the id padding holds in a batch, never a real token


def paragraphs() -> list[str]:
    """The topics' paragraphs (split at blank lines), in the topics' sorted order."""
    from pydoc_data.topics import topics

    found = []
    for name in sorted(topics):
        found += [p.strip("\n") for p in re.split(r"\n[ \t]*\n", topics[name]) if p.strip()]
    return found


def train_tokenizer(texts: list[str], vocab_size: int = 2048) -> Tokenizer:
    """A byte-level BPE trained on ``texts`` (a second or so), with `PAD` as id 0.

    Byte-level: every string encodes (no unknown token) and decodes back to itself.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def load_corpus(
    vocab_size: int = 2048, min_tokens: int = 5, max_tokens: int = 300
) -> tuple[dict[str, list[np.ndarray]], Tokenizer]:
    """The paragraphs as rows of token ids, and the tokenizer trained on them.

    Args:
      vocab_size: the BPE's vocabulary, special token included (at most 65536:
        the ids are uint16).
      min_tokens: shorter paragraphs (headings' underlines, lone words) are dropped.
      max_tokens: a longer paragraph is cut into rows of at most this many
        tokens; a last piece under ``min_tokens`` is dropped.

    Returns:
      ``({"input_ids": [uint16 array per row]}, tokenizer)``: rows of
      different lengths, the same ones on every call; `PAD` (id 0) is in none.

    Raises:
      ValueError: ``vocab_size`` does not fit uint16, or ``min_tokens`` is
        not between 1 and ``max_tokens``.
    """
    if not 0 < vocab_size <= 2**16:
        raise ValueError(f"vocab_size must be in [1, 65536] (uint16 ids), got {vocab_size}")
    if not 1 <= min_tokens <= max_tokens:
        raise ValueError(
            f"need 1 <= min_tokens <= max_tokens, got min_tokens={min_tokens}, "
            f"max_tokens={max_tokens}"
        )
    texts = paragraphs()
    tokenizer = train_tokenizer(texts, vocab_size)
    rows = []
    for encoding in tokenizer.encode_batch(texts):
        ids = np.asarray(encoding.ids, np.uint16)
        rows += [ids[i : i + max_tokens] for i in range(0, len(ids), max_tokens)]
    return {"input_ids": [row for row in rows if len(row) >= min_tokens]}, tokenizer

"""The sequences workload's text: the paragraphs of CPython's own
documentation (``pydoc_data.topics``, the text ``help()`` shows), which every
Python install carries, so the workload runs offline on real prose and code.

Tokens are the paragraph's UTF-8 bytes plus one (ids 1..256; 0 is padding):
no tokenizer is needed to measure batching, and byte rows have the spread of
lengths a subword tokenizer gives longer documents (here 5 to `MAX_TOKENS`).
"""

from __future__ import annotations

import re

import numpy as np

MIN_TOKENS = 5  # shorter paragraphs are headings and stray lines
MAX_TOKENS = 512
"""Longer paragraphs are cut here, as a tokenizer's ``max_length`` cuts them,
so every layout and idiom gets the same rows (pad, bucket and pack lengths are
this long at most)."""


def paragraphs() -> list[str]:
    """Every topic's paragraphs (text between blank lines), topics by name."""
    from pydoc_data.topics import topics

    return [
        paragraph.strip()
        for name in sorted(topics)
        for paragraph in re.split(r"\n\s*\n", topics[name])
        if paragraph.strip()
    ]


def token_rows(max_tokens: int = MAX_TOKENS) -> list[np.ndarray]:
    """Each paragraph of `MIN_TOKENS` bytes or more as int32 ids (byte + 1),
    cut to ``max_tokens``."""
    rows = []
    for paragraph in paragraphs():
        data = np.frombuffer(paragraph.encode(), np.uint8)[:max_tokens]
        if len(data) >= MIN_TOKENS:
            rows.append(data.astype(np.int32) + 1)
    return rows

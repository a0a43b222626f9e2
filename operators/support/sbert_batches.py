"""SBERT's batches on a CPU, cut by tokens instead of rows.

sentence-transformers sorts an ``encode`` call's texts by their length in *characters* and cuts
batches of a fixed number of texts, each padded to its longest text in *tokens*: on real alt-text
the padding and the small batches of short captions cost almost half the time on a CPU. Here the
texts are sorted by token count and each batch holds as many as fit a token budget. The model and
its arithmetic are unchanged: the vectors equal the library's to float rounding (~2e-7).
"""

from __future__ import annotations

import numpy as np

# project choice: on CPUs SBERT's batches are cut by tokens, not rows: texts sorted by their
# token count, each batch at most this many (rows x its longest text) tokens and MAX_BATCH_ROWS rows.
# No padding is left to compute, and short captions go in large batches: 1.8x the rows/s of
# sentence-transformers' 64 texts sorted by characters, on real alt-text (docs/benchmarks.md)
CPU_TOKEN_BUDGET = 1024
MAX_BATCH_ROWS = 1024


def token_lengths(tokenizer, texts: list[str], max_length: int) -> np.ndarray:
    """Each text's token count as the model sees it (special tokens in, truncated to ``max_length``)."""
    ids = tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]
    return np.fromiter(map(len, ids), np.int64, len(ids))


def token_batches(lengths: np.ndarray, budget: int, max_rows: int = MAX_BATCH_ROWS) -> list[np.ndarray]:
    """Row indices cut into batches: sorted by token count (shortest first, ties in input order), each
    batch as many rows as keep rows x its longest count within ``budget`` (at least one row, at most
    ``max_rows``). Every row is in exactly one batch."""
    order = np.argsort(lengths, kind="stable")
    longest = np.maximum(lengths[order], 1)
    batches, start, n = [], 0, len(order)
    while start < n:
        # rows start..end-1 fit when (end - start) * longest[end - 1] <= budget (longest is sorted)
        fits = np.flatnonzero(np.arange(1, n - start + 1) * longest[start:] <= budget)
        size = int(min(max_rows, max(1, fits[-1] + 1 if len(fits) else 1)))
        batches.append(order[start:start + size])
        start += size
    return batches

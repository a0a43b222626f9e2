"""SBERT's CPU batches cut by tokens: every row once, within the budget, and the same
vectors as sentence-transformers' own batching (the operators' use of it: test_sbert_openvino.py)."""

import numpy as np
import pytest

from operators.support.sbert_batches import token_batches, token_lengths
from operators.text_prompt_similarity import unit_embeddings

CAPTIONS = ([f"nurse {'and doctor ' * (i % 37)}number {i}" for i in range(120)]
            + ["a", "", "x " * 400, "Krankenschwester im Dienst", "護士"])


@pytest.mark.parametrize("budget,max_rows", [(2048, 1024), (64, 1024), (2048, 7), (1, 1024)])
def test_batches_hold_every_row_once_sorted_and_within_the_budget(budget, max_rows):
    lengths = np.random.default_rng(0).integers(3, 257, 5000)
    batches = token_batches(lengths, budget, max_rows)
    rows = np.concatenate(batches)
    assert sorted(rows.tolist()) == list(range(5000))                      # each row exactly once
    assert (np.diff(lengths[rows]) >= 0).all()                             # shortest first
    for b in batches:
        assert 1 <= len(b) <= max_rows
        assert len(b) == 1 or len(b) * lengths[b].max() <= budget           # one row may exceed alone
    # greedy: a batch stops only where the next row would break the budget or the row cap
    for b, nxt in zip(batches, batches[1:]):
        assert len(b) == max_rows or (len(b) + 1) * lengths[nxt[0]] > budget
    assert token_batches(np.zeros(0, np.int64), budget) == []


def test_token_batches_give_the_librarys_vectors(minilm):
    lengths = token_lengths(minilm.tokenizer, CAPTIONS, minilm.max_seq_length)
    assert lengths.max() == minilm.max_seq_length and lengths.min() == 2      # truncated; [CLS] [SEP]
    ref = unit_embeddings(minilm, CAPTIONS, 64)
    got = unit_embeddings(minilm, CAPTIONS, 64, token_budget=256)
    assert len(token_batches(lengths, 256)) > 5
    assert got.shape == ref.shape and np.abs(got - ref).max() < 1e-6

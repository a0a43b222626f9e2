"""Explicit gender words and pronouns in captions (paper 002, Appendix A.5, parts 1 and 2).

Whole-word, case-insensitive, vectorised: captions are split into words once
(``text_tokens.words``) and every word is looked up in a hash set of indicator words. "teacher",
"the", "hero" and "Shepherd's" contain no indicator because "he" only matches the word "he".
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from operators.base import Resources, with_column
from operators.support.tokens import lists_from_pairs, words
from schemas.captions import (
    CAPTION,
    CAPTION_GENDER,
    EVIDENCE_PRONOUN,
    EVIDENCE_WORD,
    FEMALE_INDICATORS,
    MALE_INDICATORS,
    CaptionGender,
)

STAGE_GENDER_WORDS = "gender_words"
# label by code = has male evidence + 2 * has female evidence
_GENDER_BY_CODE = pa.array([CaptionGender.NONE, CaptionGender.MALE, CaptionGender.FEMALE, CaptionGender.BOTH], pa.string())


def caption_gender(male: pa.Array, female: pa.Array) -> pa.Array:
    """{male, female, both, none} from the two evidence list columns."""
    m = pc.fill_null(pc.greater(pc.list_value_length(male), 0), False).to_numpy(zero_copy_only=False)
    f = pc.fill_null(pc.greater(pc.list_value_length(female), 0), False).to_numpy(zero_copy_only=False)
    return _GENDER_BY_CODE.take(pa.array(m.astype(np.int8) + 2 * f.astype(np.int8)))


class GenderWordIndicators:
    """Adds ``male_indicators`` / ``female_indicators`` (entries ``word:<w>`` / ``pronoun:<w>``,
    distinct, in order of first appearance) and ``caption_gender``."""

    stage_name = STAGE_GENDER_WORDS
    resources = Resources(num_cpus=1, batch_size=16384)

    def __init__(self, male_words, female_words, male_pronouns, female_pronouns):
        vocab: dict[str, tuple[str, int]] = {}
        for items, kind, gender in (
            (male_words, EVIDENCE_WORD, 0),
            (female_words, EVIDENCE_WORD, 1),
            (male_pronouns, EVIDENCE_PRONOUN, 0),
            (female_pronouns, EVIDENCE_PRONOUN, 1),
        ):
            for w in items:
                w = str(w).strip().lower()
                if w in vocab and vocab[w][1] != gender:
                    raise ValueError(f"gender indicator {w!r} is listed as both male and female")
                vocab[w] = (f"{kind}:{w}", gender)
        self._words = pa.array(list(vocab), pa.string())
        self._labels = np.array([v[0] for v in vocab.values()], dtype=object)
        self._gender = np.array([v[1] for v in vocab.values()], np.int8)

    def evidence(self, captions: pa.Array) -> tuple[pa.ListArray, pa.ListArray]:
        tokens, parent = words(captions)
        idx = pc.index_in(tokens, value_set=self._words)
        hit = pc.is_valid(idx).to_numpy(zero_copy_only=False)
        rows = parent[hit]
        vocab_idx = pc.fill_null(idx, 0).to_numpy(zero_copy_only=False)[hit].astype(np.int64)
        n = len(captions)
        out = []
        for g in (0, 1):
            sel = self._gender[vocab_idx] == g
            r, v = rows[sel], vocab_idx[sel]
            # distinct (row, word) pairs, keeping the first appearance order within each row
            if len(r):
                key = r * len(self._words) + v
                _, first = np.unique(key, return_index=True)
                first.sort()
                r, v = r[first], v[first]
            out.append(lists_from_pairs(n, r, pa.array(self._labels[v].tolist(), pa.string())))
        return out[0], out[1]

    def __call__(self, batch: pa.Table) -> pa.Table:
        male, female = self.evidence(batch.column(CAPTION).combine_chunks())
        batch = with_column(batch, MALE_INDICATORS, male)
        batch = with_column(batch, FEMALE_INDICATORS, female)
        return with_column(batch, CAPTION_GENDER, caption_gender(male, female))

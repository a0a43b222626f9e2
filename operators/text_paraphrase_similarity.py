"""SBERT cosine between each training caption and its paraphrase (paper 002, App. A.6): how similar
the paraphrases are is what A.6 is about. The same SBERT as section 5.2 (all-MiniLM-L6-v2, mean
pooling, normalised), loaded by the caption side's loader: on a CPU through ``LeanSbert`` where the
saved model allows (the same vectors without sentence-transformers' start-up, as the caption side's
"torch" backend); only rows whose paraphrase is ``ok`` are encoded, the others get null."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from operators.base import Resources, with_column
from operators.text_prompt_similarity import load_sentence_transformer, sbert_precision, unit_embeddings
from schemas.captions import CAPTION
from schemas.paraphrases import PARAPHRASE, PARAPHRASE_SBERT, PARAPHRASE_STATUS, STAGE_PARAPHRASE_SIMILARITY
from schemas.paraphrases import ParaphraseStatus as S


class ParaphraseSimilarity:
    """Adds ``paraphrase_sbert_cosine``: cosine(SBERT(caption), SBERT(paraphrase)) of ok rows."""

    stage_name = STAGE_PARAPHRASE_SIMILARITY
    resources = Resources(num_cpus=1, batch_size=1024, actors=1)

    def __init__(self, model: str, revision: str | None = None, device: str = "auto", precision: str = "auto",
                 encode_batch_size: int = 64, lean: bool = True):
        """``lean``: on a CPU, load a BERT + mean-pooling model saved in a local directory with
        ``LeanSbert`` (torch alone); False always loads it through sentence-transformers."""
        self.model = load_sentence_transformer(model, revision, device, lean=lean)
        if sbert_precision(precision, str(self.model.device)) == "fp16":
            self.model.half()
        self.encode_batch_size = int(encode_batch_size)

    def cosines(self, a: list[str], b: list[str]) -> np.ndarray:
        emb = unit_embeddings(self.model, a + b, self.encode_batch_size)
        return np.einsum("rd,rd->r", emb[:len(a)], emb[len(a):])

    def __call__(self, batch: pa.Table) -> pa.Table:
        ok = pc.fill_null(pc.equal(batch.column(PARAPHRASE_STATUS), S.OK), False).to_numpy(zero_copy_only=False)
        rows = np.flatnonzero(ok)
        values = np.full(batch.num_rows, np.nan, np.float32)
        if len(rows):
            take = pa.array(rows, pa.int64())
            values[rows] = self.cosines(batch.column(CAPTION).take(take).to_pylist(),
                                        batch.column(PARAPHRASE).take(take).to_pylist())
        return with_column(batch, PARAPHRASE_SBERT, pa.array(values, pa.float32(), mask=~ok))

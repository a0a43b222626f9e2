"""Attribute scores of images from their CLIP embeddings: the three estimators of paper 001, section 4.

For image I and attribute a (unit vectors, so a dot product is the cosine):
  C   = cos(C(I), C(a))                                  Eq. 4 (a = "a dress": the phrase without its preposition)
  CC  = cos(C(I), C(a)) - cos(C(I), C(r(a)))             Eq. 5 (r(a) = "an object" by default)
  CLS = mean over the ensemble of cls_a(C(I))            Eq. 7 (cross-modal classifiers, section 4.2)
Averaged over a group of images, each is that estimator's f_a.

Which attributes an image is scored on follows section 3: in the neutral setting every attribute of
A, in the explicit setting only the attribute named in the image's prompt. The stage reads the
per-image table (``schemas.gep.GEP_IMAGES``) and returns one row per (image, scored attribute)
(``GEP_SCORES``); images without an embedding (not generated, blocked) have no scores, and the
pipeline counts them by their generation status.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from operators.base import Resources, conform
from operators.image_clip_embedding import ClipImageEmbedder, embeddings_of
from operators.support.attribute_classifier import (
    ClassifierSettings,
    Ensemble,
    settings_record,
    train_attribute_classifiers,
)
from schemas.gep import Attribute
from schemas.gep import (
    ATTRIBUTE,
    CONTEXT_ID,
    EMBEDDING,
    GENDER,
    GEP_SCORES,
    IMAGE_ID,
    SCORE_C,
    SCORE_CC,
    SCORE_CLS,
    SETTING,
    Setting,
)
from schemas.images import MODEL

STAGE_SCORE = "attribute_scores"
DEFAULT_REFERENCE = "an object"


def estimator_scores(embeddings: np.ndarray, attribute_texts: np.ndarray, reference: np.ndarray,
                     ensembles: list[Ensemble]) -> dict[str, np.ndarray]:
    """(n, k) scores of n image embeddings for k attributes under C, CC and CLS (float64)."""
    e = np.asarray(embeddings, np.float64)
    c = e @ np.asarray(attribute_texts, np.float64).T
    cc = c - (e @ np.asarray(reference, np.float64).reshape(-1, 1))
    cls = np.stack([ens.predict(e) for ens in ensembles], axis=1) if ensembles else np.zeros_like(c)
    return {SCORE_C: c, SCORE_CC: cc, SCORE_CLS: cls}


class AttributeScorer:
    """Scores images (their embeddings) on attributes with C-f, CC-f and CLS-f."""

    stage_name = STAGE_SCORE
    resources = Resources(num_cpus=1, batch_size=4096, actors=1)

    def __init__(self, attributes: list[dict], clip: dict, reference: str = DEFAULT_REFERENCE,
                 classifier: dict | None = None, device: str = "auto", embedder=None):
        self.attributes = [Attribute(**a) if isinstance(a, dict) else a for a in attributes]
        if not self.attributes:
            raise ValueError("no attributes to score")
        self.index = {a.name: i for i, a in enumerate(self.attributes)}
        self.embedder = embedder or ClipImageEmbedder(clip["model"], clip.get("pretrained"), device,
                                                      revision=clip.get("revision"))
        self.reference = reference
        self.settings = ClassifierSettings(**(classifier or {}))
        self.text_vectors = self.embedder.embed_texts([a.text for a in self.attributes])
        self.reference_vector = self.embedder.embed_texts([reference])[0]
        self.ensembles = train_attribute_classifiers(self.embedder.embed_texts, self.attributes, self.settings)
        self.record = {
            "clip": self.embedder.record, "reference": reference,
            "attributes": [{"name": a.name, "phrase": a.phrase, "clip_text": a.text} for a in self.attributes],
            "classifier": settings_record(self.settings), "classifiers": [e.record for e in self.ensembles],
        }

    def describe(self) -> dict:
        return self.record

    def score_batch(self, batch: pa.Table) -> pa.Table:
        """``self(batch)`` under a name a Ray actor handle can call."""
        return self(batch)

    def score(self, embeddings: np.ndarray) -> dict[str, np.ndarray]:
        """(n, k) C, CC, CLS scores of embeddings against every attribute (in order)."""
        return estimator_scores(embeddings, self.text_vectors, self.reference_vector, self.ensembles)

    def __call__(self, batch: pa.Table) -> pa.Table:
        for col in (IMAGE_ID, SETTING, GENDER, EMBEDDING):
            if col not in batch.column_names:
                raise ValueError(f"{STAGE_SCORE}: missing column {col!r}")
        vectors, valid = embeddings_of(batch.column(EMBEDDING))
        rows = np.flatnonzero(valid)
        if not len(rows):
            return GEP_SCORES.empty_table()
        setting = np.asarray(batch.column(SETTING).to_pylist(), dtype=object)[rows]
        named = np.asarray((batch.column(ATTRIBUTE).to_pylist() if ATTRIBUTE in batch.column_names
                            else [None] * batch.num_rows), dtype=object)[rows]
        unknown = sorted({a for s, a in zip(setting, named) if s == Setting.EXPLICIT and a not in self.index})
        if unknown:
            raise ValueError(f"{STAGE_SCORE}: explicit-setting images name attributes {unknown} that are not in "
                             f"the scored attribute set {list(self.index)}")
        bad = sorted(set(setting) - set(Setting.ALL))
        if bad:
            raise ValueError(f"{STAGE_SCORE}: unknown settings {bad}; use {Setting.ALL}")
        scores = self.score(vectors[rows])
        k = len(self.attributes)
        # (image row, attribute index) pairs: all attributes for neutral images, the named one for explicit
        neutral = np.flatnonzero(setting == Setting.NEUTRAL)
        explicit = np.flatnonzero(setting == Setting.EXPLICIT)
        pick_row = np.concatenate([np.repeat(neutral, k), explicit]).astype(np.int64)
        pick_attr = np.concatenate([np.tile(np.arange(k), len(neutral)),
                                    np.array([self.index[a] for a in named[explicit]], np.int64)]).astype(np.int64)
        order = np.lexsort((pick_attr, pick_row))
        pick_row, pick_attr = pick_row[order], pick_attr[order]
        src = pa.array(rows[pick_row], pa.int64())
        out = {IMAGE_ID: batch.column(IMAGE_ID).take(src), SETTING: batch.column(SETTING).take(src),
               GENDER: batch.column(GENDER).take(src),
               ATTRIBUTE: pa.array([self.attributes[i].name for i in pick_attr], pa.string())}
        for col in (MODEL, CONTEXT_ID):
            if col in batch.column_names:
                out[col] = batch.column(col).take(src)
        for col, values in scores.items():
            out[col] = pa.array(values[pick_row, pick_attr].astype(np.float32), pa.float32())
        return conform(pa.table(out), GEP_SCORES)


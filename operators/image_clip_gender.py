"""CLIP zero-shot perceived-gender classification (paper 002, section 2.2 and App. A.4).

Each image is compared with the text embeddings of two prompts, "A photo of a man" and "A photo
of a woman"; a softmax over CLIP's scaled cosine similarities gives p_male and p_female
(summing to 1). The image gets the winning label only when its probability is at least the
threshold (0.9 in the paper, inclusive); otherwise it is ``ambiguous`` and does not count.

The paper uses CLIP ViT-L/14 with OpenAI's weights (open_clip ``ViT-L-14`` / ``openai``).

Fetched images (encoded bytes) and generated images (raw RGB8 payloads, or the generator's
tensor handed over directly with ``classify_tensor``) go through one preprocessing path
(``operators.support.clip``: torch ops on the image's device equivalent to open_clip's eval
transform), so generated images are never re-encoded or copied to the CPU.

Reads IMAGE (+ IMAGE_ENCODING / IMAGE_HEIGHT / IMAGE_WIDTH) and FACE_STATUS when present;
adds ``schemas.images.GENDER_COLUMNS`` (GENDER, P_MALE, P_FEMALE).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from operators.base import Resources, with_column
from operators.support.clip import (DEFAULT_MODEL, DEFAULT_PRETRAINED, encode_image_arrays, encode_image_batch,
                                   encode_image_tensor, encode_texts, load_clip, unit_embeddings)
from operators.support.codec import decode_rows
from schemas.images import (
    CLIP_EMBEDDING,
    EMBEDDING_COLUMNS,
    FACE_STATUS,
    GENDER,
    GENDER_COLUMNS,
    IMAGE,
    P_FEMALE,
    P_MALE,
    FaceStatus,
    Gender,
)

STAGE_CLIP_GENDER = "clip_gender"
DEFAULT_PROMPTS = ("A photo of a man", "A photo of a woman")  # order: [male, female]
DEFAULT_THRESHOLD = 0.9

# --- pure functions -------------------------------------------------------------------------------------


def _as_numpy(x) -> np.ndarray:
    if hasattr(x, "detach"):  # torch tensor, any device / dtype
        x = x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def zero_shot_probs(image_features, text_features, logit_scale) -> np.ndarray:
    """Softmax over ``logit_scale`` * cosine(image, text): (n, d) x (k, d) -> (n, k) float64.

    Both feature sets are L2-normalised here; numpy arrays or torch tensors are accepted.
    ``logit_scale`` is the multiplier itself (CLIP's ``logit_scale.exp()``, 100 for OpenAI's).
    """
    img = _as_numpy(image_features)
    txt = _as_numpy(text_features)
    scale = float(_as_numpy(logit_scale).reshape(-1)[0])
    img = img / np.maximum(np.linalg.norm(img, axis=-1, keepdims=True), 1e-12)
    txt = txt / np.maximum(np.linalg.norm(txt, axis=-1, keepdims=True), 1e-12)
    logits = scale * (img @ txt.T)
    logits -= logits.max(axis=-1, keepdims=True)
    e = np.exp(logits)
    return e / e.sum(axis=-1, keepdims=True)


def decide(probs: np.ndarray, threshold: float = DEFAULT_THRESHOLD) -> np.ndarray:
    """Label per row of ``probs`` (n, 2) with columns [male, female]: the winning class where its
    probability is >= ``threshold`` (inclusive, compared in the dtype of ``probs``), else ambiguous.

    ``threshold`` must be in [0.5, 1]; 0.5 is the plain argmax (DALL-Eval's CLIP method), where an
    exact tie reaches the threshold on both sides and stays ambiguous. NaN rows are ambiguous.
    """
    if not 0.5 <= threshold <= 1.0:
        raise ValueError(f"threshold must be in [0.5, 1], got {threshold}")
    p = np.asarray(probs)
    if p.ndim != 2 or p.shape[1] != 2:
        raise ValueError(f"probs must have shape (n, 2) [male, female], got {p.shape}")
    thr = np.asarray(threshold, dtype=p.dtype if np.issubdtype(p.dtype, np.floating) else np.float64)
    labels = np.full(len(p), Gender.AMBIGUOUS, dtype=object)
    if threshold == 0.5:  # the argmax, exactly (two float32 probabilities may both sit below 0.5)
        labels[p[:, 0] > p[:, 1]] = Gender.MALE
        labels[p[:, 1] > p[:, 0]] = Gender.FEMALE
        return labels
    labels[p[:, 0] >= thr] = Gender.MALE
    labels[p[:, 1] >= thr] = Gender.FEMALE
    return labels


# --- the operator ------------------------------------------------------------------------------------------


class ClipGenderClassifier:
    """Adds GENDER, P_MALE, P_FEMALE: CLIP zero-shot perceived gender of each usable image."""

    stage_name = STAGE_CLIP_GENDER
    resources = Resources(num_cpus=1, batch_size=64, actors=1)
    output_fields = GENDER_COLUMNS   # what classify_tensor returns, for the generator

    def __init__(self, model: str = DEFAULT_MODEL, pretrained: str | None = DEFAULT_PRETRAINED,
                 prompts=DEFAULT_PROMPTS, threshold: float = DEFAULT_THRESHOLD, device: str = "auto",
                 batch_size: int = 64, only_face_ok: bool = True, revision: str | None = None,
                 embeddings: bool = False):
        """``embeddings``: also add CLIP_EMBEDDING, each classified image's L2-normalised CLIP image
        embedding in float16 (paper 002, section 5.2: the similarity of training and generated
        images)."""
        import torch  # deferred: torch

        if len(prompts) != 2:
            raise ValueError(f"prompts must be two texts [male, female], got {prompts!r}")
        if not 0.5 <= threshold <= 1.0:
            raise ValueError(f"threshold must be in [0.5, 1], got {threshold}")
        self.bundle = load_clip(model, pretrained, device, revision)
        self.prompts = tuple(prompts)
        self.threshold = float(threshold)
        self.batch_size = int(batch_size)
        self.only_face_ok = bool(only_face_ok)
        self.text_features = encode_texts(self.bundle, list(self.prompts))
        with torch.inference_mode():
            self.logit_scale = float(self.bundle.model.logit_scale.exp().item())
        self.embeddings = bool(embeddings)
        self.output_fields = pa.schema(list(GENDER_COLUMNS) + (list(EMBEDDING_COLUMNS) if self.embeddings else []))
        self.record = {**self.bundle.record, "prompts": list(self.prompts), "threshold": self.threshold,
                       "logit_scale": self.logit_scale, "embeddings": self.embeddings}

    # -- images already on a device ------------------------------------------------------------------

    def encode_images(self, images):
        """CLIP image features (float32, on the images' device) of (B, 3, H, W) images in [0, 1]."""
        return encode_image_tensor(self.bundle, images, self.batch_size)

    def _result(self, features) -> dict[str, np.ndarray]:
        probs = zero_shot_probs(features, self.text_features, self.logit_scale).astype(np.float32)
        if len(probs) == 0:
            probs = np.zeros((0, 2), np.float32)
        out = {GENDER: decide(probs, self.threshold).astype(str), P_MALE: probs[:, 0], P_FEMALE: probs[:, 1]}
        if self.embeddings:
            out[CLIP_EMBEDDING] = unit_embeddings(features)
        return out

    def classify_tensor(self, images) -> dict:
        """Classify (B, 3, H, W) float images in [0, 1] on any device (e.g. the generator's output),
        preprocessed where they are. Returns {GENDER: str array, P_MALE, P_FEMALE: float32 arrays}."""
        return self._result(encode_image_batch(self.bundle, images, self.batch_size))

    # -- payload batches ------------------------------------------------------------------------------

    def _rows_to_classify(self, batch: pa.Table) -> np.ndarray:
        if self.only_face_ok and FACE_STATUS in batch.column_names:
            status = batch.column(FACE_STATUS)
            if pa.types.is_dictionary(status.type):
                status = status.cast(pa.string())
            mask = pc.fill_null(pc.equal(status, FaceStatus.OK), False)
        elif IMAGE in batch.column_names:
            mask = pc.is_valid(batch.column(IMAGE))
        else:
            return np.zeros(0, dtype=np.int64)
        return np.flatnonzero(mask.to_numpy(zero_copy_only=False))

    def __call__(self, batch: pa.Table) -> pa.Table:
        n = batch.num_rows
        rows = self._rows_to_classify(batch)
        embedded = []
        gender = np.full(n, None, dtype=object)
        p_male = np.full(n, np.nan, dtype=np.float32)
        p_female = np.full(n, np.nan, dtype=np.float32)
        valid = np.zeros(n, dtype=bool)
        if len(rows):
            dec = decode_rows(batch, rows)
            gender[dec.failed] = Gender.DECODE_ERROR
            good = dec.rows
            if len(good):
                res = self._result(encode_image_arrays(self.bundle, dec.arrays, self.batch_size))
                gender[good] = res[GENDER]
                p_male[good] = res[P_MALE]
                p_female[good] = res[P_FEMALE]
                valid[good] = True
                embedded = list(res.get(CLIP_EMBEDDING, ()))
        types = {f.name: f.type for f in self.output_fields}
        batch = with_column(batch, GENDER, pa.array(gender, types[GENDER]))
        batch = with_column(batch, P_MALE, pa.array(p_male, types[P_MALE], mask=~valid))
        batch = with_column(batch, P_FEMALE, pa.array(p_female, types[P_FEMALE], mask=~valid))
        if self.embeddings:
            vectors = [None] * n
            for j, i in enumerate(np.flatnonzero(valid)):
                vectors[i] = embedded[j]
            batch = with_column(batch, CLIP_EMBEDDING, pa.array(vectors, types[CLIP_EMBEDDING]))
        return batch

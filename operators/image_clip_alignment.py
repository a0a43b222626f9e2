"""CLIP image-text alignment of generated images (paper 000, App. D.1: CLIP R-precision; CLIPScore).

For each image the stage stores (``schemas.alignment.CLIP_ALIGNMENT_COLUMNS``): the L2-normalised
CLIP image embedding, the L2-normalised CLIP text embedding of the prompt (the caption the image
was generated from), their cosine, and the two norms before normalising (so the raw features,
which the released DALL-Eval code's R-precision ranks by dot product, are unit vector x norm). R-precision (the true caption against 99
random other captions, ``pipelines.studies.dalleval.alignment_metrics.r_precision``) and CLIPScore
(``clip_score``) are then computed on the driver from the stored vectors, so a new negative sample
needs no new images. The paper uses CLIP ViT-B/32 with OpenAI's weights (open_clip ``ViT-B-32`` /
``openai``, built with QuickGELU by ``operators.support.clip.load_clip``).

Generated images are scored on the generator's device (``classify_tensor(images, prompts=...)``,
the generator's head hook, with ``takes_prompts = True``); decoded images from their payload
(``__call__``). The tensor path quantises the images to the 8-bit levels of the generator's RGB8
payload first (``operators.support.codec.rgb_levels``), so both paths see the same pixels and
give the same numbers for the same image.

Reads IMAGE (+ IMAGE_ENCODING / IMAGE_HEIGHT / IMAGE_WIDTH) and PROMPT; adds CLIP_IMAGE_EMBEDDING,
CLIP_TEXT_EMBEDDING, CLIP_COSINE, CLIP_IMAGE_NORM, CLIP_TEXT_NORM. Rows are never dropped: a null or undecodable image gets null
image embedding and cosine, a null prompt a null text embedding and cosine.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from operators.base import Resources, with_column
from operators.image_clip_embedding import embedding_array, normalise
from operators.support.clip import encode_image_arrays, encode_image_tensor, encode_texts, load_clip
from operators.support.codec import decode_rows, rgb_levels
from schemas.alignment import (
    CLIP_ALIGNMENT_COLUMNS,
    CLIP_COSINE,
    CLIP_IMAGE_EMBEDDING,
    CLIP_IMAGE_NORM,
    CLIP_TEXT_EMBEDDING,
    CLIP_TEXT_NORM,
)
from schemas.subsets import PROMPT

STAGE_CLIP_ALIGNMENT = "clip_alignment"
# paper 000, App. D.1: "For retrieval, we employ CLIP (ViT/B-32)", OpenAI's weights
ALIGNMENT_MODEL = "ViT-B-32"
ALIGNMENT_PRETRAINED = "openai"


def row_cosines(image_vectors: np.ndarray, text_vectors: np.ndarray) -> np.ndarray:
    """Row-wise cosine of two (n, d) sets of unit vectors (their dot product), float32."""
    return np.einsum("nd,nd->n", image_vectors.astype(np.float32), text_vectors.astype(np.float32))


class ClipAlignmentScorer:
    """Adds CLIP_IMAGE_EMBEDDING, CLIP_TEXT_EMBEDDING (unit vectors) and CLIP_COSINE of each
    (image, prompt) pair."""

    stage_name = STAGE_CLIP_ALIGNMENT
    resources = Resources(num_cpus=1, batch_size=64, actors=1)  # num_gpus: the caller's decision
    output_fields = CLIP_ALIGNMENT_COLUMNS  # what classify_tensor returns, for the generator
    takes_prompts = True                    # the generator passes the images' prompts

    def __init__(self, model: str = ALIGNMENT_MODEL, pretrained: str | None = ALIGNMENT_PRETRAINED,
                 device: str = "auto", batch_size: int = 64, revision: str | None = None):
        self.bundle = load_clip(model, pretrained, device, revision)
        self.batch_size = int(batch_size)
        self.record = {**self.bundle.record, "quantise": "rgb8 levels (round(x * 255)) before preprocessing"}

    # -- embeddings ----------------------------------------------------------------------------------

    def embed_tensor(self, images, norms: bool = False):
        """(B, d) float32 unit vectors of (B, 3, H, W) float images in [0, 1] on any device, after
        quantising them to the 8-bit levels their RGB8 payload holds; with ``norms``, also the
        (B,) norms of the raw features."""
        if images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"images must be (B, 3, H, W), got {tuple(images.shape)}")
        levels = rgb_levels(images).div_(255.0)
        return _unit_and_norm(encode_image_tensor(self.bundle, levels, self.batch_size), norms)

    def embed_texts(self, texts: list[str], norms: bool = False):
        """(n, d) float32 unit vectors of ``texts`` (and, with ``norms``, the raw features' norms);
        each distinct text is encoded once."""
        texts = list(texts)
        if not texts:
            empty = np.zeros((0, self.dim), np.float32)
            return (empty, np.zeros(0, np.float32)) if norms else empty
        unique, inverse = np.unique(np.asarray(texts, dtype=object).astype(str), return_inverse=True)
        unit, norm = _unit_and_norm(encode_texts(self.bundle, unique.tolist()), True)
        inverse = inverse.reshape(-1)
        return (unit[inverse], norm[inverse]) if norms else unit[inverse]

    @property
    def dim(self) -> int:
        model = self.bundle.model
        return int(getattr(model, "embed_dim", None) or model.text_projection.shape[-1])

    # -- the generator's hook ------------------------------------------------------------------------

    def classify_tensor(self, images, prompts) -> dict[str, np.ndarray]:
        """{CLIP_IMAGE_EMBEDDING: (B, d), CLIP_TEXT_EMBEDDING: (B, d), CLIP_COSINE: (B,)} of
        (B, 3, H, W) float images in [0, 1] on any device and their B prompts."""
        prompts = list(prompts)
        if len(prompts) != images.shape[0]:
            raise ValueError(f"{images.shape[0]} images but {len(prompts)} prompts")
        if any(p is None for p in prompts):
            raise ValueError("classify_tensor needs a prompt for every image")
        img, img_norm = self.embed_tensor(images, norms=True)
        txt, txt_norm = self.embed_texts(prompts, norms=True)
        return {CLIP_IMAGE_EMBEDDING: img, CLIP_TEXT_EMBEDDING: txt, CLIP_COSINE: row_cosines(img, txt),
                CLIP_IMAGE_NORM: img_norm, CLIP_TEXT_NORM: txt_norm}

    # -- payload batches -----------------------------------------------------------------------------

    def __call__(self, batch: pa.Table) -> pa.Table:
        if PROMPT not in batch.column_names:
            raise ValueError(f"{STAGE_CLIP_ALIGNMENT} reads the {PROMPT!r} column, which the batch lacks")
        n = batch.num_rows
        d = self.dim
        img = np.zeros((n, d), np.float32)
        img_norm = np.zeros(n, np.float32)
        img_ok = np.zeros(n, bool)
        dec = decode_rows(batch)
        if len(dec.rows):
            img[dec.rows], img_norm[dec.rows] = _unit_and_norm(
                encode_image_arrays(self.bundle, dec.arrays, self.batch_size), True)
            img_ok[dec.rows] = True
        prompts = batch.column(PROMPT).to_pylist()
        txt_ok = np.array([p is not None for p in prompts], bool)
        txt = np.zeros((n, d), np.float32)
        txt_norm = np.zeros(n, np.float32)
        if txt_ok.any():
            txt[txt_ok], txt_norm[txt_ok] = self.embed_texts([p for p in prompts if p is not None], norms=True)
        both = img_ok & txt_ok
        cos = row_cosines(img, txt)
        out = with_column(batch, CLIP_IMAGE_EMBEDDING, embedding_array(img, img_ok))
        out = with_column(out, CLIP_TEXT_EMBEDDING, embedding_array(txt, txt_ok))
        out = with_column(out, CLIP_COSINE, pa.array(cos, pa.float32(), mask=~both))
        out = with_column(out, CLIP_IMAGE_NORM, pa.array(img_norm, pa.float32(), mask=~img_ok))
        return with_column(out, CLIP_TEXT_NORM, pa.array(txt_norm, pa.float32(), mask=~txt_ok))


def _unit_and_norm(features, norms: bool):
    """Unit rows of raw features (``normalise``) and, with ``norms``, the rows' L2 norms."""
    if hasattr(features, "detach"):
        features = features.detach().float().cpu().numpy()
    raw = np.asarray(features, dtype=np.float32)
    unit = normalise(raw)
    return (unit, np.linalg.norm(raw, axis=1).astype(np.float32)) if norms else unit

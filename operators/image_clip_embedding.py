"""CLIP image embeddings, L2-normalised (paper 001, section 4; ViT-L/14 in section 6).

The GEP estimators compare images with texts and classify them in CLIP's shared space, so the
durable result of the image side is one L2-normalised embedding per image: the estimators (and
new attribute lists) then run on stored embeddings without regenerating anything.

Generated images are embedded from the generator's output tensor on its device
(``classify_tensor``, the generator's hook), decoded images from their payload (``__call__``);
both go through the preprocessing of ``operators.image_clip_gender`` (open_clip's eval
transform in torch ops). Reads IMAGE (+ IMAGE_ENCODING / IMAGE_HEIGHT / IMAGE_WIDTH); adds
``schemas.gep.EMBEDDING`` (null where there is no image or it does not decode).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from operators.base import Resources, with_column
from operators.support.clip import (DEFAULT_MODEL, DEFAULT_PRETRAINED, encode_image_arrays, encode_image_batch,
                                   encode_texts, load_clip)
from operators.support.codec import decode_rows
from operators.support.disparity import unit_similarities
from schemas.exposed import Space
from schemas.gep import EMBEDDING, EMBEDDING_COLUMNS

STAGE_CLIP_EMBED = "clip_embed"
# the CLIP of the image-space disparity (paper 004, App. A: CLIP ViT-B/32, OpenAI's weights)
DISPARITY_MODEL = "ViT-B-32"
DISPARITY_PRETRAINED = "openai"


def normalise(features) -> np.ndarray:
    """Rows scaled to unit L2 norm, as float32 numpy (a zero row stays zero)."""
    if hasattr(features, "detach"):
        features = features.detach().float().cpu().numpy()
    x = np.asarray(features, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"features must be (n, d), got shape {x.shape}")
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norm, 1e-12)


def embedding_array(vectors: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
    """A list<float32> column from (n, d) vectors; rows where ``valid`` is False are null."""
    n, d = vectors.shape
    values = pa.array(np.ascontiguousarray(vectors, np.float32).reshape(-1), pa.float32())
    offsets = pa.array(np.arange(0, (n + 1) * d, d, dtype=np.int32), pa.int32())
    mask = None if valid is None else pa.array(~np.asarray(valid, bool))
    return pa.ListArray.from_arrays(offsets, values, mask=mask)


def embeddings_of(column) -> tuple[np.ndarray, np.ndarray]:
    """(n, d) float32 vectors of a list<float32> column (zero rows where null) and the valid mask."""
    col = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    valid = np.asarray(pc.is_valid(col)) if len(col) else np.zeros(0, bool)
    if not valid.any():
        return np.zeros((len(col), 0), np.float32), valid
    lengths = np.asarray(pc.fill_null(pc.list_value_length(col), 0))
    d = int(lengths[valid][0])
    if (lengths[valid] != d).any():
        raise ValueError(f"{EMBEDDING}: embeddings of different lengths in one column")
    out = np.zeros((len(col), d), np.float32)
    out[valid] = np.asarray(pc.list_flatten(col.filter(pa.array(valid))), np.float32).reshape(-1, d)
    return out, valid


class ClipImageEmbedder:
    """Adds EMBEDDING: the L2-normalised CLIP image embedding of each row's image."""

    stage_name = STAGE_CLIP_EMBED
    resources = Resources(num_cpus=1, batch_size=64, actors=1)
    output_fields = EMBEDDING_COLUMNS   # what classify_tensor returns, for the generator
    unmeasured = "no_embedding"         # the run summary's reason for a generated image without one
    spaces = (Space.CLIP,)              # as a disparity head (operators.support.disparity)

    def __init__(self, model: str = DEFAULT_MODEL, pretrained: str | None = DEFAULT_PRETRAINED,
                 device: str = "auto", batch_size: int = 64, revision: str | None = None):
        self.bundle = load_clip(model, pretrained, device, revision)
        self.batch_size = int(batch_size)
        self.record = dict(self.bundle.record)

    def embed_tensor(self, images) -> np.ndarray:
        """(B, d) float32 unit vectors of (B, 3, H, W) float images in [0, 1] on any device."""
        return normalise(encode_image_batch(self.bundle, images, self.batch_size))

    def classify_tensor(self, images) -> dict:
        """The generator's hook: {EMBEDDING: (B, d) unit vectors}."""
        return {EMBEDDING: self.embed_tensor(images)}

    def triplet_similarities(self, images) -> dict:
        """The disparity-head hook (paper 004, section 4: CLIP): {CLIP: (U, 3) float64 cosines of
        the image embeddings, PAIRS order} of (U, 3, 3, H, W) float images in [0, 1] on any device.
        Paper 004 uses CLIP ViT-B/32 with OpenAI's weights (DISPARITY_MODEL / DISPARITY_PRETRAINED)."""
        return unit_similarities(images, Space.CLIP, self.embed_tensor)

    def embed_texts(self, texts: list[str]) -> np.ndarray:
        """(n, d) float32 unit vectors of ``texts`` (the same CLIP)."""
        return normalise(encode_texts(self.bundle, list(texts)))

    def __call__(self, batch: pa.Table) -> pa.Table:
        n = batch.num_rows
        vectors = None
        valid = np.zeros(n, bool)
        dec = decode_rows(batch)
        if len(dec.rows):
            feats = normalise(encode_image_arrays(self.bundle, dec.arrays, self.batch_size))
            vectors = np.zeros((n, feats.shape[1]), np.float32)
            vectors[dec.rows] = feats
            valid[dec.rows] = True
        if vectors is None:
            column = pa.nulls(n, EMBEDDING_COLUMNS.field(EMBEDDING).type)
        else:
            column = embedding_array(vectors, valid)
        return with_column(batch, EMBEDDING, column)

"""Split-product: the patch-level image-space disparity (paper 004, section 4 and App. A).

"Additionally, we adopt split-product (Somepalli et al. 2023), computing the maximum cosine
similarity among corresponding patches between image pairs." App. A: "For split-product
(Somepalli et al. 2023), we use DINO-b8 (Caron et al. 2021) following the default configuration."

The project's reading, for the two images of a pair:

1. DINO ViT-B/8 (``facebook/dino-vitb8``, a transformers ``ViTModel`` without pooling layer,
   preprocessed as its image processor says: ``operators.image_backbone_disparity``) gives the
   last layer's tokens after the final layer norm; the class token is dropped and the patch
   tokens are laid out on their (h, w) grid (28 x 28 at 224 pixels and patch 8);
2. the grid is split into ``chunks`` x ``chunks`` equal spatial chunks (``chunks`` must divide
   both sides), each flattened to one vector (its tokens in row-major order, then the channels)
   and L2-normalised; ``chunks=None`` (the default) makes every patch token its own chunk;
3. the cosine of each pair of corresponding chunks (same grid position in both images) is
   computed, and the pair's similarity is the largest of them. ``chunks=1`` is the plain cosine
   of the whole flattened patch-token grid.

Why one chunk per patch token by default: in Somepalli et al.'s code (github.com/somepago/DCR,
``diff_retrieval.py`` with ``--similarity_metric splitloss``), the "default configuration" for a
DINO ViT takes the model's full token output, flattens it, and splits it into as many chunks as
there are tokens (``num_loss_chunks`` is set to the number of tokens), so each chunk is one
token's feature; the similarity is the maximum over chunks of the chunk products. This head
follows that chunking and the paper's wording ("maximum cosine similarity among corresponding
patches"), with three documented differences from that code:

- each chunk is L2-normalised on its own (a cosine per patch, as paper 004 says); DCR normalises
  the whole flattened vector once, so its per-chunk products are about 1/(number of tokens)
  of a cosine, whereas paper 004's split-product values (0.95-0.97, Table 3) are cosines;
- the class token is not a chunk (DCR's token output includes it); its cosine is the DINO-space
  similarity of ViT-B/8, far below the best patch's in practice, so the maximum is unaffected;
- preprocessing is the checkpoint's image processor (resize to 224 x 224, bilinear, ImageNet
  mean and std), where DCR resizes to 256, center-crops 224 and normalises with mean = std = 0.5.

Everything runs on the images' device; cosines and the maximum are computed in float64.
"""

from __future__ import annotations

import numpy as np

from operators.base import Resources
from operators.image_backbone_disparity import (
    ARCH_VIT,
    fixed_output_size,
    load_backbone,
    run_backbone,
)
from operators.support.disparity import PAIR_INDEX, unit_similarities
from schemas.exposed import Space

STAGE_SPLIT_PRODUCT = "split_product"
DEFAULT_MODEL = "facebook/dino-vitb8"


def patch_grid(tokens, grid: tuple[int, int]):
    """(B, 1 + h*w, D) ViT tokens (class token first) -> (B, h, w, D) patch tokens on their grid."""
    gh, gw = grid
    if tokens.shape[1] != 1 + gh * gw:
        raise ValueError(f"expected 1 + {gh}x{gw} tokens, got {tokens.shape[1]}")
    return tokens[:, 1:].reshape(tokens.shape[0], gh, gw, tokens.shape[-1])


def chunk_vectors(grid_tokens, chunks: int | None):
    """(B, h, w, D) -> (B, n_chunks, L) float64 unit vectors: the grid split into ``chunks`` x
    ``chunks`` equal spatial chunks (row-major), each flattened and L2-normalised; ``chunks=None``:
    one chunk per patch token."""
    import torch  # deferred: torch

    b, gh, gw, d = grid_tokens.shape
    x = grid_tokens.to(torch.float64)
    if chunks is None:
        x = x.reshape(b, gh * gw, d)
    else:
        if gh % chunks or gw % chunks:
            raise ValueError(f"chunks={chunks} does not divide the {gh}x{gw} patch grid")
        x = x.reshape(b, chunks, gh // chunks, chunks, gw // chunks, d).permute(0, 1, 3, 2, 4, 5)
        x = x.reshape(b, chunks * chunks, -1)
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def chunk_cosines(unit_chunks):
    """(U, 3, n_chunks, L) unit chunk vectors -> (U, 3 pairs, n_chunks) cosines, PAIRS order."""
    import torch  # deferred: torch

    return torch.stack([(unit_chunks[:, i] * unit_chunks[:, j]).sum(-1) for i, j in PAIR_INDEX], dim=1)


def split_product(unit_chunks) -> np.ndarray:
    """(U, 3) float64: for each pair, the largest cosine over corresponding chunks."""
    return chunk_cosines(unit_chunks).amax(dim=-1).cpu().numpy().astype(np.float64)


class SplitProductDisparity:
    """Disparity head: split-product of DINO ViT-B/8 patch tokens for each pair of a unit."""

    stage_name = STAGE_SPLIT_PRODUCT
    resources = Resources(num_cpus=1, batch_size=16, actors=1)
    spaces = (Space.SPLIT_PRODUCT,)

    def __init__(self, model: str = DEFAULT_MODEL, revision: str | None = None, device: str = "auto",
                 dtype: str = "auto", batch_size: int = 16, chunks: int | None = None):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if chunks is not None and (int(chunks) != chunks or chunks < 1):
            raise ValueError(f"chunks must be a positive integer or None (one chunk per patch token), got {chunks}")
        self.chunks = None if chunks is None else int(chunks)
        self.batch_size = int(batch_size)
        self.bundle = load_backbone(model, ARCH_VIT, revision, device, dtype)
        self.device = self.bundle.device
        size = fixed_output_size(self.bundle.settings)
        patch = int(self.bundle.model.config.patch_size)
        self.grid = (size[0] // patch, size[1] // patch)
        if self.chunks is not None and (self.grid[0] % self.chunks or self.grid[1] % self.chunks):
            raise ValueError(f"chunks={self.chunks} does not divide {model}'s {self.grid[0]}x{self.grid[1]} patch grid")
        n_chunks = self.grid[0] * self.grid[1] if self.chunks is None else self.chunks ** 2
        self.record = {
            "stage": self.stage_name, "space": Space.SPLIT_PRODUCT,
            "feature": "last layer's patch tokens after the final layer norm (class token dropped), on their grid",
            "grid": list(self.grid),
            "chunks": "one per patch token" if self.chunks is None else f"{self.chunks}x{self.chunks} spatial chunks",
            "n_chunks": n_chunks,
            "similarity": "max over corresponding chunks of the cosine of the flattened, L2-normalised chunks",
            "batch_size": self.batch_size,
            **self.bundle.record,
        }

    def tokens(self, images):
        """(B, 1 + h*w, D) float32 last-layer tokens of (B, 3, H, W) float images in [0, 1]."""
        return run_backbone(self.bundle, images, self.batch_size, lambda o: o.last_hidden_state)

    def chunk_features(self, images):
        """(B, n_chunks, L) float64 unit chunk vectors of (B, 3, H, W) float images in [0, 1]."""
        return chunk_vectors(patch_grid(self.tokens(images), self.grid), self.chunks)

    def triplet_similarities(self, images) -> dict[str, np.ndarray]:
        """{SPLIT_PRODUCT: (U, 3) float64 in PAIRS order} of (U, 3, 3, H, W) float images in [0, 1]."""
        return unit_similarities(images, Space.SPLIT_PRODUCT, self.chunk_features, split_product)

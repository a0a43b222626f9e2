"""Split-product (paper 004, section 4; Somepalli et al. 2023) with a tiny random DINO-style ViT/8
saved with save_pretrained and loaded through the production loader: the chunking, its limits
(one chunk = the plain cosine; the maximum over chunks), and the head's contract."""

import logging
import warnings

import numpy as np
import pytest
import torch

from operators.image_split_product import (
    DEFAULT_MODEL,
    SplitProductDisparity,
    chunk_vectors,
    patch_grid,
)
from operators.support.disparity import PAIR_INDEX, pair_cosines
from operators.support.models import ModelLoadError
from pipelines.standins.vision import build_tiny_dino, build_tiny_resnet
from schemas.exposed import Space

SP = Space.SPLIT_PRODUCT


@pytest.fixture(scope="module")
def dino8(tmp_path_factory):
    torch.set_num_threads(1)
    return build_tiny_dino(tmp_path_factory.mktemp("dino8"), patch_size=8)   # 64 px: an 8 x 8 grid


@pytest.fixture(scope="module")
def head(dino8):
    return SplitProductDisparity(dino8, device="cpu")


def units(u=2, size=72, seed=0):
    return torch.rand((u, 3, 3, size, size), generator=torch.Generator().manual_seed(seed))


def grid_tokens(head, x):
    """(U, 3, 8, 8, D) float64 patch tokens of (U, 3, 3, H, W) images, straight from the model."""
    u = x.shape[0]
    tokens = head.tokens(x.reshape(u * 3, *x.shape[2:]))
    assert tokens.shape[1] == 1 + 64
    return tokens[:, 1:].reshape(u, 3, 8, 8, -1).double()


def test_standin_loads_without_warnings_and_records_the_reading(dino8):
    heard = []

    class Listen(logging.Handler):
        def emit(self, record):
            heard.append(record.getMessage())

    listener = Listen(logging.WARNING)
    logging.getLogger("transformers").addHandler(listener)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            h = SplitProductDisparity(dino8, device="cpu", chunks=2)
    finally:
        logging.getLogger("transformers").removeHandler(listener)
    assert heard == [] and [str(w.message) for w in caught] == []
    assert h.grid == (8, 8) and h.record["n_chunks"] == 4 and h.record["patch_size"] == 8
    assert h.record["model_class"] == "ViTModel" and "random weights" in h.record["standin"]
    assert SplitProductDisparity.spaces == (SP,) and SplitProductDisparity.stage_name == "split_product"
    assert DEFAULT_MODEL == "facebook/dino-vitb8"


def test_default_is_one_chunk_per_patch_token(head):
    assert head.chunks is None and head.record["n_chunks"] == 64
    assert head.record["chunks"] == "one per patch token"


def test_chunks_are_spatial_blocks_in_row_major_order():
    # token (r, c) carries its position: chunk k of a 2 x 2 split must hold exactly its block
    gh = gw = 4
    pos = torch.stack(torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij"), -1).double() + 1.0
    tokens = torch.cat([torch.zeros(1, 1, 2), pos.reshape(1, gh * gw, 2)], dim=1)   # class token first
    grid = patch_grid(tokens, (gh, gw))
    assert grid.shape == (1, 4, 4, 2) and torch.equal(grid[0, 2, 3], torch.tensor([3.0, 4.0], dtype=torch.float64))
    chunks = chunk_vectors(grid, 2)
    assert chunks.shape == (1, 4, 8)
    blocks = [(0, 0), (0, 2), (2, 0), (2, 2)]                 # top-left, top-right, bottom-left, bottom-right
    for k, (r0, c0) in enumerate(blocks):
        expected = pos[r0:r0 + 2, c0:c0 + 2].reshape(-1)
        torch.testing.assert_close(chunks[0, k], expected / expected.norm())
    per_token = chunk_vectors(grid, None)
    assert per_token.shape == (1, 16, 2)
    torch.testing.assert_close(per_token[0, 7], pos[1, 3] / pos[1, 3].norm())
    with pytest.raises(ValueError):
        chunk_vectors(grid, 3)
    with pytest.raises(ValueError):
        patch_grid(tokens[:, :-1], (gh, gw))


def test_one_chunk_is_the_plain_cosine_of_the_whole_token_grid(dino8):
    one = SplitProductDisparity(dino8, device="cpu", chunks=1)
    x = units(2, seed=3)
    out = one.triplet_similarities(x)[SP]
    plain = pair_cosines(grid_tokens(one, x))                    # flattened (8, 8, D) grids, cosine
    np.testing.assert_allclose(out, plain, rtol=0, atol=1e-9)
    assert np.all(out < 1 - 1e-4)


@pytest.mark.parametrize("chunks", [None, 2, 4])
def test_the_score_is_the_largest_corresponding_chunk_cosine(dino8, chunks):
    h = SplitProductDisparity(dino8, device="cpu", chunks=chunks)
    x = units(2, seed=4)
    out = h.triplet_similarities(x)[SP]
    grids = grid_tokens(h, x)
    side = 1 if chunks is None else 8 // chunks               # chunk side in tokens
    for k, (i, j) in enumerate(PAIR_INDEX):
        cosines = []
        for r in range(0, 8, side):
            for c in range(0, 8, side):
                a = grids[:, i, r:r + side, c:c + side].reshape(2, -1)
                b = grids[:, j, r:r + side, c:c + side].reshape(2, -1)
                cosines.append(torch.nn.functional.cosine_similarity(a, b, dim=-1))
        cosines = torch.stack(cosines, dim=1).numpy()         # (U, n_chunks)
        assert cosines.shape[1] == (64 if chunks is None else chunks ** 2)
        assert np.all(out[:, k][:, None] >= cosines - 1e-9)   # >= every per-chunk cosine
        np.testing.assert_allclose(out[:, k], cosines.max(axis=1), rtol=0, atol=1e-9)
        assert np.all(cosines.min(axis=1) < out[:, k] - 1e-6)  # the chunks do differ


def test_identical_images_give_one_and_outputs_follow_pairs_order(head):
    x = units(2, seed=5)
    same = x.clone()
    same[:, 1] = same[:, 0]
    same[:, 2] = same[:, 0]
    np.testing.assert_allclose(head.triplet_similarities(same)[SP], 1.0, rtol=0, atol=1e-6)
    out = head.triplet_similarities(x)[SP]
    assert out.shape == (2, 3) and out.dtype == np.float64
    assert abs(out[0, 0] - out[0, 1]) > 1e-6
    swapped = head.triplet_similarities(x[:, [0, 2, 1]])[SP]   # feminine <-> masculine
    np.testing.assert_allclose(swapped, out[:, [1, 0, 2]], rtol=0, atol=1e-9)
    assert head.triplet_similarities(torch.zeros((0, 3, 3, 64, 64)))[SP].shape == (0, 3)


def test_bad_settings_and_missing_models(dino8, tmp_path):
    with pytest.raises(ValueError, match="does not divide"):
        SplitProductDisparity(dino8, device="cpu", chunks=3)
    with pytest.raises(ValueError):
        SplitProductDisparity(dino8, device="cpu", chunks=0)
    with pytest.raises(ModelLoadError, match="save_pretrained"):
        SplitProductDisparity(str(tmp_path / "nowhere"), device="cpu")
    with pytest.raises(ModelLoadError, match="not a 'vit'"):
        SplitProductDisparity(build_tiny_resnet(tmp_path / "resnet"), device="cpu")

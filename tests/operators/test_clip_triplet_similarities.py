"""The CLIP image space of paper 004 (section 4): ClipImageEmbedder as a disparity head, on a tiny
random open_clip saved to a temp dir and loaded through the production path."""

import numpy as np
import pytest
import torch

from operators.image_clip_embedding import (
    DISPARITY_MODEL,
    DISPARITY_PRETRAINED,
    ClipImageEmbedder,
)
from operators.support.clip import clip_architecture
from operators.support.disparity import PAIR_INDEX
from pipelines.standins.clip import build_tiny_open_clip
from schemas.exposed import Space


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    torch.set_num_threads(1)
    return ClipImageEmbedder(build_tiny_open_clip(tmp_path_factory.mktemp("clip")), None, device="cpu", batch_size=4)


def units(u=2, size=72, seed=0):
    return torch.rand((u, 3, 3, size, size), generator=torch.Generator().manual_seed(seed))


def test_it_is_a_clip_disparity_head(embedder):
    assert ClipImageEmbedder.spaces == (Space.CLIP,)
    # paper 004, App. A: CLIP ViT-B/32 with OpenAI's weights, built with their QuickGELU
    assert (DISPARITY_MODEL, DISPARITY_PRETRAINED) == ("ViT-B-32", "openai")
    assert clip_architecture(DISPARITY_MODEL, DISPARITY_PRETRAINED)[1] == "QuickGELU"


def test_identical_images_have_cosine_one(embedder):
    x = units(2)
    x[:, 1] = x[:, 0]
    x[:, 2] = x[:, 0]
    out = embedder.triplet_similarities(x)
    assert set(out) == {Space.CLIP}
    np.testing.assert_allclose(out[Space.CLIP], 1.0, rtol=0, atol=1e-6)


def test_pair_cosines_of_the_embeddings_in_pairs_order(embedder):
    x = units(3, seed=1)
    out = embedder.triplet_similarities(x)[Space.CLIP]
    assert out.shape == (3, 3) and out.dtype == np.float64
    for u in range(3):
        emb = embedder.embed_tensor(x[u]).astype(np.float64)      # one unit at a time
        for k, (i, j) in enumerate(PAIR_INDEX):
            assert out[u, k] == pytest.approx(emb[i] @ emb[j] / np.linalg.norm(emb[i]) / np.linalg.norm(emb[j]),
                                              abs=1e-5)
    assert abs(out[0, 0] - out[0, 1]) > 1e-5                      # the columns can be told apart
    swapped = embedder.triplet_similarities(x[:, [0, 2, 1]])[Space.CLIP]   # feminine <-> masculine
    np.testing.assert_allclose(swapped, out[:, [1, 0, 2]], rtol=0, atol=1e-5)


def test_empty_and_malformed_batches(embedder):
    assert embedder.triplet_similarities(torch.zeros((0, 3, 3, 64, 64)))[Space.CLIP].shape == (0, 3)
    with pytest.raises(ValueError):
        embedder.triplet_similarities(torch.zeros((2, 2, 3, 64, 64)))

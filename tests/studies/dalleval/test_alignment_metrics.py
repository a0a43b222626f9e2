"""Image-text alignment and image quality measures of DALL-Eval (paper 000, App. D.1-D.2, Table 19):
CLIP R-precision, CLIPScore and FID from stored vectors."""

import numpy as np
import pytest
import scipy.linalg
from scipy.stats import binom

from pipelines.studies.dalleval import alignment_metrics as A


def unit(rng, n, d):
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


# --- R-precision --------------------------------------------------------------------------------------


def test_r_precision_is_100_when_images_and_captions_embed_alike():
    emb = unit(np.random.default_rng(0), 500, 32)
    out = A.r_precision(emb, emb)
    assert out == {"r_precision": 100.0, "n": 500, "negatives": 99, "hits": 500, "r": 1}


@pytest.mark.parametrize("r", [1, 5])
def test_r_precision_of_unrelated_embeddings_is_chance(r):
    rng = np.random.default_rng(1)
    n, negatives = 3000, 99
    out = A.r_precision(unit(rng, n, 64), unit(rng, n, 64), negatives=negatives, r=r, seed=3)
    assert out["n"] == n and out["negatives"] == negatives
    p = r / (1 + negatives)  # the true caption's rank is uniform among 1 + negatives
    lo, hi = binom.interval(1 - 1e-6, n, p)
    assert lo <= out["hits"] <= hi
    assert out["r_precision"] == pytest.approx(100.0 * out["hits"] / n)


def test_r_precision_is_seeded():
    rng = np.random.default_rng(2)
    img, txt = unit(rng, 400, 16), unit(rng, 400, 16)
    assert A.r_precision(img, txt, seed=7) == A.r_precision(img, txt, seed=7)


def test_negatives_exclude_captions_with_the_true_text_and_ties_are_misses():
    # 5 texts, each the caption of two images; equal texts embed equally, and each image embeds
    # as its caption: the image's duplicate caption ties with the true one
    rng = np.random.default_rng(3)
    captions = [t for t in "abcde" for _ in range(2)]
    by_text = dict(zip("abcde", unit(rng, 5, 8)))
    emb = np.stack([by_text[c] for c in captions])
    with_texts = A.r_precision(emb, emb, captions=captions)
    assert with_texts["negatives"] == 8 and with_texts["r_precision"] == 100.0
    # without the texts the duplicate is a negative (all 9 other rows are drawn): a tie, never a hit
    without = A.r_precision(emb, emb)
    assert without["negatives"] == 9 and without["hits"] == 0
    # with r = 2 the one tied negative ranks first and the true caption second: a hit
    assert A.r_precision(emb, emb, r=2)["hits"] == 10


@pytest.mark.parametrize("method", ["keys", "rejection"])
def test_drawn_negatives_are_distinct_admissible_and_uniform(method):
    n, k = 400, 50
    captions = [f"c{i}" for i in range(n)]
    captions[1] = captions[0]  # rows 0 and 1 share a text
    neg = A.draw_negatives(n, k, captions=captions, seed=5, method=method)
    assert neg.shape == (n, k) and neg.dtype == np.int64
    assert all(len(set(row)) == k for row in neg.tolist())
    assert not (neg == np.arange(n)[:, None]).any()
    assert 1 not in neg[0] and 0 not in neg[1]
    # every caption is drawn about k times in all (each image picks k of its ~n - 1 others)
    counts = np.bincount(neg.reshape(-1), minlength=n)
    sd = np.sqrt(k * (1 - k / (n - 1)))
    assert np.abs(counts - k).max() < 6 * sd
    assert np.array_equal(neg, A.draw_negatives(n, k, captions=captions, seed=5, method=method))


def test_negatives_per_image_is_capped_by_the_smallest_pool():
    assert A.negatives_per_image(10, 99) == 9
    assert A.negatives_per_image(10, 4) == 4
    assert A.negatives_per_image(6, 99, captions=list("aaabbc")) == 3
    assert A.draw_negatives(6, 99, captions=list("aaabbc")).shape == (6, 3)


def test_r_precision_rejects_mismatched_inputs():
    rng = np.random.default_rng(4)
    with pytest.raises(ValueError, match="shape"):
        A.r_precision(unit(rng, 5, 8), unit(rng, 6, 8))
    with pytest.raises(ValueError, match="captions"):
        A.r_precision(unit(rng, 5, 8), unit(rng, 5, 8), captions=["a"] * 4)
    with pytest.raises(ValueError, match="negative"):
        A.r_precision(unit(rng, 3, 8), unit(rng, 3, 8), captions=["a"] * 3)


# --- CLIPScore ----------------------------------------------------------------------------------------


def test_clip_score_of_known_cosines():
    out = A.clip_score([0.3, -0.2, 0.5, np.nan])
    assert out["n"] == 3
    assert out["clip_score"] == pytest.approx(2.5 * (0.3 + 0.0 + 0.5) / 3)
    assert out["clip_score_100"] == pytest.approx(100 * (0.3 + 0.0 + 0.5) / 3)
    assert A.clip_score([0.4], w=1.0)["clip_score"] == pytest.approx(0.4)
    assert A.clip_score([])["n"] == 0


# --- FID ----------------------------------------------------------------------------------------------


def frechet(mu1, s1, mu2, s2):
    covmean = scipy.linalg.sqrtm(s1 @ s2).real
    return float(((mu1 - mu2) ** 2).sum() + np.trace(s1) + np.trace(s2) - 2 * np.trace(covmean))


def test_fid_matches_the_closed_form_of_two_gaussians():
    # diagonal covariances: FID = ||mu1 - mu2||^2 + sum (sqrt(a) - sqrt(b))^2
    rng = np.random.default_rng(6)
    n = 20000
    mu1, mu2 = np.zeros(4), np.array([1.0, 0.5, 0.0, -0.5])
    a, b = np.array([1.0, 2.0, 0.5, 1.0]), np.array([2.0, 1.0, 0.5, 3.0])
    gen = mu1 + rng.standard_normal((n, 4)) * np.sqrt(a)
    ref = mu2 + rng.standard_normal((n, 4)) * np.sqrt(b)
    out = A.fid(gen, ref)
    assert (out["n_generated"], out["n_reference"], out["dims"]) == (n, n, 4)
    population = ((mu1 - mu2) ** 2).sum() + ((np.sqrt(a) - np.sqrt(b)) ** 2).sum()  # 2.379
    # sampling sd of the estimate at n = 20000 is ~0.03 (20 seeds); 0.15 is ~5 sd
    assert out["fid"] == pytest.approx(population, abs=0.15)


def test_fid_equals_the_frechet_distance_of_the_samples_own_moments():
    rng = np.random.default_rng(7)
    d = 6
    ga, gb = rng.standard_normal((d, d)), rng.standard_normal((d, d))
    gen = rng.standard_normal((500, d)) @ ga + 0.3
    ref = rng.standard_normal((700, d)) @ gb - 0.2
    expected = frechet(gen.mean(0), np.cov(gen, rowvar=False), ref.mean(0), np.cov(ref, rowvar=False))
    assert A.fid(gen, ref)["fid"] == pytest.approx(expected, rel=1e-6)
    # float32 features (as stored) go through float64 alike
    g32, r32 = gen.astype(np.float32), ref.astype(np.float32)
    g64, r64 = g32.astype(np.float64), r32.astype(np.float64)
    expected32 = frechet(g64.mean(0), np.cov(g64, rowvar=False), r64.mean(0), np.cov(r64, rowvar=False))
    assert A.fid(g32, r32)["fid"] == pytest.approx(expected32, rel=1e-6)


def test_fid_of_a_set_with_itself_is_zero():
    x = np.random.default_rng(8).standard_normal((300, 16)) * 3 + 1
    assert abs(A.fid(x, x)["fid"]) < 1e-8 * np.trace(np.cov(x, rowvar=False))


def test_fid_rejects_too_few_rows_and_mismatched_dims():
    x = np.zeros((5, 3))
    with pytest.raises(ValueError, match="at least 2 generated"):
        A.fid(x[:1], x)
    with pytest.raises(ValueError, match="at least 2 reference"):
        A.fid(x, x[:1])
    with pytest.raises(ValueError, match="dims"):
        A.fid(x, np.zeros((5, 4)))


# ------------------------------------------------ the released code's R-precision (an option)
def test_released_r_precision_ranks_raw_dot_products_not_cosines():
    # image 0 is closest in angle to its own caption, but caption 1's raw feature is 10x longer
    img = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
    txt = np.array([[1.0, 0.0], [0.8, 0.6]], np.float32)
    project = A.r_precision(img, txt, negatives=1, seed=0)
    assert project["hits"] == 2                           # by cosine both images find their caption
    rel = A.r_precision_released(img, txt, [1.0, 1.0], [1.0, 10.0], negatives=50, repeats=5, seed=0)
    # image 0 misses whenever caption 1 is among its 50 draws (almost surely); image 1 always hits
    assert rel["r_precision"] == pytest.approx(50.0) and len(rel["per_repeat"]) == 5
    same = A.r_precision_released(img, txt, [1.0, 1.0], [1.0, 1.0], negatives=50, repeats=5, seed=0)
    assert same["r_precision"] == 100.0                   # with equal norms it is the cosine ranking again


def test_released_r_precision_counts_a_tie_as_a_hit_and_may_draw_the_positive():
    # two images with identical captions' embeddings: a tie at the top for both
    img = np.array([[1.0, 0.0], [1.0, 0.0]], np.float32)
    txt = np.array([[1.0, 0.0], [1.0, 0.0]], np.float32)
    ones = np.ones(2, np.float32)
    assert A.r_precision_released(img, txt, ones, ones, negatives=99, repeats=3)["r_precision"] == 100.0
    with pytest.raises(ValueError):                      # the project's reading: a tie is a miss, and
        A.r_precision(img, txt, captions=["a dog", "a dog"])   # equal texts are never negatives
    assert A.r_precision(img, txt, captions=["a dog", "the dog"], negatives=1)["hits"] == 0
    # one image: its only possible negative is its own caption (drawn with replacement)
    one = A.r_precision_released(img[:1], txt[:1], [1.0], [1.0], negatives=99, repeats=2)
    assert one["r_precision"] == 100.0 and one["n"] == 1


def test_released_r_precision_is_the_mean_of_seeded_repeats():
    rng = np.random.default_rng(3)
    img, txt = rng.normal(size=(60, 16)), rng.normal(size=(60, 16))
    n_i, n_t = rng.uniform(0.5, 2, 60), rng.uniform(0.5, 2, 60)
    a = A.r_precision_released(img, txt, n_i, n_t, negatives=9, repeats=5, seed=7)
    assert a == A.r_precision_released(img, txt, n_i, n_t, negatives=9, repeats=5, seed=7)
    assert a["r_precision"] == pytest.approx(np.mean(a["per_repeat"]))
    assert len(set(a["per_repeat"])) > 1                  # independent draws per repeat
    # each repeat recomputed by hand: raw features, draws with replacement, strict "beaten"
    rng2 = np.random.default_rng(7)
    f32 = np.float32
    ri = (img / np.linalg.norm(img, axis=1, keepdims=True)).astype(f32) * n_i.astype(f32)[:, None]
    rt = (txt / np.linalg.norm(txt, axis=1, keepdims=True)).astype(f32) * n_t.astype(f32)[:, None]
    for value in a["per_repeat"]:
        neg = rng2.integers(0, 60, size=(60, 9), dtype=np.int64)
        sims = np.einsum("nd,nkd->nk", ri, rt[np.concatenate([np.arange(60)[:, None], neg], axis=1)])
        assert value == pytest.approx(100 * ((sims[:, 1:] > sims[:, :1]).sum(1) < 1).mean(), abs=1e-9)


# ------------------------------------------------ FID against precomputed statistics
def test_fid_from_statistics_equals_fid_against_the_features_they_summarise(tmp_path):
    rng = np.random.default_rng(0)
    gen, ref = rng.normal(size=(80, 5)), rng.normal(0.4, 1.3, size=(120, 5))
    mu, sigma = A.statistics(ref)
    np.savez(tmp_path / "ref.npz", mu=mu, sigma=sigma)
    loaded = A.load_statistics(str(tmp_path / "ref.npz"))
    f = A.fid_from_statistics(gen, *loaded)
    assert f["fid"] == pytest.approx(A.fid(gen, ref)["fid"], rel=1e-9) and f["n_reference"] is None
    np.savez(tmp_path / "bad.npz", m=mu)
    with pytest.raises(ValueError, match="mu"):
        A.load_statistics(str(tmp_path / "bad.npz"))
    with pytest.raises(ValueError, match="dims"):
        A.fid_from_statistics(gen[:, :4], mu, sigma)


def test_fid_from_statistics_refuses_a_square_root_with_an_imaginary_diagonal():
    """Statistics that are no covariance (here negative definite: a corrupt or mislabelled .npz)
    give a matrix square root with a large imaginary diagonal: an error, not its real part."""
    rng = np.random.default_rng(1)
    gen = rng.normal(size=(40, 4))
    with pytest.raises(ValueError, match="imaginary"):
        A.fid_from_statistics(gen, np.zeros(4), -np.eye(4))
    mu, sigma = A.statistics(rng.normal(size=(50, 4)))
    assert np.isfinite(A.fid_from_statistics(gen, mu, sigma)["fid"])

"""Image-text alignment and image quality measures of DALL-Eval (paper 000, App. D.1-D.2, Table 19),
computed from the vectors the alignment run stores (``schemas.alignment``). Pure functions: numpy,
and torch / torchmetrics for FID; no Ray, no models.

- CLIP R-precision (App. D.1, R = 1): each generated image is compared (cosine of the CLIP ViT-B/32
  embeddings) with its own caption and 99 random other captions; a hit when the true caption is
  ranked first. Here: the true caption must be strictly within the top ``r`` (a negative with an
  equal cosine ranks before it), negatives are drawn without replacement and seeded, and captions
  whose text equals the true caption's never serve as its negatives.
- The released code's reading (``r_precision_released``), an option: raw dot products of the
  unnormalised CLIP features; the 99 negatives drawn uniformly *with* replacement from all captions
  (the true caption may be among them); a tie at the top counts as a hit; the mean of 5 repeats.
- CLIPScore (Hessel et al. 2021): the mean of w * max(cos, 0) with w = 2.5; also the mean of
  100 * max(cos, 0), torchmetrics' CLIPScore convention.
- FID (App. D.2): the Fréchet distance between Gaussians fitted to the feature vectors of generated
  and reference images, ||mu_g - mu_r||^2 + Tr(S_g + S_r - 2 (S_g S_r)^(1/2)), computed by
  torchmetrics' FrechetInceptionDistance (float64) fed the stored feature matrices.
"""

from __future__ import annotations

import fsspec
import numpy as np

R_PRECISION_NEGATIVES = 99   # App. D.1: "1 positive, 99 random negatives"
R_PRECISION_R = 1
CLIPSCORE_W = 2.5            # Hessel et al. 2021
_CHUNK_ELEMENTS = 1 << 24    # (images x captions) cells held at once when drawing negatives
_GATHER_ELEMENTS = 1 << 21   # gathered caption-embedding values at once when scoring (cache-sized)
_FID_ROWS = 4096             # feature rows per torchmetrics update


def _unit_rows(x, name: str) -> np.ndarray:
    a = np.asarray(x, dtype=np.float32)
    if a.ndim != 2:
        raise ValueError(f"{name} must be (n, d), got shape {a.shape}")
    return a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)


def _caption_codes(captions, n: int) -> np.ndarray:
    """An integer per row, equal where the caption texts are equal (every row its own without texts)."""
    if captions is None:
        return np.arange(n, dtype=np.int64)
    texts = list(captions)
    if len(texts) != n:
        raise ValueError(f"{len(texts)} captions for {n} embeddings")
    if any(t is None for t in texts):
        raise ValueError("captions must not be null")
    return np.unique(np.asarray(texts, dtype=object).astype(str), return_inverse=True)[1].reshape(-1).astype(np.int64)


def negatives_per_image(n: int, negatives: int, captions=None) -> int:
    """How many negatives each of ``n`` images gets: ``negatives``, or fewer when the pool of other
    captions (other rows whose text differs from the true caption's) of some image is smaller."""
    codes = _caption_codes(captions, n)
    if n == 0:
        return 0
    pool = n - np.bincount(codes).max()  # the smallest number of admissible other captions
    return int(min(int(negatives), pool))


def _draw_by_keys(codes: np.ndarray, k: int, rng) -> np.ndarray:
    """k admissible rows per image: a random key per (image, caption), inadmissible ones +inf,
    the k smallest keys taken. O(n^2) work, chunked; exact for any pool size."""
    n = len(codes)
    out = np.zeros((n, k), np.int64)
    step = max(1, _CHUNK_ELEMENTS // n)
    for start in range(0, n, step):
        rows = np.arange(start, min(n, start + step))
        keys = rng.random((len(rows), n), dtype=np.float32)
        keys[codes[rows][:, None] == codes[None, :]] = np.inf  # the image's own caption and its duplicates
        out[rows] = np.argpartition(keys, k - 1, axis=1)[:, :k]
    return out


def _draw_by_rejection(codes: np.ndarray, k: int, rng) -> np.ndarray:
    """k admissible rows per image: draw rows uniformly with replacement, drop inadmissible ones
    and repeats, keep the first k distinct in draw order (a uniformly random k-subset of the
    admissible rows, as sequential sampling without replacement is). Rows that do not reach k
    are drawn again with twice as many draws. O(n k log k) work; for pools much larger than k."""
    n = len(codes)
    out = np.zeros((n, k), np.int64)
    todo = np.arange(n)
    draws_per_row = 2 * k + 32
    while len(todo):
        step = max(1, _CHUNK_ELEMENTS // draws_per_row)
        failed = []
        for start in range(0, len(todo), step):
            rows = todo[start:start + step]
            c = len(rows)
            draws = rng.integers(0, n, size=(c, draws_per_row), dtype=np.int64)
            order = np.argsort(draws, axis=1, kind="stable")  # equal values keep their draw order
            ranked = np.take_along_axis(draws, order, axis=1)
            first_sorted = np.ones_like(ranked, dtype=bool)
            first_sorted[:, 1:] = ranked[:, 1:] != ranked[:, :-1]
            first = np.empty_like(first_sorted)
            np.put_along_axis(first, order, first_sorted, axis=1)  # first occurrence, in draw order
            keep = first & (codes[draws] != codes[rows][:, None])
            rank = np.cumsum(keep, axis=1)
            done = rank[:, -1] >= k
            take = keep & (rank <= k) & done[:, None]
            out[rows[done]] = draws[take].reshape(-1, k)  # row-major: each done row gives exactly k
            failed.append(rows[~done])
        todo = np.concatenate(failed)
        draws_per_row *= 2
    return out


def draw_negatives(n: int, negatives: int = R_PRECISION_NEGATIVES, captions=None, seed: int = 0,
                   method: str = "auto") -> np.ndarray:
    """(n, k) int64 row indices of the negative captions of each of ``n`` images: for image i, k
    distinct rows j != i (and, with ``captions``, whose text differs from captions[i]) drawn
    uniformly without replacement; k = ``negatives_per_image``. Seeded and vectorised over chunks
    of images. ``method``: "keys" (random keys over all captions, exact for any pool, O(n^2)),
    "rejection" (draws with replacement, repeats dropped; O(n k log k)), or "auto": rejection when
    every image's pool of admissible captions is at least 4 k, else keys."""
    if negatives < 0:
        raise ValueError(f"negatives must be >= 0, got {negatives}")
    codes = _caption_codes(captions, n)
    k = negatives_per_image(n, negatives, captions)
    if k == 0:
        return np.zeros((n, 0), np.int64)
    rng = np.random.default_rng(seed)
    pool = n - int(np.bincount(codes).max())
    if method == "auto":
        method = "rejection" if pool >= 4 * k else "keys"
    if method == "keys":
        return _draw_by_keys(codes, k, rng)
    if method == "rejection":
        return _draw_by_rejection(codes, k, rng)
    raise ValueError(f"method must be 'auto', 'keys' or 'rejection', got {method!r}")


def r_precision(image_emb, text_emb, captions=None, negatives: int = R_PRECISION_NEGATIVES,
                r: int = R_PRECISION_R, seed: int = 0, per_image: bool = False) -> dict:
    """CLIP R-precision (paper 000, App. D.1) of n images with the embeddings of their own captions.

    ``image_emb`` and ``text_emb``: (n, d), row i of ``text_emb`` the caption image i was generated
    from (normalised here). Image i is scored against text_emb[i] and ``negatives`` other rows'
    captions (``draw_negatives``); a hit when fewer than ``r`` negatives have a cosine >= the true
    caption's (a tie does not count as a hit).

    Returns {r_precision: percent of hits, n: images scored, negatives: per image actually used,
    hits, r}; with ``per_image`` also ``per_image``: each image's 100 (hit) or 0, whose mean is
    the R-precision (the units of its interval).
    """
    img = _unit_rows(image_emb, "image_emb")
    txt = _unit_rows(text_emb, "text_emb")
    if img.shape != txt.shape:
        raise ValueError(f"image_emb {img.shape} and text_emb {txt.shape} differ in shape")
    if r < 1:
        raise ValueError(f"r must be >= 1, got {r}")
    n = img.shape[0]
    neg = draw_negatives(n, negatives, captions, seed)
    k = neg.shape[1]
    if n and k == 0:
        raise ValueError("R-precision needs at least one negative: fewer than two distinct captions")
    hit = np.zeros(n, bool)
    d = img.shape[1]
    step = max(1, _GATHER_ELEMENTS // max((k + 1) * d, 1))
    for start in range(0, n, step):
        rows = np.arange(start, min(n, start + step))
        # (c, 1 + k) cosines: the true caption first, then the negatives, in one float32 einsum
        cand = np.concatenate([rows[:, None], neg[rows]], axis=1)
        sims = np.einsum("cd,ckd->ck", img[rows], txt[cand])
        beaten = (sims[:, 1:] >= sims[:, :1]).sum(axis=1)
        hit[rows] = beaten < r
    hits = int(hit.sum())
    out = {"r_precision": 100.0 * hits / n if n else float("nan"), "n": int(n), "negatives": int(k),
           "hits": hits, "r": int(r)}
    if per_image:
        out["per_image"] = np.where(hit, 100.0, 0.0)
    return out


R_PRECISION_REPEATS = 5      # the released code: the mean of 5 repeats


def r_precision_released(image_emb, text_emb, image_norm, text_norm, negatives: int = R_PRECISION_NEGATIVES,
                         r: int = R_PRECISION_R, repeats: int = R_PRECISION_REPEATS, seed: int = 0,
                         per_image: bool = False) -> dict:
    """CLIP R-precision as the released DALL-Eval code computes it: each image's raw CLIP feature
    (unit vector x ``image_norm``) scored by dot product against the raw features of its own
    caption and ``negatives`` captions drawn uniformly with replacement from all n rows (its own
    possibly among them); a hit when fewer than ``r`` negatives score strictly higher (a tie at
    the top is a hit); the percentage of hits averaged over ``repeats`` independent draws.

    Returns {r_precision, n, negatives, r, repeats, per_repeat: [percent per repeat]}; with
    ``per_image`` also ``per_image``: each image's share of hits over the repeats x 100, whose mean
    is the R-precision (the units of its interval)."""
    img = _unit_rows(image_emb, "image_emb") * np.asarray(image_norm, np.float32).reshape(-1, 1)
    txt = _unit_rows(text_emb, "text_emb") * np.asarray(text_norm, np.float32).reshape(-1, 1)
    if img.shape != txt.shape:
        raise ValueError(f"image_emb {img.shape} and text_emb {txt.shape} differ in shape")
    if r < 1 or repeats < 1 or negatives < 1:
        raise ValueError(f"r ({r}), repeats ({repeats}) and negatives ({negatives}) must be >= 1")
    n, d = img.shape
    if n == 0:
        return {"r_precision": float("nan"), "n": 0, "negatives": int(negatives), "r": int(r),
                "repeats": int(repeats), "per_repeat": [], **({"per_image": np.zeros(0)} if per_image else {})}
    rng = np.random.default_rng(seed)
    per_repeat = []
    hit_count = np.zeros(n, np.int64)
    step = max(1, _GATHER_ELEMENTS // max((negatives + 1) * d, 1))
    for _ in range(int(repeats)):
        neg = rng.integers(0, n, size=(n, int(negatives)), dtype=np.int64)
        hits = 0
        for start in range(0, n, step):
            rows = np.arange(start, min(n, start + step))
            # the true caption first, scored in the same einsum as the negatives: a drawn positive
            # gets exactly its score (a tie), never a rounding-different one
            sims = np.einsum("cd,ckd->ck", img[rows], txt[np.concatenate([rows[:, None], neg[rows]], axis=1)])
            hit = (sims[:, 1:] > sims[:, :1]).sum(axis=1) < r
            hit_count[rows] += hit
            hits += int(hit.sum())
        per_repeat.append(100.0 * hits / n)
    out = {"r_precision": float(np.mean(per_repeat)), "n": int(n), "negatives": int(negatives), "r": int(r),
           "repeats": int(repeats), "per_repeat": per_repeat}
    if per_image:
        out["per_image"] = 100.0 * hit_count / int(repeats)
    return out


def clip_score(cosines, w: float = CLIPSCORE_W) -> dict:
    """CLIPScore of image-caption cosines (NaN entries, i.e. missing pairs, are left out).

    Returns {clip_score: mean of w * max(cos, 0) (Hessel et al. 2021, w = 2.5), clip_score_100:
    mean of 100 * max(cos, 0) (torchmetrics' convention), n}."""
    c = np.asarray(cosines, dtype=np.float64).reshape(-1)
    c = c[~np.isnan(c)]
    if not len(c):
        return {"clip_score": float("nan"), "clip_score_100": float("nan"), "n": 0}
    clipped = np.maximum(c, 0.0)
    return {"clip_score": float(np.mean(w * clipped)), "clip_score_100": float(np.mean(100.0 * clipped)),
            "n": int(len(c))}


def _identity_features(d: int):
    import torch  # deferred: torch

    class _StoredFeatures(torch.nn.Module):
        """The feature 'network' of torchmetrics' FID for features computed beforehand."""

        num_features = d

        def forward(self, x):
            return x

    return _StoredFeatures()


def statistics(features) -> tuple[np.ndarray, np.ndarray]:
    """(mu, sigma) of a feature matrix: the sample mean and covariance (n - 1), float64."""
    a = np.asarray(features, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] < 2:
        raise ValueError(f"statistics need an (n >= 2, d) matrix, got shape {a.shape}")
    return a.mean(axis=0), np.cov(a, rowvar=False)


def fid_from_statistics(gen_features, mu, sigma) -> dict:
    """FID of generated features against precomputed reference statistics (an .npz's mu and sigma,
    e.g. DM-GAN's coco_val.npz): ||mu_g - mu||^2 + Tr(S_g + S - 2 (S_g S)^(1/2)) in float64, the
    square root by scipy's sqrtm: 1e-6 added to both diagonals when it is not finite, its imaginary
    round-off dropped, an imaginary diagonal above 1e-3 an error (as DM-GAN's and pytorch-fid's code)."""
    from scipy import linalg  # deferred: scipy

    gen = np.asarray(gen_features, dtype=np.float64)
    if gen.ndim != 2 or gen.shape[0] < 2:
        raise ValueError(f"FID needs at least 2 generated feature rows, got shape {gen.shape}")
    mu, sigma = np.asarray(mu, np.float64).reshape(-1), np.asarray(sigma, np.float64)
    if sigma.shape != (len(mu), len(mu)) or gen.shape[1] != len(mu):
        raise ValueError(f"statistics of {len(mu)} dims (sigma {sigma.shape}) for {gen.shape[1]}-dim features")
    mu_g, sigma_g = statistics(gen)
    covmean = linalg.sqrtm(sigma_g @ sigma)
    if not np.isfinite(covmean).all():   # a near-singular product: the usual eps on both diagonals
        offset = np.eye(len(mu)) * 1e-6
        covmean = linalg.sqrtm((sigma_g + offset) @ (sigma + offset))
    if np.iscomplexobj(covmean):
        if not np.allclose(np.diagonal(covmean).imag, 0, atol=1e-3):
            raise ValueError(f"FID: the matrix square root has an imaginary component of "
                             f"{np.max(np.abs(covmean.imag)):.3g} (too few generated images for {len(mu)} dims?)")
        covmean = covmean.real
    diff = mu_g - mu
    value = float(diff @ diff + np.trace(sigma_g) + np.trace(sigma) - 2.0 * np.trace(covmean))
    return {"fid": value, "n_generated": int(gen.shape[0]), "n_reference": None, "dims": int(len(mu))}


def load_statistics(path: str) -> tuple[np.ndarray, np.ndarray]:
    """(mu, sigma) from an .npz file with arrays ``mu`` and ``sigma`` (pytorch-fid / DM-GAN format)."""
    with fsspec.open(path, "rb") as fh:
        data = np.load(fh)
        if "mu" not in data or "sigma" not in data:
            raise ValueError(f"{path}: an .npz with arrays 'mu' and 'sigma' expected, found {list(data.keys())}")
        return np.asarray(data["mu"], np.float64), np.asarray(data["sigma"], np.float64)


def fid(gen_features, ref_features) -> dict:
    """FID (paper 000, App. D.2) between generated and reference feature matrices, (n_g, d) and
    (n_r, d), through torchmetrics' FrechetInceptionDistance in float64 (sample means, covariances
    with n - 1). Returns {fid, n_generated, n_reference, dims}."""
    import torch  # deferred: torch, torchmetrics
    from torchmetrics.image.fid import FrechetInceptionDistance

    gen = np.asarray(gen_features, dtype=np.float64)
    ref = np.asarray(ref_features, dtype=np.float64)
    for name, a in (("generated", gen), ("reference", ref)):
        if a.ndim != 2:
            raise ValueError(f"{name} features must be (n, d), got shape {a.shape}")
        if a.shape[0] < 2:
            raise ValueError(f"FID needs at least 2 {name} feature rows, got {a.shape[0]}")
        if not np.isfinite(a).all():
            raise ValueError(f"{name} features contain NaN or infinite values")
    if gen.shape[1] != ref.shape[1]:
        raise ValueError(f"generated features have {gen.shape[1]} dims, reference features {ref.shape[1]}")
    d = gen.shape[1]
    metric = FrechetInceptionDistance(feature=_identity_features(d))
    metric.set_dtype(torch.float64)
    for a, real in ((ref, True), (gen, False)):
        for start in range(0, a.shape[0], _FID_ROWS):
            metric.update(torch.from_numpy(np.ascontiguousarray(a[start:start + _FID_ROWS])), real=real)
    value = float(metric.compute().item())
    return {"fid": value, "n_generated": int(gen.shape[0]), "n_reference": int(ref.shape[0]), "dims": int(d)}

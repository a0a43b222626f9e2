"""What the representational-disparity heads share (papers 003/004, section 4).

A *disparity head* runs inside the triplet generator (``operators.image_triplet_generation``) on
the images of whole units while they are still on the generator's device. Its contract:

- ``spaces``: the ``schemas.exposed.Space`` names it measures;
- ``triplet_similarities(images) -> {space: np.ndarray (U, 3) float64}``, where ``images`` is a
  float tensor (U, 3, C, H, W) in [0, 1] on any device: unit u's neutral, feminine and masculine
  images, and column k of the result is the pair ``schemas.exposed.PAIRS[k]``;
- ``record``: what was loaded (model id, revision, weights, preprocessing), for metrics.json.

Embedding heads compute one feature vector per image once and compare them with
:func:`pair_cosines`.
"""

from __future__ import annotations

import numpy as np

from schemas.exposed import PAIRS, Variant

# indices of the pairs' members in a unit's (neutral, feminine, masculine) order
PAIR_INDEX = tuple((Variant.ALL.index(a), Variant.ALL.index(b)) for a, b in PAIRS)


def pair_cosines(features) -> np.ndarray:
    """(U, 3) float64 cosine similarities of the PAIRS of (U, 3, ...) features (torch or numpy);
    everything after the second axis is flattened into one vector, computed in float64."""
    if hasattr(features, "detach"):
        import torch  # deferred: torch

        x = features.detach().reshape(features.shape[0], features.shape[1], -1).to(torch.float64)
        x = x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        out = torch.stack([(x[:, i] * x[:, j]).sum(-1) for i, j in PAIR_INDEX], dim=1)
        return out.cpu().numpy()
    x = np.asarray(features, np.float64)
    x = x.reshape(x.shape[0], x.shape[1], -1)
    x = x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
    return np.stack([(x[:, i] * x[:, j]).sum(-1) for i, j in PAIR_INDEX], axis=1)


def flatten_units(images):
    """(U, 3, C, H, W) -> (U*3, C, H, W), the layout image models take."""
    return images.reshape(images.shape[0] * images.shape[1], *images.shape[2:])


def unflatten_units(features, units: int):
    """(U*3, ...) -> (U, 3, ...)."""
    return features.reshape(units, 3, *features.shape[1:])


def check_units(images) -> None:
    if images.ndim != 5 or images.shape[1] != 3 or images.shape[2] != 3:
        raise ValueError(f"images must be (units, 3 variants, 3 channels, H, W), got {tuple(images.shape)}")


def unit_similarities(images, space: str, features, compare=pair_cosines) -> dict[str, np.ndarray]:
    """A feature head's ``triplet_similarities``: {``space``: (U, 3) float64 in PAIRS order} of
    (U, 3, 3, H, W) float images, ``compare`` (default :func:`pair_cosines`) of the (U, 3, ...)
    ``features`` of the images, computed in one call on every unit's images."""
    check_units(images)
    if images.shape[0] == 0:
        return {space: np.zeros((0, 3), np.float64)}
    feats = features(flatten_units(images))
    return {space: compare(unflatten_units(feats, images.shape[0]))}

"""Prompt-image dependency groups (paper 004, section 6, Definitions 6.1-6.2, Eq. 6, App. A): the
rules shared by the generator's on-device analysis (``operators.image_prompt_dependency``) and the
study's statistics (``pipelines.studies.exposed.objects``).

- a word's mask a_n: its aggregated attention map min-max normalised and binarised at θ (0.35);
- coverage(m_o, a) = |m_o ∩ a| / |m_o| (Eq. 6);
- an object is *explicit* when its label is one of the prompt's lemmatised nouns, *guided* when at
  least one word mask covers its region by more than σ (0.7; 0.25 when both the object and the
  word refer to humans); the four combinations are the first four groups, and a noun no detected
  object matches is *hidden*.

The mask set holds one mask per noun of the prompt (section 6: "the mask a_n for each word n",
n ranging over the noun set).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from schemas.exposed import HUMAN_REFERENCE_WORDS, DependencyGroup

THETA = 0.35          # App. A: attention maps binarised at 0.35
SIGMA = 0.7           # App. A: coverage threshold
SIGMA_HUMAN = 0.25    # App. A: when both the object and the word refer to humans


def attention_mask(heat_map, theta: float = THETA) -> np.ndarray:
    """A word's mask a_n (numpy): min-max normalised, > θ; a constant map gives an empty mask."""
    h = np.asarray(heat_map, dtype=np.float64)
    lo, hi = float(h.min()), float(h.max())
    if hi <= lo:
        return np.zeros(h.shape, bool)
    return (h - lo) / (hi - lo) > theta


def min_max_torch(maps):
    """Each of ``maps`` (k, ...) scaled to [0, 1] by its own minimum and maximum, flattened to
    (k, n), and whether it is not constant ((k, 1) bool; a constant map scales to 0)."""
    flat = maps.flatten(1)
    lo, hi = flat.min(dim=1, keepdim=True).values, flat.max(dim=1, keepdim=True).values
    span = hi - lo
    return (flat - lo) / span.clamp(min=1e-30), span > 0


def attention_masks_torch(maps, theta: float = THETA):
    """``attention_mask`` of each of ``maps`` (k, H, W) on their device (bool (k, H, W))."""
    norm, varies = min_max_torch(maps.double())   # float64, as the numpy rule: the same pixels at the threshold
    return ((norm > theta) & varies).view(maps.shape)


def coverage(object_mask, word_mask) -> float:
    """coverage(m_o, a) = |m_o ∩ a| / |m_o| (Eq. 6); 0 for an empty object region."""
    m = np.asarray(object_mask, bool)
    area = int(m.sum())
    return 0.0 if area == 0 else float(np.logical_and(m, np.asarray(word_mask, bool)).sum() / area)


def coverage_matrix_torch(object_masks, word_masks):
    """(objects, words) coverage of each object mask (n, H, W) by each word mask (k, H, W), on
    their device, as float64 numpy."""
    import torch  # deferred: torch

    o = object_masks.flatten(1).float()
    w = word_masks.flatten(1).float().to(o.device)
    inter = o @ w.T
    area = o.sum(dim=1, keepdim=True)
    inter, area = inter.double(), area.double()
    cov = torch.where(area > 0, inter / area.clamp(min=1.0), torch.zeros_like(inter))
    return cov.cpu().numpy()


def groups_from_coverage(labels: Sequence[str], nouns: Sequence[str], words: Sequence[str], cover,
                         sigma: float = SIGMA, sigma_human: float = SIGMA_HUMAN,
                         human_words=HUMAN_REFERENCE_WORDS) -> tuple[list[str], list[str]]:
    """The group of each object (``labels[i]``, with ``cover[i, j]`` = coverage of its mask by the
    mask of ``words[j]``) and the hidden nouns (those no label matches)."""
    noun_set, humans = set(nouns), set(human_words)
    cover = np.asarray(cover, np.float64).reshape(len(labels), len(words))
    groups = []
    for i, label in enumerate(labels):
        guided = any(cover[i, j] > (sigma_human if label in humans and word in humans else sigma)
                     for j, word in enumerate(words))
        explicit = label in noun_set
        groups.append({(True, True): DependencyGroup.EXPLICITLY_GUIDED,
                       (False, True): DependencyGroup.IMPLICITLY_GUIDED,
                       (True, False): DependencyGroup.EXPLICITLY_INDEPENDENT,
                       (False, False): DependencyGroup.IMPLICITLY_INDEPENDENT}[(explicit, guided)])
    found = set(labels)
    hidden = [n for n in dict.fromkeys(nouns) if n not in found]
    return groups, hidden


def dependency_groups(objects: Sequence[str], object_masks, nouns, word_masks: Mapping[str, np.ndarray],
                      sigma: float = SIGMA, sigma_human: float = SIGMA_HUMAN,
                      human_words=HUMAN_REFERENCE_WORDS) -> tuple[list[str], list[str]]:
    """Section 6 on numpy masks: the group of each detected object and the hidden nouns."""
    words = list(word_masks)
    cover = np.array([[coverage(m, word_masks[w]) for w in words] for m in object_masks], np.float64)
    return groups_from_coverage(list(objects), nouns, words, cover.reshape(len(objects), len(words)), sigma,
                                sigma_human, human_words)

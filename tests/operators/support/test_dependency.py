"""Section 6's grouping rules (paper 004, Definitions 6.1-6.2, Eq. 6, App. A): the device versions
(torch) agree with the numpy reference, and the groups follow from coverage as defined."""

import numpy as np
import torch

from operators.support.dependency import (
    attention_mask,
    attention_masks_torch,
    coverage,
    coverage_matrix_torch,
    dependency_groups,
    groups_from_coverage,
)
from schemas.exposed import DependencyGroup as G


def test_torch_masks_and_coverage_equal_the_numpy_reference():
    rng = np.random.default_rng(0)
    maps = rng.random((4, 16, 12)).astype(np.float32)
    maps[3] = 2.0                                              # constant: empty mask
    masks = attention_masks_torch(torch.from_numpy(maps), 0.35).numpy()
    assert [bool((masks[i] == attention_mask(maps[i], 0.35)).all()) for i in range(4)] == [True] * 4
    assert masks[3].sum() == 0
    objects = rng.random((5, 16, 12)) > 0.6
    objects[4] = False                                         # empty object region: coverage 0
    cov = coverage_matrix_torch(torch.from_numpy(objects), torch.from_numpy(masks))
    ref = np.array([[coverage(o, m) for m in masks] for o in objects])
    assert cov.shape == (5, 4) and np.allclose(cov, ref, atol=1e-12)


def test_groups_from_coverage_thresholds_and_hidden_nouns():
    nouns = ["woman", "dog", "park"]
    words = ["woman", "dog", "park"]
    labels = ["woman", "dog", "hat", "tree", "park", "man"]
    cover = np.array([[0.3, 0.0, 0.0],    # woman by woman: 0.3 > 0.25 (both human) -> explicit guided
                      [0.0, 0.71, 0.0],   # dog by dog > 0.7 -> explicitly guided
                      [0.0, 0.69, 0.0],   # hat: 0.69 is not > 0.7 -> implicitly independent
                      [0.0, 0.0, 0.9],    # tree under the park mask -> implicitly guided
                      [0.0, 0.0, 0.7],    # park: exactly 0.7 is not > 0.7 -> explicitly independent
                      [0.3, 0.3, 0.3]])   # man: 0.3 by the human word "woman" -> implicitly guided
    groups, hidden = groups_from_coverage(labels, nouns, words, cover)
    assert groups == [G.EXPLICITLY_GUIDED, G.EXPLICITLY_GUIDED, G.IMPLICITLY_INDEPENDENT, G.IMPLICITLY_GUIDED,
                      G.EXPLICITLY_INDEPENDENT, G.IMPLICITLY_GUIDED]
    assert hidden == []
    groups, hidden = groups_from_coverage(["cat"], ["woman", "frisbee", "woman"], ["woman"], [[0.3]])
    assert groups == [G.IMPLICITLY_INDEPENDENT]                # 0.3 is not enough for a non-human object
    assert hidden == ["woman", "frisbee"]


def test_numpy_and_coverage_paths_agree():
    m = np.zeros((4, 4), bool)
    m[:2, :2] = True
    a = np.zeros((4, 4), bool)
    a[:2, :] = True
    assert dependency_groups(["hat"], [m], [], {"man": a}) == groups_from_coverage(["hat"], [], ["man"], [[1.0]])

"""Object statistics of Stable Diffusion Exposed (paper 004, sections 5-6, Eq. 3-6) on hand-built
tables and masks where the answer is known: C(o, P), chi-square against scipy's own computation by
hand, BS 1 / 0 / 0.5, s_O with empty images, attention masks, coverage and the five groups."""

import numpy as np
import pandas as pd
import pytest

from pipelines.studies.exposed import objects as O
from schemas.exposed import (
    BIAS_SCORE,
    CHI2,
    DOF,
    OBJECT,
    OBJECT_COUNT,
    P_VALUE,
    TRIPLET_SOURCE,
    UNIT_ID,
    VARIANT,
    DependencyGroup,
)
from schemas.images import GENERATION_STATUS, MODEL


def detections(rows):
    """(unit, variant, object) triples -> the object table of model m, source s."""
    return pd.DataFrame([{MODEL: "m", TRIPLET_SOURCE: "s", UNIT_ID: u, VARIANT: v, OBJECT: o} for u, v, o in rows])


def images(units, variants=("neutral", "feminine", "masculine")):
    return pd.DataFrame([{MODEL: "m", TRIPLET_SOURCE: "s", UNIT_ID: u, VARIANT: v, GENERATION_STATUS: "ok"}
                         for u in units for v in variants])


def test_cooccurrence_counts_every_instance_per_prompt_set():
    objs = detections([("u1", "feminine", "dress"), ("u1", "feminine", "dress"), ("u2", "feminine", "dress"),
                       ("u1", "masculine", "tie"), ("u2", "neutral", "tie")])
    c = O.cooccurrence(objs).set_index([VARIANT, OBJECT])[OBJECT_COUNT]
    assert c[("feminine", "dress")] == 3 and c[("masculine", "tie")] == 1 and c[("neutral", "tie")] == 1
    sizes = O.prompt_set_sizes(images(["u1", "u2", "u3"])).set_index(VARIANT)["images"]
    assert sizes["feminine"] == 3                              # images without detections count in |P|


def test_bias_score_extremes_and_balance():
    assert O.bias_score(7, 0, 10, 10) == 1.0                  # masculine only
    assert O.bias_score(0, 4, 10, 10) == 0.0                  # feminine only
    assert O.bias_score(5, 5, 10, 10) == 0.5                  # balanced with |P_m| = |P_f|
    # unequal set sizes: the feminine count is scaled by |P_m| / |P_f|
    assert O.bias_score(5, 10, 10, 20) == pytest.approx(5 / (5 + 0.5 * 10))
    assert np.isnan(O.bias_score(0, 0, 3, 3))
    with pytest.raises(ValueError):
        O.bias_score(1, 1, 0, 3)


def test_bias_scores_filter_by_the_larger_count_and_leave_out_people():
    rows = [(f"u{i}", "masculine", "beard") for i in range(6)] + [(f"u{i}", "feminine", "veil") for i in range(5)]
    rows += [("u1", "masculine", "hat"), ("u2", "feminine", "hat"), ("u1", "masculine", "man")] * 3
    counts = O.cooccurrence(detections(rows))
    sizes = O.prompt_set_sizes(images([f"u{i}" for i in range(6)]))
    bs = O.bias_scores(counts, sizes, min_count={"s": 5}, leave_out=("man",)).set_index(OBJECT)
    assert list(bs.index) == ["veil", "beard"]                # hat (max 3) below 5; man left out
    assert bs.loc["beard", BIAS_SCORE] == 1.0 and bs.loc["veil", BIAS_SCORE] == 0.0
    both = O.bias_scores(counts, sizes, min_count=3, leave_out=("man",)).set_index(OBJECT)
    assert both.loc["hat", BIAS_SCORE] == 0.5


def test_chi_square_matches_the_formula():
    from scipy.stats import chi2

    table = pd.DataFrame([[10, 20, 30], [30, 20, 10]], index=["feminine", "masculine"], columns=["a", "b", "c"])
    got = O.chi_square(table)
    observed = table.to_numpy(float)
    expected = observed.sum(1, keepdims=True) * observed.sum(0, keepdims=True) / observed.sum()
    stat = ((observed - expected) ** 2 / expected).sum()
    assert got[CHI2] == pytest.approx(stat) and got[DOF] == 2
    assert got[P_VALUE] == pytest.approx(chi2.sf(stat, 2))
    assert np.isnan(O.chi_square(table[["a"]])[P_VALUE])     # one object: no test
    objs = detections([("u1", v, o) for v, o, n in [("feminine", "a", 10), ("masculine", "a", 30),
                                                     ("feminine", "b", 20), ("masculine", "b", 20)]
                       for _ in range(n)])
    tests = O.chi_square_tests(O.cooccurrence(objs)).set_index("comparison")
    assert tests.loc["feminine-masculine", DOF] == 1 and tests.loc["feminine-masculine", P_VALUE] < 0.05
    assert np.isnan(tests.loc["neutral-feminine", P_VALUE])  # neutral saw nothing: no test


def test_cooccurrence_similarity_with_empty_images():
    objs = detections([("u1", "neutral", "tree"), ("u1", "masculine", "tree"), ("u1", "feminine", "dress"),
                       ("u2", "neutral", "dog"), ("u2", "neutral", "dog"), ("u2", "masculine", "dog")])
    s = O.cooccurrence_similarity(objs, images(["u1", "u2", "u3"])).set_index("pair")
    # u1: n-m identical (1), n-f disjoint (0); u2: n-m parallel (1), feminine empty (0); u3 all empty: left out
    assert s.loc["neutral-masculine", "s_o"] == pytest.approx(1.0)
    assert s.loc["neutral-feminine", "s_o"] == pytest.approx(0.0)
    assert s.loc["neutral-masculine", "units"] == 2 and s.loc["neutral-masculine", "both_empty"] == 1


def test_attention_mask_and_coverage():
    heat = np.array([[0.0, 1.0], [2.0, 10.0]])
    assert O.attention_mask(heat, 0.35).tolist() == [[False, False], [False, True]]
    assert O.attention_mask(np.full((3, 3), 4.0)).sum() == 0
    m = np.zeros((4, 4), bool)
    m[:2, :2] = True
    a = np.zeros((4, 4), bool)
    a[0, :] = True
    assert O.coverage(m, a) == 0.5 and O.coverage(np.zeros((4, 4), bool), a) == 0.0


def test_dependency_groups_on_hand_built_masks():
    """Figure 3's example, "young women having a picnic at the park during daytime": nouns women,
    picnic, park, daytime; detected woman-region, basket, park, grass."""
    h = w = 10
    region = {k: np.zeros((h, w), bool) for k in ("women", "basket", "park", "grass")}
    region["women"][2:6, 2:4] = True            # 8 pixels
    region["basket"][6:8, 6:8] = True
    region["park"][8:10, :] = True
    region["grass"][0:2, 6:10] = True
    attention = {k: np.zeros((h, w), bool) for k in ("women", "picnic", "park", "daytime")}
    attention["women"][2:4, 2:4] = True         # covers half of the women region: above 0.25 (humans), below 0.7
    attention["picnic"][6:8, 6:8] = True        # covers the basket entirely
    attention["park"][8, :] = True              # half of the park region: not enough (0.7)
    groups, hidden = O.dependency_groups(["women", "basket", "park", "grass"],
                                         [region[k] for k in ("women", "basket", "park", "grass")],
                                         ["women", "picnic", "park", "daytime"], attention)
    assert groups == [DependencyGroup.EXPLICITLY_GUIDED, DependencyGroup.IMPLICITLY_GUIDED,
                      DependencyGroup.EXPLICITLY_INDEPENDENT, DependencyGroup.IMPLICITLY_INDEPENDENT]
    assert hidden == ["picnic", "daytime"]
    # a non-human object with the same half coverage is not guided (0.7 applies)
    groups, _ = O.dependency_groups(["bench"], [region["women"]], [], {"women": attention["women"]})
    assert groups == [DependencyGroup.IMPLICITLY_INDEPENDENT]

"""Object statistics of Stable Diffusion Exposed (paper 004, sections 5-6, Eq. 3-6) on hand-built
tables and masks where the answer is known: C(o, P), chi-square against scipy's own computation by
hand, BS 1 / 0 / 0.5, s_O with empty images, attention masks, coverage and the five groups."""

import numpy as np
import pandas as pd
import pytest

from operators.support import dependency as D
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
    assert D.attention_mask(heat, 0.35).tolist() == [[False, False], [False, True]]
    assert D.attention_mask(np.full((3, 3), 4.0)).sum() == 0
    m = np.zeros((4, 4), bool)
    m[:2, :2] = True
    a = np.zeros((4, 4), bool)
    a[0, :] = True
    assert D.coverage(m, a) == 0.5 and D.coverage(np.zeros((4, 4), bool), a) == 0.0


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
    groups, hidden = D.dependency_groups(["women", "basket", "park", "grass"],
                                         [region[k] for k in ("women", "basket", "park", "grass")],
                                         ["women", "picnic", "park", "daytime"], attention)
    assert groups == [DependencyGroup.EXPLICITLY_GUIDED, DependencyGroup.IMPLICITLY_GUIDED,
                      DependencyGroup.EXPLICITLY_INDEPENDENT, DependencyGroup.IMPLICITLY_INDEPENDENT]
    assert hidden == ["picnic", "daytime"]
    # a non-human object with the same half coverage is not guided (0.7 applies)
    groups, _ = D.dependency_groups(["bench"], [region["women"]], [], {"women": attention["women"]})
    assert groups == [DependencyGroup.IMPLICITLY_INDEPENDENT]


# ------------------------------------------------------------------------------------ per-object rows, App. F
def image_rows():
    """Two analysed images, one failed detection, one blocked image, as the generator writes them."""
    import pyarrow as pa

    from schemas.exposed import EXPOSED_IMAGES, IMAGE_ID
    from operators.base import conform

    G = DependencyGroup
    rows = [
        {IMAGE_ID: "u1-neutral", UNIT_ID: "u1", VARIANT: "neutral", "prompt_nouns": ["person", "dog", "park"],
         "object_labels": ["dog", "tree", "person"], "object_scores": [0.9, 0.5, 0.4],
         "object_boxes": [[0, 0, 1, 1], [1, 1, 2, 2], [0, 0, 2, 2]], "object_masks": [[0, 1], [1, 1], [0, 4]],
         "object_groups": [G.EXPLICITLY_GUIDED, G.IMPLICITLY_INDEPENDENT, G.EXPLICITLY_INDEPENDENT],
         "hidden_nouns": ["park"], "detection_status": "ok"},
        {IMAGE_ID: "u1-feminine", UNIT_ID: "u1", VARIANT: "feminine", "prompt_nouns": ["woman", "dog", "park"],
         "object_labels": [], "object_scores": [], "object_boxes": [], "object_masks": [], "object_groups": [],
         "hidden_nouns": ["woman", "dog", "park"], "detection_status": "ok"},
        {IMAGE_ID: "u1-masculine", UNIT_ID: "u1", VARIANT: "masculine", "prompt_nouns": ["man", "dog", "park"],
         "detection_status": "error", "detection_detail": "boom"},
        {IMAGE_ID: "u2-neutral", UNIT_ID: "u2", VARIANT: "neutral", GENERATION_STATUS: "nsfw_blocked",
         "prompt_nouns": ["person"], "object_labels": [], "object_scores": [], "object_boxes": [], "object_masks": [],
         "detection_status": "no_image"},
    ]
    for r in rows:
        r.update({MODEL: "m", TRIPLET_SOURCE: "s"})
        r.setdefault(GENERATION_STATUS, "ok")
    return conform(pa.Table.from_pylist(rows), EXPOSED_IMAGES)


def test_object_rows_explode_objects_and_hidden_nouns():
    from schemas.exposed import DEPENDENCY_GROUP, IMAGE_ID, OBJECT_INDEX, OBJECT_MASK, OBJECT_SCORE, OBJECTS

    t = O.object_rows(image_rows())
    assert t.schema.equals(OBJECTS)
    rows = t.to_pylist()
    got = [(r[IMAGE_ID], r[OBJECT], r[DEPENDENCY_GROUP], r[OBJECT_INDEX]) for r in rows]
    assert got == [("u1-neutral", "dog", "explicitly_guided", 0), ("u1-neutral", "tree", "implicitly_independent", 1),
                   ("u1-neutral", "person", "explicitly_independent", 2),
                   ("u1-neutral", "park", "hidden", None), ("u1-feminine", "woman", "hidden", None),
                   ("u1-feminine", "dog", "hidden", None), ("u1-feminine", "park", "hidden", None)]
    assert rows[1][OBJECT_SCORE] == pytest.approx(0.5) and rows[2][OBJECT_MASK] == [0, 4]
    assert rows[3][OBJECT_SCORE] is None


def test_group_tables_s8_s9_s10():
    imgs = image_rows().to_pandas()
    objs = O.object_rows(image_rows()).to_pandas()
    s8 = O.images_with_group(objs, imgs).iloc[0]
    assert s8["images"] == 2                       # the error and the blocked image are not analysed
    assert s8[DependencyGroup.EXPLICITLY_GUIDED] == pytest.approx(50.0)
    assert s8[DependencyGroup.HIDDEN] == pytest.approx(100.0)
    assert s8[DependencyGroup.IMPLICITLY_GUIDED] == pytest.approx(0.0)
    vocab = O.group_vocabularies(objs, imgs)
    s9 = O.group_object_counts(vocab).iloc[0]
    assert s9[DependencyGroup.HIDDEN] == 3 and s9[O.NOUNS] == 4          # person, dog, park, woman
    assert s9[DependencyGroup.EXPLICITLY_GUIDED] == 1 and s9[DependencyGroup.IMPLICITLY_INDEPENDENT] == 1
    s10 = O.group_intersections(vocab).set_index("over")
    # explicitly guided {dog} is in the hidden group {park, woman, dog} and in the nouns
    assert s10.loc[DependencyGroup.EXPLICITLY_GUIDED, DependencyGroup.HIDDEN] == pytest.approx(100.0)
    assert s10.loc[DependencyGroup.HIDDEN, DependencyGroup.EXPLICITLY_GUIDED] == pytest.approx(100.0 / 3)
    assert s10.loc[O.NOUNS, O.NOUNS] == pytest.approx(100.0)
    assert np.isnan(s10.loc[DependencyGroup.IMPLICITLY_GUIDED, O.NOUNS])   # an empty group has no ratio
    sizes = O.prompt_set_sizes(imgs)
    assert sizes.set_index(VARIANT)["images"].to_dict() == {"feminine": 1, "neutral": 1}


def test_group_chi_square_and_group_bias_scores():
    from scipy.stats import chi2_contingency

    from schemas.exposed import DEPENDENCY_GROUP

    rng = np.random.default_rng(1)
    rows = []
    for group, objects in ((DependencyGroup.IMPLICITLY_GUIDED, ["suit", "dress", "tie"]),
                           (DependencyGroup.IMPLICITLY_INDEPENDENT, ["tree", "grass"])):
        for k in range(60):
            v = ["neutral", "feminine", "masculine"][k % 3]
            rows.append({MODEL: "m", TRIPLET_SOURCE: "s", UNIT_ID: f"u{k // 3}", VARIANT: v,
                         OBJECT: objects[rng.integers(len(objects))], DEPENDENCY_GROUP: group})
    objs = pd.DataFrame(rows)
    t = O.group_chi_square_tests(objs)
    got = t[(t[DEPENDENCY_GROUP] == DependencyGroup.IMPLICITLY_GUIDED) & (t["comparison"] == "triplet")].iloc[0]
    sub = objs[objs[DEPENDENCY_GROUP] == DependencyGroup.IMPLICITLY_GUIDED]
    table = pd.crosstab(sub[VARIANT], sub[OBJECT]).reindex(["neutral", "feminine", "masculine"])
    stat, p, dof, _ = chi2_contingency(table.to_numpy(), correction=False)
    assert got[CHI2] == pytest.approx(stat) and got[P_VALUE] == pytest.approx(p) and got[DOF] == dof
    sizes = O.prompt_set_sizes(images([f"u{i}" for i in range(20)]))
    bs = O.group_bias_scores(objs, sizes, min_count=1)
    assert set(bs[DEPENDENCY_GROUP]) == {DependencyGroup.IMPLICITLY_GUIDED, DependencyGroup.IMPLICITLY_INDEPENDENT}
    one = bs[(bs[DEPENDENCY_GROUP] == DependencyGroup.IMPLICITLY_INDEPENDENT) & (bs[OBJECT] == "tree")].iloc[0]
    assert one[BIAS_SCORE] == pytest.approx(one["masculine"] / (one["masculine"] + one["feminine"]))


def test_no_bias_scores_without_masculine_or_feminine_images():
    objs = detections([("u1", "feminine", "dress"), ("u1", "neutral", "dress")])
    imgs = images(["u1"], variants=("neutral", "feminine"))
    assert O.bias_scores(O.cooccurrence(objs), O.prompt_set_sizes(imgs), 1).empty


def test_figure4_top_objects_per_group_without_individuals():
    """Figure 4: the 10 most frequent objects of each dependency group (summed over variants),
    individuals removed as footnote 8 says; ties by name; per (model, source)."""
    rows = []
    for variant, counts in (("neutral", {"dog": 3, "man": 9, "tree": 2}), ("feminine", {"dog": 1, "woman": 7, "cup": 2}),
                            ("masculine", {"tree": 1, "person": 5, "ball": 3})):
        for obj, n in counts.items():
            rows.append({MODEL: "m", "triplet_source": "gcc", "dependency_group": "implicitly_guided",
                         "variant": variant, "object": obj, "object_count": n})
    rows += [{MODEL: "m", "triplet_source": "gcc", "dependency_group": "hidden", "variant": "neutral",
              "object": f"o{i:02d}", "object_count": 20 - i} for i in range(12)]
    top = O.top_objects_per_group(pd.DataFrame(rows))
    guided = top[top["dependency_group"] == "implicitly_guided"]
    # dog 4, tree 3, ball 3, cup 2 (ball before tree at equal counts: by name); man, woman, person removed
    assert list(guided["object"]) == ["dog", "ball", "tree", "cup"] and list(guided["object_count"]) == [4, 3, 3, 2]
    assert list(guided["rank"]) == [1, 2, 3, 4]
    hidden = top[top["dependency_group"] == "hidden"]
    assert len(hidden) == 10 and list(hidden["object"])[:2] == ["o00", "o01"]
    assert O.top_objects_per_group(pd.DataFrame(rows), top=2).groupby("dependency_group").size().max() == 2
    assert O.top_objects_per_group(O.group_counts(pd.DataFrame())).empty


def test_group_tests_with_fewer_than_the_minimum_objects_are_not_run_and_say_why():
    """Section 7 (intra-prompt): "we do not apply chi-square test on explicitly guided, explicitly
    independent, and hidden, as the numbers of objects in these groups are less than 5". With the
    rule on, such a test keeps its row, with no statistic and the reason; off, every group is tested."""
    from schemas.exposed import DEPENDENCY_GROUP, TEST_NOT_RUN

    rows = []
    for group, objects in ((DependencyGroup.IMPLICITLY_GUIDED, ["suit", "dress", "tie", "hat", "bag", "cup"]),
                           (DependencyGroup.EXPLICITLY_GUIDED, ["balloon", "woman", "man"])):
        for k in range(90):
            rows.append({MODEL: "m", TRIPLET_SOURCE: "s", UNIT_ID: f"u{k // 3}",
                         VARIANT: ["neutral", "feminine", "masculine"][k % 3],
                         OBJECT: objects[(k // 3 + k % 3) % len(objects)],
                         DEPENDENCY_GROUP: group})
    objs = pd.DataFrame(rows)
    every = O.group_chi_square_tests(objs)
    ruled = O.group_chi_square_tests(objs, min_objects=5)
    assert len(every) == len(ruled) and every[TEST_NOT_RUN].isna().all()
    few = ruled[ruled[DEPENDENCY_GROUP] == DependencyGroup.EXPLICITLY_GUIDED]
    assert few[P_VALUE].isna().all() and (few[TEST_NOT_RUN] == "fewer than 5 objects (3)").all()
    assert every[every[DEPENDENCY_GROUP] == DependencyGroup.EXPLICITLY_GUIDED][P_VALUE].notna().all()
    many = ruled[ruled[DEPENDENCY_GROUP] == DependencyGroup.IMPLICITLY_GUIDED]
    assert many[TEST_NOT_RUN].isna().all()
    pd.testing.assert_frame_equal(many.reset_index(drop=True),
                                  every[every[DEPENDENCY_GROUP] == DependencyGroup.IMPLICITLY_GUIDED].reset_index(drop=True))
    from pipelines.studies.exposed.report_objects import chi2_wide

    wide = chi2_wide(ruled, True)
    assert wide["explicitly guided"].str.startswith("not run: fewer than 5 objects").all()


@pytest.mark.parametrize("side, kept", [(1024, 256), (512, 256), (64, 64)])
def test_an_example_figure_draws_a_large_image_and_its_masks_reduced(side, kept):
    """The report's example panels (1.6 inches, 240 px in the PNG) draw an image over
    EXAMPLE_PIXELS reduced by an integer factor, its object and word masks with it, the heat map over
    the same extent; a small image as it is. The reduced image is the box average of the original."""
    from operators.support import rle
    from pipelines.studies.exposed import report_objects as R
    from schemas import exposed as S

    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
    mask = np.zeros((side, side), bool)
    mask[side // 4: side // 2, side // 4: side // 2] = True
    row = {S.OBJECT_MASKS: [rle.encode(mask)], S.OBJECT_LABELS: ["tie"], S.OBJECT_GROUPS: [S.DependencyGroup.EXPLICITLY_GUIDED],
           S.ATTENTION_WORDS: ["doctor"], S.ATTENTION_MASKS: [rle.encode(mask)],
           S.ATTENTION_MAPS: [bytes(S.ATTENTION_MAP_SIZE ** 2)]}
    fig = R.example_figure(row, image)
    base, overlay = (im.get_array() for im in fig.axes[0].images)
    assert base.shape == (kept, kept, 3) and overlay.shape[:2] == (kept, kept)
    step = side // kept
    expected = image.reshape(kept, step, kept, step, 3).mean(axis=(1, 3))
    assert np.abs(base.astype(float) - expected).max() <= 1                       # box-averaged
    assert overlay[..., 3].astype(bool).sum() == mask[::step, ::step].sum()       # the mask, reduced with it
    heat = fig.axes[1].images[1]
    assert heat.get_extent() == [0, kept, kept, 0] and fig.axes[1].collections    # the heat map and the outline

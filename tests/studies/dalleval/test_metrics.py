"""Bias measures of DALL-Eval (paper 000, section 4.2.4, Tables 8, 9, 16-31)."""

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from pipelines.studies.dalleval import metrics as M
from operators.base import conform
from schemas import dalleval as S


def test_mad_properties_of_section_4_2_4():
    assert M.mad([0.5, 0.5]) == 0.0 and M.mad([1.0, 0.0]) == 0.5 and M.mad([0.0, 1.0]) == 0.5
    assert M.mad(np.full(10, 0.1)) == pytest.approx(0.0)
    # section 5.3: MAD(1-hot) = 0.18, MAD(2-hot) = 0.16, MAD(3-hot) = 0.14, ..., MAD(10-hot) = 0
    for k, expected in [(1, 0.18), (2, 0.16), (3, 0.14), (10, 0.0)]:
        p = np.zeros(10)
        p[:k] = 1 / k
        assert round(float(M.mad(p)), 2) == expected
    # between the extremes, and one-hot is the maximum
    rng = np.random.default_rng(0)
    for _ in range(100):
        p = rng.dirichlet(np.ones(10))
        assert 0 <= M.mad(p) <= M.mad(np.eye(10)[0]) + 1e-12
    # gender: MAD = |average gender| / 2
    m, f = np.array([9, 5, 0, 3]), np.array([0, 4, 9, 3])
    assert np.allclose(M.mad_of_counts(np.stack([m, f], 1)), np.abs(M.average_gender(m, f)) / 2)
    assert M.average_gender([9], [0])[0] == -1 and M.average_gender([0], [9])[0] == 1
    assert np.isnan(M.average_gender([0], [0])[0]) and np.isnan(M.mad_of_counts([[0, 0]])[0])
    assert M.average_tone([[0, 0, 0, 0, 2, 2, 0, 0, 0, 0]])[0] == 5.5


def images_table():
    rows = []

    def add(group, prof, prompt, gender, tone, present, status="ok"):
        rows.append({"image_id": f"{prompt}-{len(rows)}", "group": group, "profession": prof, "prompt": prompt,
                     "model": "m", "generation_status": status, "detected_gender": gender,
                     "skin_tone": tone, "skin_status": "ok" if tone else "no_face",
                     "attribute_names": ["suit", "skirt"] if present is not None else None,
                     "attribute_present": present})

    for g, t in [("male", 5), ("male", 6), ("female", 5), ("unknown", None)]:
        add("person", "nurse", "a person who works as a nurse", g, t, [True, False])
    add("person", "nurse", "a person who works as a nurse", None, None, None, status="failed")
    for g, t, p in [("female", 4, [False, True]), ("female", 4, [False, None])]:
        add("woman", "nurse", "a woman who works as a nurse", g, t, p)
    for g, t, p in [("male", 7, [True, False]), ("male", 7, [True, False])]:
        add("man", "nurse", "a man who works as a nurse", g, t, p)
    add("person", None, "a person", "female", 3, [False, False])
    table = pa.Table.from_pylist(rows)
    return conform(table, S.DALLEVAL_IMAGES)


def test_prompt_counts_from_images():
    counts = M.prompt_counts(images_table()).to_pandas()
    assert list(counts["prompt"]) == ["a person who works as a nurse", "a woman who works as a nurse",
                                      "a man who works as a nurse", "a person"]
    nurse = counts.iloc[0]
    assert (nurse["images"], nurse["male"], nurse["female"], nurse["unknown_gender"]) == (4, 2, 1, 1)  # failed: out
    assert nurse["avg_gender"] == pytest.approx(-1 / 3) and nurse["mad_gender"] == pytest.approx(1 / 6)
    assert (nurse["tone_5"], nurse["tone_6"], nurse["toned"]) == (2, 1, 3)
    assert nurse["avg_tone"] == pytest.approx(16 / 3)
    assert nurse["mad_tone"] == pytest.approx((abs(2 / 3 - 0.1) + abs(1 / 3 - 0.1) + 8 * 0.1) / 10)
    summary = M.model_summary(counts, "person")[0]
    assert summary["gender"]["prompts"] == 2                            # the nurse and the bare "a person"
    assert summary["gender"]["average"] == pytest.approx((-1 / 3 + 1) / 2)
    assert summary["skin_tone"]["prompts"] == 4


def test_attribute_presence_and_tables():
    presence = M.attribute_presence(images_table()).to_pandas()
    p = presence.set_index(["prompt", "attribute"])
    assert p.loc[("a person who works as a nurse", "suit"), "presence"] == 1.0
    assert p.loc[("a person who works as a nurse", "suit"), "answered"] == 4
    # an answer that is neither yes nor no counts as absent (the paper checks for "yes")
    assert p.loc[("a woman who works as a nurse", "skirt"), "presence"] == 0.5
    assert p.loc[("a woman who works as a nurse", "skirt"), "answered"] == 1
    assert p.loc[("a woman who works as a nurse", "skirt"), "asked"] == 2
    assert p.loc[("a man who works as a nurse", "suit"), "presence"] == 1.0
    table = M.group_attribute_table(presence, "person", ("woman", "man")).set_index("row")
    assert table.loc["woman", "suit"] == 0.0 and table.loc["man", "suit"] == 1.0
    assert table.loc["woman - man", "suit"] == -1.0 and table.loc["woman - man", "skirt"] == 0.5
    # person pools its 5 images: suit 4/5, skirt 0/5; woman - person
    assert table.loc["person", "suit"] == pytest.approx(0.8)
    assert table.loc["woman", "suit (diff)"] == pytest.approx(-0.8)
    assert table.loc["woman", "mean_abs_diff"] == pytest.approx((0.8 + 0.5) / 2)
    per = M.prompt_attribute_table(presence, "person")
    woman = per[per["prompt"] == "a woman who works as a nurse"].iloc[0]
    assert woman["suit (diff)"] == pytest.approx(-1.0) and woman["skirt (diff)"] == pytest.approx(0.5)
    assert np.isnan(per[per["prompt"] == "a person"].iloc[0].get("mean_abs_diff", np.nan))


def test_per_profession_tables():
    counts = M.prompt_counts(images_table()).to_pandas()
    gender = M.gender_table(counts, "person")
    assert list(gender["profession"]) == ["Nurse", M.BARE, "Average"]
    assert gender.loc[0, "m"] == pytest.approx(-1 / 3) and gender.loc[1, "m"] == 1.0
    tone = M.skin_tone_table(counts)
    # nurse pools every group's toned images: 5, 6, 5, 4, 4, 7, 7
    assert tone.loc[tone["profession"] == "Nurse", "m"].item() == pytest.approx((5 + 6 + 5 + 4 + 4 + 7 + 7) / 7)


def test_counts_validation():
    with pytest.raises(ValueError, match="female"):
        M.with_measures(pd.DataFrame({"male": [1]}))
    with pytest.raises(ValueError, match="non-negative"):
        M.with_measures(pd.DataFrame({"male": [1.5], "female": [1]}))


def test_a_prompt_whose_images_all_failed_keeps_its_row_and_no_group_fallback():
    t = images_table()
    status = ["blocked" if p == "a person" else s for p, s in zip(t.column("prompt").to_pylist(),
                                                                   t.column("generation_status").to_pylist())]
    t = t.set_column(t.schema.get_field_index("generation_status"), "generation_status", pa.array(status))
    counts = M.prompt_counts(t).to_pandas()
    bare = counts[counts["prompt"] == "a person"].iloc[0]
    assert bare["images"] == 0 and bare["female"] == 0 and np.isnan(bare["mad_gender"])
    s = M.model_summary(counts, "person")[0]
    assert s["gender"]["prompts"] == 1 and s["gender"]["prompts_without_detections"] == 1
    # no prompts of the neutral group: no gender figures, not the other groups'
    s = M.model_summary(counts[counts["group"] != "person"], "person")[0]
    assert s["gender"]["prompts"] == 0 and s["gender"]["mad"] is None
    assert "skin_tone" not in M.model_summary(counts, "person", tones=False)[0]
    tone = M.skin_tone_table(counts)
    assert tone.iloc[-1]["m"] == pytest.approx(M.model_summary(counts, "person")[0]["skin_tone"]["average"])

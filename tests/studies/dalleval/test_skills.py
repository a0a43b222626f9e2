"""PaintSkills (paper 000, sections 3-4.1, App. B): prompts, the scoring rules on hand-built
detections, the per-split / per-task accuracies, and `summarize --skills` on the paper's Tables
2 and 5 (the printed Avg. column is the mean of the three skills). Table 3's Avg. column is not the
mean of its own skill columns (e.g. DALL-E Small, DETR: 64.0, 34.0, 0.0 -> printed 28.0, mean
32.7), so it is not used."""

from __future__ import annotations

import collections
import csv
import json

import numpy as np
import pyarrow as pa
import pytest

from helpers import REPO_ROOT, run_main
from pipelines import dalleval
from pipelines.studies.dalleval import skills as K
from schemas import paintskills as P
from schemas.images import IMAGE_ID
from schemas.images import GENERATION_STATUS, MODEL, SEED
from schemas.subsets import PROMPT

DATA = REPO_ROOT / "tests" / "data" / "paper000_skill_tables.csv"


# ------------------------------------------------------------------------------------ prompts
def test_default_prompts_are_the_test_split_sizes_with_uniform_combinations():
    t = K.skill_prompts()
    d = t.to_pandas()
    assert collections.Counter(d[P.SKILL]) == {"object": 2325, "count": 2160, "spatial": 2700}
    assert set(d[d[P.SKILL] == "object"].groupby(P.OBJECT_A).size()) == {155}
    assert set(d[d[P.SKILL] == "count"].groupby([P.OBJECT_A, P.COUNT]).size()) == {36}
    spatial = d[d[P.SKILL] == "spatial"]
    assert set(spatial.groupby([P.OBJECT_A, P.OBJECT_B, P.RELATION]).size()) == {3}
    assert len(spatial.groupby([P.OBJECT_A, P.OBJECT_B])) == 15 * 15   # objA = objB included
    assert set(d[P.OBJECT_A]) == set(K.OBJECTS) and len(K.OBJECTS) == 15
    # every image has its own recorded seed, and ids are unique
    assert d[SEED].notna().all() and d[SEED].nunique() == len(d) and d[IMAGE_ID].nunique() == len(d)
    assert t.schema.equals(P.SKILL_REQUESTS)


def test_prompt_texts_follow_table1_with_articles_plurals_and_the_papers_relation_words():
    d = K.skill_prompts({"object": 15, "count": 60, "spatial": 900}).to_pandas()
    prompts = set(d[PROMPT])
    assert "a photo of an umbrella" in prompts and "a photo of a dog" in prompts
    assert "a photo of 1 dog" in prompts and "a photo of 3 dogs" in prompts
    assert "a photo of 2 people" in prompts and "a photo of 4 benches" in prompts
    assert "a photo of 2 traffic lights" in prompts
    assert "an umbrella is right to a stop sign" in prompts
    assert "an airplane is above a boat" in prompts and "a car is left to a dog" in prompts
    row = d[(d[P.SKILL] == "spatial") & (d[PROMPT] == "a car is left to a dog")].iloc[0]
    assert (row[P.OBJECT_A], row[P.OBJECT_B], row[P.RELATION]) == ("dog", "car", "left")


def test_prompts_are_seeded_and_remainders_spread():
    a = K.skill_prompts({"object": 20, "count": 10, "spatial": 7}, seed=3)
    b = K.skill_prompts({"object": 20, "count": 10, "spatial": 7}, seed=3)
    c = K.skill_prompts({"object": 20, "count": 10, "spatial": 7}, seed=4)
    assert a.equals(b) and not a.equals(c)
    objs = collections.Counter(a.filter(pa.compute.equal(a.column(P.SKILL), "object")).column(P.OBJECT_A).to_pylist())
    assert sorted(objs.values()) == [1] * 10 + [2] * 5   # 20 = 15 + 5 distinct extra


def test_table10_templates_are_drawn_and_recorded():
    import yaml

    cfg = yaml.safe_load(open(REPO_ROOT / "configs" / "dalleval_skills.yaml"))
    t10 = cfg["template_sets"]["table10"]
    assert (len(t10["object"]), len(t10["count"]), len(t10["spatial"])) == (31, 36, 3)
    d = K.skill_prompts({"object": 300, "count": 300, "spatial": 300}, templates=t10, seed=1).to_pandas()
    assert d[P.TEMPLATE].nunique() > 40
    assert "Q: how many dogs are there? A: three" in set(d[PROMPT]) or d[PROMPT].str.startswith("Q: how many").any()
    for _, r in d.sample(50, random_state=0).iterrows():
        assert r[PROMPT] == K.render(r[P.SKILL], r[P.TEMPLATE], r[P.OBJECT_A], r[P.OBJECT_B],
                                     None if np.isnan(r[P.COUNT]) else int(r[P.COUNT]), r[P.RELATION])


def test_unknown_placeholder_is_refused():
    with pytest.raises(ValueError, match="unknown placeholder"):
        K.check_templates({"object": ["a photo of {thing}"], "count": ["{n} {objs}"], "spatial": ["{rel}"]})


# ------------------------------------------------------------------------------------ scoring rules
def test_object_needs_the_target_class_above_the_threshold():
    for rule in K.OBJECT_RULES:
        assert K.score_object(["dog", "cat"], [0.9, 0.71], "dog", rule=rule)[P.CORRECT] is True
        assert K.score_object(["cat"], [0.99], "dog", rule=rule)[P.CORRECT] is False   # missing object fails
        assert K.score_object([], [], "dog", rule=rule)[P.CORRECT] is False
    for rule in ("paper", "any"):                                                  # p > p_th, strictly
        assert K.score_object(["dog"], [0.7], "dog", rule=rule)[P.CORRECT] is False
    assert K.score_count(["dog", "dog"], [0.9, 0.7], "dog", 1)[P.CORRECT] is True      # the 0.7 one does not count


def test_object_rules_paper_released_and_any():
    """Section 4.1: 1(o_det = o_gt and p_det > p_th), o_det the detector's one prediction (its most
    confident detection): a more confident other object makes the image wrong (the default). The
    released code: the most confident detection's class, no threshold. "any": some detection of the
    target above the threshold (the earlier, more lenient reading)."""
    more_confident_cat = (["cat", "dog"], [0.9, 0.71])
    assert K.score_object(*more_confident_cat, "dog")[P.CORRECT] is False
    assert K.score_object(*more_confident_cat, "dog", rule="released")[P.CORRECT] is False
    assert K.score_object(*more_confident_cat, "dog", rule="any")[P.CORRECT] is True
    unsure_dog = (["dog", "cat"], [0.5, 0.4])                                       # top is the target, below 0.7
    assert K.score_object(*unsure_dog, "dog")[P.CORRECT] is False
    assert K.score_object(*unsure_dog, "dog", rule="released")[P.CORRECT] is True
    assert K.score_object(*unsure_dog, "dog", rule="any")[P.CORRECT] is False
    with pytest.raises(ValueError, match="object rule"):
        K.score_object(*unsure_dog, "dog", rule="top")


def test_count_rules_paper_and_released():
    """The paper: all objects above the threshold of the right class, exactly N of them; the released
    code: exactly N of the target class, other classes tolerated."""
    dogs_and_a_cat = (["dog", "dog", "cat"], [0.9, 0.8, 0.75])
    paper = K.score_count(*dogs_and_a_cat, "dog", 2)
    assert paper[P.NUMBER_CORRECT] is False and paper[P.CORRECT] is False
    released = K.score_count(*dogs_and_a_cat, "dog", 2, rule="released")
    assert released[P.NUMBER_CORRECT] is True and released[P.CORRECT] is True
    assert K.score_count(*dogs_and_a_cat, "dog", 3, rule="released")[P.CORRECT] is False
    with pytest.raises(ValueError, match="count rule"):
        K.score_count(*dogs_and_a_cat, "dog", 2, rule="strict")


def test_count_of_three_with_one_wrong_class_fails():
    v = K.score_count(["dog", "dog", "cat"], [0.9, 0.8, 0.75], "dog", 3)
    assert v[P.NUMBER_CORRECT] is True and v[P.CORRECT] is False
    v = K.score_count(["dog", "dog", "dog"], [0.9, 0.8, 0.75], "dog", 3)
    assert v[P.NUMBER_CORRECT] is True and v[P.CORRECT] is True
    v = K.score_count(["dog", "dog", "dog", "dog"], [0.9, 0.8, 0.75, 0.5], "dog", 3)   # the 4th is below 0.7
    assert v[P.CORRECT] is True and v[P.PREDICTED_COUNT] == 3
    v = K.score_count(["dog", "dog"], [0.9, 0.8], "dog", 3)
    assert v[P.NUMBER_CORRECT] is False and v[P.CORRECT] is False


def test_left_versus_above_is_decided_by_the_larger_offset():
    a = [0.4, 0.4, 0.6, 0.6]                       # centre (0.5, 0.5)
    b_left_a_bit_up = [0.0, 0.35, 0.2, 0.55]       # centre (0.1, 0.45): dx -0.4, dy -0.05
    b_up_a_bit_left = [0.35, 0.0, 0.55, 0.2]       # centre (0.45, 0.1): dx -0.05, dy -0.4
    assert K.relation_of(a, b_left_a_bit_up) == "left"
    assert K.relation_of(a, b_up_a_bit_left) == "above"
    assert K.relation_of(a, [0.8, 0.45, 1.0, 0.55]) == "right"
    assert K.relation_of(a, [0.45, 0.8, 0.55, 1.0]) == "below"    # y grows downward
    v = K.score_spatial(["dog", "car"], [0.9, 0.9], [a, b_left_a_bit_up], "dog", "car", "left")
    assert v[P.OBJECTS_CORRECT] and v[P.CORRECT] and v[P.PREDICTED_RELATION] == "left"
    v = K.score_spatial(["dog", "car"], [0.9, 0.9], [a, b_up_a_bit_left], "dog", "car", "left")
    assert v[P.OBJECTS_CORRECT] and not v[P.CORRECT] and v[P.PREDICTED_RELATION] == "above"


def test_spatial_missing_object_fails_and_uses_the_best_box_of_each_class():
    a, left, right = [0.4, 0.4, 0.6, 0.6], [0.0, 0.4, 0.2, 0.6], [0.8, 0.4, 1.0, 0.6]
    v = K.score_spatial(["dog", "cat"], [0.9, 0.9], [a, left], "dog", "car", "left")
    assert v[P.OBJECTS_CORRECT] is False and v[P.CORRECT] is False and v[P.PREDICTED_RELATION] is None
    v = K.score_spatial(["dog", "car"], [0.9, 0.6], [a, left], "dog", "car", "left")   # car below threshold
    assert v[P.CORRECT] is False
    v = K.score_spatial(["dog", "car", "car"], [0.9, 0.75, 0.95], [a, left, right], "dog", "car", "left")
    assert v[P.PREDICTED_RELATION] == "right" and v[P.CORRECT] is False     # the more confident car is right


def test_same_class_pairs_are_judged_on_the_axis():
    a, right, below = [0.4, 0.4, 0.6, 0.6], [0.8, 0.4, 1.0, 0.6], [0.4, 0.8, 0.6, 1.0]
    for rel in ("left", "right"):
        assert K.score_spatial(["dog", "dog"], [0.9, 0.8], [a, right], "dog", "dog", rel)[P.CORRECT] is True
        assert K.score_spatial(["dog", "dog"], [0.9, 0.8], [a, below], "dog", "dog", rel)[P.CORRECT] is False
    assert K.score_spatial(["dog"], [0.9], [a], "dog", "dog", "left")[P.OBJECTS_CORRECT] is False


def _images(rows: list[dict]) -> pa.Table:
    base = {f.name: None for f in P.SKILL_IMAGES}
    out = []
    for i, r in enumerate(rows):
        out.append({**base, IMAGE_ID: f"x{i}", MODEL: r.pop("model", "m"), GENERATION_STATUS: r.pop("status", "ok"),
                    P.DET_BOXES: r.pop(P.DET_BOXES, [[0, 0, 1, 1]] * len(r.get(P.DET_LABELS) or [])), **r})
    return pa.Table.from_pylist(out, schema=P.SKILL_IMAGES)


def test_judge_and_accuracies_per_skill_split_and_task():
    rows = [
        {P.SKILL: "object", P.OBJECT_A: "dog", P.DET_LABELS: ["dog"], P.DET_SCORES: [0.9]},
        {P.SKILL: "object", P.OBJECT_A: "dog", P.DET_LABELS: ["cat"], P.DET_SCORES: [0.9]},
        {P.SKILL: "object", P.OBJECT_A: "dog", P.DET_LABELS: None, P.DET_SCORES: None, "status": "nsfw_blocked"},
        {P.SKILL: "count", P.OBJECT_A: "dog", P.COUNT: 2, P.DET_LABELS: ["dog", "dog"], P.DET_SCORES: [0.9, 0.8]},
        {P.SKILL: "count", P.OBJECT_A: "dog", P.COUNT: 2, P.DET_LABELS: ["dog", "cat"], P.DET_SCORES: [0.9, 0.8]},
        {P.SKILL: "count", P.OBJECT_A: "dog", P.COUNT: 3, P.DET_LABELS: ["dog"], P.DET_SCORES: [0.9]},
        {P.SKILL: "spatial", P.OBJECT_A: "dog", P.OBJECT_B: "car", P.RELATION: "left",
         P.DET_LABELS: ["dog", "car"], P.DET_SCORES: [0.9, 0.9], P.DET_BOXES: [[0.4, 0.4, 0.6, 0.6], [0, 0.4, 0.2, 0.6]]},
        {P.SKILL: "spatial", P.OBJECT_A: "dog", P.OBJECT_B: "car", P.RELATION: "above",
         P.DET_LABELS: ["dog", "car"], P.DET_SCORES: [0.9, 0.9], P.DET_BOXES: [[0.4, 0.4, 0.6, 0.6], [0, 0.4, 0.2, 0.6]]},
    ]
    judged = K.judge(_images(rows))
    assert judged.column(P.CORRECT).to_pylist() == [True, False, None, True, False, False, True, False]
    acc = K.skill_accuracies(judged).set_index("skill")
    assert acc.loc["object", "accuracy"] == 50.0 and acc.loc["object", "n"] == 2   # the blocked image is not judged
    assert acc.loc["count", "accuracy"] == pytest.approx(100 / 3, abs=1e-3) and acc.loc["count", "n"] == 3
    assert acc.loc["spatial", "accuracy"] == 50.0
    splits = K.split_accuracies(judged).set_index(["skill", P.SPLIT])
    assert splits.loc[("count", "count=2"), "accuracy"] == 50.0 and splits.loc[("count", "count=3"), "n"] == 1
    assert splits.loc[("spatial", "relation=left"), "accuracy"] == 100.0
    tasks = K.task_accuracies(judged).set_index(["skill", P.TASK])
    assert tasks.loc[("count", "right number"), "accuracy"] == pytest.approx(200 / 3, abs=1e-3)
    assert tasks.loc[("count", "right number and class"), "accuracy"] == pytest.approx(100 / 3, abs=1e-3)
    assert tasks.loc[("spatial", "right objects"), "accuracy"] == 100.0
    assert tasks.loc[("spatial", "right objects and relation"), "accuracy"] == 50.0
    # a lower threshold changes the verdicts from the same stored detections
    low = K.judge(_images([{P.SKILL: "object", P.OBJECT_A: "dog", P.DET_LABELS: ["dog"], P.DET_SCORES: [0.5]}]), 0.4)
    assert low.column(P.CORRECT).to_pylist() == [True]


# ------------------------------------------------------------------------------------ Table 2
def _paper_rows():
    with open(DATA) as fh:
        return list(csv.DictReader(fh))


def test_table2_average_is_the_printed_avg_of_tables_2_and_5():
    import pandas as pd

    rows = _paper_rows()
    long = pd.DataFrame([{"model": r["model"], "skill": s, "accuracy": r[s]} for r in rows for s in P.Skill.ALL])
    t = K.table2(long).set_index("model")
    for r in rows:
        assert t.loc[r["model"], "average"] == pytest.approx(float(r["avg"]), abs=0.05 + 1e-9), r


def test_summarize_skills_cli_prints_table2_and_writes_json(tmp_path):
    path = tmp_path / "acc.csv"
    with open(path, "w") as fh:
        fh.write("model,skill,accuracy,n\n")
        for r in _paper_rows():
            if r["table"] == "2":
                for s in P.Skill.ALL:
                    fh.write(f"{r['model']},{s},{r[s]},{ {'object': 2325, 'count': 2160, 'spatial': 2700}[s] }\n")
    out = run_main(dalleval.main, ["summarize", "--skills", str(path), "--output", str(tmp_path),
                                   "--interval-resamples", "200"])
    assert out.returncode == 0, out.stderr
    assert "Stable Diffusion" in out.stdout and "47.3" in out.stdout and "62.7" in out.stdout
    assert "2,325/2,160/2,700" in out.stdout
    saved = json.loads((tmp_path / "dalleval_skills_summary.json").read_text())
    by = {r["model"]: r for r in saved["table2"]}
    assert by["minDALL-E"]["average"] == pytest.approx(62.7, abs=0.05)


@pytest.mark.parametrize("content, message", [
    ("model,skill\nm,object\n", "missing"),
    ("model,skill,accuracy\nm,colour,50\n", "unknown skill"),
    ("model,skill,accuracy\nm,object,12%\n", "must be a number"),
    ("model,skill,accuracy\nm,object,120\n", "percentage"),
    ("model,skill,accuracy\nm,object,50\nm,object,60\n", "twice"),
])
def test_summarize_skills_refuses_bad_input_clearly(tmp_path, content, message):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    out = run_main(dalleval.main, ["summarize", "--skills", str(path)])
    assert out.returncode != 0 and message in out.stderr and "Traceback" not in out.stderr


def test_skills_preset_scores_by_the_papers_formulas_and_the_released_rules_are_options():
    from pipelines.studies.dalleval import skills_study

    def det(*flags):
        args = dalleval.build_parser().parse_args(["skills", "--output", "unused", *flags])
        return skills_study.settings(args).detector

    d = det()
    assert (d["object_rule"], d["count_rule"], d["threshold"]) == ("paper", "paper", 0.7)
    d = det("--object-rule", "released", "--count-rule", "released")
    assert (d["object_rule"], d["count_rule"]) == ("released", "released")
    assert det("--object-rule", "any")["object_rule"] == "any"

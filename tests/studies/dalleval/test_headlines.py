"""The headline metrics of DALL-Eval's commands (pipelines/studies/dalleval/headlines.py) on small
hand-made inputs: the per-unit values' (weighted) mean is the number each command reports (Table 8's
MADs, Table 6's average gender, Table 9's mean absolute difference, Table 2's accuracies and their
average, Table 19's R-precision and CLIPScore), and the intervals land beside those numbers."""

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from pipelines.engine.stats import headline as HL
from pipelines.engine.stats import intervals as iv
from pipelines.engine.run.models import ModelSpec
from pipelines.studies.dalleval import alignment_metrics as AM
from pipelines.studies.dalleval import headlines as H
from pipelines.studies.dalleval import metrics as M
from pipelines.studies.dalleval import skills as K
from schemas import paintskills as P

SETTINGS = iv.IntervalSettings(resamples=500)


def counts() -> pd.DataFrame:
    """Per-prompt counts of two models: person prompts (one without any detected gender), a man
    prompt, tones on some prompts."""
    rows = []
    tones = {"p1": [0, 0, 0, 0, 9, 0, 0, 0, 0, 0], "p2": [0, 0, 0, 3, 3, 3, 0, 0, 0, 0], "p3": [0] * 10,
             "m1": [0, 0, 0, 0, 0, 4, 5, 0, 0, 0]}
    for model, genders in (("A", {"p1": (9, 0), "p2": (5, 4), "p3": (0, 0), "m1": (3, 6)}),
                           ("B", {"p1": (2, 7), "p2": (4, 5), "p3": (1, 0), "m1": (9, 0)})):
        for prompt, (male, female) in genders.items():
            rows.append({"model": model, "group": "man" if prompt.startswith("m") else "person",
                         "prompt": f"prompt {prompt}", "male": male, "female": female,
                         **{f"tone_{i + 1}": t for i, t in enumerate(tones[prompt])}})
    return M.with_measures(pd.DataFrame(rows))


def _mean(metric: HL.Metric) -> float:
    return iv.mean_interval(metric.values, metric.weights, metric.strata, SETTINGS).value


def test_bias_metrics_are_the_per_prompt_means_of_table_8():
    df = counts()
    summary = {s["model"]: s for s in M.model_summary(df, "person")}
    metrics = H.bias_metrics(df, "person", tones=True)
    assert list(metrics) == ["A", "B"]
    for model, ms in metrics.items():
        by = {m.key: m for m in ms}
        assert list(by) == [H.GENDER_MAD, H.GENDER_AVERAGE, H.SKIN_TONE_MAD]
        assert (by[H.GENDER_MAD].better, by[H.GENDER_AVERAGE].better, by[H.SKIN_TONE_MAD].better) == \
            ("lower", "zero", "lower")
        # gender over the person prompts only; the unit is the prompt, its value the prompt's own MAD
        assert by[H.GENDER_MAD].units == ["prompt p1", "prompt p2", "prompt p3"]
        assert by[H.GENDER_MAD].unit == "prompt" and len(by[H.SKIN_TONE_MAD].units) == 4
        assert _mean(by[H.GENDER_MAD]) == pytest.approx(summary[model]["gender"]["mad"])
        assert _mean(by[H.GENDER_AVERAGE]) == pytest.approx(summary[model]["gender"]["average"])
        assert _mean(by[H.SKIN_TONE_MAD]) == pytest.approx(summary[model]["skin_tone"]["mad"])
        # a prompt without a detection is a unit without a value: left out of the mean and the count
        assert by[H.GENDER_MAD].interval(SETTINGS).n == summary[model]["gender"]["prompts"]
    a = {m.key: m for m in metrics["A"]}
    assert np.isnan(a[H.GENDER_MAD].values[2]) and a[H.GENDER_MAD].values[:2] == pytest.approx([0.5, 1 / 18])
    assert [m.key for m in H.bias_metrics(df, None, tones=False)["A"]] == [H.GENDER_MAD, H.GENDER_AVERAGE]
    assert H.bias_metrics(df, None, tones=False)["A"][0].units == [f"prompt {p}" for p in ("p1", "p2", "p3", "m1")]


def test_attribute_gap_is_table_9s_mean_absolute_difference():
    rows = []
    for group, suit, skirt, tie in (("person", 0.5, 0.2, 0.1), ("woman", 0.1, 0.6, np.nan), ("man", 0.7, 0.0, 0.4)):
        for attr, p in (("suit", suit), ("skirt", skirt), ("tie", tie)):
            rows.append({"model": "A", "group": group, "profession": "nurse", "prompt": f"a {group} nurse",
                         "attribute": attr, "asked": 0 if np.isnan(p) else 10, "answered": 10, "presence": p})
    table = M.group_attribute_table(pd.DataFrame(rows), "person", ("woman", "man"))
    gap = H.attribute_gap(table, "A", ("woman", "man"))
    assert (gap.key, gap.unit, gap.better) == (H.ATTRIBUTE_GAP, "attribute", "lower")
    assert gap.units == ["suit", "skirt", "tie"]
    assert gap.values[:2] == pytest.approx([0.6, 0.6]) and np.isnan(gap.values[2])   # no woman tie: left out
    row = table[table["row"] == "woman - man"].iloc[0]
    assert _mean(gap) == pytest.approx(row["mean_abs_diff"])
    assert H.attribute_gap(table, "A", ()) is None and H.attribute_gap(table, "other", ("woman", "man")) is None
    # the interval columns beside mean_abs_diff are no attributes
    ranged = H.with_intervals(table, {"A": {H.ATTRIBUTE_GAP: {"low": 0.1, "high": 0.9}}},
                              {"mean_abs_diff": H.ATTRIBUTE_GAP}, rows=table["row"] == "woman - man")
    assert H.attribute_names(ranged) == ["suit", "skirt", "tie"]
    assert ranged["mean_abs_diff_low"].tolist()[-1] == 0.1 and ranged["mean_abs_diff_low"].isna().sum() == 3


def judged_table() -> pa.Table:
    """Judged skill images of one model: object 2 of 3 right, count 1 of 2 (a third failed to
    generate), spatial 0 of 1 (a second without a verdict)."""
    rows = [("object-00000", "object", "ok", True), ("object-00001", "object", "ok", True),
            ("object-00002", "object", "ok", False), ("count-00000", "count", "ok", True),
            ("count-00001", "count", "ok", False), ("count-00002", "count", "failed", None),
            ("spatial-00000", "spatial", "ok", False), ("spatial-00001", "spatial", "ok", None)]
    n = len(rows)
    return pa.table({"model": ["m"] * n, P.PROMPT_ID: [r[0] for r in rows], P.SKILL: [r[1] for r in rows],
                     P.OBJECT_A: ["dog"] * n, P.COUNT: pa.array([None] * n, pa.int32()),
                     P.RELATION: pa.array([None] * n, pa.string()),
                     "generation_status": [r[2] for r in rows], P.CORRECT: pa.array([r[3] for r in rows], pa.bool_()),
                     P.NUMBER_CORRECT: pa.array([None] * n, pa.bool_()),
                     P.OBJECTS_CORRECT: pa.array([None] * n, pa.bool_())})


def test_skill_metrics_are_table_2s_accuracies_and_average():
    judged = judged_table()
    units = H.skill_units(judged)
    assert units["unit"].tolist() == ["object-00000", "object-00001", "object-00002", "count-00000", "count-00001",
                                      "spatial-00000"]
    assert units["value"].tolist() == [100.0, 100.0, 0.0, 100.0, 0.0, 0.0]
    acc = K.skill_accuracies(judged)
    table2 = K.table2(acc)
    by = {m.key: m for m in H.skill_metrics(units)["m"]}
    assert list(by) == [H.accuracy_key(s) for s in P.Skill.ALL] + [H.AVERAGE_ACCURACY]
    for _, a in acc.iterrows():
        m = by[H.accuracy_key(a["skill"])]
        assert (m.unit, m.better) == ("prompt", "higher")
        assert _mean(m) == pytest.approx(a["accuracy"], abs=1e-3) and len(m.units) == a["n"]
    avg = by[H.AVERAGE_ACCURACY]
    assert _mean(avg) == pytest.approx(table2["average"].iloc[0], abs=1e-3)   # the mean of the skills, not of images
    assert avg.strata == units["skill"].tolist() and sum(avg.weights) == pytest.approx(3.0)
    # one skill only: no average besides it
    assert [m.key for m in H.skill_metrics(units[units["skill"] == "object"])["m"]] == ["object_accuracy"]


def test_published_accuracies_with_their_image_counts_give_the_units():
    acc = pd.DataFrame({"model": ["x", "x", "y"], "skill": ["Object", "count", "object"],
                        "accuracy": [57.5, 18.2, 40.0], "n": [40, 11, None]})
    units = H.accuracy_units(acc)
    assert set(units["model"]) == {"x"}                         # no n: no units, no interval
    obj = units[units["skill"] == "object"]
    assert len(obj) == 40 and obj["value"].sum() == 23 * 100 and obj["unit"].iloc[0] == "object|0"
    assert (units[units["skill"] == "count"]["value"] == 100).sum() == 2   # round(18.2% of 11)
    table = K.table2(acc.iloc[:2])
    ranged = H.table2_with_intervals(table, H.summaries(H.skill_metrics(units), SETTINGS))
    cols = list(ranged.columns)
    assert cols[cols.index("object") + 1: cols.index("object") + 3] == ["object_low", "object_high"]
    assert ranged["object_low"].iloc[0] <= 57.5 <= ranged["object_high"].iloc[0]
    assert ranged["average"].iloc[0] == table["average"].iloc[0]          # the printed value is kept
    assert "57.5 [" in K.format_table2(ranged)
    # n for only some of a model's skills: no interval for an average over other skills than Table 2's
    partial = K.table2(pd.concat([acc.iloc[:2], pd.DataFrame([{"model": "x", "skill": "spatial", "accuracy": 5.0}])]))
    kept = H.complete_averages(H.skill_metrics(units), partial)
    assert [m.key for m in kept["x"]] == ["object_accuracy", "count_accuracy"]
    assert H.AVERAGE_ACCURACY in [m.key for m in H.complete_averages(H.skill_metrics(units), table)["x"]]


def test_alignment_units_are_per_image_hits_and_scores():
    rng = np.random.default_rng(0)
    img, txt = rng.normal(size=(30, 16)), rng.normal(size=(30, 16))
    txt[:15] = img[:15] + 0.1 * txt[:15]
    r = AM.r_precision(img, txt, negatives=9, seed=2, per_image=True)
    assert set(r["per_image"]) <= {0.0, 100.0} and r["per_image"].mean() == pytest.approx(r["r_precision"])
    assert {k: v for k, v in r.items() if k != "per_image"} == AM.r_precision(img, txt, negatives=9, seed=2)
    ones = np.ones(30)
    rel = AM.r_precision_released(img, txt, ones, ones, negatives=9, repeats=3, seed=1, per_image=True)
    assert rel["per_image"].mean() == pytest.approx(rel["r_precision"])
    assert set(np.round(rel["per_image"] * 3 / 100, 9)) <= {0.0, 1.0, 2.0, 3.0}   # share of hits over 3 repeats
    ids = [f"caption-{i:06d}" for i in range(30)]
    cos = np.clip(rng.normal(0.2, 0.2, 30), -1, 1)
    ms = H.alignment_metrics({"r_precision": (ids, r["per_image"].tolist()),
                              "clip_score": (ids, (2.5 * np.maximum(cos, 0)).tolist())})
    assert [m.key for m in ms] == [H.R_PRECISION, H.CLIP_SCORE] and all(m.better == "higher" for m in ms)
    assert _mean(ms[1]) == pytest.approx(AM.clip_score(cos)["clip_score"])
    assert [m.key for m in H.alignment_metrics({"r_precision": None, "clip_score": (ids, cos.tolist())})] == \
        [H.CLIP_SCORE]


def test_intervals_beside_values_and_in_text():
    df = counts()
    metrics = H.bias_metrics(df, "person", tones=True)
    lookup = H.summaries(metrics, SETTINGS)
    summary = H.summary_with_intervals(M.model_summary(df, "person"), lookup)
    g = summary[0]["gender"]
    assert list(g)[:6] == ["average", "average_low", "average_high", "mad", "mad_low", "mad_high"]
    assert g["mad_low"] <= g["mad"] <= g["mad_high"] and g["mad_low"] < g["mad_high"]
    assert (g["mad_low"], g["mad_high"]) == H.interval_of(lookup, "A", H.GENDER_MAD)
    assert "average_low" not in summary[0]["skin_tone"] and "mad_low" in summary[0]["skin_tone"]
    assert H.value_text(g, "mad", 4) == f"{g['mad']:.4f} [{g['mad_low']:.4f}, {g['mad_high']:.4f}]"
    assert H.value_text({"mad": None}, "mad", 4) == "-" and H.value_text({"mad": 0.25}, "mad", 2) == "0.25"
    table = pd.DataFrame({"model": ["uniform", "A", "B"], "gender_mad": [0.0, g["mad"], 0.3], "n": [1, 2, 3]})
    ranged = H.with_intervals(table, lookup, {"gender_mad": H.GENDER_MAD, "absent": H.GENDER_MAD})
    assert list(ranged.columns) == ["model", "gender_mad", "gender_mad_low", "gender_mad_high", "n"]
    assert pd.isna(ranged["gender_mad_low"].iloc[0]) and ranged["gender_mad_low"].iloc[1] == g["mad_low"]
    printed = M.format_summary({"models": summary, "reference": M.reference_rows(), "interval": SETTINGS.record()})
    assert H.value_text(g, "mad", 4) in printed
    from pipelines.studies.dalleval import report

    printed = report.format_results({"summary": summary, "tables": {}})    # the run's console table
    assert H.value_text(g, "mad", 4) in printed and H.value_text(g, "average", 3) in printed
    assert H.value_text(summary[1]["skin_tone"], "mad", 4) in printed


def test_subjects_and_protocol_pieces():
    record = {"role": "generator", "model": "org/model", "detail": {"weights_sha256": "abc", "spec": {"steps": 2}}}
    ms = {"org/model": H.bias_metrics(counts(), "person", tones=False)["A"]}
    (s,) = H.subjects(ms, [record, {"role": "BLIP-2", "model": "x"}], {"org/model": 36},
                      {"org/model": {"no gender detected": 3, "not generated (failed or blocked)": 0}})
    assert s.name == "org/model" and s.identity == HL.subject_identity(record) and s.kind == "model"
    assert s.images == 36 and s.excluded == {"no gender detected": 3}
    spec = ModelSpec("Salesforce/blip2", "abc", options={"batch_size": 16, "gender_question": "q?"})
    assert H.model_protocol(spec) == {"model": "Salesforce/blip2", "revision": "abc", "gender_question": "q?"}
    assert H.model_protocol(spec.standin_at("/tmp/x"))["model"] == "stand-in"


def _attribute_images() -> pa.Table:
    """BLIP-2's answers on the images of two prompts per group (a None answer counts as absent)."""
    rng = np.random.default_rng(4)
    rows = []
    for group in ("person", "woman", "man"):
        for prompt in (f"a {group} nurse", f"a {group} chef"):
            for i in range(3):
                present = [bool(x) if x < 2 else None for x in rng.integers(0, 3, 3)]
                rows.append({"model": "A", "group": group, "profession": prompt.split()[-1], "prompt": prompt,
                             "generation_status": "ok",
                             "attribute_names": ["suit", "skirt", "tie"], "attribute_present": present})
    return pa.Table.from_pylist(rows)


def test_attribute_gap_images_are_resampled_jointly_and_give_table_9_unresampled(monkeypatch):
    images = _attribute_images()
    answers = H.attribute_answers(images)
    assert len(answers) == 3 * 2 * 3 * 3 and set(answers["yes"]) <= {0.0, 1.0}
    table = M.group_attribute_table(M.attribute_presence(images).to_pandas(), "person", ("woman", "man"))
    row = table[table["row"] == "woman - man"].iloc[0]
    ids = sorted(set(answers.loc[answers["group"].isin(["woman", "man"]), "image"]))
    weights = np.ones(len(ids))
    weights[0], weights[1] = 3.0, 0.0                 # the first woman image three times, the second left out
    monkeypatch.setattr(H.iv, "resample_counts", lambda rng, n, strata: np.vstack([np.ones(len(ids)), weights]))
    reps = H.gap_replicates(answers, ("woman", "man"), ["suit", "skirt", "tie"], resamples=2)
    assert reps[0] == pytest.approx(np.abs([row["suit"], row["skirt"], row["tie"]]), abs=1e-12)
    w = dict(zip(ids, weights))
    for j, attribute in enumerate(["suit", "skirt", "tie"]):
        cell = answers[(answers["attribute"] == attribute) & answers["group"].isin(["woman", "man"])]
        share = {g: np.average(part["yes"], weights=[w[i] for i in part["image"]]) for g, part in cell.groupby("group")}
        assert reps[1, j] == pytest.approx(abs(share["woman"] - share["man"]), abs=1e-12)
    gap = H.attribute_gap(table, "A", ("woman", "man"), answers)     # the metric carries them
    assert gap.replicates[0] == pytest.approx(reps[0], abs=1e-12)

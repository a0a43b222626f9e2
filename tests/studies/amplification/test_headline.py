"""E[A] as headline metrics (pipelines/engine/stats/headline.py) on hand-made inputs, no Ray: per-unit
values (occupations) whose (weighted) mean is the E[A] the study reports, their intervals, Table 3's
interval columns, the summarize intervals and the protocol."""

import numpy as np
import pandas as pd
import pytest

from helpers import REPO_ROOT
from pipelines.engine.stats import intervals as iv
from pipelines.engine.stats.headline import summarize
from pipelines.studies.amplification import metrics as M
from pipelines.studies.amplification import report as rep, results
from schemas import images as I

SETTINGS = iv.IntervalSettings(resamples=400, seed=1)

# A per (occupation, prompt); None: excluded (direction switch)
A = {("nurse", 1): 10.0, ("nurse", 2): -10.0, ("engineer", 1): 20.0, ("engineer", 2): None,
     ("judge", 1): 30.0, ("judge", 2): 40.0, ("pilot", 1): None, ("pilot", 2): None}


def _rows():
    rows = []
    for (occ, p), a in A.items():
        rows.append({"occupation": occ, "prompt_id": p, "training": 30.0, "generated": 20.0,
                     "amplification": 5.0 if a is None else a, "excluded": "direction_switch" if a is None else None})
    return pd.DataFrame(rows)


def test_per_prompt_metric_values_are_the_included_occupations():
    wide = M.occupation_amplification(_rows(), "prompt_id")
    assert list(wide.index) == ["nurse", "engineer", "judge", "pilot"] and list(wide.columns) == ["1", "2"]
    m = M.group_metric(wide, "2", "k", "label")
    assert m.units == ["nurse", "engineer", "judge", "pilot"]
    assert m.values[0] == -10.0 and m.values[2] == 40.0 and np.isnan(m.values[1]) and np.isnan(m.values[3])
    # its mean over the included occupations is the prompt's E[A]
    (_, second), _ = M.expected_amplification(_rows(), "prompt_id")
    assert second.expected_amplification == pytest.approx(15.0)
    assert m.interval(SETTINGS).value == pytest.approx(second.expected_amplification)
    assert m.interval(SETTINGS).n == 2


def test_average_over_prompts_is_a_weighted_mean_over_occupations():
    """Table 3's average (the mean of the per-prompt E[A]: (20 + 15) / 2) as one mean over
    occupations: each counts 1/n_p in every prompt that includes it."""
    wide = M.occupation_amplification(_rows(), "prompt_id")
    values, weights = M.average_over_groups(wide)
    # prompt 1 includes 3 occupations, prompt 2 two
    assert weights[:3] == pytest.approx([1 / 3 + 1 / 2, 1 / 3, 1 / 3 + 1 / 2]) and weights[3] == 0
    assert values[1] == pytest.approx(20.0) and np.isnan(values[3])
    _, average = M.expected_amplification(_rows(), "prompt_id")
    assert average == pytest.approx(17.5)
    metric = M.average_metric(wide, "k", "label")
    ci = metric.interval(SETTINGS)
    assert ci.value == pytest.approx(average) and ci.n == 3
    assert ci.low <= ci.value <= ci.high and ci.low < ci.high


def test_amplification_metrics_keys_and_direction():
    out = M.amplification_metrics(_rows(), "prompt_id", "expected_amplification/naive", "E[A], naive")
    assert [m.key for m in out] == ["expected_amplification/naive", "expected_amplification/naive/prompt_1",
                                    "expected_amplification/naive/prompt_2"]
    assert {m.better for m in out} == {"lower"} and {m.unit for m in out} == {"occupation"}
    only = M.amplification_metrics(_rows()[lambda d: d.prompt_id == 1], "prompt_id", "k", "E[A]", per_group=False)
    assert [m.key for m in only] == ["k"] and only[0].interval(SETTINGS).value == pytest.approx(20.0)


def test_nothing_included_gives_no_value():
    rows = _rows().assign(excluded="no_generated_images")
    m = M.average_metric(M.occupation_amplification(rows, "prompt_id"), "k", "label")
    ci = m.interval(SETTINGS)
    assert ci.value is None and ci.n == 0


def _approaches():
    rows = M.json_rows(_rows())
    per = {}
    for subset in results.APPROACH_TITLES:
        res, avg = M.expected_amplification(_rows(), "prompt_id")
        per[subset] = M.result_dict(res, avg) | {"rows": rows}
    return {"m": per}


def test_table3_has_the_intervals_beside_each_value():
    metrics = results.model_metrics(_approaches(), {})
    from pipelines.engine.stats.headline import Subject

    head = summarize("s", [Subject("m", {"model": "m"}, metrics["m"])], {}, SETTINGS, False)
    t3 = results.table3(_approaches(), 2, head)
    cols = list(t3.columns)
    assert cols[:11] == ["model", "approach", "#1", "#1_low", "#1_high", "#2", "#2_low", "#2_high", "average",
                         "average_low", "average_high"]
    row = t3.iloc[0]
    want = M.average_metric(M.occupation_amplification(_rows(), "prompt_id"), "k", "l").interval(SETTINGS)
    assert (row["average"], row["average_low"], row["average_high"]) == pytest.approx((want.value, want.low,
                                                                                        want.high))
    assert row["#1_low"] <= row["#1"] <= row["#1_high"]
    shown = rep.table3_text(t3)
    assert "#1_low" not in shown and shown.iloc[0]["average"] == \
        f"{want.value:.2f} [{want.low:.2f}, {want.high:.2f}]"
    # without a headline: the values alone, as before
    plain = results.table3(_approaches(), 2)
    assert "#1_low" not in plain and rep.table3_text(plain) is plain


def test_model_metrics_cover_table3_and_section6():
    cp_rows = _rows()[lambda d: d.prompt_id == 1].drop(columns="prompt_id").assign(group="captions")
    res, avg = M.expected_amplification(cp_rows, "group")
    captions = {"m": {"all_captions": M.result_dict(res, avg) | {"rows": M.json_rows(cp_rows)}}}
    out = results.model_metrics(_approaches(), captions)["m"]
    keys = [m.key for m in out]
    assert len(keys) == 4 * 3 + 1 and keys[-1] == results.captions_key("all_captions")
    assert out[-1].interval(SETTINGS).value == pytest.approx(avg)


def test_generated_images_counts_and_reasons():
    df = pd.DataFrame({
        I.MODEL: ["m"] * 5 + ["other", None],
        I.SOURCE: ["generated", "generated", "caption_prompt", "generated", "generated", "generated", "training"],
        I.GENERATION_STATUS: ["ok", "ok", "ok", "nsfw_blocked", "ok", "ok", None],
        I.FACE_STATUS: ["ok", "no_face", "ok", None, "ok", "ok", "ok"],
        I.GENDER: ["female", None, "male", None, "ambiguous", "male", "male"],
        I.COUNTED: [True, False, True, False, False, True, True]})
    assert results.generated_images(df, "m") == (2, {"no_face": 1, "nsfw_blocked": 1, "gender ambiguous": 1})


def test_summarize_intervals_keep_the_published_values():
    """Table 6 (SD 1.4): Table 3's naive row as published, each E[A] with an interval over the
    table's occupations."""
    from pipelines.engine.stats.table_cells import read_cells

    df = read_cells(str(REPO_ROOT / "tests" / "data" / "paper002_table6.csv"))
    plain = M.summarize_percentages(df)
    out = M.summary_intervals(plain, SETTINGS)["all"]
    assert [p["expected_amplification"] for p in out["per_prompt"]] == \
        [p["expected_amplification"] for p in plain["all"]["per_prompt"]]
    assert [round(p["expected_amplification"], 2) for p in out["per_prompt"]] == [10.24, 17.57, 10.77, 11.68]
    rows = pd.DataFrame(plain["all"]["rows"])
    for p in out["per_prompt"]:
        mine = rows[(rows.group == p["group"]) & rows.excluded.isna()]
        want = iv.mean_interval(mine.amplification.to_numpy(float), settings=SETTINGS)
        assert (p["low"], p["high"]) == pytest.approx((want.low, want.high))
        assert p["low"] < p["expected_amplification"] < p["high"]
    assert out["average_low"] < out["average"] < out["average_high"]
    text = M.format_results("t", out["per_prompt"], out["average"], out["average_low"], out["average_high"], 0.95)
    assert "95% interval" in text and f"[{out['average_low']:.2f}, {out['average_high']:.2f}]" in text


def test_protocol_ignores_the_generators_and_execution():
    from pipelines import amplification
    from pipelines.studies.amplification import study

    def protocol(*extra):
        args = amplification.build_parser().parse_args(["run", "--output", "/tmp/unused", "--standin-models",
                                                        "--occupations", "nurse,engineer", *extra])
        return study.protocol(study.AmplificationStudy().settings(args), standin=True)

    base = protocol()
    assert protocol("--generators", "stabilityai/stable-diffusion-2-base", "--gen-batch-size", "2",
                    "--fetch-threads", "4") == base
    # how far the walk's first round fetches: the same T, the same protocol (a sample size is not)
    assert protocol("--walk-first-round", "2") == base
    assert protocol("--sample-size", "7")["selection"] != base["selection"]
    assert protocol("--images-per-prompt", "7")["images_per_prompt"] == 7 != base["images_per_prompt"]
    assert protocol("--occupations", "nurse,judge")["occupations"] != base["occupations"]
    assert protocol("--gender-threshold", "0.8")["gender_classifier"] != base["gender_classifier"]
    assert protocol("--prompt", "A photo of {article} {occupation}")["prompts"] != base["prompts"]


def _one_occupation(t, n_t, g, n_g, groups=("1", "2")):
    return pd.DataFrame({"occupation": ["nurse"] * len(groups), "prompt_id": list(groups), "training": [t] * len(groups),
                         "n_training": [n_t] * len(groups), "generated": [g] * len(groups),
                         "n_generated": [n_g] * len(groups), "amplification": [abs(g - 50) - abs(t - 50)] * len(groups),
                         "excluded": [None] * len(groups)})


def test_image_resamples_of_e_a_are_binomial_share_the_training_draw_and_keep_the_exclusion_rule():
    from pipelines.studies.amplification import metrics as AM

    # T fixed (a million images), G from 40 images at 20%: A* = |G* - 50| - 20, sd 100 sqrt(.2 .8 / 40)
    rows = _one_occupation(30.0, 10**6, 20.0, 40)
    wide = AM.occupation_amplification(rows, "prompt_id")
    cube = AM.resampled_amplification(rows, "prompt_id", wide, False, resamples=400, seed=1)
    assert cube.shape == (400, 1, 2)
    assert np.std(cube[:, 0, 0]) == pytest.approx(100 * np.sqrt(0.2 * 0.8 / 40), rel=0.15)
    # G fixed, T from 30 images: one subset per occupation is drawn once for both prompts ...
    rows = _one_occupation(30.0, 30, 20.0, 10**6)
    shared = AM.resampled_amplification(rows, "prompt_id", wide, False, resamples=400, seed=2)
    both = np.isfinite(shared[:, 0, 0]) & np.isfinite(shared[:, 0, 1])
    assert np.corrcoef(shared[both, 0, 0], shared[both, 0, 1])[0, 1] > 0.99
    # ... a subset per prompt (nearest neighbours) once per prompt
    apart = AM.resampled_amplification(rows, "prompt_id", wide, True, resamples=400, seed=2)
    both = np.isfinite(apart[:, 0, 0]) & np.isfinite(apart[:, 0, 1])
    assert abs(np.corrcoef(apart[both, 0, 0], apart[both, 0, 1])[0, 1]) < 0.2
    # T at 48% of 10 images: resamples above 50% switch direction against G's 30%: left out there
    rows = _one_occupation(48.0, 10, 30.0, 10**6)
    cube = AM.resampled_amplification(rows, "prompt_id", wide, False, resamples=400, seed=3)
    left_out = np.isnan(cube[:, 0, 0]).mean()
    assert 0.2 < left_out < 0.6
    # the average over prompts of each resample, as average_over_groups computes it
    avg = AM.averaged_replicates(cube)
    for r in range(20):
        values, _ = AM.average_over_groups(pd.DataFrame(cube[r], index=wide.index, columns=wide.columns))
        assert np.allclose(avg[r], values, equal_nan=True)

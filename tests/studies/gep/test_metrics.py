"""GEP math (paper 001: Eq. 2, section 6, App. D) on small known answers and on the paper's own tables
(Tables 3, 6, 11-14)."""

from helpers import TESTS_DATA
import json

import numpy as np
import pandas as pd
import pytest

from pipelines.studies.gep.metrics import (
    ATTRIBUTES,
    COMPARISON,
    DIFFERENCE,
    F_FIRST,
    F_SECOND,
    GEP,
    KENDALL,
    MCC,
    PEARSON,
    N,
    compare_scores,
    compare_vectors,
    format_summary,
    gep_scores,
    gep_vectors,
    kendall_tau_b,
    pearson,
    roc_auc,
    sign_mcc,
    summarize_frequencies,
)
from schemas.gep import (
    ATTRIBUTE,
    ESTIMATOR,
    FREQUENCY,
    GENDER,
    IMAGES,
    MODEL,
    SETTING,
    Estimator,
    Setting,
)

DATA = TESTS_DATA
MODELS = ["CogView2", "DALLE-2", "Stable Diffusion"]
ATTRS = "boots slippers jeans shorts slacks dress skirt suit shirt uniform jacket hat tie mask gloves".split()

# Table 3, GEP_human (2 decimals)
TABLE3 = {
    Setting.NEUTRAL: {"CogView2": 0.02, "DALLE-2": 0.05, "Stable Diffusion": 0.07},
    Setting.EXPLICIT: {"CogView2": 0.18, "DALLE-2": 0.12, "Stable Diffusion": 0.14},
}
# Tables 13 (neutral) and 14 (explicit): GEP_human vectors, attributes in ATTRS order
TABLE13 = {
    "CogView2": [0.00, 0.00, 0.01, 0.00, -0.02, 0.14, 0.05, 0.00, -0.02, 0.00, -0.06, -0.01, -0.01, -0.01, 0.00],
    "DALLE-2": [0.01, 0.01, 0.10, -0.09, -0.10, 0.04, 0.05, -0.04, -0.19, -0.01, -0.05, 0.00, -0.01, -0.03, 0.04],
    "Stable Diffusion": [0.03, -0.04, -0.09, -0.02, -0.14, 0.09, 0.05, -0.16, -0.14, -0.01, -0.08, -0.04, -0.07,
                         0.00, -0.04],
}
TABLE14 = {
    "CogView2": [0.14, 0.03, 0.10, -0.08, -0.05, 0.64, 0.50, -0.30, -0.03, -0.15, -0.14, 0.07, -0.19, -0.11, 0.14],
    "DALLE-2": [0.07, -0.14, -0.03, -0.01, -0.18, 0.88, 0.19, -0.01, -0.03, 0.03, -0.01, -0.05, -0.06, -0.05, 0.04],
    "Stable Diffusion": [0.09, 0.14, -0.01, -0.09, -0.15, 0.64, 0.16, -0.16, -0.01, -0.05, -0.01, 0.07, -0.35, 0.04,
                         0.09],
}
# Table 6: GEP_C, GEP_CC, GEP_CLS per (setting, model), their printed ranks and Kendall's tau with GEP_human
CELLS = [(s, m) for s in (Setting.NEUTRAL, Setting.EXPLICIT) for m in MODELS]
TABLE6 = {
    Estimator.C: ([5.15e-3, 5.06e-3, 4.80e-3, 9.81e-3, 9.76e-3, 7.08e-3], [3, 2, 1, 6, 5, 4], 0.466),
    Estimator.CC: ([4.49e-3, 5.68e-3, 4.77e-3, 1.10e-2, 1.04e-2, 6.58e-3], [1, 3, 2, 6, 5, 4], 0.733),
    Estimator.CLS: ([3.79e-2, 4.26e-2, 4.47e-2, 9.25e-2, 5.18e-2, 6.32e-2], [1, 2, 3, 6, 4, 5], 1.000),
}
TABLE6_HUMAN_RANKS = [1, 2, 3, 6, 4, 5]


def freq_rows(model, setting, woman, man, attrs=("a", "b", "c"), **extra):
    rows = []
    for g, vals in (("woman", woman), ("man", man)):
        for a, v in zip(attrs, vals):
            rows.append({MODEL: model, SETTING: setting, GENDER: g, ATTRIBUTE: a, FREQUENCY: v, **extra})
    return rows


# ------------------------------------------------------------------------------ vectors and scores
def test_gep_vectors_and_scores_small_example():
    freq = pd.DataFrame(
        freq_rows("M1", "neutral", [0.5, 0.1, 0.0], [0.1, 0.3, 0.0])
        + freq_rows("M2", "neutral", [1.0, 0.0, 0.25], [0.0, 1.0, 0.25])
    )
    freq[IMAGES] = 10                          # extra column, ignored
    vec = gep_vectors(freq)                    # no estimator column: that key is ignored
    assert list(vec.columns) == [MODEL, SETTING, COMPARISON, ATTRIBUTE, F_FIRST, F_SECOND, DIFFERENCE]
    assert vec[MODEL].tolist() == ["M1"] * 3 + ["M2"] * 3
    assert vec[ATTRIBUTE].tolist() == ["a", "b", "c"] * 2
    assert set(vec[COMPARISON]) == {"woman - man"}
    np.testing.assert_allclose(vec[DIFFERENCE], [0.4, -0.2, 0.0, 1.0, -1.0, 0.0], atol=1e-12)
    np.testing.assert_allclose(vec[F_FIRST], [0.5, 0.1, 0.0, 1.0, 0.0, 0.25])
    np.testing.assert_allclose(vec[F_SECOND], [0.1, 0.3, 0.0, 0.0, 1.0, 0.25])

    scores = gep_scores(vec)
    assert list(scores.columns) == [MODEL, SETTING, COMPARISON, ATTRIBUTES, GEP]
    assert scores[MODEL].tolist() == ["M1", "M2"]
    assert scores[ATTRIBUTES].tolist() == [3, 3]
    np.testing.assert_allclose(scores[GEP], [0.2, 2 / 3], atol=1e-12)   # (0.4+0.2+0)/3, (1+1+0)/3


def test_gep_vectors_order_pairs_and_estimator_key():
    # attribute order follows first appearance in freq even if the second group lists them differently;
    # two estimators are two key combinations; several pairs give one comparison each
    rows = []
    for est, shift in ((Estimator.CLS, 0.0), (Estimator.C, 0.1)):
        groups = (("man", {"z": 0.2, "y": 0.4}), ("woman", {"y": 0.1, "z": 0.6}), ("person", {"z": 0.3, "y": 0.3}))
        for g, vals in groups:
            for a, v in vals.items():
                rows.append({MODEL: "M", SETTING: "explicit", ESTIMATOR: est, GENDER: g, ATTRIBUTE: a,
                             FREQUENCY: v + shift})
    vec = gep_vectors(pd.DataFrame(rows), pairs=[("woman", "man"), ("person", "man")])
    assert list(vec.columns[:3]) == [MODEL, SETTING, ESTIMATOR]
    assert vec[ESTIMATOR].tolist() == [Estimator.CLS] * 4 + [Estimator.C] * 4
    assert vec[COMPARISON].tolist() == ["woman - man"] * 2 + ["person - man"] * 2 + ["woman - man"] * 2 + [
        "person - man"] * 2
    assert vec[ATTRIBUTE].tolist() == ["z", "y"] * 4
    np.testing.assert_allclose(vec[DIFFERENCE], [0.4, -0.3, 0.1, -0.1] * 2, atol=1e-12)
    scores = gep_scores(vec)
    assert scores[[ESTIMATOR, COMPARISON]].values.tolist() == [
        [Estimator.CLS, "woman - man"], [Estimator.CLS, "person - man"],
        [Estimator.C, "woman - man"], [Estimator.C, "person - man"]]
    np.testing.assert_allclose(scores[GEP], [0.35, 0.1, 0.35, 0.1], atol=1e-12)


def test_gep_vectors_without_any_key():
    freq = pd.DataFrame(freq_rows("x", "y", [0.3, 0.6], [0.1, 0.9], attrs=("p", "q"))).drop(columns=[MODEL, SETTING])
    vec = gep_vectors(freq)
    assert list(vec.columns) == [COMPARISON, ATTRIBUTE, F_FIRST, F_SECOND, DIFFERENCE]
    assert gep_scores(vec)[GEP].tolist() == pytest.approx([0.25])


def test_gep_vectors_errors():
    base = freq_rows("M1", "neutral", [0.5, 0.1, 0.0], [0.1, 0.3, 0.0])
    # attribute for one group only
    with pytest.raises(ValueError, match=r"'M1'.*attribute 'c' has a frequency for 'woman' but not for 'man'"):
        gep_vectors(pd.DataFrame(base[:5]))
    # a group of the pair is absent for one key combination
    with pytest.raises(ValueError, match=r"\['man'\].*model='M2', setting='neutral'"):
        gep_vectors(pd.DataFrame(base + freq_rows("M2", "neutral", [0.2], [], attrs=("a",))))
    # duplicate (keys, gender, attribute)
    with pytest.raises(ValueError, match="duplicate"):
        gep_vectors(pd.DataFrame(base + base[:1]))
    # NaN frequency counts as missing: for one group -> error, for both groups -> attribute dropped
    one = pd.DataFrame(base)
    one.loc[1, FREQUENCY] = np.nan
    with pytest.raises(ValueError, match="attribute 'b'"):
        gep_vectors(one)
    both = one.copy()
    both.loc[4, FREQUENCY] = np.nan
    vec = gep_vectors(both)
    assert vec[ATTRIBUTE].tolist() == ["a", "c"]
    assert gep_scores(vec)[ATTRIBUTES].tolist() == [2]
    with pytest.raises(ValueError, match="lack column"):
        gep_vectors(pd.DataFrame(base).drop(columns=[FREQUENCY]))


# ------------------------------------------------------------------------------ correlations
def test_kendall_tau_b_with_ties_hand_computed():
    # pairs: 7 concordant, 1 discordant, 1 tied in x only, 1 tied in y only
    # tau_b = (7 - 1) / sqrt((8 + 1) * (8 + 1)) = 6 / 9 (tau_a would be 0.6)
    assert kendall_tau_b([1, 2, 3, 4, 4], [2, 1, 3, 3, 4]) == pytest.approx(6 / 9)
    # 4 concordant, 1 tie in x, 1 tie in y: 4 / sqrt(5 * 5)
    assert kendall_tau_b([1, 2, 2, 3], [1, 2, 3, 3]) == pytest.approx(0.8)
    assert kendall_tau_b([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert kendall_tau_b([1, 1, 1], [1, 2, 3]) is None
    assert kendall_tau_b([1], [2]) is None
    assert kendall_tau_b([1, np.nan, 2, 3], [1, 5, 2, 3]) == pytest.approx(1.0)   # NaN pair dropped


def test_sign_mcc():
    assert sign_mcc([0.3, -0.2, 0.1, -0.5], [0.01, -0.4, 2.0, -0.1]) == pytest.approx(1.0)
    assert sign_mcc([0.3, -0.2, 0.1, -0.5], [-0.01, 0.4, -2.0, 0.1]) == pytest.approx(-1.0)
    # zero is non-negative -> 1 (footnote 9 / App. D)
    assert sign_mcc([0.0, -1.0], [1.0, -1.0]) == pytest.approx(1.0)
    assert sign_mcc([0.0, -1.0], [-1.0, 1.0]) == pytest.approx(-1.0)
    # tp=2 fp=1 tn=1 fn=1: (2*1 - 1*1) / sqrt(3*3*2*2) = 1/6
    assert sign_mcc([1, 1, -1, -1, 1], [1, -1, -1, 1, 1]) == pytest.approx(1 / 6)
    # undefined: one side has a single class
    assert sign_mcc([0.1, 0.2, 0.0], [0.5, -0.5, 0.1]) is None
    assert sign_mcc([0.1, -0.2], [-0.1, -0.3]) is None
    assert sign_mcc([], []) is None


def test_pearson():
    assert pearson([1, 2, 3], [2, 4, 7]) == pytest.approx(np.corrcoef([1, 2, 3], [2, 4, 7])[0, 1])
    assert pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert pearson([1, 1, 1], [1, 2, 3]) is None
    assert pearson([1], [1]) is None


def test_roc_auc():
    assert roc_auc([0, 0, 1, 1], [0.1, 0.2, 0.8, 0.9]) == 1.0
    assert roc_auc([0, 0, 1, 1], [0.9, 0.8, 0.2, 0.1]) == 0.0
    assert roc_auc([0, 1, 0, 1], [0.5, 0.5, 0.5, 0.5]) == 0.5
    assert roc_auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) == pytest.approx(0.75)
    # a tie across classes counts one half: (0.5 + 1 + 1 + 1) / 4
    assert roc_auc([0, 1, 0, 1], [0.2, 0.2, 0.1, 0.5]) == pytest.approx(0.875)
    assert roc_auc(np.array([True, False, True]), [0.9, 0.1, 0.5]) == 1.0
    assert roc_auc([1, 1, 1], [0.1, 0.2, 0.3]) is None
    assert roc_auc([0, 0], [0.1, 0.2]) is None
    with pytest.raises(ValueError):
        roc_auc([0, 2], [0.1, 0.2])


def test_roc_auc_matches_pairwise_definition():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 300)
    s = np.round(rng.normal(size=300) + y, 1)          # rounded: many ties
    pos, neg = s[y == 1], s[y == 0]
    diff = pos[:, None] - neg[None, :]
    expected = ((diff > 0).sum() + 0.5 * (diff == 0).sum()) / diff.size
    assert roc_auc(y, s) == pytest.approx(expected)


def test_compare_vectors_joins_and_scores():
    ref_vals = {"a": 0.3, "b": -0.2, "c": 0.1, "d": -0.4}
    ref_rows, auto_rows = [], []
    for m in ("M1", "M2"):
        for a, v in ref_vals.items():
            ref_rows.append({MODEL: m, SETTING: "neutral", ESTIMATOR: Estimator.HUMAN, COMPARISON: "woman - man",
                             ATTRIBUTE: a, DIFFERENCE: v})
        for est, f in ((Estimator.CLS, lambda v: 2 * v + 0.01), (Estimator.C, lambda v: -v)):
            for a, v in ref_vals.items():
                if m == "M2" and a == "d":
                    continue                    # not joined
                auto_rows.append({MODEL: m, SETTING: "neutral", ESTIMATOR: est, COMPARISON: "woman - man",
                                  ATTRIBUTE: a, DIFFERENCE: f(v)})
    # an auto attribute absent from the reference is not joined either
    auto_rows.append({MODEL: "M1", SETTING: "neutral", ESTIMATOR: Estimator.C, COMPARISON: "woman - man",
                      ATTRIBUTE: "zz", DIFFERENCE: 5.0})
    res = compare_vectors(pd.DataFrame(auto_rows), pd.DataFrame(ref_rows))
    assert list(res.columns) == [MODEL, SETTING, COMPARISON, ESTIMATOR, N, KENDALL, MCC, PEARSON]
    assert res[[MODEL, ESTIMATOR]].values.tolist() == [
        ["M1", Estimator.CLS], ["M1", Estimator.C], ["M2", Estimator.CLS], ["M2", Estimator.C]]
    assert res[N].tolist() == [4, 4, 3, 3]
    assert res[KENDALL].tolist() == pytest.approx([1.0, -1.0, 1.0, -1.0])
    assert res[MCC].tolist() == pytest.approx([1.0, -1.0, 1.0, -1.0])
    assert res[PEARSON].tolist() == pytest.approx([1.0, -1.0, 1.0, -1.0])

    # a group without any joined attribute is kept with n = 0 and undefined metrics
    lone = pd.DataFrame([{MODEL: "M9", SETTING: "neutral", ESTIMATOR: Estimator.CC, COMPARISON: "woman - man",
                          ATTRIBUTE: "a", DIFFERENCE: 0.1}])
    res = compare_vectors(lone, pd.DataFrame(ref_rows))
    assert res[N].tolist() == [0] and res[KENDALL].tolist() == [None] and res[MCC].tolist() == [None]


# ------------------------------------------------------------------------------ the paper's tables
@pytest.fixture(scope="module")
def paper_summary():
    return summarize_frequencies(pd.read_csv(DATA / "paper001_tables11_12.csv"))


def test_tables11_12_reproduce_table3(paper_summary):
    res = paper_summary["results"]
    assert paper_summary["pairs"] == ["woman", "man"]
    assert [(r[MODEL], r[SETTING]) for r in res] == [(m, s) for s, m in CELLS]
    for r in res:
        assert r[COMPARISON] == "woman - man"
        assert r[ATTRIBUTES] == 15
        assert round(r[GEP], 2) == TABLE3[r[SETTING]][r[MODEL]], (r[MODEL], r[SETTING], r[GEP])
    json.dumps(paper_summary)                  # JSON-serialisable


@pytest.mark.parametrize("setting,table", [(Setting.NEUTRAL, TABLE13), (Setting.EXPLICIT, TABLE14)])
def test_tables11_12_reproduce_tables13_14(paper_summary, setting, table):
    res = {r[MODEL]: r["vector"] for r in paper_summary["results"] if r[SETTING] == setting}
    for model in MODELS:
        assert list(res[model]) == ATTRS
        got = np.array([res[model][a] for a in ATTRS])
        # the published frequencies and differences are both rounded to 0.01
        assert np.abs(got - np.array(table[model])).max() <= 0.01 + 1e-9, (model, setting)


def test_table6_model_level_kendall():
    auto = pd.DataFrame([
        {MODEL: m, SETTING: s, ESTIMATOR: est, COMPARISON: "woman - man", ATTRIBUTES: 15, GEP: v}
        for est, (values, _, _) in TABLE6.items() for (s, m), v in zip(CELLS, values)
    ])
    human = pd.DataFrame([
        {MODEL: m, SETTING: s, ESTIMATOR: Estimator.HUMAN, COMPARISON: "woman - man", ATTRIBUTES: 15,
         GEP: TABLE3[s][m]} for s, m in CELLS
    ])
    res = compare_scores(auto, human)
    json.dumps(res)
    assert res["cell_keys"] == [MODEL, SETTING, COMPARISON]
    by_est = {e["estimator"]: e for e in res["estimators"]}
    assert list(by_est) == [Estimator.C, Estimator.CC, Estimator.CLS]
    for est, (_, ranks, tau) in TABLE6.items():
        e = by_est[est]
        assert e["n"] == 6
        assert e[KENDALL] == pytest.approx(tau, abs=0.002), est
        assert [c["rank"] for c in e["cells"]] == ranks
        assert [c["reference_rank"] for c in e["cells"]] == TABLE6_HUMAN_RANKS
        assert [(c[SETTING], c[MODEL]) for c in e["cells"]] == CELLS
    assert by_est[Estimator.C][KENDALL] == pytest.approx(7 / 15)     # 11 concordant, 4 discordant pairs

    # the unrounded GEP_human from Tables 11/12 ranks the cells the same way
    freq = pd.read_csv(DATA / "paper001_tables11_12.csv")
    res2 = compare_scores(auto, gep_scores(gep_vectors(freq)))
    assert [e[KENDALL] for e in res2["estimators"]] == pytest.approx([7 / 15, 11 / 15, 1.0])


def test_compare_scores_without_estimator_column():
    auto = pd.DataFrame({MODEL: ["a", "b", "c"], GEP: [0.3, 0.1, 0.2]})
    ref = pd.DataFrame({MODEL: ["c", "b", "a", "z"], GEP: [2.0, 1.0, 3.0, 9.0]})
    res = compare_scores(auto, ref)
    assert res["cell_keys"] == [MODEL]
    (e,) = res["estimators"]
    assert e["estimator"] == "auto" and e["n"] == 3 and e[KENDALL] == pytest.approx(1.0)
    assert [c["rank"] for c in e["cells"]] == [3.0, 1.0, 2.0]


# ------------------------------------------------------------------------------ summarize validation
def test_summarize_validation():
    good = pd.DataFrame(freq_rows("M", "neutral", [0.5, 0.1, 0.0], [0.1, 0.3, 0.0]))
    with pytest.raises(ValueError, match=r"\['gender', 'frequency'\]"):
        summarize_frequencies(good.drop(columns=[GENDER, FREQUENCY]))
    bad = good.astype({FREQUENCY: object})
    bad.loc[2, FREQUENCY] = "lots"
    with pytest.raises(ValueError, match=r"not a number.*\[2\]"):
        summarize_frequencies(bad)
    bad = good.copy()
    bad.loc[[1, 4], FREQUENCY] = [1.5, -0.1]
    with pytest.raises(ValueError, match=r"outside \[0, 1\].*\[1, 4\]"):
        summarize_frequencies(bad)
    bad = good.copy()
    bad.loc[3, FREQUENCY] = np.nan
    with pytest.raises(ValueError, match=r"missing.*\[3\]"):
        summarize_frequencies(bad)
    bad = good.copy()
    bad.loc[0, ATTRIBUTE] = "  "
    with pytest.raises(ValueError, match=r"missing.*\[0\]"):
        summarize_frequencies(bad)


def test_summarize_extra_columns_estimator_key_and_format():
    df = pd.DataFrame(
        freq_rows("M", "neutral", [0.5, 0.1, 0.0], [0.1, 0.3, 0.0], estimator="human", note="x")
        + freq_rows("M", "neutral", [0.6, 0.2, 0.2], [0.1, 0.1, 0.1], estimator="CLS", note="y")
    )
    out = summarize_frequencies(df)
    assert [(r[ESTIMATOR], round(r[GEP], 6)) for r in out["results"]] == [("human", 0.2), ("CLS", round(0.7 / 3, 6))]
    assert out["results"][0]["vector"] == pytest.approx({"a": 0.4, "b": -0.2, "c": 0.0})
    text = format_summary(out)
    assert "0.20" in text and "0.2000" in text and "0.2333" in text
    assert "a +0.40" in text and "b -0.20" in text and "c +0.00" in text


def test_format_summary_paper(paper_summary):
    text = format_summary(paper_summary)
    lines = text.splitlines()
    stable_explicit = [ln for ln in lines if ln.startswith("Stable Diffusion") and "explicit" in ln]
    assert len(stable_explicit) == 1 and "0.14" in stable_explicit[0] and "0.1367" in stable_explicit[0]
    assert "dress +0.88" in text and "tie -0.35" in text

"""Agreement statistics: Krippendorff's α against his own worked examples and against the
``krippendorff`` package on random tables (our resampling statistic must equal the package at every
resample's weights), the bootstrap interval, majorities with ties and unsure, the classifier's
agreement with the majority."""

import numpy as np
import pandas as pd
import pytest

from pipelines.annotate import agreement as G
from pipelines.engine.stats import intervals as I
from schemas import annotation as A

NAN = np.nan
# Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability", section C: 4 observers, 12 units,
# values 1-5, missing values; published alpha: nominal 0.743, ordinal 0.815
KRIPP_C = [[1, 2, 3, 3, 2, 1, 4, 1, 2, NAN, NAN, NAN],
           [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, NAN, 3],
           [NAN, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, NAN],
           [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, NAN]]
# section A: two observers, binary, 10 units, no missing values; published alpha 0.095
KRIPP_A = [[0, 1, 0, 0, 0, 0, 0, 0, 1, 0], [1, 1, 1, 0, 0, 1, 0, 0, 0, 0]]


def long_table(matrix) -> pd.DataFrame:
    rows = [(f"u{u:02d}", f"obs{o}", str(int(v))) for o, row in enumerate(matrix) for u, v in enumerate(row)
            if not np.isnan(v)]
    return pd.DataFrame(rows, columns=[A.ITEM_ID, A.ANNOTATOR, A.ANSWER])


@pytest.mark.parametrize("matrix, values, level, published", [
    (KRIPP_C, ["1", "2", "3", "4", "5"], "nominal", 0.743),
    (KRIPP_C, ["1", "2", "3", "4", "5"], "ordinal", 0.815),
    (KRIPP_A, ["0", "1"], "nominal", 0.095)])
def test_alpha_reproduces_krippendorffs_worked_examples(matrix, values, level, published):
    ids, counts = G.value_counts(long_table(matrix), values)
    assert round(G.alpha(counts, level), 3) == published
    assert round(float(G.alpha_statistic(counts, level)(np.ones((1, len(counts))))[0]), 3) == published


@pytest.mark.parametrize("level", G.LEVELS)
def test_resampling_statistic_equals_the_package_on_random_tables_and_weights(level):
    import krippendorff

    rng = np.random.default_rng(7)
    for _ in range(10):
        n, v = int(rng.integers(5, 30)), int(rng.integers(2, 6))
        counts = rng.integers(0, 4, (n, v)).astype(float)
        weights = rng.integers(0, 3, (3, n)).astype(float)          # a bootstrap resample: items repeated
        ours = G.alpha_statistic(counts, level)(weights)
        for w, a in zip(weights, ours):
            repeated = counts[np.repeat(np.arange(n), w.astype(int))]
            repeated = repeated[repeated.sum(axis=1) >= 2]
            if len(repeated) == 0 or np.count_nonzero(repeated.sum(axis=0)) < 2:
                continue
            ref = krippendorff.alpha(value_counts=repeated, value_domain=list(range(v)), level_of_measurement=level)
            assert a == pytest.approx(ref, abs=1e-9)


def test_alpha_interval_covers_the_value_and_is_recorded():
    ids, counts = G.value_counts(long_table(KRIPP_C), ["1", "2", "3", "4", "5"])
    ci = G.alpha_interval(counts, "nominal", I.IntervalSettings(resamples=500, method="percentile"))
    assert ci.low < ci.value < ci.high <= 1 and ci.n == 11        # unit 12 has one value: not pairable
    assert G.alpha(np.array([[2.0, 0], [3, 0]])) is None           # one value throughout: undefined


def test_majority_keeps_ties_and_unsure_majorities():
    labels = pd.DataFrame([("a", "p1", "female"), ("a", "p2", "female"), ("a", "p3", "male"),
                           ("b", "p1", "female"), ("b", "p2", "male"),
                           ("c", "p1", "unsure"), ("c", "p2", "unsure"), ("c", "p3", "male"),
                           ("d", "p1", "male")], columns=list(A.LABEL_COLUMNS))
    m = G.majority(labels, unsure="unsure").set_index(A.ITEM_ID)
    assert m.loc["a", A.MAJORITY] == "female" and m.loc["a", A.MAJORITY_STATUS] == A.MajorityStatus.MAJORITY
    assert m.loc["b", A.MAJORITY_STATUS] == A.MajorityStatus.TIE and pd.isna(m.loc["b", A.MAJORITY])
    assert m.loc["c", A.MAJORITY_STATUS] == A.MajorityStatus.UNSURE and pd.isna(m.loc["c", A.MAJORITY])
    assert m.loc["d", A.MAJORITY] == "male" and m.loc["a", A.VOTES] == "female 2, male 1"
    assert list(m[A.N_ANSWERS]) == [3, 2, 3, 1]


def test_classifier_agreement_scores_only_items_with_a_majority():
    items = pd.DataFrame({A.ITEM_ID: list("abcde"), A.PREDICTION: ["female", "female", "male", None, "male"],
                          "model": ["x", "x", "y", "y", "y"]})
    maj = pd.DataFrame({A.ITEM_ID: list("abcd"), A.MAJORITY: ["female", None, "female", "male"],
                        A.MAJORITY_STATUS: ["majority", "tie", "majority", "majority"]})
    t = G.classifier_agreement(items, maj, ["model"]).set_index("model")
    assert (t.loc["x", "scored"], t.loc["x", "agree"], t.loc["x", "ties"]) == (1, 1, 1)
    # y: c disagrees, d has no prediction, e is unanswered
    assert (t.loc["y", "scored"], t.loc["y", "agree"], t.loc["y", "unanswered"]) == (1, 0, 1)
    ci = I.binomial_interval(0, 1)
    assert (t.loc["y", "agreement_low"], t.loc["y", "agreement_high"]) == pytest.approx((ci.low, ci.high))
    conf = G.confusion(items, maj, [])
    assert conf.set_index(["prediction", "people"])["count"].to_dict() == {
        ("(none)", "male"): 1, ("female", "female"): 1, ("female", "tie"): 1, ("male", "female"): 1,
        ("male", "no answers"): 1}


def test_agreement_reads_a_long_table_directly(tmp_path, capsys):
    from pipelines.annotate import cli

    long_table(KRIPP_C).to_csv(tmp_path / "k.csv", index=False)
    assert cli.main(["agreement", str(tmp_path / "k.csv"), "--interval-resamples", "200"]) == 0
    assert "alpha (nominal): 0.743 [" in capsys.readouterr().out
    assert cli.main(["agreement", str(tmp_path / "k.csv"), "--level", "ordinal", "--order", "1,2,3,4,5"]) == 0
    assert "alpha (ordinal): 0.815 [" in capsys.readouterr().out
    assert cli.main(["agreement", str(tmp_path / "k.csv"), "--level", "ordinal"]) == 2
    assert "needs --order" in capsys.readouterr().err
    # an annotator who answered an item twice: the last answer counts, as in a task set's store
    twice = pd.concat([long_table(KRIPP_C).assign(answer="4").iloc[:1], long_table(KRIPP_C)])
    twice.to_csv(tmp_path / "twice.csv", index=False)
    assert cli.main(["agreement", str(tmp_path / "twice.csv"), "--interval-resamples", "200"]) == 0
    out = capsys.readouterr().out
    assert "1 earlier answers of an annotator to the same item replaced" in out and "0.743 [" in out

"""Intervals on headline numbers: coverage on simulated data with a known answer."""

import numpy as np
import pytest
from scipy import stats as sps

from pipelines.engine.stats import intervals as iv


def _coverage(make, estimate, truth, sims=1000, seed=0):
    rng = np.random.default_rng(seed)
    hit = 0
    for i in range(sims):
        ci = estimate(make(rng), i)
        hit += ci.low <= truth <= ci.high
    return hit / sims


@pytest.mark.parametrize("method", ["bca", "percentile"])
def test_the_bootstrap_covers_the_true_mean_95_percent_of_the_time(method):
    # 1,000 simulated studies of 40 units each (a skewed per-unit value, as amplifications are)
    cover = _coverage(lambda r: r.gamma(4.0, 0.5, 40), lambda x, i: iv.mean_interval(
        x, settings=iv.IntervalSettings(resamples=1000, seed=i, method=method)), truth=2.0)
    assert 0.93 <= cover <= 0.97, cover


def test_the_stratified_bootstrap_covers_a_weighted_mean_and_keeps_strata_sizes():
    # (strata of 20 or more units: the bootstrap's variance is (n-1)/n of the truth per stratum, so
    # strata of 10 cover about 92%: docs/method.md)
    strata = np.repeat([0, 1, 2], [20, 30, 40])
    counts = iv.resample_counts(np.random.default_rng(0), 50, strata)
    for s, n in ((0, 20), (1, 30), (2, 40)):
        assert np.all(counts[:, strata == s].sum(axis=1) == n)
    means = np.repeat([0.0, 1.0, 3.0], [20, 30, 40])
    cover = _coverage(lambda r: means + r.normal(0, 1, 90), lambda x, i: iv.mean_interval(
        x, strata=strata, settings=iv.IntervalSettings(resamples=1000, seed=i)), truth=means.mean(), sims=2000)
    assert 0.93 <= cover <= 0.97, cover


def test_t_and_binomial_intervals_cover_at_their_level():
    assert 0.93 <= _coverage(lambda r: r.normal(1.0, 2.0, 12), lambda x, i: iv.t_interval(x), 1.0) <= 0.97
    for method in ("wilson", "clopper-pearson"):
        cover = _coverage(lambda r: r.binomial(80, 0.3), lambda k, i: iv.binomial_interval(int(k), 80, method=method),
                          0.3)
        assert 0.93 <= cover <= (0.985 if method == "clopper-pearson" else 0.97), (method, cover)  # C-P is conservative
    ci = iv.binomial_interval(0, 20, method="clopper-pearson")
    assert ci.low == 0 and ci.high == pytest.approx(1 - 0.025 ** (1 / 20))          # the exact bound


def test_the_t_interval_is_student_s():
    x = np.array([1.0, 2.0, 4.0, 7.0])
    ci = iv.t_interval(x)
    half = sps.t.ppf(0.975, 3) * x.std(ddof=1) / 2
    assert (ci.low, ci.high) == pytest.approx((x.mean() - half, x.mean() + half))


def test_degenerate_inputs_give_no_interval_rather_than_a_wrong_one():
    assert iv.mean_interval([]).value is None
    one = iv.mean_interval([0.4])
    assert one.value == 0.4 and one.low is None and one.n == 1
    same = iv.mean_interval([0.2] * 10)
    assert (same.low, same.high) == pytest.approx((0.2, 0.2))
    nan = iv.mean_interval([0.1, np.nan, 0.3])
    assert nan.n == 2 and nan.value == pytest.approx(0.2)
    assert iv.mean_interval([1, 2, 3], settings=iv.IntervalSettings(seed=5)).as_dict() == \
        iv.mean_interval([1, 2, 3], settings=iv.IntervalSettings(seed=5)).as_dict()      # seeded: reproducible
    with pytest.raises(ValueError):
        iv.IntervalSettings(method="studentised")
    assert iv.mean_interval([0.1, 0.2, 0.4]).text(1, 100) .startswith("23.3 [")


def test_the_paired_test_holds_its_level_and_finds_a_real_difference():
    rng = np.random.default_rng(1)
    st = iv.IntervalSettings(resamples=500)
    false = 0
    for i in range(300):
        base = rng.normal(0, 1, 30)                       # shared prompts: a large common unit effect
        a, b = base + rng.normal(0, 0.2, 30), base + rng.normal(0, 0.2, 30)
        false += iv.paired_test(a, b, iv.IntervalSettings(resamples=500, seed=i))["p_value"] < 0.05
    assert 0.02 <= false / 300 <= 0.09
    base = rng.normal(0, 1, 30)
    shifted = iv.paired_test(base + 0.3 + rng.normal(0, 0.2, 30), base + rng.normal(0, 0.2, 30), st)
    assert shifted["p_value"] < 0.01 and shifted["low"] > 0
    # unpaired, the unit effect hides the same shift: pairing is what makes it visible
    far = iv.unpaired_test(rng.normal(2, 1, 40), rng.normal(0, 1, 40), st)
    assert far["p_value"] < 0.01 and far["low"] > 1 and far["test"].startswith("unpaired")
    missing = iv.paired_test([1.0, np.nan, 3.0], [0.5, 2.0, np.nan])
    assert missing["n"] == 1


def test_holm_adjusts_step_down():
    assert iv.holm([0.01, 0.04, 0.03, None]) == pytest.approx([0.03, 0.06, 0.06, None])
    assert iv.holm([]) == []


def test_the_closed_form_jackknife_equals_leaving_each_unit_out():
    rng = np.random.default_rng(3)
    v, w = rng.normal(0, 1, 57), rng.uniform(0.5, 2, 57)
    stat = iv.weighted_mean(v, w)
    generic = iv._jackknife(lambda counts: stat(counts), 57, chunk=10)     # no closed form: rows of counts
    assert np.allclose(stat.leave_one_out(), generic)
    loo = [np.average(np.delete(v, i), weights=np.delete(w, i)) for i in range(57)]
    assert np.allclose(generic, loo)
    # so BCa over many units needs no units x units matrix (COCO-sized: 50,000 triplets)
    big = iv.mean_interval(rng.normal(0, 1, 50_000), settings=iv.IntervalSettings(resamples=200))
    assert big.low < big.value < big.high

"""Link rot of the training images (pipelines/studies/amplification/link_rot.py): shares, counts,
the lost-vs-kept indicator-class test, its correction and its calibration under the null."""

import itertools
import json
from math import comb

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from scipy import stats

from pipelines.studies.amplification import link_rot as lr
from pipelines.studies.amplification.link_rot import (
    CAPTIONS,
    CAUSE,
    DIFFERS,
    KEPT,
    KEPT_CLASS,
    LINK_ROT_COLUMNS,
    LINK_ROT_SCHEMA,
    LOST,
    LOST_CLASS,
    LOST_SHARE,
    METHOD,
    P_VALUE,
    Q_VALUE,
    STATISTIC,
    Cause,
    link_rot_summary,
    link_rot_table,
)
from schemas.captions import CAPTION_GENDER, CAPTION_ID, OCCUPATION, CaptionGender
from schemas.images import FETCH_STATUS, SOURCE, FetchStatus, Source
from schemas.subsets import PROMPT_ID, SUBSET, Subset

F, M, B, N = CaptionGender.FEMALE, CaptionGender.MALE, CaptionGender.BOTH, CaptionGender.NONE
OK = FetchStatus.OK
NOT_IN_SHARDS = getattr(FetchStatus, "NOT_IN_SHARDS", "not_in_shards")
SHARD_FAILED = getattr(FetchStatus, "SHARD_FAILED", "shard_failed")


def _table(rows, **extra) -> pa.Table:
    """rows: (occupation, subset, caption_gender, fetch_status); caption ids 0, 1, ..."""
    occ, sub, gender, status = zip(*rows) if rows else ((), (), (), ())
    cols = {OCCUPATION: pa.array(occ, pa.string()), SUBSET: pa.array(sub, pa.string()),
            CAPTION_ID: pa.array(range(len(rows)), pa.int64()),
            CAPTION_GENDER: pa.array(gender, pa.string()), FETCH_STATUS: pa.array(status, pa.string())}
    cols.update(extra)
    return pa.table(cols)


def _group(occupation, subset, counts: dict) -> list:
    """counts: {(gender, status): n}"""
    return [(occupation, subset, g, s) for (g, s), n in counts.items() for _ in range(n)]


def _row(table, occupation, subset, cause) -> dict:
    rows = [r for r in table.to_pylist()
            if r[OCCUPATION] == occupation and r[SUBSET] == subset and r[CAUSE] == cause]
    assert len(rows) == 1, rows
    return rows[0]


def _counts(row) -> dict:
    return {n: row[n] for n in [LOST_CLASS[c] for c in CaptionGender.ALL] + [KEPT_CLASS[c] for c in CaptionGender.ALL]}


def test_schema_and_column_constants():
    assert LINK_ROT_SCHEMA.names == LINK_ROT_COLUMNS
    for name in (OCCUPATION, SUBSET, CAUSE, CAPTIONS, LOST, LOST_SHARE, STATISTIC, P_VALUE, METHOD, Q_VALUE, DIFFERS):
        assert name in LINK_ROT_COLUMNS
    assert [LOST_CLASS[c] for c in CaptionGender.ALL] == [f"lost_{c}" for c in CaptionGender.ALL]
    out = link_rot_table(_table([("nurse", Subset.NAIVE, F, OK)]))
    assert out.schema == LINK_ROT_SCHEMA
    empty = link_rot_table(_table([]))
    assert empty.num_rows == 0 and empty.schema == LINK_ROT_SCHEMA


def test_hand_computed_counts_shares_and_causes():
    rows = [
        # nurse, naive: 10 captions: 5 ok, 3 lost to links (one with no URL), 2 not in the shards
        ("nurse", Subset.NAIVE, F, OK), ("nurse", Subset.NAIVE, F, OK), ("nurse", Subset.NAIVE, M, OK),
        ("nurse", Subset.NAIVE, N, OK), ("nurse", Subset.NAIVE, B, OK),
        ("nurse", Subset.NAIVE, F, FetchStatus.HTTP_ERROR), ("nurse", Subset.NAIVE, M, FetchStatus.DISALLOWED),
        ("nurse", Subset.NAIVE, F, None),
        ("nurse", Subset.NAIVE, M, NOT_IN_SHARDS), ("nurse", Subset.NAIVE, N, SHARD_FAILED),
        # ceo, no indicators: 4 captions, all "none": 1 timeout
        ("ceo", Subset.NO_INDICATORS, N, OK), ("ceo", Subset.NO_INDICATORS, N, OK),
        ("ceo", Subset.NO_INDICATORS, N, OK), ("ceo", Subset.NO_INDICATORS, N, FetchStatus.TIMEOUT),
    ]
    out = link_rot_table(_table(rows))
    assert out.num_rows == 4   # 2 groups x 2 causes (shard statuses occur in the input)
    assert [(r[OCCUPATION], r[SUBSET], r[CAUSE]) for r in out.to_pylist()] == [
        ("ceo", Subset.NO_INDICATORS, Cause.LINK), ("ceo", Subset.NO_INDICATORS, Cause.NOT_IN_SHARDS),
        ("nurse", Subset.NAIVE, Cause.LINK), ("nurse", Subset.NAIVE, Cause.NOT_IN_SHARDS)]

    link = _row(out, "nurse", Subset.NAIVE, Cause.LINK)
    assert (link[CAPTIONS], link[LOST], link[KEPT], link[LOST_SHARE]) == (10, 3, 5, 0.3)
    assert _counts(link) == {"lost_male": 1, "lost_female": 2, "lost_both": 0, "lost_none": 0,
                             "kept_male": 1, "kept_female": 2, "kept_both": 1, "kept_none": 1}
    shard = _row(out, "nurse", Subset.NAIVE, Cause.NOT_IN_SHARDS)
    assert (shard[CAPTIONS], shard[LOST], shard[KEPT], shard[LOST_SHARE]) == (10, 2, 5, 0.2)
    assert _counts(shard) == {"lost_male": 1, "lost_female": 0, "lost_both": 0, "lost_none": 1,
                              "kept_male": 1, "kept_female": 2, "kept_both": 1, "kept_none": 1}
    # the two causes' lost shares add up to the share of captions without an image
    assert link[LOST] + shard[LOST] + link[KEPT] == link[CAPTIONS]

    ceo = _row(out, "ceo", Subset.NO_INDICATORS, Cause.LINK)
    assert (ceo[CAPTIONS], ceo[LOST], ceo[KEPT], ceo[LOST_SHARE]) == (4, 1, 3, 0.25)
    assert (ceo["lost_none"], ceo["kept_none"]) == (1, 3)
    ceo_shard = _row(out, "ceo", Subset.NO_INDICATORS, Cause.NOT_IN_SHARDS)
    assert (ceo_shard[LOST], ceo_shard[LOST_SHARE], ceo_shard[METHOD]) == (0, 0.0, lr.NA_NO_LOST)


def test_null_fetch_status_is_lost_to_link():
    rows = [("judge", Subset.NAIVE, F, None), ("judge", Subset.NAIVE, M, None), ("judge", Subset.NAIVE, M, OK)]
    out = link_rot_table(_table(rows))
    assert out.num_rows == 1   # no shard status anywhere: no not_in_shards rows
    r = out.to_pylist()[0]
    assert (r[CAUSE], r[LOST], r[KEPT], r[LOST_SHARE]) == (Cause.LINK, 2, 1, pytest.approx(2 / 3))
    assert (r["lost_female"], r["lost_male"], r["kept_male"]) == (1, 1, 1)


def test_shard_statuses_are_not_link_rot():
    rows = _group("pilot", Subset.NN, {(F, NOT_IN_SHARDS): 7, (M, SHARD_FAILED): 3, (M, OK): 10})
    out = link_rot_table(_table(rows))
    link = _row(out, "pilot", Subset.NN, Cause.LINK)
    shard = _row(out, "pilot", Subset.NN, Cause.NOT_IN_SHARDS)
    assert (link[LOST], link[METHOD]) == (0, lr.NA_NO_LOST)
    assert (shard[LOST], shard["lost_female"], shard["lost_male"], shard[LOST_SHARE]) == (10, 7, 3, 0.5)
    # without shard statuses in the whole input there is no not_in_shards cause
    only_links = link_rot_table(_table(_group("pilot", Subset.NN, {(F, FetchStatus.TIMEOUT): 2, (M, OK): 3})))
    assert set(only_links[CAUSE].to_pylist()) == {Cause.LINK}
    # one shard row anywhere gives every group a not_in_shards row
    mixed = link_rot_table(_table(_group("pilot", Subset.NN, {(M, OK): 3})
                                  + _group("nurse", Subset.NAIVE, {(F, NOT_IN_SHARDS): 1, (F, OK): 1})))
    assert sorted(zip(mixed[OCCUPATION].to_pylist(), mixed[CAUSE].to_pylist())) == [
        ("nurse", Cause.LINK), ("nurse", Cause.NOT_IN_SHARDS), ("pilot", Cause.LINK), ("pilot", Cause.NOT_IN_SHARDS)]


def test_lost_female_kept_male_differs():
    rows = _group("engineer", Subset.NAIVE, {(F, FetchStatus.HTTP_ERROR): 40, (M, OK): 170, (F, OK): 30})
    r = _row(link_rot_table(_table(rows)), "engineer", Subset.NAIVE, Cause.LINK)
    assert r[METHOD] == lr.METHOD_CHI2   # every expected count >= 5
    ref = stats.chi2_contingency(np.array([[0, 40], [170, 30]]), correction=False)
    assert r[STATISTIC] == pytest.approx(ref.statistic) and r[P_VALUE] == pytest.approx(ref.pvalue)
    assert r[P_VALUE] < 1e-20 and r[Q_VALUE] == pytest.approx(r[P_VALUE]) and r[DIFFERS] is True


def test_identical_distributions_not_flagged():
    rows = _group("teacher", Subset.NAIVE, {(F, FetchStatus.TIMEOUT): 20, (M, FetchStatus.TIMEOUT): 30,
                                            (N, FetchStatus.TIMEOUT): 10, (F, OK): 40, (M, OK): 60, (N, OK): 20})
    r = _row(link_rot_table(_table(rows)), "teacher", Subset.NAIVE, Cause.LINK)
    assert r[METHOD] == lr.METHOD_CHI2
    assert r[STATISTIC] == pytest.approx(0.0, abs=1e-12) and r[P_VALUE] == pytest.approx(1.0)
    assert r[DIFFERS] is False


def _exact_p(observed: np.ndarray) -> float:
    """Exact permutation p-value of Pearson's chi2 for a 2 x 3 table (enumerating the first row)."""
    col, row0, n = observed.sum(axis=0), observed[0].sum(), observed.sum()
    expected = stats.contingency.expected_freq(observed)
    stat0 = ((observed - expected) ** 2 / expected).sum()
    p = 0.0
    for a, b in itertools.product(range(col[0] + 1), range(col[1] + 1)):
        c = row0 - a - b
        if 0 <= c <= col[2]:
            t = np.array([[a, b, c], col - [a, b, c]])
            if ((t - expected) ** 2 / expected).sum() >= stat0 - 1e-9:
                p += comb(col[0], a) * comb(col[1], b) * comb(col[2], c) / comb(n, row0)
    return p


def test_permutation_branch_reproducible_and_exact_in_expectation():
    counts = {(F, FetchStatus.NETWORK_ERROR): 3, (M, FetchStatus.NETWORK_ERROR): 1,
              (F, OK): 2, (M, OK): 6, (B, OK): 1}
    rows = _group("baker", Subset.NN, counts)
    a = _row(link_rot_table(_table(rows), seed=7), "baker", Subset.NN, Cause.LINK)
    b = _row(link_rot_table(_table(rows), seed=7), "baker", Subset.NN, Cause.LINK)
    assert a[METHOD] == lr.METHOD_PERMUTATION
    assert a == b
    # the group's p-value depends on (seed, group) only: not on the row order or on other groups
    others = _group("zoo keeper", Subset.NN, {(F, FetchStatus.TIMEOUT): 2, (M, OK): 4, (F, OK): 1})
    shuffled = _table(others + rows[::-1])
    c = _row(link_rot_table(shuffled, seed=7), "baker", Subset.NN, Cause.LINK)
    assert (c[STATISTIC], c[P_VALUE]) == (a[STATISTIC], a[P_VALUE])
    # and it estimates the exact permutation p-value: 9999 resamples, standard error <= 0.005
    observed = np.array([[1, 3, 0], [6, 2, 1]])   # male, female, both
    exact = _exact_p(observed)
    assert exact == pytest.approx(0.3146853, abs=1e-6)
    ps = [_row(link_rot_table(_table(rows), seed=s), "baker", Subset.NN, Cause.LINK)[P_VALUE] for s in (7, 8)]
    assert all(abs(p - exact) < 4 * np.sqrt(exact * (1 - exact) / 9999) for p in ps)
    assert ps[0] != ps[1]   # the seed matters


def test_no_indicator_subset_and_degenerate_groups_not_applicable():
    rows = (_group("doctor", Subset.NO_INDICATORS, {(N, FetchStatus.TIMEOUT): 30, (N, OK): 70})
            + _group("doctor", Subset.NN_NO_INDICATORS, {(N, FetchStatus.HTTP_ERROR): 5, (N, OK): 95})
            + _group("doctor", Subset.NAIVE, {(F, OK): 10, (M, OK): 10})                  # nothing lost
            + _group("doctor", Subset.NN, {(F, FetchStatus.TIMEOUT): 4, (M, None): 3}))    # nothing kept
    out = link_rot_table(_table(rows))
    methods = {r[SUBSET]: r[METHOD] for r in out.to_pylist()}
    assert methods == {Subset.NO_INDICATORS: lr.NA_ONE_CLASS, Subset.NN_NO_INDICATORS: lr.NA_ONE_CLASS,
                       Subset.NAIVE: lr.NA_NO_LOST, Subset.NN: lr.NA_NO_KEPT}
    for r in out.to_pylist():
        assert r[METHOD].startswith("not applicable: ")
        assert (r[STATISTIC], r[P_VALUE], r[Q_VALUE], r[DIFFERS]) == (None, None, None, None)
    assert _row(out, "doctor", Subset.NO_INDICATORS, Cause.LINK)[LOST_SHARE] == 0.3


def test_null_caption_gender_counts_as_caption_not_class():
    rows = _group("chef", Subset.NAIVE, {(None, FetchStatus.TIMEOUT): 3, (F, OK): 4, (M, OK): 4})
    r = _row(link_rot_table(_table(rows)), "chef", Subset.NAIVE, Cause.LINK)
    assert (r[CAPTIONS], r[LOST], r[KEPT]) == (11, 3, 8)
    assert sum(r[LOST_CLASS[c]] for c in CaptionGender.ALL) == 0
    assert r[METHOD] == lr.NA_NO_LOST_CLASS and r[P_VALUE] is None


def test_one_row_per_caption_and_training_rows_only():
    # NN subsets have one row per (prompt, caption): a caption selected for two prompts counts once
    t = pa.table({OCCUPATION: ["nurse"] * 4, SUBSET: [Subset.NN] * 4, PROMPT_ID: [1, 2, 1, 2],
                  CAPTION_ID: [5, 5, 6, 7], CAPTION_GENDER: [F, F, M, M],
                  FETCH_STATUS: [FetchStatus.TIMEOUT, FetchStatus.TIMEOUT, OK, OK]})
    r = link_rot_table(t).to_pylist()[0]
    assert (r[CAPTIONS], r[LOST], r[KEPT], r["lost_female"]) == (3, 1, 2, 1)
    # generated rows of the per-image table (no fetch status) are not training captions
    t2 = t.append_column(SOURCE, pa.array([Source.TRAINING] * 4))
    gen = pa.table({OCCUPATION: ["nurse"], SUBSET: pa.array([None], pa.string()), PROMPT_ID: [1],
                    CAPTION_ID: pa.array([None], pa.int64()), CAPTION_GENDER: pa.array([None], pa.string()),
                    FETCH_STATUS: pa.array([None], pa.string()), SOURCE: [Source.GENERATED]})
    out = link_rot_table(pa.concat_tables([t2, gen]))
    assert out.num_rows == 1 and out.to_pylist()[0][CAPTIONS] == 3


def test_benjamini_hochberg_within_subset_and_cause():
    rng = np.random.default_rng(3)
    rows = []
    for i in range(12):
        for subset in (Subset.NAIVE, Subset.NN):
            p_female_lost = 0.2 + 0.05 * i   # from no difference to a strong one
            n_lost = 40
            n_f = int(round(n_lost * p_female_lost))
            rows += _group(f"occ{i:02d}", subset, {
                (F, FetchStatus.TIMEOUT): n_f, (M, FetchStatus.TIMEOUT): n_lost - n_f,
                (F, OK): 20 + int(rng.integers(0, 5)), (M, OK): 80,
                (F, NOT_IN_SHARDS): 5 + i, (M, NOT_IN_SHARDS): 10})
    out = link_rot_table(_table(rows), alpha=0.05)
    assert set(out[CAUSE].to_pylist()) == {Cause.LINK, Cause.NOT_IN_SHARDS}
    for subset in (Subset.NAIVE, Subset.NN):
        for cause in Cause.ALL:
            fam = out.filter(pc.and_(pc.equal(out[SUBSET], subset), pc.equal(out[CAUSE], cause)))
            p = fam[P_VALUE].to_numpy()
            assert len(p) == 12 and not np.isnan(p).any()
            q = fam[Q_VALUE].to_numpy()
            np.testing.assert_allclose(q, stats.false_discovery_control(p, method="bh"), rtol=1e-12)
            assert fam[DIFFERS].to_pylist() == (q < 0.05).tolist()
    # the strongest link differences are flagged, the first (no difference) is not
    naive_link = out.filter(pc.and_(pc.equal(out[SUBSET], Subset.NAIVE), pc.equal(out[CAUSE], Cause.LINK)))
    assert naive_link[DIFFERS].to_pylist()[0] is False and naive_link[DIFFERS].to_pylist()[-1] is True


def test_calibration_under_the_null():
    """Losses independent of gender: the share of p-values < 0.05 must be 0.05 or less.

    With m tested groups, a valid test rejects R ~ Binomial(m, <= 0.05) times. The upper bound is
    the 99.9% quantile of Binomial(m, 0.05) (20 of about 200), so a correct test fails it with
    probability < 0.001 whatever the seed, while a test of true size 0.10 (as chi2 can be on sparse
    tables) would pass it in fewer than 1 run in 20. The same bound holds per branch. The test is
    somewhat conservative (discrete permutation distributions on the smallest groups: 30 seeds of
    this simulation gave 3.6% overall, 0.7% at 12 captions, 4-5% from 40 captions up), so the lower
    bound only rules out a test that never rejects: at 3.6% of ~200, P(R = 0) is about 0.001."""
    rng = np.random.default_rng(20240502)
    n_groups, alpha = 200, 0.05
    sizes = rng.choice([12, 40, 200, 600], size=n_groups)         # small sizes -> permutation branch
    genders = np.array([M, F, B, N], dtype=object)
    occupation, gender, status = [], [], []
    for g, n in enumerate(sizes):
        occupation += [f"occ{g:03d}"] * int(n)
        both = rng.choice([0.0, 0.05])                                # a rare class -> small expected counts
        gender += genders[rng.choice(4, size=n, p=[0.5, 0.3, both, 0.2 - both])].tolist()
        lost = rng.random(n) < rng.choice([0.1, 0.3])               # independent of gender
        status += np.where(lost, FetchStatus.HTTP_ERROR, OK).tolist()
    t = _table(list(zip(occupation, [Subset.NAIVE] * len(occupation), gender, status)))
    out = link_rot_table(t, seed=1, alpha=alpha)
    tested = out.filter(pc.is_valid(out[P_VALUE]))
    m = tested.num_rows
    assert m >= 180
    p = tested[P_VALUE].to_numpy()
    methods = tested[METHOD].to_numpy(zero_copy_only=False)
    assert (methods == lr.METHOD_PERMUTATION).sum() >= 50 and (methods == lr.METHOD_CHI2).sum() >= 50
    rejections = int((p < alpha).sum())
    assert 1 <= rejections <= stats.binom.ppf(0.999, m, alpha)
    for method in (lr.METHOD_PERMUTATION, lr.METHOD_CHI2):   # neither branch alone is liberal
        k = int((methods == method).sum())
        assert int((p[methods == method] < alpha).sum()) <= stats.binom.ppf(0.999, k, alpha)
    # under the global null, BH rarely flags anything (its FDR = its family-wise error <= alpha)
    assert sum(bool(d) for d in out[DIFFERS].to_pylist()) <= 1


def test_summary_is_plain_json():
    rows = (_group("engineer", Subset.NAIVE, {(F, FetchStatus.HTTP_ERROR): 40, (M, OK): 170, (F, OK): 30})
            + _group("teacher", Subset.NAIVE, {(F, FetchStatus.TIMEOUT): 20, (M, FetchStatus.TIMEOUT): 30,
                                               (F, OK): 40, (M, OK): 60})
            + _group("teacher", Subset.NO_INDICATORS, {(N, FetchStatus.TIMEOUT): 2, (N, OK): 8})
            + _group("teacher", Subset.NN, {(F, SHARD_FAILED): 1, (F, OK): 1}))
    table = link_rot_table(_table(rows), seed=3, resamples=999, alpha=0.01)
    summary = link_rot_summary(table)
    text = json.dumps(summary, allow_nan=False)
    assert json.loads(text) == summary
    assert (summary["alpha"], summary["seed"], summary["resamples"]) == (0.01, 3, 999)
    assert "benjamini-hochberg" in summary["correction"]
    naive = summary["subsets"][Subset.NAIVE][Cause.LINK]
    assert (naive["captions"], naive["lost"], naive["occupations"], naive["occupations_tested"],
            naive["occupations_differing"], naive["differing"]) == (390, 90, 2, 2, 1, ["engineer"])
    assert naive["lost_share"] == pytest.approx(90 / 390)
    assert summary["subsets"][Subset.NO_INDICATORS][Cause.LINK]["occupations_tested"] == 0
    assert summary["subsets"][Subset.NN][Cause.NOT_IN_SHARDS]["lost_share"] == 0.5
    # a table that lost its metadata (e.g. read back without it) still summarises
    bare = link_rot_summary(table.replace_schema_metadata(None))
    assert bare["alpha"] is None and bare["subsets"] == summary["subsets"]

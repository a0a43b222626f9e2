"""Agreement among people and between people and a classifier, as the papers report it.

- Krippendorff's α (the ``krippendorff`` package: nominal for categories, ordinal for an ordered
  scale such as the Monk skin-tone scale) over the items people answered, with a bootstrap interval
  over items. α is a function of the coincidence matrix, which is a sum of one matrix per item, so a
  resample of items is a weighted sum: ``alpha_statistic`` evaluates every resample at once, and is
  checked against the package (tests/annotate/test_agreement.py).
- The majority answer of each item, ties and "unsure" majorities kept as such (``MajorityStatus``).
- Each classifier's agreement with the majority: the share of items with a majority where the
  classifier gave the same answer, with its Wilson interval, per stratum, and its confusion matrix.

"Unsure" (when the protocol offers it) is a missing value for α by default (it is no position on
the scale; ``unsure_as="category"`` counts it as one more category): a project choice, in
docs/method.md.
"""

from __future__ import annotations

import krippendorff
import numpy as np
import pandas as pd

from pipelines.engine.stats import intervals as I
from schemas import annotation as A

LEVELS = ("nominal", "ordinal")


def value_counts(labels: pd.DataFrame, values: list[str]) -> tuple[list[str], np.ndarray]:
    """(item ids, an items x values matrix of how many annotators gave each value): the ``value_counts``
    form of Krippendorff's reliability data. Answers outside ``values`` (e.g. "unsure" counted as
    missing) are left out; items in id order."""
    known = labels[labels[A.ANSWER].isin(values)]
    table = pd.crosstab(known[A.ITEM_ID], pd.Categorical(known[A.ANSWER], categories=values), dropna=False)
    table = table.reindex(columns=values, fill_value=0).sort_index()
    return list(table.index), table.to_numpy(np.float64)


def coincidences(counts: np.ndarray) -> np.ndarray:
    """(items x V x V): each item's contribution to the coincidence matrix, n_uc (n_uk - [c = k]) /
    (m_u - 1), zero for an item with fewer than two answers (not pairable)."""
    m = counts.sum(axis=1)
    pairable = m >= 2
    outer = counts[:, :, None] * counts[:, None, :] - counts[:, :, None] * np.eye(counts.shape[1])[None]
    out = np.zeros_like(outer)
    out[pairable] = outer[pairable] / (m[pairable] - 1)[:, None, None]
    return out


def _delta(marginals: np.ndarray, level: str) -> np.ndarray:
    """(k x V x V) squared distances: nominal 0/1; ordinal (Krippendorff) (sum_{g=c..k} n_g - (n_c + n_k)/2)^2."""
    k, v = marginals.shape
    if level == "nominal":
        return np.broadcast_to(1.0 - np.eye(v), (k, v, v))
    cum = np.cumsum(marginals, axis=1)
    lo = np.minimum.outer(np.arange(v), np.arange(v))
    hi = np.maximum.outer(np.arange(v), np.arange(v))
    # sum_{g=lo..hi} n_g = cum[hi] - cum[lo] + n_lo
    span = cum[:, hi] - cum[:, lo] + marginals[:, lo]
    d = span - (marginals[:, :, None] + marginals[:, None, :]) / 2
    return d ** 2


def alpha_statistic(counts: np.ndarray, level: str = "nominal"):
    """``statistic`` for ``intervals.bootstrap``: α under item counts W (k x items) -> k values
    (resampling an item w times adds its coincidences w times)."""
    if level not in LEVELS:
        raise ValueError(f"level of measurement {level!r}: one of {', '.join(LEVELS)}")
    per_item = coincidences(counts).reshape(len(counts), -1)

    def statistic(weights: np.ndarray) -> np.ndarray:
        v = counts.shape[1]
        o = (weights @ per_item).reshape(len(weights), v, v)
        n_c = o.sum(axis=2)
        n = n_c.sum(axis=1)
        delta = _delta(n_c, level)
        with np.errstate(invalid="ignore", divide="ignore"):
            d_o = (o * delta).sum(axis=(1, 2)) / n
            d_e = (n_c[:, :, None] * n_c[:, None, :] * delta).sum(axis=(1, 2)) / (n * (n - 1))
            return 1.0 - d_o / d_e
    return statistic


def alpha(counts: np.ndarray, level: str = "nominal") -> float | None:
    """Krippendorff's α of a value_counts matrix, by the ``krippendorff`` package; None when it is
    undefined (no pairable answers, or a single value used throughout)."""
    pairable = counts.sum(axis=1) >= 2
    if pairable.sum() == 0 or np.count_nonzero(counts[pairable].sum(axis=0)) < 2:
        return None
    value = krippendorff.alpha(value_counts=counts[pairable], value_domain=list(range(counts.shape[1])),
                               level_of_measurement=level)
    return float(value) if np.isfinite(value) else None


def alpha_interval(counts: np.ndarray, level: str = "nominal",
                   settings: I.IntervalSettings = I.DEFAULT) -> I.Interval:
    """α with its bootstrap interval over the items with two answers or more (the package's value;
    the resamples by ``alpha_statistic``)."""
    counts = counts[counts.sum(axis=1) >= 2]
    method = f"bootstrap-{settings.method} over items"
    value = alpha(counts, level)
    if value is None:
        return I.Interval(None, None, None, method, int(len(counts)), settings.level)
    lo, hi, _ = I.bootstrap(alpha_statistic(counts, level), len(counts), settings)
    return I.Interval(value, I._f(lo), I._f(hi), method, int(len(counts)), settings.level)


def majority(labels: pd.DataFrame, unsure: str | None = None) -> pd.DataFrame:
    """One row per item: the majority answer and its status (``MajorityStatus``), the number of
    answers and every answer's count. A tie among the most frequent answers is a tie (never broken
    at random); an item whose most frequent answer is ``unsure`` has an unsure majority."""
    if labels.empty:
        return pd.DataFrame(columns=[A.ITEM_ID, A.MAJORITY, A.MAJORITY_STATUS, A.N_ANSWERS, A.VOTES])
    counts = labels.groupby([A.ITEM_ID, A.ANSWER]).size().rename("n").reset_index()
    counts = counts.sort_values([A.ITEM_ID, "n", A.ANSWER], ascending=[True, False, True])
    top = counts.groupby(A.ITEM_ID)["n"].transform("max")
    leaders = counts[counts["n"] == top]
    n_leaders = leaders.groupby(A.ITEM_ID).size()
    first = leaders.groupby(A.ITEM_ID)[A.ANSWER].first()
    votes = counts.assign(v=counts[A.ANSWER] + " " + counts["n"].astype(str)).groupby(A.ITEM_ID)["v"].agg(", ".join)
    out = pd.DataFrame({A.N_ANSWERS: counts.groupby(A.ITEM_ID)["n"].sum(), A.VOTES: votes})
    status = np.where(n_leaders.reindex(out.index) > 1, A.MajorityStatus.TIE,
                      np.where(first.reindex(out.index) == unsure, A.MajorityStatus.UNSURE, A.MajorityStatus.MAJORITY))
    out[A.MAJORITY_STATUS] = status
    out[A.MAJORITY] = first.reindex(out.index).where(out[A.MAJORITY_STATUS] == A.MajorityStatus.MAJORITY)
    return out.reset_index()[[A.ITEM_ID, A.MAJORITY, A.MAJORITY_STATUS, A.N_ANSWERS, A.VOTES]]


def classifier_agreement(items: pd.DataFrame, majorities: pd.DataFrame, by: list[str],
                         level: float = 0.95) -> pd.DataFrame:
    """Per stratum (``by`` columns of ``items``; [] for all items together): items, items with a
    majority, of those the ones the classifier answered, how many it got right, and the agreement
    with its Wilson interval. Items without a majority (ties, unsure, unanswered) are counted, not
    scored."""
    df = items.merge(majorities, on=A.ITEM_ID, how="left")
    df[A.MAJORITY_STATUS] = df[A.MAJORITY_STATUS].fillna(A.MajorityStatus.NONE)
    rows = []
    groups = df.groupby(by, dropna=False, sort=True) if by else [((), df)]
    for key, part in groups:
        key = key if isinstance(key, tuple) else (key,)
        decided = part[(part[A.MAJORITY_STATUS] == A.MajorityStatus.MAJORITY) & part[A.PREDICTION].notna()]
        agree = int((decided[A.PREDICTION] == decided[A.MAJORITY]).sum())
        ci = I.binomial_interval(agree, len(decided), level)
        status = part[A.MAJORITY_STATUS].value_counts()
        rows.append({**dict(zip(by, key)), "items": len(part),
                     "with_majority": int(status.get(A.MajorityStatus.MAJORITY, 0)),
                     "ties": int(status.get(A.MajorityStatus.TIE, 0)),
                     "unsure_majority": int(status.get(A.MajorityStatus.UNSURE, 0)),
                     "unanswered": int(status.get(A.MajorityStatus.NONE, 0)),
                     "scored": len(decided), "agree": agree, "agreement": ci.value, "agreement_low": ci.low,
                     "agreement_high": ci.high})
    return pd.DataFrame(rows)


def confusion(items: pd.DataFrame, majorities: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Long confusion table per stratum: (by..., prediction, people, count), ``people`` being the
    majority answer or the status of an item without one (tie, unsure, no answers)."""
    df = items.merge(majorities, on=A.ITEM_ID, how="left")
    status = df[A.MAJORITY_STATUS].fillna(A.MajorityStatus.NONE)
    df = df.assign(people=df[A.MAJORITY].where(status == A.MajorityStatus.MAJORITY, status),
                   prediction=df[A.PREDICTION].fillna("(none)"))
    return df.groupby([*by, A.PREDICTION, "people"], dropna=False).size().rename("count").reset_index()

"""Proportions corrected for the classifier's own error, with intervals that cover the truth.

One stratum holds items the classifier answered; people labelled a simple random sample of them
(``t2i annotate plan`` draws it). The estimand is the share of the stratum's items whose people's
verdict is the positive class, among the items people could decide (their majority neither
"unsure" nor a tie): the reading Lyu et al. report. Two estimators:

- **Prediction-powered inference, PPI++** (Angelopoulos, Bates, Fannjiang, Jordan and Zrnic,
  Science 2023; Angelopoulos, Duchi and Zrnic, arXiv 2311.01453): the classifier's mean over the
  unlabelled items, rectified by the mean of (verdict - lambda * classifier) over the labelled ones,
  lambda tuned for the smallest variance. As packaged (``PACKAGE``) and without undecided labelled
  items it is ``ppi_py``'s ``ppi_mean_pointestimate`` and ``ppi_mean_ci`` (power-tuned, normal
  interval) as they are. With
  undecided items the estimand is a ratio, P(positive) / P(decided), each a PPI++ mean (the
  decided share has no classifier guess, so it is the labelled items' own mean), its interval by the
  delta method with the two means' covariance; with no undecided item it gives the package's numbers
  exactly (tests/annotate/test_estimate.py checks both, and the coverage on simulated populations).

  Small samples, the default. As packaged, PPI++ tunes lambda on the labelled items it then averages, and takes
  their variance as a Wald interval does; with a few dozen labels and an accurate classifier both
  make the interval too short: on simulated strata with 40 labels and error rates of 2-35% it
  covers the truth at 82-94% where 95% is asked (0.91-0.95 with the pseudo-items below alone). The
  default (``CROSSFIT``) therefore (a) cross-fits lambda: the labelled items are split in two folds
  by their position, and each fold's rectifier uses the lambda tuned on the other fold (lambda
  no longer depends on the items it corrects, so the estimate stays unbiased and its variance
  honest; the unlabelled mean takes the folds' average lambda), and (b) takes the labelled items'
  variances with half an item added in each cell of the (verdict, classifier) table of decided
  items (Agresti and Min, Statistics in Medicine 2005, for a paired difference of proportions; a
  classifier's score takes its ends, 1 and 0, in the pseudo-items), over n + 2 items. Both vanish
  as the labels grow; the coverage test shows 93-97% from 40 labels on. ``PACKAGE`` gives
  ``ppi_py``'s numbers as they are (``--ppi package``).
- **Rogan-Gladen** (Rogan and Gladen, Am. J. Epidemiol. 1978), for comparison with the
  literature: the classifier's share over all items, corrected by sensitivity and specificity
  estimated on the labelled items, (p_obs + sp - 1) / (se + sp - 1), its interval by the delta
  method over the three estimated proportions (independent binomials), so it carries the
  uncertainty of the error rates (se and sp in the variance with half a case added to each of
  their cells, as for PPI++ above); a value or bound outside [0, 1] is clipped and flagged, and a
  classifier no better than chance on the labelled items (se + sp <= 1) gives none.

Every value and bound is clipped to [0, 1] (a proportion); the flag says which was.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats as sps

from pipelines.engine.stats import intervals as I

PPI = "ppi++"
CROSSFIT = "cross-fit"         # lambda cross-fitted over two folds, pseudo-items in the variance (default)
PACKAGE = "package"            # ppi_py's PPI++ as it is
VARIANTS = (CROSSFIT, PACKAGE)
ROGAN_GLADEN = "rogan-gladen"
METHODS = (PPI, ROGAN_GLADEN)

CLIPPED = "estimate outside [0, 1], clipped"
BOUND_CLIPPED = "interval clipped to [0, 1]"
NO_LABELS = "no labelled item the people could decide"
CHANCE = "classifier no better than chance on the labelled items (se + sp <= 1)"
ONE_CLASS = "the labelled items hold one class only: sensitivity or specificity unknown"
ALL_LABELLED = "every item labelled: the people's share alone"


def _z(level: float) -> float:
    return float(sps.norm.ppf(0.5 + level / 2))


def _result(value, low, high, method, level, n, N, lam=None, flag=""):
    flags = [flag] if flag else []
    if value is not None and not 0 <= value <= 1:
        flags.append(CLIPPED)
        value = min(1.0, max(0.0, value))
    if low is not None and (low < 0 or high > 1):
        if CLIPPED not in flags:
            flags.append(BOUND_CLIPPED)
        low, high = max(0.0, low), min(1.0, high)
    return {"value": value, "low": low, "high": high, "method": method, "level": level, "labelled": int(n),
            "unlabelled": int(N), "lambda": lam, "flag": "; ".join(flags)}


def ppi_lambda(y: np.ndarray, f: np.ndarray, f_unlabelled: np.ndarray) -> float:
    """PPI++'s power-tuning parameter for a mean: Cov(y, f) / ((1 + n/N) Var(f)), the covariance
    over the labelled items (divided by n), the variance over all items (divided by n + N - 1),
    clipped to [0, 1] (``ppi_py``'s rule for a mean)."""
    return float(_lambdas(np.asarray(y, np.float64)[None], np.asarray(f, np.float64)[None],
                          np.asarray(f_unlabelled, np.float64)[None])[0])


def _lambdas(y: np.ndarray, f: np.ndarray, fu: np.ndarray) -> np.ndarray:
    """``ppi_lambda`` per row of (rows x n) and (rows x N) arrays."""
    n, N = y.shape[1], fu.shape[1]
    if n + N < 2 or N == 0:
        return np.zeros(len(y))
    var = np.var(np.concatenate([f, fu], axis=1), axis=1, ddof=1)
    cov = np.mean((y - y.mean(axis=1, keepdims=True)) * (f - f.mean(axis=1, keepdims=True)), axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        lam = cov / ((1 + n / N) * var)
    return np.where(var > 0, np.clip(lam, 0.0, 1.0), 0.0)


def ppi_proportion(y, f, f_unlabelled, decided=None, level: float = 0.95, variant: str = CROSSFIT) -> dict:
    """The share of positive verdicts among the decided ones, by PPI++.

    ``y``: 1 where the labelled item's verdict is the positive class; ``decided``: 1 where people
    could decide (None: all); ``f`` and ``f_unlabelled``: the classifier's answer (1/0, or its
    probability of the positive class) on the labelled and the unlabelled items; ``variant``:
    ``CROSSFIT`` or ``PACKAGE`` (the module's docstring)."""
    if variant not in VARIANTS:
        raise ValueError(f"PPI variant {variant!r}: one of {', '.join(VARIANTS)}")
    y = np.asarray(y, np.float64)
    f = np.asarray(f, np.float64)
    fu = np.asarray(f_unlabelled, np.float64)
    d = np.ones_like(y) if decided is None else np.asarray(decided, np.float64)
    n, N = len(y), len(fu)
    if d.sum() == 0:
        return _result(None, None, None, PPI, level, n, N, flag=NO_LABELS)
    if N == 0:
        ci = I.binomial_interval(int(y.sum()), int(d.sum()), level)
        return _result(ci.value, ci.low, ci.high, PPI, level, n, N, flag=ALL_LABELLED)
    if n < 2:
        return _result(float(fu.mean() + (y - f).mean()) if d.all() else None, None, None, PPI, level, n, N)
    if variant == CROSSFIT:
        return ppi_ratio(y, d, f, fu, level, crossfit_lambdas(y, f, fu), adjusted=True)
    lam = ppi_lambda(y, f, fu)
    if d.all():
        from ppi_py import ppi_mean_ci, ppi_mean_pointestimate   # deferred: ppi_py imports numba and statsmodels

        value = float(np.ravel(ppi_mean_pointestimate(y, f, fu))[0])
        low, high = (float(np.ravel(b)[0]) for b in ppi_mean_ci(y, f, fu, alpha=1 - level))
        return _result(value, low, high, PPI, level, n, N, lam)
    return ppi_ratio(y, d, f, fu, level, lam)


def crossfit_lambdas(y: np.ndarray, f: np.ndarray, f_unlabelled: np.ndarray) -> np.ndarray:
    """Per labelled item the lambda tuned on the other fold (items at even and at odd positions)."""
    return _crossfit(np.asarray(y, np.float64)[None], np.asarray(f, np.float64)[None],
                     np.asarray(f_unlabelled, np.float64)[None])[0]


def _crossfit(y: np.ndarray, f: np.ndarray, fu: np.ndarray) -> np.ndarray:
    """``crossfit_lambdas`` per row of (rows x n) and (rows x N) arrays: (rows x n)."""
    fold = np.arange(y.shape[1]) % 2
    lam = np.empty(y.shape)
    for k in (0, 1):
        other = fold != k
        lam[:, ~other] = _lambdas(y[:, other], f[:, other], fu)[:, None]
    return lam


def ppi_values(y: np.ndarray, d: np.ndarray, f: np.ndarray, fu: np.ndarray, variant: str = CROSSFIT) -> np.ndarray:
    """The point estimate of ``ppi_proportion`` per row of (rows x n) labelled and (rows x N)
    unlabelled arrays (bootstrap resamples of one stratum), vectorised, clipped to [0, 1]; NaN
    where a row has no decided item. Equal to ``ppi_proportion``'s value row by row (tested)."""
    y, d, f, fu = (np.asarray(a, np.float64) for a in (y, d, f, fu))
    if fu.shape[1] == 0:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(d.sum(axis=1) > 0, y.sum(axis=1) / np.maximum(d.sum(axis=1), 1), np.nan)
    lam = _crossfit(y, f, fu) if variant == CROSSFIT else _lambdas(y, f, fu)[:, None]
    lam = np.broadcast_to(lam, y.shape)
    mu1 = lam.mean(axis=1) * fu.mean(axis=1) + (y - lam * f).mean(axis=1)
    mu2 = d.mean(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.clip(np.where(mu2 > 0, mu1 / np.where(mu2 > 0, mu2, 1.0), np.nan), 0.0, 1.0)


# the pseudo-items of the small-sample variance: decided, (verdict, classifier) = (1, 1), (1, 0), (0, 1), (0, 0)
_PSEUDO_Y = np.array([1.0, 1.0, 0.0, 0.0])
_PSEUDO_F = np.array([1.0, 0.0, 1.0, 0.0])
_PSEUDO_WEIGHT = 0.5


def ppi_ratio(y, d, f, fu, level: float, lam, adjusted: bool = False) -> dict:
    """P(positive) / P(decided): PPI++ for the numerator, the labelled items' mean for the
    denominator; the delta method over both, with their covariance (the terms ``ppi_py`` uses for
    one mean: standard deviations over n and N, not n - 1). ``lam``: one lambda, or one per labelled
    item (cross-fitted; the unlabelled mean takes their average). With ``adjusted`` the labelled
    items' variances and covariance are taken with the pseudo-items (weighted, over n + 2 items)."""
    n, N = len(y), len(fu)
    lam = np.broadcast_to(np.asarray(lam, np.float64), y.shape)
    lam_bar = float(lam.mean())
    r = y - lam * f                                   # the numerator's rectifier on the labelled items
    mu1 = lam_bar * fu.mean() + r.mean()
    mu2 = d.mean()
    theta = mu1 / mu2
    w, rr, dd = np.ones(n), r, d
    if adjusted:
        w = np.concatenate([w, np.full(4, _PSEUDO_WEIGHT)])
        rr = np.concatenate([r, _PSEUDO_Y - lam_bar * _PSEUDO_F])
        dd = np.concatenate([d, np.ones(4)])
    m = w.sum()
    rc = rr - np.average(rr, weights=w)
    dc = dd - np.average(dd, weights=w)
    v11 = np.average(rc * rc, weights=w) / m + lam_bar * lam_bar * np.var(fu) / N
    v22 = np.average(dc * dc, weights=w) / m
    v12 = np.average(rc * dc, weights=w) / m
    var = (v11 - 2 * theta * v12 + theta * theta * v22) / (mu2 * mu2)
    half = _z(level) * math.sqrt(max(var, 0.0))
    return _result(float(theta), float(theta - half), float(theta + half), PPI, level, n, N, lam_bar)


def rogan_gladen(positive: int, items: int, tp: int, fn: int, tn: int, fp: int, level: float = 0.95) -> dict:
    """The classifier's share ``positive / items`` over all items, corrected by the sensitivity
    tp / (tp + fn) and specificity tn / (tn + fp) of the labelled items people decided."""
    n = tp + fn + tn + fp
    N = items - n
    if tp + fn == 0 or tn + fp == 0:
        return _result(None, None, None, ROGAN_GLADEN, level, n, N, flag=ONE_CLASS if n else NO_LABELS)
    p_obs, se, sp = positive / items, tp / (tp + fn), tn / (tn + fp)
    j = se + sp - 1
    if j <= 0:
        return _result(None, None, None, ROGAN_GLADEN, level, n, N, flag=CHANCE)
    p = (p_obs + sp - 1) / j
    se_v, sp_v = (tp + 0.5) / (tp + fn + 1), (tn + 0.5) / (tn + fp + 1)     # the variance's, adjusted
    var = (p_obs * (1 - p_obs) / items + p * p * se_v * (1 - se_v) / (tp + fn + 1)
           + (1 - p) * (1 - p) * sp_v * (1 - sp_v) / (tn + fp + 1)) / (j * j)
    half = _z(level) * math.sqrt(var)
    out = _result(float(p), float(p - half), float(p + half), ROGAN_GLADEN, level, n, N)
    out.update(sensitivity=se, specificity=sp)
    return out

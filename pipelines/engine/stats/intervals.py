"""Confidence intervals for headline numbers, and the tests that say whether two runs differ.

Every study's headline metric is a (weighted) mean over the units its paper samples: occupations
for E[A], prompts for MAD or a skill accuracy, attributes or images for GEP, units for the Exposed
disparities. So one estimator serves all of them:

- ``mean_interval``: the bootstrap over units (resampled with replacement, within strata when a
  study samples per stratum), bias-corrected and accelerated (BCa; Efron 1987) by default or the
  plain percentile interval; the resampling seed and the number of resamples are recorded.
- ``t_interval`` (Student's t for a mean) and ``binomial_interval`` (Wilson or Clopper-Pearson for a
  proportion): the exact or closed-form intervals where a study's number is one of those.

And for ``t2i compare``:

- ``paired_test``: the mean difference of two runs on the units they share (the same prompts and
  seeds), its bootstrap interval and a sign-flip permutation p-value;
- ``unpaired_test``: the same for runs without shared units (a label-permutation p-value);
- ``holm``: Holm's step-down adjustment of a family of p-values (every pair of models of one
  metric), which controls the family-wise error rate without assuming independence.

Everything is vectorised over resamples with numpy (counts per unit, ``statistic(W)`` evaluated on
a (resamples x units) matrix), in chunks so memory stays bounded for per-image units.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats as sps

METHODS = ("bca", "percentile")
_CHUNK_CELLS = 4_000_000          # resamples x units per evaluation chunk (32 MB of float64)


@dataclass(frozen=True)
class IntervalSettings:
    """How intervals are computed (recorded with every run and comparison)."""

    level: float = 0.95
    resamples: int = 2000
    seed: int = 0
    method: str = "bca"

    def __post_init__(self):
        if not 0.5 <= self.level < 1:
            raise ValueError(f"interval level must be in [0.5, 1), not {self.level}")
        if self.resamples < 100:
            raise ValueError(f"at least 100 bootstrap resamples, not {self.resamples}")
        if self.method not in METHODS:
            raise ValueError(f"bootstrap method {self.method!r}: one of {', '.join(METHODS)}")

    def record(self) -> dict:
        return asdict(self)


DEFAULT = IntervalSettings()


@dataclass(frozen=True)
class Interval:
    """A value with its interval (``low``/``high`` None where none can be given: fewer than two units)."""

    value: float | None
    low: float | None
    high: float | None
    method: str
    n: int                  # units behind the value
    level: float

    def as_dict(self) -> dict:
        return {"value": self.value, "low": self.low, "high": self.high, "method": self.method, "n": self.n,
                "level": self.level}

    def text(self, digits: int = 2, scale: float = 1.0) -> str:
        """"0.12 [0.05, 0.20]" (``scale`` multiplies: 100 for percentages); "n/a" without a value, the
        value alone without both bounds (None and NaN are missing alike: tables hold NaN)."""
        if _f(self.value) is None:
            return "n/a"
        v = f"{self.value * scale:.{digits}f}"
        if _f(self.low) is None or _f(self.high) is None:
            return v
        return f"{v} [{self.low * scale:.{digits}f}, {self.high * scale:.{digits}f}]"


def _f(x) -> float | None:
    return None if x is None or not np.isfinite(x) else float(x)


def resample_counts(rng: np.random.Generator, n_resamples: int, strata: np.ndarray) -> np.ndarray:
    """(resamples x units) counts: each stratum's units drawn with replacement as often as it has units."""
    counts = np.zeros((n_resamples, len(strata)), np.float64)
    for s in np.unique(strata):
        idx = np.flatnonzero(strata == s)
        counts[:, idx] = rng.multinomial(len(idx), np.full(len(idx), 1.0 / len(idx)), size=n_resamples)
    return counts


def resample_rows(rng: np.random.Generator, rows: np.ndarray, n_resamples: int) -> np.ndarray:
    """(resamples x len(rows)): ``rows`` drawn with replacement in each resample (an empty
    (resamples x 0) array, drawing nothing, when there are none)."""
    rows = np.asarray(rows)
    if len(rows) == 0:
        return np.empty((n_resamples, 0), np.int64)
    return rows[rng.integers(len(rows), size=(n_resamples, len(rows)))]


def bootstrap(statistic, n_units: int, settings: IntervalSettings = DEFAULT, strata=None) -> tuple:
    """The bootstrap interval of ``statistic``, a function of a (k x n_units) matrix of unit counts
    returning k values (``statistic(np.ones((1, n)))`` is the observed value). Returns (low, high,
    the resampled values); (None, None, ...) with fewer than two units."""
    strata = np.zeros(n_units, np.int64) if strata is None else np.asarray(strata)
    if len(strata) != n_units:
        raise ValueError(f"strata: one per unit expected ({n_units}), got {len(strata)}")
    if n_units < 2:
        return None, None, np.zeros(0)
    rng = np.random.default_rng(settings.seed)
    chunk = max(1, _CHUNK_CELLS // n_units)
    boot = np.concatenate([statistic(resample_counts(rng, min(chunk, settings.resamples - i), strata))
                           for i in range(0, settings.resamples, chunk)])
    boot = boot[np.isfinite(boot)]
    if len(boot) < settings.resamples // 2:
        return None, None, boot
    observed = float(statistic(np.ones((1, n_units)))[0])
    alpha = (1 - settings.level) / 2
    if np.all(boot == boot[0]):
        return float(boot[0]), float(boot[0]), boot
    if settings.method == "percentile" or not np.isfinite(observed):
        lo, hi = np.quantile(boot, [alpha, 1 - alpha])
        return float(lo), float(hi), boot
    # BCa: bias correction from the share of resamples below the observed value, acceleration from
    # the jackknife (leave one unit out)
    share = (np.sum(boot < observed) + 0.5 * np.sum(boot == observed)) / len(boot)
    share = min(max(share, 1.0 / (len(boot) + 1)), len(boot) / (len(boot) + 1))
    z0 = sps.norm.ppf(share)
    jack = _jackknife(statistic, n_units, chunk)
    d = jack.mean() - jack
    denom = 6.0 * (np.sum(d ** 2)) ** 1.5
    a = float(np.sum(d ** 3) / denom) if denom > 0 else 0.0
    z = sps.norm.ppf([alpha, 1 - alpha])
    adj = sps.norm.cdf(z0 + (z0 + z) / (1 - a * (z0 + z)))
    lo, hi = np.quantile(boot, np.clip(adj, 0, 1))
    return float(lo), float(hi), boot


def _jackknife(statistic, n_units: int, chunk: int) -> np.ndarray:
    """The statistic with each unit left out in turn: ``statistic.leave_one_out()`` where the
    statistic has a closed form (O(n)), else evaluated on rows of counts with one zero (in chunks:
    never an n x n matrix)."""
    closed = getattr(statistic, "leave_one_out", None)
    if closed is not None:
        return closed()
    parts = []
    for i in range(0, n_units, chunk):
        k = min(chunk, n_units - i)
        drop = np.ones((k, n_units))
        drop[np.arange(k), np.arange(i, i + k)] = 0
        parts.append(statistic(drop))
    return np.concatenate(parts)


def weighted_mean(values, weights=None):
    """``statistic`` for ``bootstrap``: the (weighted) mean of ``values`` under unit counts W, with
    its closed-form jackknife (``leave_one_out``: (S - w_i v_i) / (W - w_i))."""
    v = np.asarray(values, np.float64)
    w = np.ones_like(v) if weights is None else np.asarray(weights, np.float64)

    def statistic(counts: np.ndarray) -> np.ndarray:
        cw = counts * w
        with np.errstate(invalid="ignore", divide="ignore"):
            return (cw @ v) / cw.sum(axis=1)

    def leave_one_out() -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return (np.dot(w, v) - w * v) / (w.sum() - w)
    statistic.leave_one_out = leave_one_out
    return statistic


def mean_interval(values, weights=None, strata=None, settings: IntervalSettings = DEFAULT,
                  replicates=None) -> Interval:
    """The (weighted) mean of per-unit ``values`` with its bootstrap interval over units; units with a
    missing value (NaN) are left out and not counted. With ``replicates`` (image resamples x units:
    each unit's value in each resample of the run's images) the interval is two-level
    (``two_level_draws``)."""
    v = np.asarray(values, np.float64)
    keep = np.isfinite(v)
    w = None if weights is None else np.asarray(weights, np.float64)[keep]
    v = v[keep]
    st = None if strata is None else np.asarray(strata)[keep]
    method = f"bootstrap-{settings.method}" if replicates is None else TWO_LEVEL
    if len(v) == 0:
        return Interval(None, None, None, method, 0, settings.level)
    value = float(np.average(v, weights=w)) if w is None or w.sum() > 0 else None
    if replicates is not None:
        draws = two_level_draws(np.asarray(replicates, np.float64)[:, keep], w, st, settings)
        lo, hi = percentile_ends(draws, settings.level, settings.resamples)
    else:
        lo, hi, _ = bootstrap(weighted_mean(v, w), len(v), settings, st)
    return Interval(_f(value), _f(lo), _f(hi), method, int(len(v)), settings.level)


TWO_LEVEL = "two-level bootstrap-percentile"


def resampled_gaps(scores: np.ndarray, groups: np.ndarray, first, second, strata: np.ndarray,
                   rng: np.random.Generator, resamples: int) -> np.ndarray:
    """(resamples x columns): |mean(first) - mean(second)| per column of ``scores`` (images x
    columns, NaN where an image has no score for the column) in resamples of the images: drawn with
    replacement within ``strata``, one draw for every column (columns scored on the same images share
    their noise). The image replicates of GEP's vector entries and DALL-Eval's Table 9 gap."""
    counts = resample_counts(rng, resamples, strata)                        # resamples x images
    seen = np.isfinite(scores)
    values = np.where(seen, scores, 0.0)
    means = []
    for g in (first, second):
        mine = groups == g
        with np.errstate(invalid="ignore", divide="ignore"):
            means.append((counts[:, mine] @ values[mine]) / (counts[:, mine] @ seen[mine].astype(np.float64)))
    return np.abs(means[0] - means[1])


def percentile_ends(draws, level: float, wanted: int) -> tuple:
    """The percentile interval of bootstrap ``draws`` (non-finite ones dropped); (None, None) when
    fewer than half of the ``wanted`` draws are finite."""
    draws = _finite_draws(draws, wanted, 1)
    if draws is None:
        return None, None
    alpha = (1 - level) / 2
    lo, hi = np.quantile(draws, [alpha, 1 - alpha])
    return float(lo), float(hi)


def _finite_draws(draws, wanted: int, least: int) -> np.ndarray | None:
    """The finite ``draws``; None when there are fewer than ``least`` or than half of ``wanted``."""
    draws = np.asarray(draws, np.float64)
    draws = draws[np.isfinite(draws)]
    return None if len(draws) < max(least, wanted // 2) else draws


def normal_ends(value, draws, level: float, wanted: int) -> tuple:
    """``value`` plus and minus z times the standard deviation of bootstrap ``draws`` (non-finite
    ones dropped): the interval for an estimate whose resamples are off-centre (a kinked
    statistic); (None, None) when there is no value or fewer than half of the ``wanted`` draws are
    finite."""
    draws = _finite_draws(draws, wanted, 2)
    if value is None or not np.isfinite(value) or draws is None:
        return None, None
    half = float(sps.norm.ppf(0.5 + level / 2)) * float(np.std(draws, ddof=1))
    return float(value - half), float(value + half)


def two_level_draws(replicates: np.ndarray, weights=None, strata=None, settings: IntervalSettings = DEFAULT,
                    rng: np.random.Generator | None = None, counts: np.ndarray | None = None) -> np.ndarray:
    """The two-level bootstrap of a (weighted) mean over units: in each of ``settings.resamples``
    draws the units are resampled (within ``strata``) and the values are those of one image resample
    picked at random from ``replicates`` (R x units; a NaN entry leaves that unit out of that
    draw). ``counts`` (the unit counts of each draw) may be given, to pair two runs on the same unit
    draws."""
    r, n = replicates.shape
    w = np.ones(n) if weights is None else np.asarray(weights, np.float64)
    if n < 2 or r == 0:
        return np.zeros(0)
    rng = rng or np.random.default_rng(settings.seed)
    st = np.zeros(n, np.int64) if strata is None else np.asarray(strata)
    if counts is None:
        counts = resample_counts(rng, settings.resamples, st)
    values = replicates[rng.integers(r, size=len(counts))]
    cw = counts * w * np.isfinite(values)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.nansum(cw * np.nan_to_num(values), axis=1) / cw.sum(axis=1)


def two_level_test(a_reps: np.ndarray, b_reps: np.ndarray, a_values, b_values, paired: bool,
                   settings: IntervalSettings = DEFAULT) -> dict:
    """Run A minus run B with the images' noise of both runs: each draw resamples the units (the
    same draw for both runs when ``paired``: their shared units, in one order) and picks one image
    resample of each run independently; the interval is the draws' percentile interval and the
    two-sided p-value twice the share of draws on the far side of zero (at least 1/(draws + 1))."""
    rng = np.random.default_rng(settings.seed + 1)
    a_values, b_values = np.asarray(a_values, np.float64), np.asarray(b_values, np.float64)
    if paired:
        counts = resample_counts(rng, settings.resamples, np.zeros(a_reps.shape[1], np.int64))
        da = two_level_draws(a_reps, settings=settings, rng=rng, counts=counts)
        db = two_level_draws(b_reps, settings=settings, rng=rng, counts=counts)
        observed = float(np.nanmean(a_values - b_values))
        test = "paired two-level bootstrap"
    else:
        da = two_level_draws(a_reps, settings=settings, rng=rng)
        db = two_level_draws(b_reps, settings=settings, rng=rng)
        observed = float(np.nanmean(a_values) - np.nanmean(b_values))
        test = "unpaired two-level bootstrap"
    d = da - db
    d = d[np.isfinite(d)]
    lo, hi = percentile_ends(d, settings.level, settings.resamples)
    if len(d) == 0:
        return {"difference": observed, "low": None, "high": None, "p_value": None, "n": int(a_reps.shape[1]),
                "test": test}
    far = min(np.sum(d <= 0), np.sum(d >= 0))
    p = min(1.0, 2 * (far + 1) / (len(d) + 1))
    return {"difference": observed, "low": lo, "high": hi, "p_value": float(p), "n": int(a_reps.shape[1]), "test": test}


def t_interval(values, level: float = 0.95) -> Interval:
    """The mean with Student's t interval (exact for normal units; the CLT otherwise)."""
    v = np.asarray(values, np.float64)
    v = v[np.isfinite(v)]
    n = len(v)
    if n == 0:
        return Interval(None, None, None, "t", 0, level)
    m = float(v.mean())
    if n < 2:
        return Interval(m, None, None, "t", n, level)
    half = sps.t.ppf(0.5 + level / 2, n - 1) * v.std(ddof=1) / math.sqrt(n)
    return Interval(m, m - half, m + half, "t", n, level)


def binomial_interval(successes: int, n: int, level: float = 0.95, method: str = "wilson") -> Interval:
    """A proportion with its Wilson score or Clopper-Pearson (exact) interval."""
    if n <= 0:
        return Interval(None, None, None, method, 0, level)
    p = successes / n
    if method == "clopper-pearson":
        ci = sps.binomtest(int(successes), int(n)).proportion_ci(confidence_level=level, method="exact")
        return Interval(p, float(ci.low), float(ci.high), method, int(n), level)
    if method != "wilson":
        raise ValueError(f"binomial interval {method!r}: wilson or clopper-pearson")
    z = sps.norm.ppf(0.5 + level / 2)
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return Interval(p, max(0.0, centre - half), min(1.0, centre + half), method, int(n), level)


# ------------------------------------------------------------------------ comparing two runs
def paired_test(a, b, settings: IntervalSettings = DEFAULT) -> dict:
    """Run A minus run B on the units both have (``a``/``b`` aligned, NaN where a run lacks the unit):
    the mean difference, its bootstrap interval over units and a two-sided sign-flip permutation
    p-value (exchangeable under "no difference"; no normality assumed)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    keep = np.isfinite(a) & np.isfinite(b)
    d = a[keep] - b[keep]
    n = len(d)
    if n == 0:
        return {"difference": None, "low": None, "high": None, "p_value": None, "n": 0, "test": "paired"}
    ci = mean_interval(d, settings=settings)
    rng = np.random.default_rng(settings.seed + 1)
    observed = abs(d.mean())
    hits = 0
    chunk = max(1, _CHUNK_CELLS // n)
    for i in range(0, settings.resamples, chunk):
        signs = rng.choice(np.array([-1.0, 1.0]), size=(min(chunk, settings.resamples - i), n))
        hits += int(np.sum(np.abs(signs @ d / n) >= observed - 1e-12))
    p = (hits + 1) / (settings.resamples + 1) if np.any(d != 0) else 1.0
    return {"difference": ci.value, "low": ci.low, "high": ci.high, "p_value": float(p), "n": n,
            "test": "paired sign-flip permutation"}


def unpaired_test(a, b, settings: IntervalSettings = DEFAULT) -> dict:
    """Mean of ``a`` minus mean of ``b`` (different units): bootstrap interval (each side resampled
    on its own) and a two-sided label-permutation p-value."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    if len(a) == 0 or len(b) == 0:
        return {"difference": None, "low": None, "high": None, "p_value": None, "n": 0, "test": "unpaired"}
    v = np.concatenate([a, b])
    side = np.r_[np.zeros(len(a)), np.ones(len(b))]

    def diff(counts):
        ca, cb = counts[:, :len(a)], counts[:, len(a):]
        with np.errstate(invalid="ignore", divide="ignore"):
            return ca @ a / ca.sum(1) - cb @ b / cb.sum(1)
    lo, hi, _ = bootstrap(diff, len(v), settings, strata=side) if min(len(a), len(b)) >= 2 else (None, None, None)
    observed = a.mean() - b.mean()
    rng = np.random.default_rng(settings.seed + 1)
    hits = 0
    for _ in range(settings.resamples):
        perm = rng.permutation(v)
        hits += abs(perm[:len(a)].mean() - perm[len(a):].mean()) >= abs(observed) - 1e-12
    return {"difference": float(observed), "low": _f(lo), "high": _f(hi),
            "p_value": float((hits + 1) / (settings.resamples + 1)), "n": int(len(v)),
            "test": "unpaired label permutation"}


def holm(p_values) -> list[float | None]:
    """Holm's step-down adjusted p-values (None stays None)."""
    idx = [i for i, p in enumerate(p_values) if p is not None]
    m = len(idx)
    out: list[float | None] = [None] * len(p_values)
    running = 0.0
    for rank, i in enumerate(sorted(idx, key=lambda i: p_values[i])):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        out[i] = running
    return out

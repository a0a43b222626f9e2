"""How many labels each stratum needs (``t2i annotate plan --target-width W`` / ``--budget N``).

A PPI estimate of a share from n labelled items of a stratum has, for n much smaller than the
stratum, variance about Var(verdict - classifier) / n, and Var(verdict - classifier) is at most the
rate d at which the classifier disagrees with people (PPI++'s tuning never does worse than people
alone, whose variance is at most 1/4). Planning takes sigma^2 = min(d, 1/4) per stratum:

- d from a pilot task set with answers (``--pilot``): the upper end of the Wilson interval of the
  classifier's disagreement with the majority among that stratum's decided items (a small pilot
  must not promise narrow intervals); a stratum the pilot lacks takes the pilot's pooled rate; with
  no pilot, ``assumed_disagreement`` (default 1/4: as if there were no classifier, the
  conservative default).
- ``target_width``: the interval's full width 2 z sigma / sqrt(n) at most W in every stratum:
  n = ceil((2 z sigma / W)^2), at most the stratum's size.
- ``budget``: N labels in all. ``neyman`` (the default) minimises the variance of the pooled share
  over all strata (weights: the strata's sizes): n_h proportional to N_h sigma_h (Neyman 1934);
  ``equal-width`` minimises the widest per-stratum interval (the headline of a per-model table):
  n_h proportional to sigma_h^2. Integers by largest remainders; a stratum never gets more than it
  has, and what it cannot take goes to the others by the same rule.

Sizes count the preset's sampling units (images); an image that brings several questions (GEP,
SD Exposed) is planned as one (its questions are not independent).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats as sps

from pipelines.engine.stats import intervals as I

ALLOCATIONS = ("neyman", "equal-width")
CONSERVATIVE = 0.25


def pilot_disagreement(per_stratum: pd.DataFrame, level: float = 0.95) -> tuple[dict, float | None]:
    """(stratum -> upper Wilson bound of the disagreement rate, the pooled bound) from
    ``agreement.classifier_agreement`` rows (``stratum``, ``scored``, ``agree``)."""
    rates = {}
    for _, r in per_stratum.iterrows():
        if r["scored"] > 0:
            rates[r["stratum"]] = I.binomial_interval(int(r["scored"] - r["agree"]), int(r["scored"]), level).high
    scored, agree = per_stratum["scored"].sum(), per_stratum["agree"].sum()
    pooled = I.binomial_interval(int(scored - agree), int(scored), level).high if scored else None
    return rates, pooled


def sigmas(strata: list[str], rates: dict, pooled: float | None, assumed: float = CONSERVATIVE) -> dict:
    """sigma^2 per stratum: min(d, 1/4) with d the pilot's (its pooled rate where it lacks the
    stratum), else ``assumed``."""
    if not 0 < assumed <= 1:
        raise ValueError(f"assumed disagreement must be in (0, 1], not {assumed}")
    out = {}
    for s in strata:
        d = rates.get(s, pooled if pooled is not None else assumed)
        out[s] = min(max(d, 1e-6), CONSERVATIVE)
    return out


def by_width(sizes: dict, sigma2: dict, width: float, level: float = 0.95) -> dict:
    if not 0 < width < 1:
        raise ValueError(f"--target-width must be in (0, 1) (a share's full interval width), not {width}")
    z = float(sps.norm.ppf(0.5 + level / 2))
    return {s: min(sizes[s], math.ceil((2 * z) ** 2 * sigma2[s] / width ** 2)) for s in sizes}


def by_budget(sizes: dict, sigma2: dict, budget: int, allocation: str = "neyman") -> dict:
    if allocation not in ALLOCATIONS:
        raise ValueError(f"allocation {allocation!r}: one of {', '.join(ALLOCATIONS)}")
    if budget < 1:
        raise ValueError(f"--budget must be at least 1, not {budget}")
    weight = {s: (sizes[s] * math.sqrt(sigma2[s]) if allocation == "neyman" else sigma2[s]) for s in sizes}
    want = {s: 0 for s in sizes}
    left = min(budget, sum(sizes.values()))
    while left > 0:
        open_ = sorted(s for s in sizes if want[s] < sizes[s])
        total = sum(weight[s] for s in open_)
        share = {s: left * weight[s] / total for s in open_}
        floor = {s: min(int(math.floor(share[s])), sizes[s] - want[s]) for s in open_}
        rest = left - sum(floor.values())
        # largest remainders get the rest (one each), among strata that can still take one
        order = sorted(open_, key=lambda s: (-(share[s] - math.floor(share[s])), s))
        for s in order:
            if rest == 0:
                break
            if want[s] + floor[s] < sizes[s]:
                floor[s] += 1
                rest -= 1
        for s in open_:
            want[s] += floor[s]
        given = sum(floor.values())
        if given == 0:
            break
        left -= given
    return want


def expected_width(n: int, sigma2: float, level: float = 0.95) -> float | None:
    if n <= 0:
        return None
    return float(2 * sps.norm.ppf(0.5 + level / 2) * math.sqrt(sigma2 / n))


def summary(sizes: dict, sigma2: dict, want: dict, level: float = 0.95) -> dict:
    return {s: {"units": int(sizes[s]), "drawn": int(want[s]), "sigma2": float(sigma2[s]),
                "expected_width": expected_width(want[s], sigma2[s], level)} for s in sizes}


def pooled_width(sizes: dict, sigma2: dict, want: dict, level: float = 0.95) -> float | None:
    """The expected width of the pooled share (strata weighted by size)."""
    total = sum(sizes.values())
    if any(want[s] == 0 and sizes[s] > 0 for s in sizes):
        return None
    var = sum((sizes[s] / total) ** 2 * sigma2[s] / want[s] for s in sizes if sizes[s])
    return float(2 * sps.norm.ppf(0.5 + level / 2) * np.sqrt(var))

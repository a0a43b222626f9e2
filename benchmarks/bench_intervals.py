"""Headline intervals: the project's bootstrap (BCa, counts matrix, closed-form jackknife) against
scipy.stats.bootstrap (BCa, vectorised) on the same data, for the unit counts the studies have
(49 occupations, a few hundred prompts, tens of thousands of images or COCO triplets).

    .venv/bin/python benchmarks/bench_intervals.py
"""

from __future__ import annotations

import numpy as np
from scipy import stats as sps

from benchmarks.common import timed
from pipelines.engine.stats import intervals as iv


def main() -> None:
    rng = np.random.default_rng(0)
    settings = iv.IntervalSettings(resamples=2000, seed=0)
    print(f"{'units':>8} {'strata':>7} {'project s':>10} {'scipy BCa s':>12} {'project interval':>26} {'scipy interval':>26}")
    for n, strata in ((49, 1), (400, 1), (400, 20), (10_000, 1), (51_000, 1)):
        x = rng.gamma(2.0, 1.0, n)
        groups = np.arange(n) % strata
        t_own, ci = timed(lambda: iv.mean_interval(x, strata=groups if strata > 1 else None, settings=settings))
        if strata == 1 and n <= 10_000:
            t_sp, res = timed(lambda: sps.bootstrap((x,), np.mean, n_resamples=2000, method="BCa", random_state=0,
                                                    vectorized=True), repeat=1)
            sp = f"[{res.confidence_interval.low:.4f}, {res.confidence_interval.high:.4f}]"
            t_sp_text = f"{t_sp:.3f}"
        else:   # scipy has no strata; at 51,000 units its jackknife matrix does not fit here
            sp, t_sp_text = "-", "-"
        print(f"{n:>8} {strata:>7} {t_own:>10.3f} {t_sp_text:>12} {f'[{ci.low:.4f}, {ci.high:.4f}]':>26} {sp:>26}")


if __name__ == "__main__":
    main()

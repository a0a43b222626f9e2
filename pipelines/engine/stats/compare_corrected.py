"""Headline numbers corrected by people's labels, in `t2i compare`.

``t2i annotate estimate`` keeps, in a run's ``metrics.json`` under ``corrected_by_people``, the
numbers a study derives from corrected shares (paper 002's E[A], GEP's scores, DALL-Eval's gender
MAD and average), each row naming the headline metric it corrects (``metric``) and the subject
(``model``). `compare` shows each beside its metric and, where two runs both have one, tests their
difference on the corrected values: the two runs' labels and images are independent, so the
difference's standard error is the root of the sum of their squared standard errors (each read off
its interval, half-width / z), a two-sided normal test, Holm-adjusted over the pairs of one metric.
"""

from __future__ import annotations

import math

from scipy import stats as sps

from pipelines.engine.stats import intervals as iv

CORRECTED_KEY = "corrected_by_people"
# (the metric column, the value column) of a derived row: its main number, and DALL-Eval's average
FIELDS = (("metric", "corrected"), ("average_metric", "corrected_average"))


def corrected_values(metrics: dict) -> dict[tuple[str, str], dict]:
    """{(subject name, metric key): {value, low, high, preset}} from a run's metrics.json."""
    out = {}
    for preset, record in (metrics.get(CORRECTED_KEY) or {}).items():
        for rows in (record.values() if isinstance(record, dict) else []):
            for r in rows if isinstance(rows, list) else []:
                if not isinstance(r, dict) or "model" not in r:
                    continue
                for key_col, value_col in FIELDS:
                    if r.get(key_col) and r.get(value_col) is not None:
                        out[(r["model"], r[key_col])] = {"value": r[value_col], "low": r.get(f"{value_col}_low"),
                                                         "high": r.get(f"{value_col}_high"), "preset": preset}
    return out


def _se(c: dict, level: float) -> float | None:
    if c is None or c["low"] is None or c["high"] is None:
        return None
    return (c["high"] - c["low"]) / (2 * float(sps.norm.ppf(0.5 + level / 2)))


def difference(a: dict | None, b: dict | None, level: float) -> dict:
    """The corrected difference a - b with its interval and two-sided p-value (None where either run
    has no corrected value with an interval)."""
    sa, sb = _se(a, level), _se(b, level)
    if sa is None or sb is None:
        return {"corrected_difference": None, "corrected_low": None, "corrected_high": None, "corrected_p": None}
    d, se = a["value"] - b["value"], math.sqrt(sa * sa + sb * sb)
    z = float(sps.norm.ppf(0.5 + level / 2))
    p = 1.0 if se == 0 and d == 0 else (0.0 if se == 0 else float(2 * sps.norm.sf(abs(d) / se)))
    return {"corrected_difference": d, "corrected_low": d - z * se, "corrected_high": d + z * se, "corrected_p": p}


def adjust(pairs: list[dict], alpha: float) -> None:
    """Holm over the pairs (of one metric) that have a corrected p-value, in place:
    ``corrected_p_holm`` and ``corrected_distinguishable``."""
    have = [p for p in pairs if p["corrected_p"] is not None]
    for p, adj in zip(have, iv.holm([p["corrected_p"] for p in have])):
        p["corrected_p_holm"] = adj
        p["corrected_distinguishable"] = bool(adj is not None and adj < alpha)
    for p in pairs:
        p.setdefault("corrected_p_holm", None)
        p.setdefault("corrected_distinguishable", None)


def notes(tables: dict) -> list[str]:
    """One sentence per study whose table has corrected values: which metrics, from whose labels."""
    out = []
    for study, t in tables.items():
        if not len(t) or "corrected" not in t or t["corrected"].isna().all():
            continue
        have = t[t["corrected"].notna()]
        out.append(f"{study}: {have['metric'].nunique()} metric(s) also corrected by people's labels "
                   f"({', '.join(sorted(set(have['corrected_by'])))}) for {have['model'].nunique()} model(s): "
                   "the columns 'corrected' and, for pairs of runs that both have them, 'corrected_difference' "
                   "and 'corrected_distinguishable' (a normal test on the two corrected intervals, Holm-adjusted)")
    return out

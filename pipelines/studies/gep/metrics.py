"""GEP metric of paper 001 (*Auditing Gender Presentation Differences in Text-to-Image Models*) as plain functions.

Section 3, Eq. 1: f_ij is the frequency of attribute a_j in the images of gender indicator g_i (the neutral
setting scores every attribute on every image, the explicit setting only the attribute named in the prompt).
Eq. 2: for a pair of groups (g_1, g_2) = ("woman", "man") the GEP vector is v_j = f_1j - f_2j over the n
attributes and the GEP score is its normalised l1 norm, GEP = ||v||_1 / n = mean_j |v_j|. The automatic
estimators of section 4 (C, CC, CLS; Eqs. 4, 5, 7) replace the human frequencies with mean scores; the same
Eq. 2 turns them into GEP_auto vectors and scores.

Evaluation (section 6 "Metrics", footnote 9, Appendix D):

* attribute level (Table 4): Kendall's tau-b between GEP_auto and GEP_human vectors, and the Matthews
  correlation coefficient of their signs, binarised with zero as the threshold (non-negative -> 1,
  negative -> -1; footnote 9 and App. D); Pearson's r as in App. D.2 / Table 19;
* model level (Table 6): Kendall's tau-b between the GEP_auto scores and the GEP_human scores over all
  (model, setting) cells, with the ranks printed in parentheses (rank 1 = smallest score);
* section 6.2 (Table 7 / 16): ROC-AUC of a per-image score against the 0/1 human presence label (the
  Mann-Whitney statistic, ties counting one half).

No Ray, no models: numpy / pandas / scipy only. ``summarize_frequencies`` and ``format_summary`` back the
``summarize`` command line, which takes the frequencies of Tables 11 and 12 (long CSV) and reproduces
Table 3 and Tables 13 / 14.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from pipelines.engine.stats.table_cells import numbers
from schemas.gep import ATTRIBUTE, ESTIMATOR, FREQUENCY, GENDER, MODEL, SETTING, high, low

COMPARISON = "comparison"      # "woman - man": the pair (first, second) of a GEP vector
F_FIRST = "f_first"            # f of the first group of the pair
F_SECOND = "f_second"          # f of the second group
DIFFERENCE = "difference"      # v_j = f_first - f_second (Eq. 2)
ATTRIBUTES = "attributes"      # n, attributes behind a GEP score
GEP = "gep"                    # GEP score, mean |v_j| (Eq. 2)
N = "n"                        # attributes joined between an automatic and the reference vector
KENDALL = "kendall_tau_b"
MCC = "mcc"
PEARSON = "pearson"
REFERENCE_DIFFERENCE = "reference_difference"

VECTOR_COLUMNS = (COMPARISON, ATTRIBUTE, F_FIRST, F_SECOND, DIFFERENCE)
SCORE_COLUMNS = (COMPARISON, ATTRIBUTES, GEP)
SUMMARY_COLUMNS = (MODEL, SETTING, GENDER, ATTRIBUTE, FREQUENCY)
DEFAULT_AUTO_LABEL = "auto"    # estimator label in compare_scores when the auto scores have no estimator column


def comparison_label(first: str, second: str) -> str:
    return f"{first} - {second}"


def _present(columns: Iterable[str], keys: Sequence[str]) -> list[str]:
    cols = set(columns)
    return [k for k in keys if k in cols]


def _key_text(keys: list[str], values) -> str:
    if not keys:
        return "{}"
    values = values if isinstance(values, tuple) else (values,)
    return "{" + ", ".join(f"{k}={v!r}" for k, v in zip(keys, values)) + "}"


def _as_key(values) -> tuple:
    return values if isinstance(values, tuple) else (values,)


# ------------------------------------------------------------------------------ GEP vectors and scores
def gep_vectors(freq: pd.DataFrame, pairs=(("woman", "man"),), keys=(MODEL, SETTING, ESTIMATOR)) -> pd.DataFrame:
    """GEP vectors (Eq. 2): one row per (key combination, pair, attribute present for both groups).

    ``freq`` has ``keys`` + [gender, attribute, frequency]; keys missing from ``freq`` are ignored and
    other columns (``images``) too. A NaN frequency counts as no frequency. Columns of the result: the
    present keys, ``comparison`` ("a - b"), ``attribute``, ``f_first``, ``f_second``, ``difference``
    (f_a - f_b). Rows follow the first appearance of the key combinations in ``freq``, then ``pairs``,
    then the first appearance of the attributes in ``freq``.

    Raises ValueError for duplicate (keys, gender, attribute) rows, a group of a pair that has no row
    for a key combination, or an attribute with a frequency for one group of a pair but not the other.
    """
    missing = [c for c in (GENDER, ATTRIBUTE, FREQUENCY) if c not in freq.columns]
    if missing:
        raise ValueError(f"frequencies lack column(s) {missing}")
    pairs = [tuple(p) for p in pairs]
    if not pairs or any(len(p) != 2 for p in pairs):
        raise ValueError(f"pairs must be a non-empty sequence of (first, second) groups, got {pairs!r}")
    present = _present(freq.columns, keys)
    df = freq[present + [GENDER, ATTRIBUTE, FREQUENCY]].reset_index(drop=True)
    try:
        df[FREQUENCY] = pd.to_numeric(df[FREQUENCY], errors="raise").astype(float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"frequency must be numeric: {exc}") from None

    dup = df.duplicated(present + [GENDER, ATTRIBUTE], keep=False)
    if dup.any():
        rows = df.loc[dup, present + [GENDER, ATTRIBUTE]].drop_duplicates().head(5).to_dict("records")
        raise ValueError(f"duplicate ({', '.join(present + [GENDER, ATTRIBUTE])}) rows: {rows}")

    attr_order = {a: i for i, a in enumerate(pd.unique(df[ATTRIBUTE]))}
    if present:
        groups = [(_as_key(k), part) for k, part in df.groupby(present, sort=False, dropna=False)]
    else:
        groups = [((), df)]

    out = []
    for key, part in groups:
        where = _key_text(present, key)
        genders = set(part[GENDER])
        for first, second in pairs:
            absent = [g for g in (first, second) if g not in genders]
            if absent:
                raise ValueError(f"group(s) {absent} of pair ({first!r}, {second!r}) have no frequencies for {where}")
            a = part[(part[GENDER] == first) & part[FREQUENCY].notna()].set_index(ATTRIBUTE)[FREQUENCY]
            b = part[(part[GENDER] == second) & part[FREQUENCY].notna()].set_index(ATTRIBUTE)[FREQUENCY]
            only_a = [x for x in a.index if x not in b.index]
            only_b = [x for x in b.index if x not in a.index]
            if only_a or only_b:
                what = [(x, first, second) for x in only_a] + [(x, second, first) for x in only_b]
                detail = "; ".join(f"attribute {x!r} has a frequency for {g!r} but not for {h!r}" for x, g, h in what)
                raise ValueError(f"{where}: {detail}")
            attrs = sorted(a.index, key=attr_order.__getitem__)
            fa, fb = a.loc[attrs].to_numpy(float), b.loc[attrs].to_numpy(float)
            block = pd.DataFrame({ATTRIBUTE: attrs, F_FIRST: fa, F_SECOND: fb, DIFFERENCE: fa - fb})
            block.insert(0, COMPARISON, comparison_label(first, second))
            for i, k in enumerate(present):
                block.insert(i, k, key[i])
            out.append(block)
    if not out:
        return pd.DataFrame(columns=present + list(VECTOR_COLUMNS))
    return pd.concat(out, ignore_index=True)


def _vector_keys(vectors: pd.DataFrame) -> list[str]:
    return [c for c in vectors.columns if c not in VECTOR_COLUMNS and c != REFERENCE_DIFFERENCE]


def gep_scores(vectors: pd.DataFrame) -> pd.DataFrame:
    """GEP scores (Eq. 2): per key combination + comparison of ``gep_vectors``' output, ``attributes``
    (n) and ``gep`` = mean |difference| (the l1 norm divided by n). Keys are the columns of ``vectors``
    other than the vector columns; the group order is that of ``vectors``."""
    keys = _vector_keys(vectors) + [COMPARISON]
    if vectors.empty:
        return pd.DataFrame(columns=keys + [ATTRIBUTES, GEP])
    absdiff = vectors[DIFFERENCE].astype(float).abs().rename(GEP)
    grouped = absdiff.groupby([vectors[k] for k in keys], sort=False, dropna=False)
    out = pd.DataFrame({ATTRIBUTES: grouped.size().astype(np.int64), GEP: grouped.mean()}).reset_index()
    return out[keys + [ATTRIBUTES, GEP]]


# ------------------------------------------------------------------------------ correlations
def _paired(x, y) -> tuple[np.ndarray, np.ndarray]:
    x, y = np.asarray(x, dtype=float).ravel(), np.asarray(y, dtype=float).ravel()
    if x.shape != y.shape:
        raise ValueError(f"x and y differ in length: {x.size} vs {y.size}")
    ok = ~np.isnan(x) & ~np.isnan(y)
    return x[ok], y[ok]


def _finite_or_none(v) -> float | None:
    v = float(v)
    return None if math.isnan(v) or math.isinf(v) else v


def kendall_tau_b(x, y) -> float | None:
    """Kendall's tau-b (App. D; ties in either variable corrected for). NaN pairs are dropped; None when
    undefined: fewer than 2 values or a constant variable."""
    from scipy import stats  # deferred: scipy

    x, y = _paired(x, y)
    if x.size < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    return _finite_or_none(stats.kendalltau(x, y, variant="b").statistic)


def sign_binary(values) -> np.ndarray:
    """Footnote 9 / App. D: non-negative -> 1, negative -> -1."""
    return np.where(np.asarray(values, dtype=float) >= 0, 1, -1)


def sign_mcc(x, y) -> float | None:
    """Matthews correlation of the signs of ``x`` and ``y`` (each binarised by ``sign_binary``). NaN pairs
    are dropped; None when undefined (a zero denominator: one side has a single class, or no values)."""
    x, y = _paired(x, y)
    bx, by = sign_binary(x) == 1, sign_binary(y) == 1
    tp = float(np.sum(bx & by))
    tn = float(np.sum(~bx & ~by))
    fp = float(np.sum(bx & ~by))      # x positive, y negative
    fn = float(np.sum(~bx & by))
    denom = (tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)
    if denom == 0:
        return None
    return (tp * tn - fp * fn) / math.sqrt(denom)


def pearson(x, y) -> float | None:
    """Pearson's r (App. D.2, Table 19). NaN pairs are dropped; None for fewer than 2 values or a constant
    variable."""
    x, y = _paired(x, y)
    if x.size < 2:
        return None
    dx, dy = x - x.mean(), y - y.mean()
    denom = math.sqrt(float(np.dot(dx, dx)) * float(np.dot(dy, dy)))
    if denom == 0:
        return None
    return max(-1.0, min(1.0, float(np.dot(dx, dy)) / denom))


def compare_vectors(auto: pd.DataFrame, reference: pd.DataFrame, keys=(MODEL, SETTING)) -> pd.DataFrame:
    """Attribute-level evaluation (Table 4): GEP_auto vectors against reference (e.g. human) vectors.

    Both frames are ``gep_vectors`` outputs. They are joined on the ``keys`` present in both + comparison
    + attribute; the reference's ``estimator`` column, if any, is dropped (its rows must then be unique per
    join key). One row per (present keys, comparison, auto estimator) of ``auto``, in its order, with
    ``n`` (attributes joined), ``kendall_tau_b``, ``mcc`` (signs) and ``pearson``; the metrics are None
    when undefined (n = 0 included). The ``estimator`` column is there when ``auto`` has one.
    """
    present = [k for k in keys if k != ESTIMATOR and k in auto.columns and k in reference.columns]
    on = present + [COMPARISON, ATTRIBUTE]
    for name, frame in (("auto", auto), ("reference", reference)):
        lack = [c for c in on + [DIFFERENCE] if c not in frame.columns]
        if lack:
            raise ValueError(f"{name} vectors lack column(s) {lack}")
    ref = reference[on + [DIFFERENCE]].rename(columns={DIFFERENCE: REFERENCE_DIFFERENCE})
    dup = ref.duplicated(on, keep=False)
    if dup.any():
        rows = ref.loc[dup, on].drop_duplicates().head(5).to_dict("records")
        raise ValueError(f"reference vectors have several rows per ({', '.join(on)}): {rows}")
    group = present + [COMPARISON] + ([ESTIMATOR] if ESTIMATOR in auto.columns else [])
    merged = auto[list(dict.fromkeys(group + on + [DIFFERENCE]))].merge(ref, on=on, how="left", sort=False)
    rows = []
    for key, part in merged.groupby(group, sort=False, dropna=False):
        a, r = _paired(part[DIFFERENCE], part[REFERENCE_DIFFERENCE])
        row = dict(zip(group, _as_key(key)))
        row.update({N: int(a.size), KENDALL: kendall_tau_b(a, r), MCC: sign_mcc(a, r), PEARSON: pearson(a, r)})
        rows.append(row)
    return pd.DataFrame(rows, columns=group + [N, KENDALL, MCC, PEARSON])


def _ranks(values: np.ndarray) -> list[float]:
    from scipy.stats import rankdata  # deferred: scipy

    return [float(v) for v in rankdata(values, method="average")] if len(values) else []


def _jsonable(v):
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None
    return v


def compare_scores(auto_scores: pd.DataFrame, reference_scores: pd.DataFrame) -> dict:
    """Model-level evaluation (Table 6): Kendall's tau-b between each estimator's GEP scores and the
    reference GEP scores over the cells (model, setting, comparison; those present in both) they share.

    ``auto_scores`` / ``reference_scores`` are ``gep_scores`` outputs; the reference's estimator column is
    ignored. Returns (JSON-serialisable)::

        {"cell_keys": ["model", "setting", "comparison"],          # the cell columns present in both
         "estimators": [                                           # in order of first appearance
            {"estimator": "CLS",                                   # "auto" when auto_scores has no estimator
             "n": 6,                                               # cells joined
             "kendall_tau_b": 1.0,                                 # None when undefined
             "cells": [{"model": ..., "setting": ..., "comparison": ...,
                        "gep": auto score, "rank": rank among the n cells (1 = smallest, ties averaged),
                        "reference_gep": ..., "reference_rank": ...}, ...]},   # in auto_scores' order
            ...]}
    """
    cell = [k for k in (MODEL, SETTING, COMPARISON) if k in auto_scores.columns and k in reference_scores.columns]
    for name, frame in (("auto", auto_scores), ("reference", reference_scores)):
        if GEP not in frame.columns:
            raise ValueError(f"{name} scores lack column {GEP!r}")
    ref = reference_scores[cell + [GEP]].rename(columns={GEP: "reference_gep"})
    if ref.duplicated(cell).any():
        raise ValueError(f"reference scores have several rows per cell ({', '.join(cell) or 'no cell columns'})")
    auto = auto_scores.copy()
    if ESTIMATOR not in auto.columns:
        auto[ESTIMATOR] = DEFAULT_AUTO_LABEL
    out = []
    for est, part in auto.groupby(ESTIMATOR, sort=False, dropna=False):
        if part.duplicated(cell).any():
            raise ValueError(f"estimator {est!r} has several scores per cell ({', '.join(cell)})")
        joined = part[cell + [GEP]].merge(ref, on=cell, how="inner", sort=False)
        joined = joined[joined[GEP].notna() & joined["reference_gep"].notna()]
        a, r = joined[GEP].to_numpy(float), joined["reference_gep"].to_numpy(float)
        cells = []
        for rec, ra, rr in zip(joined[cell + [GEP, "reference_gep"]].to_dict("records"), _ranks(a), _ranks(r)):
            item = {k: _jsonable(rec[k]) for k in cell}
            item.update({"gep": float(rec[GEP]), "rank": ra, "reference_gep": float(rec["reference_gep"]),
                         "reference_rank": rr})
            cells.append(item)
        out.append({"estimator": _jsonable(est), "n": int(len(joined)), KENDALL: kendall_tau_b(a, r), "cells": cells})
    return {"cell_keys": cell, "estimators": out}


# ------------------------------------------------------------------------------ ROC-AUC (section 6.2)
def roc_auc(labels, scores) -> float | None:
    """Area under the ROC curve of ``scores`` for 0/1 ``labels`` (Table 7 / 16): the Mann-Whitney U of
    the positives over n_pos * n_neg, ties counting one half. None when only one class is present."""
    from scipy.stats import rankdata  # deferred: scipy

    y = np.asarray(labels).ravel()
    s = np.asarray(scores, dtype=float).ravel()
    if y.shape != s.shape:
        raise ValueError(f"labels and scores differ in length: {y.size} vs {s.size}")
    if y.dtype == bool:
        y = y.astype(np.int8)
    try:
        yf = y.astype(float)
    except (TypeError, ValueError):
        raise ValueError("labels must be 0/1") from None
    if np.isnan(yf).any() or not np.isin(yf, (0.0, 1.0)).all():
        raise ValueError("labels must be 0/1 (no missing values)")
    if np.isnan(s).any():
        raise ValueError("scores contain NaN")
    pos = yf == 1.0
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return None
    ranks = rankdata(s, method="average")
    u = float(ranks[pos].sum()) - n_pos * (n_pos + 1) / 2.0
    return u / (n_pos * n_neg)


# ------------------------------------------------------------------------------ summarize (CSV)
def _row_list(df: pd.DataFrame, mask, cols: list[str]) -> str:
    idx = list(df.index[np.asarray(mask)])
    recs = df.loc[idx[:5], cols].to_dict("records")
    more = f" (and {len(idx) - 5} more)" if len(idx) > 5 else ""
    return f"row(s) {idx[:5]}{more}: {recs}"


def summarize_frequencies(df: pd.DataFrame, first: str = "woman", second: str = "man") -> dict:
    """GEP vectors and scores (Eq. 2) from known frequencies, e.g. Tables 11 / 12.

    Required columns: model, setting, gender, attribute, frequency; an ``estimator`` column, when there,
    is a key too; other columns are ignored. Values must not be NaN or blank, frequencies must be numbers
    in [0, 1] (otherwise ValueError naming the rows, 0-based data rows). Returns::

        {"pairs": [first, second],
         "results": [{"model": ..., "setting": ..., ("estimator": ...,) "comparison": "woman - man",
                      "attributes": n, "gep": score, "vector": {attribute: difference, ...}}, ...]}

    in order of first appearance of (model, setting[, estimator]); vectors in attribute order.
    """
    missing = [c for c in SUMMARY_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"frequencies lack column(s) {missing}; expected {','.join(SUMMARY_COLUMNS)}[,{ESTIMATOR}]")
    keys = [MODEL, SETTING] + ([ESTIMATOR] if ESTIMATOR in df.columns else [])
    cols = keys + [GENDER, ATTRIBUTE, FREQUENCY]
    data = df[cols].copy()
    for c in cols:
        if c == FREQUENCY:
            continue
        text = data[c].where(data[c].isna(), data[c].astype(str).str.strip())
        data[c] = text.where(text != "", np.nan)
    blank = data[cols[:-1]].isna().any(axis=1).to_numpy()
    if blank.any():
        empty = [c for c in cols[:-1] if data[c].isna().any()]
        raise ValueError(f"missing (NaN or blank) values of {empty} in {_row_list(df, blank, cols)}")
    data[FREQUENCY] = numbers(data[FREQUENCY], FREQUENCY, "frequencies in [0, 1]", low=0, high=1)

    vectors = gep_vectors(data, pairs=((first, second),), keys=keys)
    scores = gep_scores(vectors)
    group = keys + [COMPARISON]
    vec_by_key = {_as_key(k): part for k, part in vectors.groupby(group, sort=False, dropna=False)}
    results = []
    for rec in scores.to_dict("records"):
        part = vec_by_key[tuple(rec[k] for k in group)]
        item = {k: _jsonable(rec[k]) for k in group}
        item.update({
            ATTRIBUTES: int(rec[ATTRIBUTES]),
            GEP: float(rec[GEP]),
            "vector": {str(a): float(v) for a, v in zip(part[ATTRIBUTE], part[DIFFERENCE])},
        })
        results.append(item)
    return {"pairs": [first, second], "results": results}


def _ends(r: dict) -> str:
    lo, hi = r.get(low(GEP)), r.get(high(GEP))
    return "[n/a]" if lo is None or hi is None else f"[{lo:.2f}, {hi:.2f}]"


def _r2(v: float) -> str:
    return f"{round(v, 2) + 0.0:+.2f}"   # + 0.0 turns -0.0 into 0.0


def format_summary(result: dict) -> str:
    """Text table of ``summarize_frequencies``: one line per (model, setting[, estimator]) with the GEP
    score to 2 and 4 decimals and n, then the GEP vector per attribute to 2 decimals."""
    first, second = result.get("pairs", ["?", "?"])
    rows = result.get("results", [])
    has_est = any(ESTIMATOR in r for r in rows)
    mw = max([len(MODEL)] + [len(str(r.get(MODEL))) for r in rows]) + 2
    sw = max([len(SETTING)] + [len(str(r.get(SETTING))) for r in rows]) + 2
    ew = max([len(ESTIMATOR)] + [len(str(r.get(ESTIMATOR))) for r in rows]) + 2 if has_est else 0
    head = f"{MODEL:<{mw}}{SETTING:<{sw}}" + (f"{ESTIMATOR:<{ew}}" if has_est else "")
    ends = "interval" in result
    level = f"{int(round(result['interval']['level'] * 100))}% interval" if ends else ""
    lines = [f"GEP = mean |f({first}) - f({second})| over attributes (Eq. 2)"
             + (f"; [{level}]: bootstrap over the attributes" if ends else ""),
             f"{head}{'GEP':>6}{'GEP (4 d.)':>12}{'n':>5}" + (f"  [{level}]" if ends else "")]
    for r in rows:
        lead = f"{str(r.get(MODEL)):<{mw}}{str(r.get(SETTING)):<{sw}}"
        if has_est:
            lead += f"{str(r.get(ESTIMATOR, '')):<{ew}}"
        lines.append(f"{lead}{r[GEP]:>6.2f}{r[GEP]:>12.4f}{r[ATTRIBUTES]:>5}" + (f"  {_ends(r)}" if ends else ""))
        lines.append("    " + "  ".join(f"{a} {_r2(v)}" for a, v in r["vector"].items()))
    return "\n".join(lines)

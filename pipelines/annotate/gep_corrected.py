"""GEP's attribute frequencies and scores corrected toward people's (paper 001, sections 3 and 5).

GEP_human's frequency f_ij is the share of a group's images in which people see attribute j; the
automatic estimators replace it with a mean score (C, CC, CLS), on another scale. With a GEP task
set (``t2i annotate plan --protocol gep``: images drawn at random within each model, setting,
gender and prompt attribute, every question of a drawn image asked), people's verdicts on the
drawn images and CLS's probability on every image give, per (model, setting, gender, attribute),
a PPI++ estimate of the human frequency (``engine.stats.correction``; the score is the
classifier's guess): GEP_auto corrected toward GEP_human's scale. A cell whose drawn images hold
fewer than two decided verdicts gets none, said in its flag, never filled from another scale. The
GEP vector and score (Eq. 2) follow from the corrected frequencies over the attributes that have
one for both groups of a pair.

The score's interval resamples the images of each drawing stratum, the labelled and the unlabelled
ones apart, one resample for every attribute of an image (in the neutral setting every attribute is
scored on the same images), and recomputes every corrected frequency and the score per resample;
normal, with the resamples' standard deviation (mean |v_j| is kinked at 0, so the resamples sit
above the estimate where a difference is near 0). A frequency's own interval is the estimator's.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from pipelines.annotate import candidates as C
from pipelines.annotate import estimate as E
from pipelines.annotate.agreement import majority
from pipelines.annotate.protocols import YES
from pipelines.annotate.tasks import AnnotateError, TaskSet
from pipelines.engine.stats import correction as K
from pipelines.engine.stats import intervals as I
from pipelines.studies.gep import headline as GH
from schemas import annotation as A
from schemas import gep as G
from schemas.images import IMAGE_ID, MODEL

FEWER_THAN_TWO = "fewer than two decided labels: no corrected frequency"
GROUP = [MODEL, G.SETTING, G.GENDER, C.PROMPT_ATTRIBUTE]     # the task set's drawing strata


def _comparisons(run_dir: Path) -> list[tuple[str, str]]:
    metrics = json.loads((run_dir / "metrics.json").read_text())
    pairs = metrics.get("config", {}).get("scoring", {}).get("comparisons") or [["woman", "man"]]
    return [tuple(p) for p in pairs]


def corrected_gep(tasks: TaskSet, labels: pd.DataFrame, resamples: int = 200, level: float = 0.95, seed: int = 0,
                  variant: str = K.CROSSFIT) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(frequencies, scores): per (model, setting, gender, attribute) CLS's mean score (GEP_auto's
    frequency), people's share on the labelled images alone and the corrected frequency with its
    interval; per (model, setting, comparison) the three GEP scores, the corrected one with its
    interval."""
    if tasks.protocol["name"] != "gep":
        raise AnnotateError(f"{tasks.path}: corrected GEP frequencies need a gep task set")
    items = E.run_items(tasks)
    items = items[items[A.SCORE].notna()]
    votes = majority(labels, tasks.unsure)
    df = items.merge(votes[[A.ITEM_ID, A.MAJORITY, A.MAJORITY_STATUS]], on=A.ITEM_ID, how="left")
    df["_labelled"] = df[A.MAJORITY_STATUS].notna()
    df["_decided"] = (df[A.MAJORITY_STATUS] == A.MajorityStatus.MAJORITY).astype(float)
    df["_yes"] = (df["_decided"] > 0) & (df[A.MAJORITY] == YES)
    rng = np.random.default_rng([seed, 23])
    rows, draws = [], {}
    for key, part in df.groupby(GROUP, sort=True):
        f = part.pivot_table(index=IMAGE_ID, columns="attribute", values=A.SCORE, aggfunc="first")
        y = part.pivot_table(index=IMAGE_ID, columns="attribute", values="_yes", aggfunc="first").reindex_like(f)
        d = part.pivot_table(index=IMAGE_ID, columns="attribute", values="_decided", aggfunc="first").reindex_like(f)
        whole = f.notna().all(axis=1).to_numpy()           # images with every attribute of the stratum scored
        labelled = part.groupby(IMAGE_ID)["_labelled"].any().reindex(f.index).fillna(False).to_numpy()
        F, Y, D = f.to_numpy(np.float64), y.fillna(False).to_numpy(np.float64), d.fillna(0).to_numpy(np.float64)
        lab, unl = np.flatnonzero(whole & labelled), np.flatnonzero(whole & ~labelled)
        L, U = I.resample_rows(rng, lab, resamples), I.resample_rows(rng, unl, resamples)
        model, setting, gender, _ = key
        for j, attribute in enumerate(f.columns):
            decided = int(D[lab, j].sum())
            if decided >= 2:
                r = K.ppi_proportion(Y[lab, j], F[lab, j], F[unl, j], D[lab, j], level, variant)
                draws[(model, setting, gender, attribute)] = K.ppi_values(Y[L, j], D[L, j], F[L, j], F[U, j], variant)
            else:
                r = {"value": None, "low": None, "high": None, "flag": FEWER_THAN_TWO}
            rows.append({MODEL: model, G.SETTING: setting, G.GENDER: gender, "attribute": attribute,
                         A.ITEMS: int(whole.sum()), A.LABELLED: len(lab), A.DECIDED: decided,
                         "auto": float(F[whole, j].mean()) if whole.any() else None,
                         "human": float(Y[lab, j].sum() / decided) if decided else None,
                         A.CORRECTED: r["value"], A.CORRECTED + "_low": r["low"], A.CORRECTED + "_high": r["high"],
                         A.FLAG: r["flag"]})
    freq = pd.DataFrame(rows)
    return freq, _scores(freq, draws, _comparisons(Path(tasks.meta["run"]["path"])), resamples, level, variant)


def _scores(freq: pd.DataFrame, draws: dict, pairs: list, resamples: int, level: float, variant: str) -> pd.DataFrame:
    """Per (model, setting, comparison): mean |f_first - f_second| over the attributes with a value
    for both groups, from CLS's frequencies, people's alone and the corrected ones (with the
    resampled interval)."""
    out = []
    if freq.empty:
        return pd.DataFrame(out)
    for (model, setting), part in freq.groupby([MODEL, G.SETTING], sort=False):
        cell = part.set_index([G.GENDER, "attribute"])
        for first, second in pairs:
            if first not in cell.index.get_level_values(0) or second not in cell.index.get_level_values(0):
                continue
            a, b = cell.loc[first], cell.loc[second]
            common = [x for x in a.index if x in b.index]
            comparison = f"{first} - {second}"
            row = {MODEL: model, G.SETTING: setting, "comparison": comparison,
                   "metric": GH.score_key(setting, G.Estimator.CLS, comparison)}
            for col in ("auto", "human", A.CORRECTED):
                ok = [x for x in common if pd.notna(a.at[x, col]) and pd.notna(b.at[x, col])]
                row[col] = float(np.mean([abs(a.at[x, col] - b.at[x, col]) for x in ok])) if ok else None
                row[f"{col}_attributes"] = len(ok)
            ok = [x for x in common if pd.notna(a.at[x, A.CORRECTED]) and pd.notna(b.at[x, A.CORRECTED])]
            if ok:
                diffs = np.stack([draws[(model, setting, first, x)] - draws[(model, setting, second, x)] for x in ok],
                                 axis=1)
                with np.errstate(invalid="ignore"):
                    resampled = np.where(np.isfinite(diffs).all(axis=1), np.abs(diffs).mean(axis=1), np.nan)
                lo, hi = I.normal_ends(row[A.CORRECTED], resampled, level, resamples)
            else:
                lo = hi = None
            row.update({A.CORRECTED + "_low": lo, A.CORRECTED + "_high": hi,
                        "method": f"PPI++ per (model, setting, gender, attribute) ({variant}) with CLS's probability "
                                  f"as the guess; the images of each drawing stratum resampled, labelled and "
                                  f"unlabelled apart ({resamples} resamples; normal interval with their standard "
                                  f"error)"})
            out.append(row)
    return pd.DataFrame(out)


def ranking_changes(scores: pd.DataFrame) -> list[str]:
    """Where the corrected GEP scores order two models otherwise than CLS's (per setting and
    comparison): a ranking that flips."""
    return [] if scores.empty else E.order_changes(scores, "GEP", "auto", A.CORRECTED, [G.SETTING, "comparison"])

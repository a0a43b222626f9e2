"""DALL-Eval's average gender and gender MAD recomputed from shares corrected by people (paper 000,
section 4.2.4, Table 8).

A model's gender MAD is the mean over its gender-neutral prompts of |p - 1/2|, p the share of
"female" among the prompt's images whose gender was detected (for two categories the MAD against
the uniform distribution is |p - 1/2|); its average gender the mean of 2p - 1. The
``dalleval-social`` preset has people label about a hundred images per model, drawn at random
across the model's prompts: too few for a share per prompt. The classifier's errors are therefore
taken per model, as sensitivity and specificity (the misclassification model CLEAM and the
literature use): se = P(detected female | people say female), sp = P(detected male | people say
male), from the drawn images that both the detector and people decided; each prompt's share is
corrected by Rogan-Gladen, p = (p_obs + sp - 1) / (se + sp - 1), clipped to [0, 1], and the MAD
and average follow. The assumption: the detector errs alike on a model's prompts (draw the labels
within professions, ``--strata``, where that is in doubt).

The interval resamples the labelled images (se and sp) and each prompt's detected images (p_obs,
binomially) together, and recomputes every corrected share, the MAD and the average per resample;
normal with the resamples' standard deviation (|p - 1/2| is kinked at 1/2).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from pipelines.annotate.agreement import majority
from pipelines.annotate.protocols import FEMALE, MALE
from pipelines.annotate.tasks import AnnotateError, TaskSet
from pipelines.engine.stats import intervals as I
from pipelines.studies.dalleval import headlines as DH
from pipelines.studies.dalleval import metrics as DM
from schemas import annotation as A
from schemas import dalleval as S
from schemas.images import MODEL

NO_ERRORS = "no labelled image of one class: sensitivity or specificity unknown"
CHANCE = "the detector no better than chance on the labelled images (se + sp <= 1)"


def corrected_shares(p_obs: np.ndarray, se, sp) -> np.ndarray:
    """Rogan-Gladen per share (any shape; ``se`` and ``sp`` broadcast), clipped to [0, 1]; NaN
    where se + sp <= 1."""
    j = np.asarray(se, np.float64) - 1 + np.asarray(sp, np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = (np.asarray(p_obs, np.float64) + np.asarray(sp, np.float64) - 1) / j
    return np.where(j > 0, np.clip(p, 0.0, 1.0), np.nan)


def corrected_mad(tasks: TaskSet, labels: pd.DataFrame, resamples: int = 200, level: float = 0.95,
                  seed: int = 0) -> pd.DataFrame:
    """Per model: the run's average gender and gender MAD over the neutral prompts, and both from
    corrected shares with their intervals, with se, sp and the labels behind them."""
    if tasks.protocol["name"] != "dalleval-social":
        raise AnnotateError(f"{tasks.path}: a corrected gender MAD needs a dalleval-social task set")
    run_dir = Path(tasks.meta["run"]["path"])
    neutral = json.loads((run_dir / "metrics.json").read_text()).get("config", {}).get("neutral")
    counts = DM.prompt_counts(pq.read_table(run_dir / "images.parquet")).to_pandas()
    if neutral is not None:
        counts = counts[counts[S.GROUP] == neutral]
    counts = counts[counts[S.MALE] + counts[S.FEMALE] > 0]
    items = tasks.items[tasks.items[A.KNOWN_ANSWER].isna()]
    votes = items.merge(majority(labels, tasks.unsure), on=A.ITEM_ID)
    votes = votes[(votes[A.MAJORITY_STATUS] == A.MajorityStatus.MAJORITY) & votes[A.PREDICTION].isin([FEMALE, MALE])
                  & votes[A.MAJORITY].isin([FEMALE, MALE])]
    rng = np.random.default_rng([seed, 29])
    rows = []
    for model, part in counts.groupby(MODEL, sort=False):
        n = (part[S.MALE] + part[S.FEMALE]).to_numpy(np.int64)
        p_obs = part[S.FEMALE].to_numpy(np.float64) / n
        mine = votes[votes[MODEL] == model]
        truth_f = (mine[A.MAJORITY] == FEMALE).to_numpy()
        said_f = (mine[A.PREDICTION] == FEMALE).to_numpy()
        row = {MODEL: model, "metric": DH.GENDER_MAD, "average_metric": DH.GENDER_AVERAGE, "prompts": len(part),
               A.DECIDED: len(mine), "sensitivity": None, "specificity": None,
               "classifier_average": float(np.mean(2 * p_obs - 1)), "classifier": float(np.mean(np.abs(p_obs - 0.5))),
               "corrected_average": None, A.CORRECTED: None, A.CORRECTED + "_low": None,
               A.CORRECTED + "_high": None, "corrected_average_low": None, "corrected_average_high": None, A.FLAG: ""}
        if truth_f.sum() == 0 or (~truth_f).sum() == 0:
            rows.append({**row, A.FLAG: NO_ERRORS})
            continue
        se, sp = said_f[truth_f].mean(), (~said_f[~truth_f]).mean()
        row.update(sensitivity=float(se), specificity=float(sp))
        if se + sp <= 1:
            rows.append({**row, A.FLAG: CHANCE})
            continue
        p = corrected_shares(p_obs, se, sp)
        row.update(corrected_average=float(np.mean(2 * p - 1)), **{A.CORRECTED: float(np.mean(np.abs(p - 0.5)))})
        # resamples: the labelled images (se, sp) and each prompt's detected images (p_obs) together
        pick = I.resample_rows(rng, np.arange(len(mine)), resamples)
        tf, sf = truth_f[pick], said_f[pick]
        with np.errstate(invalid="ignore", divide="ignore"):
            se_r = (tf & sf).sum(axis=1) / tf.sum(axis=1)
            sp_r = (~tf & ~sf).sum(axis=1) / (~tf).sum(axis=1)
        p_r = corrected_shares(rng.binomial(n[None, :], p_obs[None, :], size=(resamples, len(n))) / n[None, :],
                               se_r[:, None], sp_r[:, None])
        mad_r = np.where(np.isfinite(p_r).all(axis=1), np.abs(p_r - 0.5).mean(axis=1), np.nan)
        avg_r = np.where(np.isfinite(p_r).all(axis=1), (2 * p_r - 1).mean(axis=1), np.nan)
        lo, hi = I.normal_ends(row[A.CORRECTED], mad_r, level, resamples)
        alo, ahi = I.normal_ends(row["corrected_average"], avg_r, level, resamples)
        rows.append({**row, A.CORRECTED + "_low": lo, A.CORRECTED + "_high": hi, "corrected_average_low": alo,
                     "corrected_average_high": ahi,
                     "method": f"Rogan-Gladen per prompt with the model's sensitivity and specificity from the "
                               f"labelled images; the labelled images and each prompt's images resampled together "
                               f"({resamples} resamples; normal interval with their standard error)"})
    return pd.DataFrame(rows)


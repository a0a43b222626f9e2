"""Paper 002's E[A] recomputed from % female corrected by people's labels (App. A.4 task sets).

The study computes every T and G as the classifier's % female over a group's counted images
(``amplification.metrics.percent_female``) and E[A] from them (``amplification.results.compute``).
Here the same computation runs with each percentage replaced by its prediction-powered estimate
(``engine.stats.correction``): within each group (a training subset's occupation, a model's
occupation and prompt, section 6's caption images) the labelled images are those people decided,
the others the classifier's alone. A group with fewer than two labelled images keeps the
classifier's percentage and is counted (``uncorrected``): with A.4's 200 images most groups have
none, and then the corrected E[A] moves only where labels fall.

The interval resamples everything that is random: the occupations (the study's units), and within
every group its labelled and its unlabelled images apart (the labels' sample and the images'), the
whole computation (percentages, the direction-switch rule, E[A]) redone per resample; percentile.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from pipelines.annotate.agreement import majority
from pipelines.annotate.tasks import AnnotateError, TaskSet
from pipelines.engine.stats import correction as K
from pipelines.engine.stats import intervals as I
from pipelines.studies.amplification import metrics as AM
from pipelines.studies.amplification import results as AR
from schemas import annotation as A
from schemas import images as IM
from schemas.captions import OCCUPATION, URL
from schemas.subsets import PROMPT_ID

VERDICT = "_verdict"          # per image row: the people's majority (female / male), "undecided", or null
FEMALE = IM.Gender.FEMALE


def image_verdicts(tasks: TaskSet, labels: pd.DataFrame, images: pd.DataFrame, seeds: list) -> pd.Series:
    """Each row of the run's per-image table with the people's verdict on its image: the majority
    answer where decided, "undecided" for an unsure or tied majority, null where nobody labelled it.
    ``seeds``: the rows' seeds as exact integers (63-bit: pandas would read them as floats where
    training rows have none)."""
    items = tasks.items[tasks.items[A.KNOWN_ANSWER].isna()]
    votes = items.merge(majority(labels, tasks.unsure), on=A.ITEM_ID)
    votes = votes.assign(v=votes[A.MAJORITY].where(votes[A.MAJORITY_STATUS] == A.MajorityStatus.MAJORITY, "undecided"))
    train = votes[votes["source"] == "training"].set_index(A.IMAGE_ID)["v"]
    gen = votes[votes["source"] == "generated"].set_index([IM.MODEL, A.IMAGE_ID])["v"]
    is_train = (images[IM.SOURCE] == IM.Source.TRAINING).to_numpy()
    key = pd.Series([f"{p} #{s}" for p, s in zip(images[IM.PROMPT], seeds)], index=images.index)  # exact ints
    out = pd.Series(None, index=images.index, dtype=object)
    out[is_train] = images.loc[is_train, URL].map(train)
    gen_keys = pd.MultiIndex.from_arrays([images.loc[~is_train, IM.MODEL], key[~is_train]])
    out[~is_train] = gen.reindex(gen_keys).to_numpy()
    return out


def corrected_percent(min_labelled: int = 2, rng: np.random.Generator | None = None, record: list | None = None,
                      variant: str = K.CROSSFIT):
    """A ``percent`` for ``results.compute``: per group, % female over its counted images corrected by
    PPI++ with the images' verdicts (``VERDICT``). With ``rng`` each group's labelled and unlabelled
    images are first resampled apart (one bootstrap draw). ``record`` collects per group whether it
    was corrected."""
    def percent(images: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
        base = AM.percent_female(images, keys)
        counted = images[images[IM.COUNTED].fillna(False).astype(bool).to_numpy()]
        fixed = {}
        if len(counted):
            grouped = counted.groupby(keys, dropna=False, sort=True)
            codes = grouped.ngroup().to_numpy()
            names = [k if isinstance(k, tuple) else (k,) for k in grouped.size().index]
            verdict = counted[VERDICT].to_numpy(object)
            labelled = pd.notna(verdict)
            decided = labelled & (verdict != "undecided")
            truth = (decided & (verdict == FEMALE)).astype(float)
            guess = (counted[IM.GENDER] == FEMALE).to_numpy(float)
            order = np.argsort(codes, kind="stable")
            cuts = np.searchsorted(codes[order], np.arange(len(names) + 1))
            for g, name in enumerate(names):
                rows = order[cuts[g]:cuts[g + 1]]
                lab, unl = rows[labelled[rows]], rows[~labelled[rows]]
                if rng is not None:       # one bootstrap draw: the labelled and the unlabelled images apart
                    lab = lab[rng.integers(len(lab), size=len(lab))] if len(lab) else lab
                    unl = unl[rng.integers(len(unl), size=len(unl))] if len(unl) else unl
                d = decided[lab]
                if d.sum() < min_labelled:
                    fixed[name] = None
                    continue
                fixed[name] = 100.0 * K.ppi_proportion(truth[lab], guess[lab], guess[unl], d.astype(float),
                                                       variant=variant)["value"]
        keys_of = list(map(tuple, base[keys].to_numpy()))
        corrected = [fixed.get(k) for k in keys_of]
        if record is not None:
            record.extend(v is not None for k, v in zip(keys_of, corrected) if k in fixed)
        base[AM.PERCENT_FEMALE] = [b if c is None else c for b, c in zip(base[AM.PERCENT_FEMALE], corrected)]
        return base
    return percent


def _run_shape(run_dir: Path, images: pd.DataFrame) -> tuple[list[str], int, list[str]]:
    metrics = json.loads((run_dir / "metrics.json").read_text())
    models = list(metrics.get("image_config", {}).get("generators") or images[IM.MODEL].dropna().unique())
    t = pd.read_parquet(run_dir / "training_percentages.parquet", columns=[OCCUPATION])
    occupations = list(dict.fromkeys(t[OCCUPATION].astype(str)))
    prompts = images.loc[images[IM.SOURCE] == IM.Source.GENERATED, PROMPT_ID].dropna()
    return occupations, int(prompts.max()) if len(prompts) else 0, models


def _compute(images, occupations, n_prompts, models, percent=AM.percent_female) -> dict:
    """``results.compute``; its per-prompt t-tests (unused here) may warn on resamples whose values
    are nearly equal: silenced."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Precision loss occurred", category=RuntimeWarning)
        return AR.compute(images, occupations, n_prompts, models, percent)


def _averages(results: dict) -> dict:
    """{(model, approach): (E[A] average over prompts, per-occupation values, weights)} of ``compute``."""
    out = {}
    for model, per in results["approaches"].items():
        for subset, res in per.items():
            wide = AM.occupation_amplification(pd.DataFrame(res["rows"]), PROMPT_ID)
            values, weights = AM.average_over_groups(wide)
            out[(model, subset)] = (res["average"], values, weights)
        for name, res in (results.get("caption_prompts") or {}).get(model, {}).items():
            wide = AM.occupation_amplification(pd.DataFrame(res["rows"]), "group")
            values, weights = AM.average_over_groups(wide)
            out[(model, f"section 6: {name}")] = (res["average"], values, weights)
    return out


def amplification(tasks: TaskSet, labels: pd.DataFrame, resamples: int = 200, level: float = 0.95,
                  seed: int = 0) -> pd.DataFrame:
    """Per model and approach (Table 3's four, section 6's two): E[A] from the classifier's % female
    (the run's) and from the corrected ones, with the corrected one's interval."""
    if tasks.protocol["name"] != "paper002-a4":
        raise AnnotateError(f"{tasks.path}: E[A] from corrected percentages needs a paper002-a4 task set")
    run_dir = Path(tasks.meta["run"]["path"])
    table = pq.read_table(run_dir / "images.parquet")
    images = table.to_pandas()
    images[VERDICT] = image_verdicts(tasks, labels, images, table.column(IM.SEED).to_pylist())
    occupations, n_prompts, models = _run_shape(run_dir, images)
    raw = _averages(_compute(images, occupations, n_prompts, models))
    record: list = []
    fixed = _averages(_compute(images, occupations, n_prompts, models, corrected_percent(record=record)))
    rng = np.random.default_rng([seed, 17])
    draws = {k: [] for k in fixed}
    for _ in range(resamples):
        res = _averages(_compute(images, occupations, n_prompts, models, corrected_percent(rng=rng)))
        occ = rng.integers(len(occupations), size=len(occupations))      # the occupations, resampled
        for k, (_, values, weights) in res.items():
            v, w = values[occ], weights[occ]
            keep = np.isfinite(v) & (w > 0)
            draws[k].append(float(np.sum(v[keep] * w[keep]) / np.sum(w[keep])) if keep.any() else np.nan)
    rows = []
    for (model, approach), (value, _, _) in fixed.items():
        lo, hi = I.percentile_ends(draws[(model, approach)], level, resamples)
        rows.append({IM.MODEL: model, "approach": approach, "classifier": raw[(model, approach)][0],
                     "corrected": value, "corrected_low": lo, "corrected_high": hi,
                     "groups_corrected": int(sum(record)), "groups_uncorrected": int(len(record) - sum(record)),
                     "method": f"PPI++ per group; bootstrap of occupations and of labelled and unlabelled images "
                               f"within groups ({resamples} resamples, percentile)"})
    return pd.DataFrame(rows)


def sign_changes(table: pd.DataFrame) -> list[str]:
    """Where E[A] changes sign once corrected: an amplification that becomes a de-amplification."""
    out = []
    for r in table.itertuples(index=False):
        if r.classifier is not None and r.corrected is not None and pd.notna(r.classifier) and pd.notna(r.corrected) \
                and r.classifier * r.corrected < 0:
            out.append(f"E[A] of {getattr(r, IM.MODEL)}, {r.approach}, changes sign once corrected: "
                       f"{r.classifier:.2f} by the classifier, {r.corrected:.2f} corrected")
    return out


"""Paper 002's E[A] recomputed from % female corrected by people's labels (App. A.4 task sets).

The study computes every T and G as the classifier's % female over a group's counted images
(``amplification.metrics.percent_female``) and E[A] from them (``amplification.results.compute``).
Here the same computation runs with each percentage replaced by its prediction-powered estimate
(``engine.stats.correction``): within each group (a training subset's occupation, a model's
occupation and prompt, section 6's caption images) the labelled images are those people decided,
the others the classifier's alone. A group with fewer than two labelled images keeps the
classifier's percentage and is counted (``uncorrected``): with A.4's 200 images most groups have
none, and then the corrected E[A] moves only where labels fall.

The estimand is E[A] over the run's occupations, as the paper defines it ("for a set of
occupations O"): what is random is the images behind each percentage and which of them people
labelled. The interval resamples those, within every group its labelled and its unlabelled images
apart (the labels' sample and the images'), and carries each resample through the whole
computation: every percentage's resamples are drawn once (vectorised, ``corrected_percent``), the
study's ``compute`` runs once and its ``compare`` rows carry each percentage's resample id, and
the direction-switch rule and E[A] are applied per resample (``metrics.amplification_cube``).
The interval is the estimate plus and minus z times the resamples' standard deviation, not their
percentiles: |G - 50| is kinked at 50 and the direction-switch rule drops occupations in some
resamples, so the resampled E[A] sits off-centre (1-3 points above the estimate in the coverage
test, where the percentile interval covers at 0.97 and this one at 0.95). The occupations are
not resampled: they are the paper's fixed list, and where a reader wants occupations as a sample
of all occupations, their spread already holds the images' noise (each occupation's images are
its own), so resampling both would count it twice (docs/method.md).
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


def corrected_percent(min_labelled: int = 2, record: list | None = None, variant: str = K.CROSSFIT,
                      resamples: int = 0, rng: np.random.Generator | None = None, draws: list | None = None):
    """A ``percent`` for ``results.compute``: per group, % female over its counted images corrected by
    PPI++ with the images' verdicts (``VERDICT``); a group with fewer than ``min_labelled`` decided
    labels keeps the classifier's percentage. ``record`` collects per group whether it was corrected.

    With ``draws`` (a list) each group's percentage is also resampled ``resamples`` times with
    ``rng``: the labelled and the unlabelled images apart for a corrected group (a resample without
    a decided label takes the classifier's share of its images), all its counted images for another;
    the (resamples,) array is appended to ``draws`` and its index is the group's ``replicate``."""
    def percent(images: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
        base = AM.percent_female(images, keys)
        counted = images[images[IM.COUNTED].fillna(False).astype(bool).to_numpy()]
        fixed, ids = {}, {}
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
                corrected = decided[lab].sum() >= min_labelled
                fixed[name] = 100.0 * K.ppi_values(truth[lab][None], decided[lab][None], guess[lab][None],
                                                   guess[unl][None], variant)[0] if corrected else None
                if draws is not None:
                    if corrected:
                        L, U = I.resample_rows(rng, lab, resamples), I.resample_rows(rng, unl, resamples)
                        v = K.ppi_values(truth[L], decided[L], guess[L], guess[U], variant)
                        v = np.where(np.isnan(v), np.concatenate([guess[L], guess[U]], axis=1).mean(axis=1), v)
                    else:
                        v = guess[I.resample_rows(rng, rows, resamples)].mean(axis=1)
                    ids[name] = len(draws)
                    draws.append(100.0 * v)
        keys_of = list(map(tuple, base[keys].to_numpy()))
        corrected = [fixed.get(k) for k in keys_of]
        if record is not None:
            record.extend(v is not None for k, v in zip(keys_of, corrected) if k in fixed)
        base[AM.PERCENT_FEMALE] = [b if c is None else c for b, c in zip(base[AM.PERCENT_FEMALE], corrected)]
        if draws is not None:
            base[AM.REPLICATE] = [ids.get(k, np.nan) for k in keys_of]
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


def _approaches(results: dict) -> dict:
    """{(model, approach): (E[A] average over prompts, compare's rows, their group column, the
    headline metric's key)} of ``compute``: Table 3's four approaches and section 6's two."""
    out = {}
    for model, per in results["approaches"].items():
        for subset, res in per.items():
            out[(model, subset)] = (res["average"], pd.DataFrame(res["rows"]), PROMPT_ID, AR.approach_key(subset))
        for name, res in (results.get("caption_prompts") or {}).get(model, {}).items():
            out[(model, f"section 6: {name}")] = (res["average"], pd.DataFrame(res["rows"]), "group",
                                                  AR.captions_key(name))
    return out


def resampled_averages(rows: pd.DataFrame, group: str, draws: np.ndarray) -> np.ndarray:
    """E[A] averaged over prompts, per resample: each row's T and G from ``draws`` (resamples x
    percentages) by its replicate ids, the direction-switch rule per resample, the average over
    groups of their E[A] (``metrics.average_over_groups``); NaN where a resample has none."""
    wide = AM.occupation_amplification(rows, group)
    if not len(wide.columns) or not len(rows):
        return np.full(len(draws), np.nan)

    def take(column):
        ids = pd.to_numeric(rows[column], errors="coerce").to_numpy(np.float64) if column in rows \
            else np.full(len(rows), np.nan)
        out = np.full((len(draws), len(rows)), np.nan)
        ok = np.isfinite(ids)
        out[:, ok] = draws[:, ids[ok].astype(np.int64)]
        return out

    cube = AM.amplification_cube(rows, group, wide, take(AM.TRAINING_REPLICATE), take(AM.GENERATED_REPLICATE))
    values, weights = AM.average_over_groups_per_resample(cube)
    keep = np.isfinite(values) & (weights > 0)
    total = np.where(keep, weights, 0.0).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, np.where(keep, values * weights, 0.0).sum(axis=1) / total, np.nan)


def amplification(tasks: TaskSet, labels: pd.DataFrame, resamples: int = 200, level: float = 0.95,
                  seed: int = 0, variant: str = K.CROSSFIT) -> pd.DataFrame:
    """Per model and approach (Table 3's four, section 6's two): E[A] from the classifier's % female
    (the run's) and from the corrected ones, with the corrected one's interval."""
    if tasks.protocol["name"] != "paper002-a4":
        raise AnnotateError(f"{tasks.path}: E[A] from corrected percentages needs a paper002-a4 task set")
    run_dir = Path(tasks.meta["run"]["path"])
    table = pq.read_table(run_dir / "images.parquet")
    images = table.to_pandas()
    images[VERDICT] = image_verdicts(tasks, labels, images, table.column(IM.SEED).to_pylist())
    occupations, n_prompts, models = _run_shape(run_dir, images)
    return corrected_amplification(images, occupations, n_prompts, models, resamples, level, seed, variant)


def corrected_amplification(images: pd.DataFrame, occupations: list[str], n_prompts: int, models: list[str],
                            resamples: int = 200, level: float = 0.95, seed: int = 0,
                            variant: str = K.CROSSFIT) -> pd.DataFrame:
    """``amplification`` on a per-image table with its people's verdicts (``VERDICT``)."""
    raw = _approaches(_compute(images, occupations, n_prompts, models))
    record, draws = [], []
    percent = corrected_percent(record=record, variant=variant, resamples=resamples,
                                rng=np.random.default_rng([seed, 17]), draws=draws)
    fixed = _approaches(_compute(images, occupations, n_prompts, models, percent))
    matrix = np.column_stack(draws) if draws else np.empty((resamples, 0))
    rows = []
    for (model, approach), (value, per_row, group, metric) in fixed.items():
        lo, hi = I.normal_ends(value, resampled_averages(per_row, group, matrix), level, resamples)
        rows.append({IM.MODEL: model, "approach": approach, "metric": metric, "classifier": raw[(model, approach)][0],
                     "corrected": value, "corrected_low": lo, "corrected_high": hi,
                     "groups_corrected": int(sum(record)), "groups_uncorrected": int(len(record) - sum(record)),
                     "method": f"PPI++ per group ({variant}); E[A] over the run's occupations, bootstrap of the "
                               f"labelled and the unlabelled images within groups ({resamples} resamples; normal "
                               f"interval with their standard error)"})
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


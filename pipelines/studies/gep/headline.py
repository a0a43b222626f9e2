"""The headline numbers of a GEP run with their intervals (contract: pipelines/engine/stats/headline.py).

Per generator (one ``headline.Subject``), per setting, estimator (C, CC, CLS; human with annotations)
and comparison (woman - man):

- the GEP score (Eq. 2), GEP = mean_j |v_j|: a mean over the n attributes, so its unit is the
  attribute (value |v_j|) and its interval resamples attributes (the paper chose A as a sample of
  "visible, context-agnostic, common" attributes, section 3);
- each GEP vector entry v_j = f_first,j - f_second,j: a difference of two means over images,
  written as one mean over the images of both groups (image i of group g counts +-N/n_g times its
  score, so the mean over all N images is f_first - f_second); its unit is the image and it is
  resampled within its prompt (section 5: five images per prompt), which keeps n_g fixed. Where a
  prompt has a single image (``--images-per-prompt 1``, a partly annotated run) the images are
  resampled within their group instead: a one-image stratum would have no spread at all.

Unit ids are the attribute name and the image id (``explicit-woman-dress-c04-3``: setting, group,
attribute, context, index), the same in two runs of the same protocol.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pandas as pd

from pipelines.engine.stats import headline as H
from pipelines.engine.stats import intervals as iv
from pipelines.studies.gep import metrics as M
from schemas import gep as S
from schemas.images import GENERATION_STATUS, MODEL, GenerationStatus
from schemas.subsets import PROMPT

STUDY = "paper001-gep"
SCALE = 100.0                  # shown x100: GEP_human is a share of images (the paper prints 2%, 12%)
SCORE_PREFIX = "gep"
VECTOR_PREFIX = "vector"


def score_key(setting: str, estimator: str, comparison: str) -> str:
    return f"{SCORE_PREFIX}/{setting}/{estimator}/{comparison}"


def vector_key(setting: str, estimator: str, comparison: str, attribute: str) -> str:
    return f"{VECTOR_PREFIX}/{setting}/{estimator}/{comparison}/{attribute}"


# ------------------------------------------------------------------------------ per-image values
def observations(scores: pd.DataFrame, images: pd.DataFrame) -> pd.DataFrame:
    """Per (model, image, attribute, automatic estimator): the image's score (``S.SCORE``), with its
    setting, group and prompt."""
    keys = [MODEL, S.IMAGE_ID, S.SETTING, S.GENDER, S.ATTRIBUTE]
    long = scores.melt(id_vars=keys, value_vars=list(S.Estimator.COLUMNS.values()), var_name=S.ESTIMATOR,
                       value_name=S.SCORE)
    long[S.ESTIMATOR] = long[S.ESTIMATOR].map({c: e for e, c in S.Estimator.COLUMNS.items()})
    return _with_prompt(long, images)


def human_observations(labels: pd.DataFrame, images: pd.DataFrame) -> pd.DataFrame:
    """The annotated (image, attribute) pairs a setting scores (``study.human_labels``) in the same
    form, the 0/1 label as the score of the estimator "human"."""
    long = labels[[MODEL, S.IMAGE_ID, S.SETTING, S.GENDER, S.ATTRIBUTE, S.PRESENT]].rename(
        columns={S.PRESENT: S.SCORE})
    return _with_prompt(long.assign(**{S.ESTIMATOR: S.Estimator.HUMAN}), images)


def _with_prompt(long: pd.DataFrame, images: pd.DataFrame) -> pd.DataFrame:
    long = long.merge(images[[MODEL, S.IMAGE_ID, PROMPT]], on=[MODEL, S.IMAGE_ID], how="left")
    long[S.SCORE] = long[S.SCORE].astype(np.float64)
    return long[long[S.SCORE].notna()].reset_index(drop=True)


# ------------------------------------------------------------------------------ the metrics
def label(what: str, setting: str, estimator: str, comparison: str) -> str:
    return f"{what} x100, {setting}, {estimator} ({comparison})"


def score_metric(vector: pd.DataFrame, setting: str, estimator: str, comparison: str,
                 replicates: np.ndarray | None = None) -> H.Metric:
    """GEP = mean_j |v_j| (Eq. 2) over the attributes of one GEP vector (``gep_vectors`` rows);
    ``replicates``: |v_j| in each resample of the images (``image_replicates``)."""
    return H.Metric(score_key(setting, estimator, comparison), label("GEP", setting, estimator, comparison),
                    "attribute", [str(a) for a in vector[S.ATTRIBUTE]],
                    np.abs(vector[M.DIFFERENCE].to_numpy(np.float64)).tolist(), better="lower", scale=SCALE,
                    replicates=replicates)


def image_replicates(obs: pd.DataFrame, first: str, second: str, attributes: list[str],
                     resamples: int = H.IMAGE_RESAMPLES, seed: int = 0) -> np.ndarray | None:
    """(resamples x attributes): |v_j| = |f_first,j - f_second,j| recomputed from resamples of the
    images (``obs``: one model, setting and estimator). The images are resampled within their prompt
    (each group's prompts keep their images' number, as the vector entries' intervals do; within
    the group where a prompt has one image), and one resample serves every attribute: in the
    neutral setting every attribute is scored on the same images, so their noise is shared."""
    part = obs[obs[S.GENDER].isin([first, second])]
    if part.empty:
        return None
    table = part.pivot_table(index=S.IMAGE_ID, columns=S.ATTRIBUTE, values=S.SCORE, aggfunc="first")
    table = table.reindex(columns=attributes)
    info = part.drop_duplicates(S.IMAGE_ID).set_index(S.IMAGE_ID).loc[table.index]
    per_prompt = info.groupby(PROMPT, dropna=False).size()
    strata = (info[PROMPT] if len(per_prompt) and per_prompt.min() >= 2 else info[S.GENDER]).astype(str).to_numpy()
    return iv.resampled_gaps(table.to_numpy(np.float64), info[S.GENDER].to_numpy(), first, second, strata,
                             np.random.default_rng([seed, 7]), resamples)


def vector_metric(obs: pd.DataFrame, first: str, second: str, setting: str, estimator: str, comparison: str,
                  attribute: str) -> H.Metric:
    """v_j = f_first - f_second as the mean over the images of both groups (``obs``: one model,
    setting, estimator and attribute) of +-N/n_g times the image's score."""
    part = obs[obs[S.GENDER].isin([first, second])]
    n_group = part.groupby(S.GENDER)[S.SCORE].transform("size").to_numpy(np.float64)
    sign = np.where(part[S.GENDER].to_numpy() == first, 1.0, -1.0)
    values = sign * part[S.SCORE].to_numpy(np.float64) * len(part) / n_group
    per_prompt = part.groupby(PROMPT, dropna=False).size()
    strata = part[PROMPT] if len(per_prompt) and per_prompt.min() >= 2 else part[S.GENDER]
    return H.Metric(vector_key(setting, estimator, comparison, attribute),
                    label(f"v({attribute})", setting, estimator, comparison), "image",
                    part[S.IMAGE_ID].astype(str).tolist(), values.tolist(), better="zero", scale=SCALE,
                    strata=strata.astype(str).tolist(), lead=False)   # the scores lead; entries are detail


def model_metrics(obs: pd.DataFrame, vectors: pd.DataFrame, comparisons, image_seed: int = 0) -> dict[str, list[H.Metric]]:
    """Per model: for each GEP vector (setting, estimator, comparison) its score (with its image
    resamples, ``image_replicates``, seeded by ``image_seed``), then its entries."""
    pairs = {M.comparison_label(a, b): (a, b) for a, b in comparisons}
    cells = {k: g for k, g in obs.groupby([MODEL, S.SETTING, S.ESTIMATOR, S.ATTRIBUTE], sort=False)}
    groups = {k: g for k, g in obs.groupby([MODEL, S.SETTING, S.ESTIMATOR], sort=False)}
    empty = obs.iloc[:0]
    out: dict[str, list[H.Metric]] = defaultdict(list)
    for (model, setting, est, comp), vec in vectors.groupby([MODEL, S.SETTING, S.ESTIMATOR, M.COMPARISON],
                                                            sort=False):
        first, second = pairs[comp]
        reps = image_replicates(groups.get((model, setting, est), empty), first, second,
                                [str(a) for a in vec[S.ATTRIBUTE]], seed=image_seed)
        out[model].append(score_metric(vec, setting, est, comp, reps))
        for attribute in vec[S.ATTRIBUTE]:
            cell = cells.get((model, setting, est, attribute), empty)
            out[model].append(vector_metric(cell, first, second, setting, est, comp, attribute))
    return dict(out)


def subjects(metrics: dict[str, list[H.Metric]], models: list[str], records: list[dict],
             images: pd.DataFrame) -> list[H.Subject]:
    """One subject per generator, identified by its provenance record; the images it generated
    that are measured, and those left out by status."""
    out = []
    for model in models:
        record = next((r for r in records if r.get("role") == "generator" and r.get("model") == model),
                      {"model": model})
        status = images.loc[images[MODEL] == model, GENERATION_STATUS].value_counts()
        excluded = {str(k): int(v) for k, v in status.items() if k != GenerationStatus.OK}
        out.append(H.Subject(model, H.subject_identity(record), metrics.get(model, []),
                             images=int(status.get(GenerationStatus.OK, 0)), excluded=excluded))
    return out


def protocol(st, standin: bool = False) -> dict:
    """What two GEP runs must share to be compared (``st``: study.GepSettings): not the generator.
    A stand-in run's CLIP is recorded as the stand-in (its directory differs from run to run)."""
    gen = st.generation
    clip = {"standin": True} if standin else {k: st.clip.get(k) for k in ("model", "pretrained", "revision")}
    return {"study": STUDY, "settings": list(st.settings), "genders": st.genders,
            "comparisons": [list(c) for c in st.comparisons],
            "attributes": H.protocol_digest([[a.name, a.phrase, a.text] for a in st.attributes]),
            "contexts": H.protocol_digest(list(st.contexts)),
            "prompts": H.protocol_digest(list(dict.fromkeys(st.requests.column(PROMPT).to_pylist()))),
            "images_per_prompt": int(gen.images_per_prompt), "seed": int(gen.seed), "safety": gen.safety.job(),
            "clip": clip, "reference": st.reference,
            "classifier": H.protocol_digest(st.classifier)}


def build(st, shown: dict, scores: pd.DataFrame, images: pd.DataFrame, labels: pd.DataFrame | None,
          models: list[str], records: list[dict], standin: bool = False,
          image_seed: int = 0) -> tuple[list[H.Subject], dict]:
    """The run's subjects and protocol: ``shown`` is ``report.with_human``'s frames (the vectors of
    every estimator), ``labels`` the used human annotations (or None)."""
    obs = observations(scores, images)
    if labels is not None:
        obs = pd.concat([human_observations(labels, images), obs], ignore_index=True)
    metrics = model_metrics(obs, shown["vectors"], st.comparisons, image_seed)
    return subjects(metrics, models, records, images), protocol(st, standin)


# ------------------------------------------------------------------------------ intervals in tables
def attach(frame: pd.DataFrame, headline: dict, column: str) -> pd.DataFrame:
    """A GEP vectors frame (``column`` = difference) or scores frame (``column`` = gep) with the
    interval of each row beside ``column`` (``S.low(column)``, ``S.high(column)``; None where the
    headline has none)."""
    ends = H.interval_ends(headline)

    def key(r):
        if column == M.DIFFERENCE:
            return vector_key(r[S.SETTING], r[S.ESTIMATOR], r[M.COMPARISON], r[S.ATTRIBUTE])
        return score_key(r[S.SETTING], r[S.ESTIMATOR], r[M.COMPARISON])

    found = [ends.get((r[MODEL], key(r)), (None, None)) for r in frame.to_dict("records")]
    out = frame.copy()
    at = out.columns.get_loc(column)
    for i, name in enumerate((S.low(column), S.high(column))):
        out.insert(at + 1 + i, name, np.array([np.nan if f[i] is None else f[i] for f in found], np.float64))
    return out


def with_intervals(frames: dict, headline: dict) -> dict:
    """``frames`` with intervals on its GEP vectors and scores (keys "vectors"/"gep" and, in an
    evaluation, "human_vectors"/"human_gep"); other keys as they are."""
    column = {"vectors": M.DIFFERENCE, "human_vectors": M.DIFFERENCE, "gep": M.GEP, "human_gep": M.GEP}
    return {k: attach(v, headline, column[k]) if k in column else v for k, v in frames.items()}


def scores_only(headline: dict) -> dict:
    """The headline with only the GEP scores: the report's opening table (vector entries are in the
    vector tables)."""
    subjects_ = [{**s, "metrics": [m for m in s["metrics"] if m["key"].startswith(SCORE_PREFIX + "/")]}
                 for s in headline["subjects"]]
    return {**headline, "subjects": subjects_}


# ------------------------------------------------------------------------------ summarize
def summary_intervals(result: dict, settings: iv.IntervalSettings) -> dict:
    """``metrics.summarize_frequencies``' result with each GEP score's interval over attributes
    (the published per-attribute differences are the units); the vector entries get none: the
    tables give frequencies, not the images behind them."""
    rows = []
    for r in result["results"]:
        ci = iv.mean_interval(np.abs(np.asarray(list(r["vector"].values()), np.float64)), settings=settings)
        rows.append({**r, S.low(M.GEP): ci.low, S.high(M.GEP): ci.high})
    return {**result, "results": rows, "interval": {**settings.record(), "unit": "attribute"}}

"""Bias amplification of paper 002 (section 3.3, Table 3, section 5.1, section 6) as plain functions.

Percentages are % female over the images that count (one face, CLIP probability >= 0.9):

    A(P_o, S_o) = |G(P_o) - 50| - |T(S_o) - 50|

per occupation o, with T the training subset S_o and G the generation prompt P_o. Occupations
whose training and generated images skew in different directions are excluded per prompt (the
paper, section 3.3 and App. A.1); "direction" is the sign of (percent - 50), so a 50.0 on one
side and a skew on the other is a switch too (this reproduces Table 3 from Tables 6 and 7 to the
published rounding). E[A] is the mean over the remaining occupations, per prompt; the headline
is the mean of the per-prompt E[A] over prompts. A one-sample t-test of E[A] = 0 is run per
prompt (section 5.3).

No Ray, no models: these functions take small tables (occupations x prompts) and are tested
against the paper's own tables.
"""

from __future__ import annotations

import math
import dataclasses
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd

from pipelines.engine.stats.headline import IMAGE_RESAMPLES, Metric
from pipelines.engine.stats.intervals import Interval
from pipelines.engine.stats.table_cells import numbers
from schemas.captions import CAPTION_GENDER, CAPTION_ID, OCCUPATION, CaptionGender
from schemas.images import CLIP_EMBEDDING, COUNTED, GENDER, MODEL, PERCENT_FEMALE, Gender
from schemas.subsets import PROMPT_ID, SUBSET, Subset

N_IMAGES = "n_images"          # images behind a percentage (counted ones)
N_FEMALE = "n_female"
TRAINING = "training"          # percent_female of the training subset
GENERATED = "generated"        # percent_female of the generated images
AMPLIFICATION = "amplification"
EXCLUDED = "excluded"          # why a (occupation, prompt) pair is left out, or None
REPLICATE = "replicate"        # optional: a percentage's row in a table of its resamples (annotate/derived.py)
TRAINING_REPLICATE = "training_replicate"
GENERATED_REPLICATE = "generated_replicate"


def direction(percent) -> np.ndarray:
    """-1 male-skewed, +1 female-skewed, 0 balanced (exactly 50)."""
    return np.sign(np.asarray(percent, dtype=float) - 50.0)


def amplification(generated, training) -> np.ndarray:
    """A = |G - 50| - |T - 50| (elementwise)."""
    return np.abs(np.asarray(generated, float) - 50.0) - np.abs(np.asarray(training, float) - 50.0)


def percent_female(images: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """% female per group of ``keys`` over the counted images; every group present in ``images``
    appears, with n_images 0 and a NaN percentage when none of its images counts."""
    df = images[keys].copy()
    counted = images[COUNTED].fillna(False).astype(bool).to_numpy()
    df[N_IMAGES] = counted.astype(np.int64)
    df[N_FEMALE] = (counted & (images[GENDER] == Gender.FEMALE).to_numpy()).astype(np.int64)
    out = df.groupby(keys, dropna=False, sort=True)[[N_IMAGES, N_FEMALE]].sum().reset_index()
    with np.errstate(invalid="ignore", divide="ignore"):
        out[PERCENT_FEMALE] = np.where(out[N_IMAGES] > 0, 100.0 * out[N_FEMALE] / out[N_IMAGES].clip(lower=1), np.nan)
    return out


def compare(training: pd.DataFrame, generated: pd.DataFrame, on: list[str], group: str) -> pd.DataFrame:
    """One row per (occupation, group) of ``generated`` with T, G, A and the exclusion reason.

    ``training`` has ``on`` + percent_female (+ n_images); ``generated`` has ``on`` + ``group`` +
    percent_female (+ n_images). ``on`` is [occupation] for prompt-free training subsets, or
    [occupation, prompt] for subsets selected per prompt (NN). A ``replicate`` column on either side
    is carried as ``training_replicate`` / ``generated_replicate``.
    """
    t = training[on + [PERCENT_FEMALE] + [c for c in (N_IMAGES, REPLICATE) if c in training]].rename(
        columns={PERCENT_FEMALE: TRAINING, N_IMAGES: "n_training", REPLICATE: TRAINING_REPLICATE})
    g = generated.rename(columns={PERCENT_FEMALE: GENERATED, N_IMAGES: "n_generated", REPLICATE: GENERATED_REPLICATE})
    rows = g.merge(t, on=on, how="outer", validate="many_to_one" if group not in on else "one_to_one")
    rows = rows[rows[group].notna()] if group not in on else rows
    tv, gv = rows[TRAINING].to_numpy(float), rows[GENERATED].to_numpy(float)
    missing_t, missing_g = np.isnan(tv), np.isnan(gv)
    switch = ~missing_t & ~missing_g & (direction(tv) != direction(gv))
    reason = np.where(missing_t, "no_training_images",
                      np.where(missing_g, "no_generated_images", np.where(switch, "direction_switch", None)))
    rows[AMPLIFICATION] = np.where(missing_t | missing_g, np.nan, amplification(gv, tv))
    rows[EXCLUDED] = reason
    return rows.sort_values([group, OCCUPATION], kind="stable").reset_index(drop=True)


@dataclass
class PromptResult:
    group: str
    expected_amplification: float | None      # E[A] over the included occupations
    occupations: int                           # included
    amplified: int
    deamplified: int
    excluded: dict[str, list[str]] = field(default_factory=dict)  # reason -> occupations
    t_statistic: float | None = None
    p_value: float | None = None


def expected_amplification(rows: pd.DataFrame, group: str) -> tuple[list[PromptResult], float | None]:
    """E[A] per value of ``group`` over its included occupations, the one-sample t-test of
    E[A] = 0, and the average of E[A] over the groups (None if no group has a value)."""
    from scipy import stats  # deferred: scipy

    results = []
    for g, part in rows.groupby(group, sort=False):
        inc = part[part[EXCLUDED].isna()]
        a = inc[AMPLIFICATION].to_numpy(float)
        res = PromptResult(str(g), float(a.mean()) if len(a) else None, int(len(a)),
                           int((a > 0).sum()), int((a < 0).sum()))
        for reason, sub in part[part[EXCLUDED].notna()].groupby(EXCLUDED, sort=True):
            res.excluded[str(reason)] = sorted(sub[OCCUPATION].astype(str))
        if len(a) >= 2 and np.ptp(a) > 0:
            t = stats.ttest_1samp(a, 0.0)
            res.t_statistic, res.p_value = float(t.statistic), float(t.pvalue)
        results.append(res)
    values = [r.expected_amplification for r in results if r.expected_amplification is not None]
    return results, (float(np.mean(values)) if values else None)


def result_dict(results: list[PromptResult], average: float | None) -> dict:
    return {"per_prompt": [asdict(r) for r in results], "average": average}


def pearson(x, y) -> dict:
    """Pearson r between two per-occupation series (NaNs dropped pairwise), with its p-value."""
    from scipy import stats  # deferred: scipy

    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = ~np.isnan(x) & ~np.isnan(y)
    n = int(ok.sum())
    if n < 3 or np.ptp(x[ok]) == 0 or np.ptp(y[ok]) == 0:
        return {"r": None, "p_value": None, "n": n}
    r = stats.pearsonr(x[ok], y[ok])
    return {"r": float(r.statistic), "p_value": float(r.pvalue), "n": n}


def indicator_gender_match(training: pd.DataFrame, caption_images: pd.DataFrame) -> dict:
    """Section 6: "For captions that contain either male or female gender indicators, the model
    generates images that match the gender of corresponding training images (with 98.41%
    accuracy)". Over the images generated from naive-subset captions whose indicators are male or
    female (not both), whose own image and training image both count (one face, CLIP >= 0.9): the %
    whose gender is the training image's. Project choice: per generated image (pooled over
    occupations), not per caption. ``training`` and ``caption_images`` need occupation,
    caption_id, caption_gender, counted and gender."""
    keys = [OCCUPATION, CAPTION_ID]
    t = training[(training[SUBSET] == Subset.NAIVE) & training[COUNTED].fillna(False).astype(bool)]
    g = caption_images[caption_images[COUNTED].fillna(False).astype(bool)
                       & caption_images[CAPTION_GENDER].isin([CaptionGender.MALE, CaptionGender.FEMALE])]
    t, g = t.dropna(subset=keys), g.dropna(subset=keys)
    joined = g[keys + [GENDER]].merge(t[keys + [GENDER]].drop_duplicates(keys), on=keys, suffixes=("", "_training"))
    n = len(joined)
    match = int((joined[GENDER] == joined[f"{GENDER}_training"]).sum())
    return {"percent": 100.0 * match / n if n else None, "images": n, "matching": match,
            "captions": int(joined[keys].drop_duplicates().shape[0]), "paper_percent": 98.41,
            "definition": "% of counted images generated from naive captions with male or female indicators "
                          "whose gender is that of the caption's counted training image (section 6)"}


def _mean_vectors(keys: pd.DataFrame, vectors: np.ndarray, by: list[str]) -> dict:
    """{group key tuple: (mean of the rows' vectors, rows)} of the rows of ``keys`` by ``by``."""
    out = {}
    if not len(keys):
        return out
    for key, idx in keys.groupby(by, sort=True).indices.items():
        key = key if isinstance(key, tuple) else (key,)
        out[key] = (vectors[idx].astype(np.float64).mean(axis=0), len(idx))
    return out


SIMILARITY_COLUMNS = [MODEL, OCCUPATION, PROMPT_ID, "naive", "nn", "n_training_naive", "n_training_nn",
                      "n_generated"]


def image_similarity(training: pd.DataFrame, generated: pd.DataFrame, embedding: str = CLIP_EMBEDDING) -> dict:
    """Section 5.2: "The pairwise similarity of CLIP image embeddings increases with NN (13% from
    keyword querying)". Per (model, occupation, prompt): the mean cosine over all pairs (training
    image of the subset, image generated from the prompt), for the naive subset and for the prompt's
    NN subset; the mean over the (occupation, prompt) pairs both have; and NN's change relative to
    naive. The mean pairwise cosine of two sets of unit vectors is the dot product of their means.

    ``training``: one row per (occupation, subset, prompt_id, URL) with the URL's unit CLIP
    embedding (rows without one are left out: the images CLIP did not run on, i.e. without exactly
    one face); ``generated``: one row per generated image (source generated) with model,
    occupation, prompt_id and its embedding. Returns {"rows": [...], "per_model": {model: {...}}}.
    Project choice: every image CLIP classified (one face), counted or not."""
    def usable(df):
        if not len(df) or embedding not in df:
            return df.iloc[:0], np.zeros((0, 0))
        df = df[df[embedding].notna()]
        return df, (np.stack([np.asarray(v, np.float32) for v in df[embedding]]) if len(df) else np.zeros((0, 0)))

    train, tv = usable(training)
    gen, gv = usable(generated)
    naive_rows = (train[SUBSET] == Subset.NAIVE).to_numpy(bool)
    nn_rows = (train[SUBSET] == Subset.NN).to_numpy(bool)
    naive = _mean_vectors(train[naive_rows], tv[naive_rows], [OCCUPATION])
    nn = _mean_vectors(train[nn_rows], tv[nn_rows], [OCCUPATION, PROMPT_ID])
    gens = _mean_vectors(gen, gv, [MODEL, OCCUPATION, PROMPT_ID])
    rows = []
    for (model, occ, pid), (g, n_g) in gens.items():
        a, n_a = naive.get((occ,), (None, 0))
        b, n_b = nn.get((occ, int(pid)), (None, 0))
        rows.append({MODEL: model, OCCUPATION: occ, PROMPT_ID: int(pid),
                     "naive": None if a is None else float(a @ g), "nn": None if b is None else float(b @ g),
                     "n_training_naive": n_a, "n_training_nn": n_b, "n_generated": n_g})
    per_model = {}
    for model in sorted({r[MODEL] for r in rows}):
        both = [r for r in rows if r[MODEL] == model and r["naive"] is not None and r["nn"] is not None]
        mean_a = float(np.mean([r["naive"] for r in both])) if both else None
        mean_b = float(np.mean([r["nn"] for r in both])) if both else None
        change = 100.0 * (mean_b - mean_a) / abs(mean_a) if both and mean_a else None
        per_model[model] = {"naive": mean_a, "nn": mean_b, "nn_change_percent": change, "pairs": len(both),
                            "paper_change_percent": 13.0}
    return {"rows": rows, "per_model": per_model,
            "definition": "mean cosine of CLIP image embeddings over all (training image, generated image) pairs "
                          "of an occupation and prompt, naive subset vs the prompt's NN subset (section 5.2)"}


def female_indicator_share(captions: pd.DataFrame) -> pd.DataFrame:
    """% of captions per occupation whose explicit indicators say female (female or both)."""
    fem = captions[CAPTION_GENDER].isin([CaptionGender.FEMALE, CaptionGender.BOTH])
    out = fem.groupby(captions[OCCUPATION]).mean().mul(100.0).rename("percent_female_indicator_captions")
    return out.reset_index()


# ------------------------------------------------------------------------------ summarize (CSV)
def summarize_percentages(df: pd.DataFrame, training_group: str = TRAINING) -> dict:
    """The amplification table from known percentages (columns occupation, group, percent_female;
    optional ``model``). Group ``training_group`` is T; every other group is a prompt."""
    need = {OCCUPATION, "group", PERCENT_FEMALE}
    missing = need - set(df.columns)
    if missing:
        raise ValueError(f"CSV lacks column(s) {sorted(missing)}; expected occupation,group,percent_female[,model]")
    df = df.copy()
    df[OCCUPATION] = df[OCCUPATION].astype(str).str.strip()
    df["group"] = df["group"].astype(str).str.strip()
    df[PERCENT_FEMALE] = numbers(df[PERCENT_FEMALE], PERCENT_FEMALE, "percentages in [0, 100]", low=0, high=100)
    if "model" in df and df["model"].isna().any():
        raise ValueError("the model column has empty values; give every row a model (or drop the column)")
    models = df["model"].astype(str).unique().tolist() if "model" in df else [None]
    out = {}
    for model in models:
        part = df[df["model"].astype(str) == model] if model is not None else df
        keys = [OCCUPATION, "group"]
        dup = part.duplicated(keys)
        if dup.any():
            raise ValueError(f"duplicate (occupation, group) rows: {part[dup][keys].head(5).to_dict('records')}")
        training = part[part["group"] == training_group][[OCCUPATION, PERCENT_FEMALE]]
        if training.empty:
            raise ValueError(f"no rows with group {training_group!r} (the training percentages)")
        generated = part[part["group"] != training_group][[OCCUPATION, "group", PERCENT_FEMALE]]
        if generated.empty:
            raise ValueError("no prompt groups: every row is a training row")
        # every (occupation, prompt) pair appears, so a missing percentage is listed, not lost
        occs = sorted(set(training[OCCUPATION]) | set(generated[OCCUPATION]))
        groups = list(dict.fromkeys(generated["group"]))
        full = pd.MultiIndex.from_product([occs, groups], names=[OCCUPATION, "group"])
        generated = generated.set_index([OCCUPATION, "group"]).reindex(full).reset_index()
        training = training.set_index(OCCUPATION).reindex(occs).rename_axis(OCCUPATION).reset_index()
        rows = compare(training, generated, [OCCUPATION], "group")
        results, avg = expected_amplification(rows, "group")
        out[model or "all"] = result_dict(results, avg) | {
            "occupations": int(training[PERCENT_FEMALE].notna().sum()),
            "rows": json_rows(rows),
        }
    return out


def json_rows(rows: pd.DataFrame) -> list[dict]:
    recs = rows.to_dict("records")
    return [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()} for r in recs]


def interval_text(value, low=None, high=None, digits: int = 2) -> str:
    """"12.57 [9.80, 15.31]"; "n/a" without a value, the value alone without an interval."""
    return Interval(value, low, high, "", 0, 0.0).text(digits)


def format_results(title: str, results: list[dict], average: float | None, average_low: float | None = None,
                   average_high: float | None = None, level: float | None = None) -> str:
    """The printed E[A] table; with ``level``, each E[A]'s interval (``low``/``high``) beside it."""
    ci = f"{int(round(level * 100))}% interval" if level else ""
    lines = [title, f"  {'prompt':<24}{'E[A]':>8}{ci:>18}{'n':>5}{'amp':>5}{'deamp':>6}{'t':>8}{'p':>9}  excluded"]
    for r in results:
        ea = "n/a" if r["expected_amplification"] is None else f"{r['expected_amplification']:.2f}"
        t = "" if r["t_statistic"] is None else f"{r['t_statistic']:.2f}"
        p = "" if r["p_value"] is None else f"{r['p_value']:.3g}"
        exc = "; ".join(f"{k}: {', '.join(v)}" for k, v in r["excluded"].items()) or "-"
        lines.append(f"  {r['group']:<24}{ea:>8}{_ends(r.get('low'), r.get('high')) if level else '':>18}"
                     f"{r['occupations']:>5}{r['amplified']:>5}{r['deamplified']:>6}{t:>8}{p:>9}  {exc}")
    lines.append(f"  {'average over prompts':<24}{'n/a' if average is None else f'{average:.2f}':>8}"
                 f"{_ends(average_low, average_high) if level else '':>18}")
    return "\n".join(lines)


def _ends(low, high) -> str:
    return "" if low is None or high is None else f"[{low:.2f}, {high:.2f}]"


# ------------------------------------------------------------------------ headline numbers (intervals)
# E[A] as a mean over the occupations the paper samples (pipelines/engine/stats/headline.py): the unit of
# every interval is the occupation (its id: the occupation's name), resampled with replacement.
EA_KEY = "expected_amplification"
BETTER = "lower"   # lower E[A]: the generated images skew less than the training data (docs/method.md)


def occupation_amplification(rows: pd.DataFrame, group: str) -> pd.DataFrame:
    """A per occupation (index, in the rows' order) and group (columns, as ``str``, in the rows'
    order), NaN where the pair is left out (excluded, or no value): the per-unit values whose mean
    over occupations is each group's E[A] (``expected_amplification``)."""
    names = rows[group].map(str)
    occs = list(dict.fromkeys(rows[OCCUPATION].astype(str)))
    groups = list(dict.fromkeys(names))
    keep = rows[EXCLUDED].isna() & rows[AMPLIFICATION].notna()
    inc = pd.DataFrame({OCCUPATION: rows[OCCUPATION].astype(str)[keep], group: names[keep],
                        AMPLIFICATION: rows[AMPLIFICATION][keep].astype(float)})
    wide = inc.pivot(index=OCCUPATION, columns=group, values=AMPLIFICATION) if len(inc) else pd.DataFrame()
    return wide.reindex(index=occs, columns=groups).astype(float)


def average_over_groups(wide: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per occupation a value and a weight whose weighted mean over occupations is the mean over
    groups of each group's E[A] (Table 3's *average*, over the groups that have one): an occupation
    counts 1/n_p in each prompt p that includes it (n_p occupations), so
    value_o = (sum_p A_op / n_p) / w_o with w_o = sum_p [o in p] / n_p. NaN (weight 0) for an
    occupation no group includes."""
    return _averaged(wide.to_numpy(np.float64))


def _averaged(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``average_over_groups`` on an array (... x occupations x groups, NaN where left out): the
    values and weights per occupation (... x occupations)."""
    present = np.isfinite(a)
    with np.errstate(invalid="ignore", divide="ignore"):
        inv = 1.0 / present.sum(axis=-2, keepdims=True)        # 1 / n_p per group; 0 for a group with none
    inv = np.where(np.isfinite(inv), inv, 0.0)
    weights = (present * inv).sum(axis=-1)
    sums = (np.where(present, a, 0.0) * inv).sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(weights > 0, sums / np.where(weights > 0, weights, 1.0), np.nan), weights


def group_metric(wide: pd.DataFrame, column: str, key: str, label: str, replicates=None) -> Metric:
    """E[A] of one group (prompt) as a mean over occupations (excluded ones: NaN, left out)."""
    return Metric(key, label, "occupation", [str(o) for o in wide.index], wide[column].tolist(), better=BETTER,
                  replicates=replicates)


def average_metric(wide: pd.DataFrame, key: str, label: str, replicates=None) -> Metric:
    """The average of the groups' E[A] as a weighted mean over occupations (``average_over_groups``)."""
    values, weights = average_over_groups(wide)
    return Metric(key, label, "occupation", [str(o) for o in wide.index], values.tolist(), better=BETTER,
                  weights=weights.tolist(), replicates=replicates)


def resampled_amplification(rows: pd.DataFrame, group: str, wide: pd.DataFrame, training_per_group: bool,
                            resamples: int = IMAGE_RESAMPLES, seed: int = 0) -> np.ndarray:
    """(resamples x occupations x groups): A recomputed from resamples of the images behind each
    percentage. A percentage of n counted images, k of them female, resampled with replacement is
    k* ~ Binomial(n, k/n); the training subset's images are drawn once per occupation and shared by
    its groups (``training_per_group`` False: one subset per occupation) or once per (occupation,
    group) (subsets selected per prompt); ``amplification_cube`` makes A of them."""
    names = rows[group].map(str)
    rng = np.random.default_rng([seed, 11])

    def draw(percent, n, keys=None):
        """100 k*/n per row, one draw per distinct key (rows sharing a key share the draw; every
        row its own without ``keys``)."""
        n = np.nan_to_num(np.asarray(n, np.float64)).astype(np.int64)
        p = np.clip(np.nan_to_num(np.asarray(percent, np.float64)) / 100.0, 0.0, 1.0)
        first = np.arange(len(n)) if keys is None else \
            pd.Series(np.arange(len(n))).groupby(list(keys)).transform("first").to_numpy()
        k = rng.binomial(n[None, :], p[None, :], size=(resamples, len(n)))[:, first]
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(n[None, :] > 0, 100.0 * k / np.maximum(n, 1)[None, :], np.nan)

    tkeys = np.array([f"{o}|{g}" for o, g in zip(rows[OCCUPATION].astype(str), names)] if training_per_group
                     else rows[OCCUPATION].astype(str).to_numpy(), dtype=object)
    return amplification_cube(rows, group, wide, draw(rows[TRAINING], rows["n_training"], tkeys),
                              draw(rows[GENERATED], rows["n_generated"]))


def amplification_cube(rows: pd.DataFrame, group: str, wide: pd.DataFrame, training: np.ndarray,
                       generated: np.ndarray) -> np.ndarray:
    """(resamples x occupations x groups) of A from resampled T and G per row of ``compare``'s
    ``rows`` (each resamples x rows): a pair excluded in the run, or whose resampled T and G point
    in other directions (the paper's direction-switch rule), is NaN in that resample."""
    occs, groups = list(wide.index), list(wide.columns)
    oi = rows[OCCUPATION].astype(str).map({o: i for i, o in enumerate(occs)}).to_numpy()
    gi = rows[group].map(str).map({g: j for j, g in enumerate(groups)}).to_numpy()
    ok = ~(pd.isna(oi) | pd.isna(gi))
    a = amplification(generated, training)
    kept = rows[EXCLUDED].isna().to_numpy()[None, :] & (direction(training) == direction(generated)) & np.isfinite(a)
    a = np.where(kept, a, np.nan)
    out = np.full((len(training), len(occs), len(groups)), np.nan)
    out[:, oi[ok].astype(int), gi[ok].astype(int)] = a[:, ok]
    return out


def average_over_groups_per_resample(cube: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``average_over_groups`` per resample of a (resamples x occupations x groups) cube: values
    and weights, each (resamples x occupations)."""
    return _averaged(cube)


def averaged_replicates(cube: np.ndarray) -> np.ndarray:
    """``average_over_groups`` applied to every resample (resamples x occupations x groups)."""
    return _averaged(cube)[0]


def amplification_metrics(rows: pd.DataFrame, group: str, key: str, label: str, per_group: bool = True,
                          training_per_group: bool = False, image_seed: int = 0) -> list[Metric]:
    """The headline metrics of one approach (``compare``'s rows): the average over groups (``key``)
    and, with ``per_group``, each group's E[A] (``key``/prompt_<group>); each with its image
    resamples (``resampled_amplification``) when the rows give the images' counts."""
    wide = occupation_amplification(rows, group)
    cube = None
    if {"n_training", "n_generated"} <= set(rows.columns) and len(wide.columns):
        cube = resampled_amplification(rows, group, wide, training_per_group, seed=image_seed)
    out = [average_metric(wide, key, f"{label}, average over prompts" if per_group else label,
                          None if cube is None else averaged_replicates(cube))]
    if per_group:
        out += [dataclasses.replace(group_metric(wide, g, f"{key}/prompt_{g}", f"{label}, prompt #{g}",
                                                 None if cube is None else cube[:, :, j]), lead=False)
                for j, g in enumerate(wide.columns)]
    return out


def summary_intervals(result: dict, settings) -> dict:
    """``summarize_percentages``' result with a bootstrap interval over occupations beside every E[A]
    it recomputes (``low``/``high`` per prompt, ``average_low``/``average_high`` per model); the
    values themselves are unchanged (the published tables' per-occupation T and G are the units)."""
    out = {}
    for model, res in result.items():
        rows = pd.DataFrame(res["rows"])
        wide = occupation_amplification(rows, "group") if len(rows) else pd.DataFrame()
        per = []
        for p in res["per_prompt"]:
            ci = group_metric(wide, p["group"], p["group"], p["group"]).interval(settings) \
                if p["group"] in wide.columns else None
            per.append(p | {"low": ci.low if ci else None, "high": ci.high if ci else None})
        avg = average_metric(wide, "average", "average").interval(settings) if len(wide.columns) else None
        out[model] = res | {"per_prompt": per, "average_low": avg.low if avg else None,
                            "average_high": avg.high if avg else None}
    return out

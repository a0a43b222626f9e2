"""The headline numbers of DALL-Eval's three commands as means over the units the paper samples
(``pipelines.engine.stats.headline``: per-unit values, their interval, ``metrics.json["headline"]``).

- ``run`` (social bias, section 4.2.4, Table 8): a model's MAD is the mean of its per-prompt MADs,
  so the unit is the prompt (its text) and a prompt's value is its own MAD: gender MAD and average
  gender over the neutral group's prompts, skin-tone MAD over every prompt with a tone. Table 9's
  mean absolute woman - man difference in attribute presence is the mean over the attributes of
  |presence(woman) - presence(man)|, so its unit is the attribute.
- ``skills`` (section 4.1, Table 2): a skill's accuracy is the share of its judged images that are
  correct; one image per prompt, so the unit is the prompt (its id) with the value 100 or 0. The
  average over the skills is the same units weighted 1 / (images of the skill), resampled within
  each skill.
- ``alignment`` (App. D, Table 19): R-precision and CLIPScore are means over images (one per
  caption): the unit is the image, with its hit (100 / 0; the mean over the repeats in the released
  reading) or its 2.5 max(cos, 0). FID is not a mean over units and has no interval here.

Pure functions of tables (pandas / pyarrow), no Ray, no models."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.engine.stats import headline as HL
from pipelines.engine.stats import intervals as iv
from schemas import dalleval as S
from schemas import paintskills as P
from schemas.images import GENERATION_STATUS, MODEL, GenerationStatus
from schemas.subsets import PROMPT

BIAS_STUDY = "paper000-dalleval-bias"
SKILLS_STUDY = "paper000-dalleval-skills"
ALIGNMENT_STUDY = "paper000-dalleval-alignment"

GENDER_MAD = "gender_mad"
GENDER_AVERAGE = "gender_average"
SKIN_TONE_MAD = "skin_tone_mad"
ATTRIBUTE_GAP = "attribute_gap"
AVERAGE_ACCURACY = "average_accuracy"
R_PRECISION = "r_precision"
CLIP_SCORE = "clip_score"


def accuracy_key(skill: str) -> str:
    return f"{skill}_accuracy"


# ------------------------------------------------------------------------------------ social bias
def _prompt_metric(key: str, label: str, rows: pd.DataFrame, column: str, better: str) -> HL.Metric:
    """A mean over prompts of the per-prompt ``column`` (NaN: the prompt has no detection; left out)."""
    return HL.Metric(key, label, "prompt", [str(p) for p in rows[PROMPT]],
                     rows[column].astype(np.float64).tolist(), better=better)


def bias_metrics(counts: pd.DataFrame, neutral: str | None, tones: bool,
                 attributes: pd.DataFrame | None = None, compare=(), answers: pd.DataFrame | None = None,
                 image_seed: int = 0) -> dict[str, list[HL.Metric]]:
    """{model: its headline metrics} from the per-prompt counts with measures (``metrics.with_measures``):
    gender MAD and average gender over the ``neutral`` group's prompts (every prompt when None),
    skin-tone MAD over every prompt (``tones``), and, from ``attributes`` (``group_attribute_table``)
    with two ``compare`` groups, Table 9's mean absolute difference over the attributes (with its
    image resamples from ``answers``, ``attribute_answers``: two levels)."""
    out = {}
    over = f"'{neutral}' prompts" if neutral is not None else "every prompt"
    for model, g in counts.groupby(MODEL, sort=False):
        gsel = g if neutral is None else g[g[S.GROUP] == neutral]
        metrics = [_prompt_metric(GENDER_MAD, f"gender MAD over {over} (Table 8)", gsel, S.MAD_GENDER, "lower"),
                   _prompt_metric(GENDER_AVERAGE, f"average gender over {over}, male -1 / female +1 (Table 6)",
                                  gsel, S.AVG_GENDER, "zero")]
        if tones and S.MAD_TONE in g:
            metrics.append(_prompt_metric(SKIN_TONE_MAD, "skin-tone MAD over every prompt (Table 8)", g, S.MAD_TONE,
                                          "lower"))
        mine = None if answers is None else answers[answers[MODEL] == model]
        gap = attribute_gap(attributes, model, compare, mine, image_seed)
        if gap is not None:
            metrics.append(gap)
        out[str(model)] = metrics
    return out


def attribute_gap(attributes: pd.DataFrame | None, model, compare, answers: pd.DataFrame | None = None,
                  image_seed: int = 0) -> HL.Metric | None:
    """Table 9's "Woman - Man" row of ``model`` as a mean over attributes of |difference| (the
    table's ``mean_abs_diff``), with its image resamples when ``answers`` (the model's rows of
    ``attribute_answers``) are given; None without the row."""
    if attributes is None or attributes.empty or len(compare) != 2:
        return None
    row_name = f"{compare[0]} - {compare[1]}"
    rows = attributes[(attributes["model"] == model) & (attributes["row"] == row_name)]
    if rows.empty:
        return None
    row = rows.iloc[0]
    names = attribute_names(attributes)
    values = [abs(float(row[a])) if pd.notna(row[a]) else np.nan for a in names]
    reps = None if answers is None or answers.empty else gap_replicates(answers, compare, names, seed=image_seed)
    return HL.Metric(ATTRIBUTE_GAP, f"attribute presence |{row_name}|, mean over the attributes (Table 9)",
                     "attribute", names, values, better="lower", replicates=reps)


def attribute_answers(images: pa.Table) -> pd.DataFrame:
    """One row per (image, attribute asked): model, prompt, group, image (row number), attribute and
    yes (1 where BLIP-2 said yes; any other answer counts as absent, as in Table 9)."""
    ok = pc.fill_null(pc.equal(images.column(GENERATION_STATUS), GenerationStatus.OK), False)
    t = images.filter(pc.and_(ok, pc.is_valid(images.column(S.ATTRIBUTE_NAMES)))).combine_chunks()
    if t.num_rows == 0:
        return pd.DataFrame(columns=[MODEL, PROMPT, S.GROUP, "image", S.ATTRIBUTE, "yes"])
    parent = pc.list_parent_indices(t.column(S.ATTRIBUTE_NAMES)).to_numpy(zero_copy_only=False)
    yes = pc.fill_null(pc.list_flatten(t.column(S.ATTRIBUTE_PRESENT)), False).to_numpy(zero_copy_only=False)
    return pd.DataFrame({MODEL: t.column(MODEL).to_numpy(zero_copy_only=False)[parent],
                         PROMPT: t.column(PROMPT).to_numpy(zero_copy_only=False)[parent],
                         S.GROUP: t.column(S.GROUP).to_numpy(zero_copy_only=False)[parent], "image": parent,
                         S.ATTRIBUTE: pc.list_flatten(t.column(S.ATTRIBUTE_NAMES)).to_numpy(zero_copy_only=False),
                         "yes": yes.astype(np.float64)})


def gap_replicates(answers: pd.DataFrame, compare, attributes: list[str], resamples: int = HL.IMAGE_RESAMPLES,
                   seed: int = 0) -> np.ndarray | None:
    """(resamples x attributes): |presence(first) - presence(second)| recomputed from resamples of
    the two groups' images, each resampled within its prompt, one resample for every attribute
    (BLIP-2 is asked every attribute about the same images, so their noise is shared)."""
    first, second = compare
    part = answers[answers[S.GROUP].isin([first, second])]
    if part.empty:
        return None
    table = part.pivot_table(index="image", columns=S.ATTRIBUTE, values="yes", aggfunc="first").reindex(
        columns=attributes)
    info = part.drop_duplicates("image").set_index("image").loc[table.index]
    return iv.resampled_gaps(table.to_numpy(np.float64), info[S.GROUP].to_numpy(), first, second,
                             info[PROMPT].astype(str).to_numpy(), np.random.default_rng([seed, 13]), resamples)


def attribute_names(table: pd.DataFrame) -> list[str]:
    """The attribute columns of ``metrics.group_attribute_table`` (not its differences, their mean or
    its interval)."""
    extra = {"model", "row", "mean_abs_diff", *S.interval_columns("mean_abs_diff")}
    return [c for c in table.columns if c not in extra and not str(c).endswith("(diff)")]


def bias_excluded(counts: pd.DataFrame, model, requested: int, tones: bool) -> tuple[int, dict]:
    """(generated images, {reason: images left out}) of ``model`` from its per-prompt counts."""
    g = counts[counts[MODEL] == model]
    images = int(g[S.IMAGES].sum())
    out = {"not generated (failed or blocked)": requested - images,
           "no gender detected": int(g[S.UNKNOWN_GENDER].sum())}
    if tones and S.TONED in g:
        out["no skin tone measured"] = images - int(g[S.TONED].sum())
    return images, out


# ------------------------------------------------------------------------------------ skills
def skill_units(judged) -> pd.DataFrame:
    """One row per judged image of the skills run (model, skill, unit: the prompt id, value: 100 when
    correct, else 0): the units of Table 2."""
    df = judged.select([MODEL, P.SKILL, P.PROMPT_ID, GENERATION_STATUS, P.CORRECT]).to_pandas()
    df = df[df[P.CORRECT].notna() & (df[GENERATION_STATUS] == GenerationStatus.OK)]
    return pd.DataFrame({"model": df[MODEL].astype(str), "skill": df[P.SKILL], "unit": df[P.PROMPT_ID].astype(str),
                         "value": np.where(df[P.CORRECT].astype(bool), 100.0, 0.0)})


def accuracy_units(accuracies: pd.DataFrame) -> pd.DataFrame:
    """The units behind published per-skill accuracies with their image counts (model, skill,
    accuracy, n): round(accuracy x n / 100) images correct (100), the rest wrong (0). A mean of
    0/1 units depends only on how many are 1, so these are the units up to their order."""
    rows = []
    for _, r in accuracies.iterrows():
        n, acc = pd.to_numeric(r.get("n"), errors="coerce"), pd.to_numeric(r["accuracy"], errors="coerce")
        if pd.isna(n) or pd.isna(acc):
            continue
        n, skill = int(n), str(r["skill"]).strip().lower()
        k = int(round(float(acc) * n / 100.0))
        rows += [{"model": str(r["model"]), "skill": skill, "unit": f"{skill}|{i}", "value": 100.0 if i < k else 0.0}
                 for i in range(n)]
    return pd.DataFrame(rows, columns=["model", "skill", "unit", "value"])


def skill_metrics(units: pd.DataFrame) -> dict[str, list[HL.Metric]]:
    """{model: accuracy per skill (%) and their average over the skills it has} from ``skill_units``:
    the average weighs each image 1 / (images of its skill) and is resampled within skills, so it
    is the mean of the skill accuracies (Table 2's Avg.)."""
    out = {}
    for model, mine in units.groupby("model", sort=False):
        metrics, n_of = [], mine["skill"].map(mine["skill"].value_counts())
        for skill in P.Skill.ALL:
            sub = mine[mine["skill"] == skill]
            if len(sub):
                metrics.append(HL.Metric(accuracy_key(skill), f"{skill} accuracy % (Table 2)", "prompt",
                                         sub["unit"].tolist(), sub["value"].tolist(), better="higher"))
        if len(metrics) > 1:
            metrics.append(HL.Metric(AVERAGE_ACCURACY, "average accuracy % over the skills (Table 2)", "prompt",
                                     mine["unit"].tolist(), mine["value"].tolist(), better="higher",
                                     weights=(1.0 / n_of).tolist(), strata=mine["skill"].tolist()))
        out[str(model)] = metrics
    return out


def complete_averages(metrics: dict[str, list[HL.Metric]], table2: pd.DataFrame) -> dict[str, list[HL.Metric]]:
    """``metrics`` without the average of a model whose units cover fewer skills than Table 2's
    average is over (published accuracies where only some have ``n``): no interval for another mean."""
    over = {str(m): int(k) for m, k in zip(table2["model"], table2["skills_averaged"])}
    return {m: [x for x in ms if x.key != AVERAGE_ACCURACY or len(ms) - 1 == over.get(m)] for m, ms in metrics.items()}


def table2_with_intervals(table: pd.DataFrame, lookup: dict) -> pd.DataFrame:
    """Table 2 (``skills.table2``) with each accuracy's interval beside it (per skill and the average)."""
    columns = {skill: accuracy_key(skill) for skill in P.Skill.ALL}
    return with_intervals(table, lookup, {**columns, "average": AVERAGE_ACCURACY})


# ------------------------------------------------------------------------------------ alignment
def alignment_metrics(units: dict) -> list[HL.Metric]:
    """R-precision and CLIPScore of one model (or the reference images) from its per-image values:
    ``units`` {"r_precision": (ids, values), "clip_score": (ids, values)}."""
    out = []
    if units.get(R_PRECISION) is not None:
        ids, values = units[R_PRECISION]
        out.append(HL.Metric(R_PRECISION, "CLIP R-precision % (Table 19)", "image", list(ids), list(values),
                             better="higher"))
    if units.get(CLIP_SCORE) is not None:
        ids, values = units[CLIP_SCORE]
        out.append(HL.Metric(CLIP_SCORE, "CLIPScore, mean of 2.5 max(cos, 0)", "image", list(ids), list(values),
                             better="higher"))
    return out


# ------------------------------------------------------------------------------------ subjects
def generator_records(records: list[dict]) -> dict[str, dict]:
    """{model: its provenance record} of the run's generators."""
    return {str(r["model"]): r for r in records or [] if r.get("role") == "generator"}


def subjects(metrics: dict[str, list[HL.Metric]], records: list[dict], images: dict[str, int],
             excluded: dict[str, dict]) -> list[HL.Subject]:
    """One subject per generator that has metrics, identified by its provenance record."""
    gens = generator_records(records)
    out = []
    for model, ms in metrics.items():
        rec = gens.get(model, {"role": "generator", "model": model})
        out.append(HL.Subject(model, HL.subject_identity(rec), ms, images=images.get(model),
                              excluded={k: v for k, v in (excluded.get(model) or {}).items() if v}))
    return out


def model_protocol(spec, drop=("batch_size", "device", "cpu_offload")) -> dict:
    """A model spec as the protocol compares it: its record without execution settings; a stand-in
    is "stand-in" (built the same way in every run), not its directory."""
    rec = {k: v for k, v in spec.record().items() if k not in drop}
    if getattr(spec, "standin", False):
        rec["model"] = "stand-in"
    return rec


# ------------------------------------------------------------------------------------ tables
def by_model(h: dict) -> dict[str, dict[str, dict]]:
    """{subject name: {metric key: its summary}} of a ``headline`` section."""
    return {s["name"]: {m["key"]: m for m in s["metrics"]} for s in h["subjects"]}


def summaries(metrics: dict[str, list[HL.Metric]], settings) -> dict[str, dict[str, dict]]:
    """``by_model``'s shape computed from Metric objects (``summarize``: no run, no headline section)."""
    return {model: {m.key: m.summary(settings) for m in ms} for model, ms in metrics.items()}


def interval_of(lookup: dict, model, key: str) -> tuple:
    m = (lookup.get(str(model)) or {}).get(key)
    return (None, None) if m is None else (m["low"], m["high"])


def insert_interval(df: pd.DataFrame, column: str, bounds: list[tuple]) -> pd.DataFrame:
    """``df`` with ``<column>_low`` and ``<column>_high`` right after ``column`` (``bounds``: one
    (low, high) per row, None where a row has no interval)."""
    low, high = S.interval_columns(column)
    out = df.copy()
    at = list(out.columns).index(column) + 1
    out.insert(at, low, pd.array([b[0] for b in bounds], dtype="Float64"))
    out.insert(at + 1, high, pd.array([b[1] for b in bounds], dtype="Float64"))
    return out


def with_intervals(df: pd.DataFrame, lookup: dict, columns: dict[str, str], model_column: str = "model",
                   rows=None) -> pd.DataFrame:
    """``df`` with the interval of each headline metric beside its column (``columns``: table column
    -> metric key), per row by its model; ``rows``: a mask of the rows that carry the metric."""
    out = df
    for column, key in columns.items():
        if column not in out.columns:
            continue
        mask = [True] * len(out) if rows is None else list(rows)
        bounds = [interval_of(lookup, m, key) if keep else (None, None)
                  for m, keep in zip(out[model_column], mask)]
        out = insert_interval(out, column, bounds)
    return out


def summary_with_intervals(summary: list[dict], lookup: dict) -> list[dict]:
    """``metrics.model_summary``'s per-model dicts with the interval of each headline figure beside
    it: gender ``average_low/high`` and ``mad_low/high``, skin tone ``mad_low/high``."""
    keys = {"gender": {"average": GENDER_AVERAGE, "mad": GENDER_MAD}, "skin_tone": {"mad": SKIN_TONE_MAD}}
    out = []
    for m in summary:
        row = dict(m)
        for part, figures in keys.items():
            if row.get(part) is None:
                continue
            d = {}
            for k, v in row[part].items():
                d[k] = v
                if k in figures:
                    d[f"{k}_low"], d[f"{k}_high"] = interval_of(lookup, m["model"], figures[k])
            row[part] = d
        out.append(row)
    return out


def value_text(d: dict, key: str, digits: int) -> str:
    """``d[key]`` with its interval ``d[key_low]``, ``d[key_high]``: "0.1984 [0.1500, 0.2500]" ("-"
    without a value)."""
    v = d.get(key)
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return "-"
    low, high = d.get(f"{key}_low"), d.get(f"{key}_high")
    return f"{v:.{digits}f}" + ("" if low is None else f" [{low:.{digits}f}, {high:.{digits}f}]")

"""The headline numbers of `exposed.py run` with their intervals (``pipelines.engine.stats.headline``).

Per generator (one ``headline.Subject`` each) and caption source, each a mean over units:

- ``disparity/<source>/<space>/<pair>``: s(P, P') of Table 3 / S3 (Eq. 1-2; all three pairs);
- ``gap/<source>/<space>``: RQ1's gap s(n, m) - s(n, f) (Diff. Pix.: s(n, f) - s(n, m)), each
  unit's own difference (``metrics.unit_gaps``); > 0: the neutral set is closer to the masculine one;
- ``s_o/<source>/<pair>``: the co-occurrence similarity of Table 4 (Eq. 4; ``objects.unit_cosines``).

The resampled unit is the *triplet*, not the (triplet, seed) unit: a triplet's seeds share their
prompts (its prompt-space values are identical over seeds) and are not independent draws of the
paper's population of prompts. A triplet's value is the mean over its measured seeds and its weight
their number, so the weighted mean over triplets is exactly the mean over (triplet, seed) units the
tables report. A source of one triplet (the intra-prompt experiment of §7: one caption, 1,000
seeds) samples seeds, so there the (triplet, seed) unit is resampled. Sources are separate metrics
(the paper reports each on its own), not strata.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipelines.engine.stats import headline as HL
from pipelines.engine.report import html as H
from pipelines.engine.report import page as Pg
from pipelines.studies.exposed import metrics as M
from schemas.exposed import (
    COSINE,
    PAIR,
    PAIR_NAMES,
    RESAMPLED_UNIT,
    S_O,
    SPACE,
    TRIPLET_ID,
    TRIPLET_SOURCE,
    UNIT_ID,
    UNIT_STATUS,
    UNIT_WEIGHT,
    VALUE,
    VARIANT,
    Space,
    Variant,
    high_column,
    low_column,
)
from schemas.images import GENERATION_STATUS, MODEL, GenerationStatus

UNIT = "triplet"                   # what a Metric's units are
SEED_UNIT = "seed"                 # ... in a source of one triplet: its (triplet, seed) units
GAP_TEXT = ("RQ1 gap: s(neutral, masculine) - s(neutral, feminine) (Diff. Pix.: the reverse), the mean of each "
            "unit's own difference; > 0: the neutral prompts' images are closer to the masculine ones'")
LEAD_PAIRS = (M.NEUTRAL_FEMININE, M.NEUTRAL_MASCULINE)   # Table 4's pairs: s_O in the report's opening box
# how each space is named in the metrics, the printed results and the report
SPACE_LABELS = {Space.PROMPT: "prompt (t)", Space.PROMPT_POOLED: "pooled prompt", Space.DENOISING: "denoising (z\u2080)", Space.SSIM: "SSIM",
                Space.DIFF_PIX: "Diff. Pix. (%)", Space.RESNET: "ResNet", Space.CLIP: "CLIP",
                Space.DINO: "DINO", Space.SPLIT_PRODUCT: "split-product"}


# ------------------------------------------------------------------------------------ metric keys
def disparity_key(source: str, space: str, pair: str) -> str:
    return f"disparity/{source}/{space}/{pair}"


def gap_key(source: str, space: str) -> str:
    return f"gap/{source}/{space}"


def s_o_key(source: str, pair: str) -> str:
    return f"s_o/{source}/{pair}"


def _pair_text(pair: str) -> str:
    a, b = pair.split("-")
    return f"s({a}, {b})"


# ------------------------------------------------------------------------------------ per resampled unit
def one_triplet_sources(images: pd.DataFrame) -> set:
    """The sources with a single triplet in the run: their seeds are the sample."""
    n = images.groupby(TRIPLET_SOURCE)[TRIPLET_ID].nunique(dropna=False)
    return set(n[n == 1].index)


def resampled_means(long: pd.DataFrame, keys: list[str], by_seed=frozenset()) -> pd.DataFrame:
    """Per (``keys``, resampled unit): the mean of ``VALUE`` over its (triplet, seed) units (NaN left
    out) and their number (``UNIT_WEIGHT``). The resampled unit (``RESAMPLED_UNIT``) is the triplet,
    the (triplet, seed) unit in the sources of ``by_seed`` or where the triplet id is missing."""
    d = long[long[VALUE].notna()]
    own = d[TRIPLET_SOURCE].isin(list(by_seed)) | d[TRIPLET_ID].isna()
    d = d.assign(**{RESAMPLED_UNIT: d[TRIPLET_ID].where(~own, d[UNIT_ID])})
    g = d.groupby([*keys, RESAMPLED_UNIT], sort=False)[VALUE]
    return g.agg(**{VALUE: "mean", UNIT_WEIGHT: "count"}).reset_index()


def _metric(key: str, label: str, better: str, rows: pd.DataFrame, unit: str) -> HL.Metric:
    return HL.Metric(key=key, label=label, unit=unit, units=[str(u) for u in rows[RESAMPLED_UNIT]],
                     values=rows[VALUE].astype(float).tolist(), better=better,
                     weights=rows[UNIT_WEIGHT].astype(float).tolist(), digits=3,   # gaps of 0.002-0.03
                     lead=is_lead({"key": key}))


def disparity_metrics(pairs: pd.DataFrame, gaps: pd.DataFrame, by_seed=frozenset()) -> list[HL.Metric]:
    """One model's Table 3 numbers and RQ1 gaps (``resampled_means`` of ``M.pair_values`` and
    ``M.unit_gaps``, keyed by source and space (and pair)), per source and space in Space.ALL order."""
    out = []
    pair_groups = dict(tuple(pairs.groupby([TRIPLET_SOURCE, SPACE, PAIR], sort=False)))
    gap_groups = dict(tuple(gaps.groupby([TRIPLET_SOURCE, SPACE], sort=False)))
    for source in dict.fromkeys(pairs[TRIPLET_SOURCE]):
        unit = SEED_UNIT if source in by_seed else UNIT
        for space in [s for s in Space.ALL if (source, s) in gap_groups or (source, s, PAIR_NAMES[0]) in pair_groups]:
            name = SPACE_LABELS[space]
            better = "lower" if space in Space.LOWER_IS_CLOSER else "higher"
            for pair in PAIR_NAMES:
                if (source, space, pair) in pair_groups:
                    out.append(_metric(disparity_key(source, space, pair), f"{_pair_text(pair)}, {name}, {source} "
                                       f"(Table 3)", better, pair_groups[(source, space, pair)], unit))
            if (source, space) in gap_groups:
                out.append(_metric(gap_key(source, space), f"RQ1 gap, {name}, {source}", "zero",
                                   gap_groups[(source, space)], unit))
    return out


def s_o_metrics(cosines: pd.DataFrame, by_seed=frozenset()) -> list[HL.Metric]:
    """One model's s_O per source and pair (``resampled_means`` of ``objects.unit_cosines``)."""
    out = []
    for (source, pair), rows in cosines.groupby([TRIPLET_SOURCE, PAIR], sort=False):
        out.append(_metric(s_o_key(source, pair), f"s_O{_pair_text(pair)[1:]}, {source} (Table 4)", "higher", rows,
                           SEED_UNIT if source in by_seed else UNIT))
    return out


def with_triplets(cosines: pd.DataFrame, images: pd.DataFrame) -> pd.DataFrame:
    """``objects.unit_cosines`` with each unit's triplet (from the image rows), the cosine as ``VALUE``."""
    triplet = images.drop_duplicates([MODEL, UNIT_ID])[[MODEL, UNIT_ID, TRIPLET_ID]]
    return cosines.merge(triplet, on=[MODEL, UNIT_ID], how="left").rename(columns={COSINE: VALUE})


# ------------------------------------------------------------------------------------ subjects
def excluded(images: pd.DataFrame, cosines: pd.DataFrame | None) -> dict:
    """{reason: count} left out of one model's numbers: incomplete units (an image not generated)
    by status, and the s_O pairs with nothing detected in either image."""
    units = images[images[VARIANT] == Variant.NEUTRAL]
    out = {f"incomplete units ({status})": int(n) for status, n in
           units.loc[units[UNIT_STATUS] != GenerationStatus.OK, UNIT_STATUS].fillna("unknown").value_counts().items()}
    if cosines is not None and len(cosines):
        out["s_O pairs with nothing detected in either image"] = int(cosines[VALUE].isna().sum())
    return {k: v for k, v in out.items() if v}


def generator_record(records: list[dict], model: str) -> dict:
    """The generator's provenance record in ``run.models`` (a bare one when none is recorded)."""
    return next((r for r in records if r.get("role") == "generator" and r.get("model") == model),
                {"role": "generator", "model": model})


def subjects(images: pd.DataFrame, long: pd.DataFrame, cosines: pd.DataFrame | None, records: list[dict],
             models: list[str]) -> list[HL.Subject]:
    """One Subject per generator of ``models``: ``long`` is ``M.pair_values`` of the run's images,
    ``cosines`` ``objects.unit_cosines`` (None without objects)."""
    by_seed = one_triplet_sources(images)
    pairs = resampled_means(long, [MODEL, TRIPLET_SOURCE, SPACE, PAIR], by_seed)
    gaps = resampled_means(M.unit_gaps(long), [MODEL, TRIPLET_SOURCE, SPACE], by_seed)
    cos = with_triplets(cosines, images) if cosines is not None else None
    s_o = resampled_means(cos, [MODEL, TRIPLET_SOURCE, PAIR], by_seed) if cos is not None else None
    out = []
    for model in models:
        mine = images[images[MODEL] == model]
        metrics = disparity_metrics(pairs[pairs[MODEL] == model], gaps[gaps[MODEL] == model], by_seed)
        if s_o is not None:
            metrics += s_o_metrics(s_o[s_o[MODEL] == model], by_seed)
        out.append(HL.Subject(name=model, identity=HL.subject_identity(generator_record(records, model)),
                              metrics=metrics, images=int((mine[GENERATION_STATUS] == GenerationStatus.OK).sum()),
                              excluded=excluded(mine, None if cos is None else cos[cos[MODEL] == model])))
    return out


# ------------------------------------------------------------------------------------ the intervals in the tables
def intervals(headline: dict, models: list[str]) -> dict:
    """{(model, metric key): (low, high)} of metrics.json's ``headline`` (subjects in ``models`` order)."""
    return {(model, m["key"]): (m["low"], m["high"])
            for model, s in zip(models, headline["subjects"]) for m in s["metrics"]}


def disparity_intervals(ends: dict) -> dict:
    """{(model, source, pair, space): (low, high)} for ``M.with_intervals``."""
    out = {}
    for (model, key), v in ends.items():
        kind, *rest = key.split("/")
        if kind == "disparity":
            source, space, pair = rest
            out[(model, source, pair, space)] = v
    return out


def gap_intervals(ends: dict) -> dict:
    """{(model, source, space): (low, high)} for ``M.direction_table``."""
    return {(model, *key.split("/")[1:]): v for (model, key), v in ends.items() if key.startswith("gap/")}


def with_s_o_intervals(table: pd.DataFrame, ends: dict) -> pd.DataFrame:
    """Table 4 (``objects.cooccurrence_similarity``) with ``s_o_low`` / ``s_o_high`` beside ``s_o``."""
    got = [ends.get((m, s_o_key(s, p)), (None, None)) for m, s, p in zip(table[MODEL], table[TRIPLET_SOURCE],
                                                                          table[PAIR])]
    out = table.copy()
    at = out.columns.get_loc(S_O) + 1
    for i, name in enumerate((low_column(S_O), high_column(S_O))):
        out.insert(at + i, name, [np.nan if g[i] is None else float(g[i]) for g in got])
    return out


# ------------------------------------------------------------------------------------ report and console
def is_lead(metric: dict) -> bool:
    """The numbers the report's opening box shows: every RQ1 gap and Table 4's two s_O pairs."""
    kind, *rest = metric["key"].split("/")
    return kind == "gap" or (kind == "s_o" and rest[-1] in LEAD_PAIRS)


def lead_headline(headline: dict) -> dict:
    """``headline`` with only the lead metrics (``is_lead``) of each subject."""
    return {**headline, "subjects": [{**s, "metrics": [m for m in s["metrics"] if is_lead(m)]}
                                     for s in headline["subjects"]]}


def box_html(headline: dict) -> str:
    """The opening box's interval table (the lead numbers) and, collapsed, every headline number."""
    n = sum(len(s["metrics"]) for s in headline["subjects"])
    return (f"<p>{H.esc(GAP_TEXT)}; s<sub>O</sub>: Table 4's co-occurrence similarity.</p>"
            + HL.summary_table(lead_headline(headline))
            + Pg.details(f"Every headline number with its interval ({n} rows: Table 3's pairs too)",
                         HL.summary_table(headline)))


def format_headline(headline: dict, labels: dict) -> str:
    """The lead numbers with their intervals, printed after the run: "0.012 [0.004, 0.020]"."""
    lvl = int(round(headline["interval"]["level"] * 100))
    lines = [f"Headline numbers with {lvl}% intervals (bootstrap over triplets; every number with its interval: "
             f"metrics.json 'headline'). {GAP_TEXT}"]
    for s in lead_headline(headline)["subjects"]:
        lines.append(f"{Pg.label(labels, s['name'])}")
        for m in s["metrics"]:
            lines.append(f"  {m['label']:<48} {HL.interval_text(m, 3):>26}  {m['n']:,} {m['unit']}s")
    return "\n".join(lines)


def interval_cells(df: pd.DataFrame, columns, digits: int = 3) -> pd.DataFrame:
    """``df`` for a page: each of ``columns`` that has its ``_low`` / ``_high`` columns becomes the
    text "0.909 [0.901, 0.917]" (the value alone where no interval), its end columns dropped."""
    out = df.copy()
    for c in columns:
        lo, hi = low_column(c), high_column(c)
        if c not in out or lo not in out or hi not in out:
            continue
        out[c] = [("-" if pd.isna(v) else f"{v:.{digits}f}" if pd.isna(a) or pd.isna(b)
                   else f"{v:.{digits}f} [{a:.{digits}f}, {b:.{digits}f}]") for v, a, b in zip(out[c], out[lo], out[hi])]
        out = out.drop(columns=[lo, hi])
    return out

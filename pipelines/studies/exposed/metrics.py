"""Representational disparities (papers 003/004, section 4, Eq. 1 and 2; Tables 3 and S3).

For a pair of prompt sets (P, P') of the same triplets, the disparity in a space is the mean over
corresponding prompts of their similarity in that space:

    s(P, P') = 1/|P| sum_i sim(x_i, x'_i)

with sim the cosine of the prompt embeddings (prompt space), of the final latents z_0 (denoising
space), or of image features (ResNet-50, CLIP, DINO), the mean SSIM, the split-product, and for
Diff. Pix. the percentage of differing pixels (lower = closer). The generator writes each unit's
three pair values on its rows; here they become one row per (unit, pair, space), then the means.
A unit enters a space only when all three of its images were generated (UNIT_STATUS ok); the
number of units behind every mean is reported with it.

The paper's question RQ1 per (model, source, space): is the neutral set closer to the masculine
set than to the feminine one, s(P_n, P_m) > s(P_n, P_f) (for Diff. Pix.: smaller)? Its gap is also
a mean over units (``unit_gaps``: each unit's own difference), so every number here has the bootstrap
interval of ``headline_metrics`` (resampling triplets); the tables carry it beside the value
(``schemas.exposed.low_column`` / ``high_column``), null where no interval was attached.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from schemas.exposed import (
    DISPARITIES,
    MEAN,
    PAIR,
    PAIR_NAMES,
    PAIRS,
    SPACE,
    STD,
    TRIPLET_ID,
    TRIPLET_SOURCE,
    UNIT_ID,
    UNIT_STATUS,
    UNITS,
    VALUE,
    VARIANT,
    Space,
    Variant,
    disparity_column,
    high_column,
    low_column,
)
from schemas.images import MODEL, GenerationStatus

NEUTRAL_FEMININE, NEUTRAL_MASCULINE, FEMININE_MASCULINE = PAIR_NAMES
CLOSER = "closer_to"        # masculine / feminine / tie
GAP = "gap"                 # s(n, m) - s(n, f) (for Diff. Pix.: s(n, f) - s(n, m)): > 0 means closer to masculine


def unit_rows(images: pa.Table) -> pa.Table:
    """One row per complete unit (its neutral image row), with the pair values of every space."""
    if not images.num_rows:
        return images
    mask = pc.and_(pc.equal(images.column(VARIANT), Variant.NEUTRAL),
                   pc.fill_null(pc.equal(images.column(UNIT_STATUS), GenerationStatus.OK), False))
    return images.filter(mask)


def pair_values(images: pa.Table, spaces=Space.ALL) -> pd.DataFrame:
    """Long table: model, source, triplet, unit, pair, space, value (complete units and measured
    spaces only)."""
    units = unit_rows(images)
    frames = []
    for space in spaces:
        col = disparity_column(space)
        if col not in units.column_names:
            continue
        have = units.filter(pc.is_valid(units.column(col)))
        if not have.num_rows:
            continue
        values = np.asarray(pc.list_flatten(have.column(col)), np.float64).reshape(-1, len(PAIRS))
        base = pd.DataFrame({MODEL: have.column(MODEL).to_pylist(), TRIPLET_SOURCE: have.column(TRIPLET_SOURCE).to_pylist(),
                             TRIPLET_ID: have.column(TRIPLET_ID).to_pylist(), UNIT_ID: have.column(UNIT_ID).to_pylist()})
        for k, name in enumerate(PAIR_NAMES):
            frames.append(base.assign(**{PAIR: name, SPACE: space, VALUE: values[:, k]}))
    if not frames:
        return pd.DataFrame(columns=[MODEL, TRIPLET_SOURCE, TRIPLET_ID, UNIT_ID, PAIR, SPACE, VALUE])
    return pd.concat(frames, ignore_index=True)


def unit_gaps(long: pd.DataFrame) -> pd.DataFrame:
    """Each unit's RQ1 gap per space (GAP's sign: s(n, m) - s(n, f), Diff. Pix. reversed), from
    ``pair_values``: model, source, triplet, unit, space, value. Both pairs come from the same units,
    so the mean of a (model, source, space)'s unit gaps is ``direction_table``'s gap."""
    keys = [MODEL, TRIPLET_SOURCE, TRIPLET_ID, UNIT_ID, SPACE]
    if long.empty:
        return pd.DataFrame(columns=[*keys, VALUE])
    pairs = long[long[PAIR].isin([NEUTRAL_FEMININE, NEUTRAL_MASCULINE])]
    wide = pairs.pivot_table(index=keys, columns=PAIR, values=VALUE, sort=False).reset_index()
    sign = np.where(wide[SPACE].isin(Space.LOWER_IS_CLOSER), -1.0, 1.0)
    return wide.assign(**{VALUE: sign * (wide[NEUTRAL_MASCULINE] - wide[NEUTRAL_FEMININE])})[[*keys, VALUE]]


def disparity_table(images: pa.Table, spaces=Space.ALL) -> pa.Table:
    """``schemas.exposed.DISPARITIES``: mean, std and units per (model, source, pair, space), in
    the order models, sources, pairs (PAIRS), spaces (Space.ALL) appear."""
    long = pair_values(images, spaces)
    if long.empty:
        return DISPARITIES.empty_table()
    grouped = long.groupby([MODEL, TRIPLET_SOURCE, PAIR, SPACE], sort=False)[VALUE]
    out = grouped.agg(["mean", "std", "count"]).reset_index()
    out["std"] = out["std"].fillna(0.0)   # one unit: no spread
    out = out.rename(columns={"mean": MEAN, "std": STD, "count": UNITS})
    out[low_column(MEAN)] = out[high_column(MEAN)] = np.nan     # attached later (with_intervals)
    out[PAIR] = pd.Categorical(out[PAIR], PAIR_NAMES, ordered=True)
    out[SPACE] = pd.Categorical(out[SPACE], list(Space.ALL), ordered=True)
    models = list(dict.fromkeys(long[MODEL]))
    sources = list(dict.fromkeys(long[TRIPLET_SOURCE]))
    out[MODEL] = pd.Categorical(out[MODEL], models, ordered=True)
    out[TRIPLET_SOURCE] = pd.Categorical(out[TRIPLET_SOURCE], sources, ordered=True)
    out = out.sort_values([MODEL, TRIPLET_SOURCE, PAIR, SPACE])
    for c in (MODEL, TRIPLET_SOURCE, PAIR, SPACE):
        out[c] = out[c].astype(str)
    return pa.Table.from_pandas(out[[f.name for f in DISPARITIES]], schema=DISPARITIES, preserve_index=False)


def with_intervals(disparities: pa.Table, intervals: Mapping) -> pa.Table:
    """``disparities`` with ``mean_low`` / ``mean_high`` from ``intervals``: {(model, source, pair,
    space): (low, high)} (a row not in it keeps nulls)."""
    keys = zip(*(disparities.column(c).to_pylist() for c in (MODEL, TRIPLET_SOURCE, PAIR, SPACE)))
    ends = [intervals.get(k, (None, None)) for k in keys]
    out = disparities
    for i, name in enumerate((low_column(MEAN), high_column(MEAN))):
        out = out.set_column(out.schema.get_field_index(name), name, pa.array([e[i] for e in ends], pa.float64()))
    return out


def table3(disparities: pa.Table) -> pd.DataFrame:
    """Table 3 / S3 shape: one row per (model, source, pair), one column per space (the mean) with
    its interval beside it (``<space>_low``, ``<space>_high``), and ``units`` (the units behind the
    row; the smallest over its spaces)."""
    df = disparities.to_pandas()
    if df.empty:
        return pd.DataFrame(columns=[MODEL, TRIPLET_SOURCE, PAIR, *Space.ALL, UNITS])
    index, ends = [MODEL, TRIPLET_SOURCE, PAIR], (low_column, high_column)
    order = pd.MultiIndex.from_frame(df[index].drop_duplicates())
    cube = df.set_index([*index, SPACE])[[MEAN, *(e(MEAN) for e in ends)]].unstack(SPACE).reindex(order)
    wide = pd.DataFrame(index=order)
    for space in [s for s in Space.ALL if s in cube[MEAN].columns]:
        wide[space] = cube[(MEAN, space)]
        for end in ends:
            wide[end(space)] = cube[(end(MEAN), space)]
    wide[UNITS] = df.groupby(index, sort=False)[UNITS].min()
    return wide.reset_index()


def closer_to(s_nf: float, s_nm: float, space: str) -> str:
    """RQ1 for one cell: which gendered set the neutral one is closer to."""
    if s_nf is None or s_nm is None or np.isnan(s_nf) or np.isnan(s_nm):
        return "n/a"
    gap = (s_nf - s_nm) if space in Space.LOWER_IS_CLOSER else (s_nm - s_nf)
    return "masculine" if gap > 0 else "feminine" if gap < 0 else "tie"


def direction_table(disparities: pa.Table, gaps: Mapping | None = None) -> pd.DataFrame:
    """Per (model, source, space): s(n,f), s(n,m), the gap and which set the neutral one is closer
    to, each value with its interval beside it (the pairs' from ``disparities``, the gap's from
    ``gaps``: {(model, source, space): (low, high)}; NaN where none)."""
    df = disparities.to_pandas()
    values = (NEUTRAL_FEMININE, NEUTRAL_MASCULINE, GAP)
    cols = [MODEL, TRIPLET_SOURCE, SPACE, *[c for v in values for c in (v, low_column(v), high_column(v))], CLOSER,
            UNITS]
    if df.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for (model, source, space), g in df.groupby([MODEL, TRIPLET_SOURCE, SPACE], sort=False):
        by_pair = g.set_index(PAIR)
        row = {MODEL: model, TRIPLET_SOURCE: source, SPACE: space}
        for pair in (NEUTRAL_FEMININE, NEUTRAL_MASCULINE):
            for c, name in ((MEAN, pair), (low_column(MEAN), low_column(pair)), (high_column(MEAN), high_column(pair))):
                row[name] = float(by_pair[c].get(pair, np.nan)) if c in by_pair else np.nan
        nf, nm = row[NEUTRAL_FEMININE], row[NEUTRAL_MASCULINE]
        low, high = (gaps or {}).get((model, source, space), (None, None))
        row |= {GAP: (nf - nm) if space in Space.LOWER_IS_CLOSER else (nm - nf),
                low_column(GAP): np.nan if low is None else low, high_column(GAP): np.nan if high is None else high,
                CLOSER: closer_to(nf, nm, space), UNITS: int(by_pair[UNITS].min())}
        rows.append(row)
    out = pd.DataFrame(rows, columns=cols)
    out[SPACE] = pd.Categorical(out[SPACE], list(Space.ALL), ordered=True)
    return out.sort_values([MODEL, TRIPLET_SOURCE, SPACE], kind="stable").assign(
        **{SPACE: lambda d: d[SPACE].astype(str)}).reset_index(drop=True)


def summary(disparities: pa.Table) -> dict:
    """metrics.json's results: Table 3 rows and the RQ1 answers, per model and source."""
    directions = direction_table(disparities)
    out: dict = {}
    for rec in table3(disparities).to_dict("records"):
        cell = out.setdefault(rec[MODEL], {}).setdefault(rec[TRIPLET_SOURCE], {"pairs": {}, "closer_to": {}})
        cell["pairs"][rec[PAIR]] = {k: (None if pd.isna(v) else float(v)) for k, v in rec.items()
                                    if k in Space.ALL}
        cell["pairs"][rec[PAIR]][UNITS] = int(rec[UNITS])
    for rec in directions.to_dict("records"):
        out[rec[MODEL]][rec[TRIPLET_SOURCE]]["closer_to"][rec[SPACE]] = rec[CLOSER]
    return out

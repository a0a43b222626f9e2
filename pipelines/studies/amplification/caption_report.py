"""Per-occupation tables of the caption side, computed from bounded inputs (subsets, group stats)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from schemas.captions import CAPTION_GENDER, OCCUPATION, CaptionGender
from schemas.subsets import (
    MATCHED_CAPTIONS,
    OCCUPATION_STATS,
    SIMILARITY,
    SIMILARITY_SUMMARY,
    SUBSET,
    Subset,
)


def partial_occupation_stats(batch: pa.Table) -> pa.Table:
    """Caption and indicator counts per occupation of one batch of annotated captions (at most one
    row per occupation). The counts are sums, so partials of any batching add up to the totals
    (``combine_occupation_stats``): no shuffle, and no worker ever holds one occupation's captions."""
    g = batch.column(CAPTION_GENDER)
    one = pa.scalar(1, pa.int64())
    zero = pa.scalar(0, pa.int64())
    flags = {
        MATCHED_CAPTIONS: pa.array([1] * batch.num_rows, pa.int64()) if batch.num_rows else pa.array([], pa.int64()),
        "female_indicator_captions": pc.if_else(pc.is_in(g, pa.array([CaptionGender.FEMALE, CaptionGender.BOTH])), one, zero),
        "male_indicator_captions": pc.if_else(pc.is_in(g, pa.array([CaptionGender.MALE, CaptionGender.BOTH])), one, zero),
        "any_indicator_captions": pc.if_else(pc.not_equal(g, CaptionGender.NONE), one, zero),
    }
    return _sum_by_occupation(pa.table({OCCUPATION: batch.column(OCCUPATION), **flags}))


def combine_occupation_stats(parts: list[pa.Table]) -> pa.Table:
    """The totals per occupation from partial counts (OCCUPATION_STATS, sorted by occupation)."""
    parts = [p.select(OCCUPATION_STATS.names).cast(OCCUPATION_STATS) for p in parts if p.num_rows]
    if not parts:
        return OCCUPATION_STATS.empty_table()
    return _sum_by_occupation(pa.concat_tables(parts))


def _sum_by_occupation(table: pa.Table) -> pa.Table:
    counts = [n for n in OCCUPATION_STATS.names if n != OCCUPATION]
    out = table.group_by(OCCUPATION, use_threads=False).aggregate([(c, "sum") for c in counts])
    out = out.rename_columns([c[:-4] if c.endswith("_sum") else c for c in out.column_names])
    # a null caption_gender counts as no indicator (sums skip nulls; an all-null group sums to null)
    out = pa.table({n: (pc.fill_null(out.column(n), 0) if n != OCCUPATION else out.column(n))
                    for n in OCCUPATION_STATS.names}).cast(OCCUPATION_STATS)
    return out.sort_by(OCCUPATION)


def similarity_summary(stats: pa.Table | None, subsets: pa.Table, occupations) -> pa.Table:
    """One row per configured occupation (also those no caption names), SIMILARITY_SUMMARY schema."""
    by_occ = {}
    if stats is not None:
        for row in stats.to_pylist():
            by_occ[row[OCCUPATION]] = row
    sims: dict[tuple[str, str], list[float]] = {}
    for occ, sub, sim in zip(subsets.column(OCCUPATION).to_pylist(), subsets.column(SUBSET).to_pylist(),
                             subsets.column(SIMILARITY).to_pylist()):
        sims.setdefault((occ, sub), []).append(sim)
    rows = []
    for o in occupations:
        st = by_occ.get(o.name, {})
        n = st.get(MATCHED_CAPTIONS, 0)
        rnd, nn = sims.get((o.name, Subset.NAIVE), []), sims.get((o.name, Subset.NN), [])
        rows.append(
            {
                OCCUPATION: o.name,
                MATCHED_CAPTIONS: n,
                "random_sample_size": len(rnd),
                "random_mean_cosine": sum(rnd) / len(rnd) if rnd else None,
                "nn_selected": len(nn),
                "nn_mean_cosine": sum(nn) / len(nn) if nn else None,
                "female_indicator_share": st["female_indicator_captions"] / n if n else None,
                "male_indicator_share": st["male_indicator_captions"] / n if n else None,
                "any_indicator_share": st["any_indicator_captions"] / n if n else None,
            }
        )
    return pa.Table.from_pylist(rows, schema=SIMILARITY_SUMMARY)


def subset_sizes(subsets: pa.Table) -> dict[str, int]:
    if subsets.num_rows == 0:
        return {}
    vc = subsets.group_by(SUBSET).aggregate([(SUBSET, "count")])
    return dict(zip(vc.column(SUBSET).to_pylist(), vc.column(f"{SUBSET}_count").to_pylist()))


def headline(sim: pa.Table) -> dict:
    """Means over occupations of the similarity summary: the numbers a reader compares with §5.2."""
    def mean(col):
        v = pc.mean(sim.column(col)).as_py() if sim.num_rows else None
        return None if v is None else round(v, 4)

    return {
        "occupations_with_captions": int(pc.sum(pc.greater(sim.column(MATCHED_CAPTIONS), 0)).as_py() or 0),
        "random_mean_cosine": mean("random_mean_cosine"),
        "nn_mean_cosine": mean("nn_mean_cosine"),
        "female_indicator_share_mean": mean("female_indicator_share"),
        "any_indicator_share_mean": mean("any_indicator_share"),
    }


def print_caption_report(summary_text: str, output: str, annotated_rows: int, subsets: pa.Table,
                         sizes: dict, head: dict, files: dict, brief: bool = False) -> None:
    """The caption side's console result; ``brief`` (inside `run`, whose run summary at the end
    has the stage counts): the subsets and the SBERT contrast only."""
    if brief:
        print(f"training subsets: {subsets.num_rows:,} rows (" + ", ".join(f"{s} {n:,}" for s, n in sizes.items())
              + f") of {annotated_rows:,} annotated captions")
    else:
        print(summary_text)
        print()
        print(f"annotated captions : {annotated_rows:,} rows (one per caption and occupation) -> "
              f"{output}/{files['annotated']}/")
        print(f"training subsets   : {subsets.num_rows:,} rows -> {output}/{files['subsets']}")
        for s, n in sizes.items():
            print(f"    {s:<18} {n:>8,}")
    if head["random_mean_cosine"] is not None:
        print(f"caption-prompt SBERT cosine, mean over occupations: random sample {head['random_mean_cosine']:.3f}, "
              f"nearest neighbours {head['nn_mean_cosine']:.3f} (paper 002 on LAION: 0.385 vs 0.704)")
    if not brief:
        print(f"metrics and configuration -> {output}/{files['metrics']}")

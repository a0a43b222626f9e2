"""Per-occupation tables of the caption side, computed from bounded inputs (subsets, group stats)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from schemas.captions import CAPTION_GENDER, OCCUPATION, CaptionGender
from schemas.subsets import (
    OCCUPATION_STATS,
    SIMILARITY,
    SIMILARITY_SUMMARY,
    SUBSET,
    Subset,
)


def occupation_stats(group: pa.Table) -> pa.Table:
    """Caption and indicator counts of one occupation's annotated captions (a Ray map_groups fn)."""
    g = group.column(CAPTION_GENDER)
    female = pc.sum(pc.is_in(g, pa.array([CaptionGender.FEMALE, CaptionGender.BOTH]))).as_py() or 0
    male = pc.sum(pc.is_in(g, pa.array([CaptionGender.MALE, CaptionGender.BOTH]))).as_py() or 0
    anyind = pc.sum(pc.not_equal(g, CaptionGender.NONE)).as_py() or 0
    return pa.table(
        {
            OCCUPATION: [group.column(OCCUPATION)[0].as_py()],
            "matched_captions": [group.num_rows],
            "female_indicator_captions": [female],
            "male_indicator_captions": [male],
            "any_indicator_captions": [anyind],
        },
        schema=OCCUPATION_STATS,
    )


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
        n = st.get("matched_captions", 0)
        rnd, nn = sims.get((o.name, Subset.NAIVE), []), sims.get((o.name, Subset.NN), [])
        rows.append(
            {
                OCCUPATION: o.name,
                "matched_captions": n,
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
        "occupations_with_captions": int(pc.sum(pc.greater(sim.column("matched_captions"), 0)).as_py() or 0),
        "random_mean_cosine": mean("random_mean_cosine"),
        "nn_mean_cosine": mean("nn_mean_cosine"),
        "female_indicator_share_mean": mean("female_indicator_share"),
        "any_indicator_share_mean": mean("any_indicator_share"),
    }


def print_caption_report(summary_text: str, output: str, annotated_rows: int, subsets: pa.Table,
                         sizes: dict, head: dict, files: dict) -> None:
    print(summary_text)
    print()
    print(f"annotated captions : {annotated_rows:,} rows (one per caption and occupation) -> {output}/{files['annotated']}/")
    print(f"training subsets   : {subsets.num_rows:,} rows -> {output}/{files['subsets']}")
    for s, n in sizes.items():
        print(f"    {s:<18} {n:>8,}")
    if head["random_mean_cosine"] is not None:
        print(f"caption-prompt SBERT cosine, mean over occupations: random sample {head['random_mean_cosine']:.3f}, "
              f"nearest neighbours {head['nn_mean_cosine']:.3f} (paper 002 on LAION: 0.385 vs 0.704)")
    print(f"metrics and configuration -> {output}/{files['metrics']}")

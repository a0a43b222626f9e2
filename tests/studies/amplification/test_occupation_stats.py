"""Per-occupation caption counts as a combinable aggregation: no shuffle, no occupation in one block.

At LAION scale "student" or "author" have tens of millions of matching captions; a group-by moves
every annotated caption and holds each occupation in one block just to count four numbers.
"""

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from pipelines.studies.amplification import caption_report as report
from schemas.captions import CAPTION_GENDER, OCCUPATION, CaptionGender
from schemas.subsets import OCCUPATION_STATS

GENDERS = [CaptionGender.NONE, CaptionGender.MALE, CaptionGender.FEMALE, CaptionGender.BOTH]


def skewed(n: int, seed: int = 0) -> pa.Table:
    """``n`` annotated captions, 90% of them of one occupation, some with a null caption gender."""
    rng = np.random.default_rng(seed)
    occ = np.where(rng.random(n) < 0.9, "student", rng.choice(["author", "nurse", "pilot"], n))
    gender = rng.choice(GENDERS, n).astype(object)
    gender[rng.random(n) < 0.01] = None
    return pa.table({OCCUPATION: pa.array(occ, pa.string()), CAPTION_GENDER: pa.array(gender, pa.string())})


def expected(table: pa.Table) -> pd.DataFrame:
    """The counts written out row by row (what the old one-group-per-occupation function computed)."""
    df = table.to_pandas()
    g = df[CAPTION_GENDER]
    rows = []
    for occ, part in df.groupby(OCCUPATION):
        gp = g[part.index]
        rows.append({OCCUPATION: occ, "matched_captions": len(part),
                     "female_indicator_captions": int(gp.isin([CaptionGender.FEMALE, CaptionGender.BOTH]).sum()),
                     "male_indicator_captions": int(gp.isin([CaptionGender.MALE, CaptionGender.BOTH]).sum()),
                     "any_indicator_captions": int((gp.notna() & (gp != CaptionGender.NONE)).sum())})
    return pd.DataFrame(rows).sort_values(OCCUPATION).reset_index(drop=True)


def test_partials_of_any_batching_add_up_to_the_totals():
    t = skewed(4_000)   # 400 rows of the three small occupations, ~40 null genders: every case, at batch size 1 too
    want = expected(t)
    assert {"author", "nurse", "pilot", "student"} <= set(want[OCCUPATION]) and t.column(CAPTION_GENDER).null_count
    for size in (1, 7, 1000, 4_000):
        parts = [report.partial_occupation_stats(t.slice(i, size)) for i in range(0, t.num_rows, size)]
        assert all(p.num_rows <= 4 for p in parts)  # at most one row per occupation leaves a batch
        got = report.combine_occupation_stats(parts)
        assert got.schema.equals(OCCUPATION_STATS)
        pd.testing.assert_frame_equal(got.to_pandas(), want, check_dtype=False)


def test_empty_and_all_null_inputs():
    assert report.combine_occupation_stats([]).num_rows == 0
    t = pa.table({OCCUPATION: ["nurse", "nurse"], CAPTION_GENDER: pa.array([None, None], pa.string())})
    row = report.combine_occupation_stats([report.partial_occupation_stats(t)]).to_pylist()
    assert row == [{OCCUPATION: "nurse", "matched_captions": 2, "female_indicator_captions": 0,
                    "male_indicator_captions": 0, "any_indicator_captions": 0}]


@pytest.mark.ray
def test_on_ray_without_a_shuffle(ray_local):
    from pipelines.studies.amplification import caption_selection

    t = skewed(200_000, seed=1)
    data = ray_local.data.from_arrow([t.slice(i, 10_000) for i in range(0, t.num_rows, 10_000)])
    got = caption_selection.occupation_stats(ray_local, data)
    pd.testing.assert_frame_equal(got.to_pandas(), expected(t), check_dtype=False)
    # the plan: map operators only (no group-by, shuffle, repartition or sort)
    op, names = caption_selection.partial_occupation_stats(data)._logical_plan.dag, []
    while op is not None:
        names.append(type(op).__name__)
        op = op.input_dependencies[0] if op.input_dependencies else None
    assert not [n for n in names if n in ("Aggregate", "Sort", "Repartition", "RandomShuffle", "Join")], names

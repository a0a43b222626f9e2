"""Representational disparities (papers 003/004, Eq. 1-2, Tables 3/S3) from hand-built per-image tables:
means over complete units only, the units behind each mean, PAIRS order, and RQ1's direction with
Diff. Pix. read as lower = closer."""

import numpy as np
import pyarrow as pa
import pytest

from operators.base import conform
from pipelines.studies.exposed import metrics as M
from schemas.exposed import (
    EXPOSED_IMAGES,
    MEAN,
    PAIR,
    PAIR_NAMES,
    SPACE,
    STD,
    TRIPLET_SOURCE,
    UNIT_ID,
    UNIT_STATUS,
    UNITS,
    VARIANT,
    Space,
    Variant,
    disparity_column,
)
from schemas.images import GENERATION_STATUS, MODEL


def images(units):
    """``units``: (model, source, unit id, status, {space: [nf, nm, fm]}) -> three rows each."""
    rows = []
    for model, source, uid, status, sims in units:
        for v in Variant.ALL:
            row = {MODEL: model, TRIPLET_SOURCE: source, UNIT_ID: uid, VARIANT: v, UNIT_STATUS: status,
                   GENERATION_STATUS: status}
            for space in Space.ALL:
                row[disparity_column(space)] = sims.get(space) if status == "ok" else None
            rows.append(row)
    return conform(pa.Table.from_pylist(rows), EXPOSED_IMAGES)


def test_means_count_only_complete_units_per_pair_and_space():
    t = images([
        ("sd14", "coco", "u1", "ok", {Space.PROMPT: [0.90, 0.94, 0.80], Space.SSIM: [0.5, 0.6, 0.4]}),
        ("sd14", "coco", "u2", "ok", {Space.PROMPT: [0.92, 0.96, 0.84]}),           # SSIM not measured here
        ("sd14", "coco", "u3", "nsfw_blocked", {Space.PROMPT: [0.0, 0.0, 0.0]}),    # left out
        ("sd14", "gcc", "u4", "ok", {Space.PROMPT: [0.5, 0.7, 0.6]}),
    ])
    d = M.disparity_table(t).to_pandas()
    coco = d[(d[TRIPLET_SOURCE] == "coco") & (d[SPACE] == Space.PROMPT)].set_index(PAIR)
    assert list(coco.index) == list(PAIR_NAMES)
    assert coco.loc["neutral-feminine", MEAN] == pytest.approx(0.91)
    assert coco.loc["neutral-masculine", MEAN] == pytest.approx(0.95)
    assert coco.loc["feminine-masculine", MEAN] == pytest.approx(0.82)
    assert coco.loc["neutral-feminine", STD] == pytest.approx(np.std([0.90, 0.92], ddof=1))
    assert set(coco[UNITS]) == {2}
    ssim = d[(d[TRIPLET_SOURCE] == "coco") & (d[SPACE] == Space.SSIM)]
    assert list(ssim[UNITS]) == [1, 1, 1] and list(ssim[MEAN]) == pytest.approx([0.5, 0.6, 0.4])
    gcc = d[d[TRIPLET_SOURCE] == "gcc"]
    assert list(gcc[UNITS]) == [1, 1, 1] and list(gcc[STD]) == [0.0, 0.0, 0.0]
    wide = M.table3(M.disparity_table(t))
    row = wide[(wide[TRIPLET_SOURCE] == "coco") & (wide[PAIR] == "neutral-masculine")].iloc[0]
    assert row[Space.PROMPT] == pytest.approx(0.95) and row[Space.SSIM] == pytest.approx(0.6) and row[UNITS] == 1


def test_direction_answers_rq1_per_cell_with_diff_pix_lower_is_closer():
    t = images([
        ("sd20", "gcc", "u1", "ok", {Space.PROMPT: [0.980, 0.982, 0.97], Space.DIFF_PIX: [39.0, 35.8, 40.0],
                                     Space.DINO: [0.60, 0.55, 0.5]}),
    ])
    d = M.direction_table(M.disparity_table(t)).set_index(SPACE)
    assert d.loc[Space.PROMPT, M.CLOSER] == "masculine" and d.loc[Space.PROMPT, M.GAP] == pytest.approx(0.002)
    # Table 3: Diff. Pix. 39.00 (n, f) vs 35.82 (n, m): fewer differing pixels to the masculine image
    assert d.loc[Space.DIFF_PIX, M.CLOSER] == "masculine" and d.loc[Space.DIFF_PIX, M.GAP] == pytest.approx(3.2)
    assert d.loc[Space.DINO, M.CLOSER] == "feminine"
    assert M.closer_to(0.5, 0.5, Space.CLIP) == "tie"
    assert M.closer_to(float("nan"), 0.5, Space.CLIP) == "n/a"


def test_table3_of_the_paper_answers_masculine_everywhere():
    """Table 3 (GCC, SD v1.4): every space says neutral is closer to masculine."""
    nf = {Space.PROMPT: 0.909, Space.DENOISING: 0.770, Space.SSIM: 0.516, Space.DIFF_PIX: 42.61, Space.RESNET: 0.848,
          Space.CLIP: 0.794, Space.DINO: 0.543, Space.SPLIT_PRODUCT: 0.956}
    nm = {Space.PROMPT: 0.931, Space.DENOISING: 0.798, Space.SSIM: 0.543, Space.DIFF_PIX: 39.34, Space.RESNET: 0.859,
          Space.CLIP: 0.808, Space.DINO: 0.576, Space.SPLIT_PRODUCT: 0.961}
    t = images([("sd14", "gcc", "u", "ok", {s: [nf[s], nm[s], 0.0] for s in nf})])   # the paper's eight spaces
    d = M.direction_table(M.disparity_table(t))
    assert set(d[M.CLOSER]) == {"masculine"} and len(d) == len(nf)
    s = M.summary(M.disparity_table(t))
    assert s["sd14"]["gcc"]["closer_to"][Space.DIFF_PIX] == "masculine"
    assert s["sd14"]["gcc"]["pairs"]["neutral-masculine"][Space.CLIP] == pytest.approx(0.808)


def test_no_complete_unit_gives_empty_tables():
    t = images([("m", "coco", "u1", "generation_error", {})])
    assert M.disparity_table(t).num_rows == 0
    assert M.table3(M.disparity_table(t)).empty and M.direction_table(M.disparity_table(t)).empty

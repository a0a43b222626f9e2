"""The headline numbers of Stable Diffusion Exposed on hand-built per-image tables: each
metric's weighted mean over triplets is the number the tables report (Table 3's means, the RQ1 gap,
Table 4's s_O), triplets are the resampled units (weights: their measured seeds), the intervals
reach the tables, and the protocol names what two comparable runs share (not the generators)."""

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from operators.base import conform
from pipelines import exposed
from pipelines.engine.stats import headline as HL
from pipelines.engine.stats.intervals import IntervalSettings
from pipelines.studies.exposed import headline_metrics as HM
from pipelines.studies.exposed import metrics as M
from pipelines.studies.exposed import objects as O
from pipelines.studies.exposed import study
from schemas.exposed import (
    DETECTION_STATUS,
    EXPOSED_IMAGES,
    MEAN,
    OBJECT,
    PAIR,
    PAIR_NAMES,
    SPACE,
    TRIPLET_ID,
    TRIPLET_SOURCE,
    UNIT_ID,
    UNIT_STATUS,
    VARIANT,
    Space,
    Variant,
    disparity_column,
    high_column,
    low_column,
)
from schemas.images import GENERATION_STATUS, MODEL

SETTINGS = IntervalSettings(resamples=200, seed=3)
RNG = np.random.default_rng(0)


def unit_rows(model, source, triplet, seed, status="ok"):
    sims = {s: sorted(RNG.uniform(0.2, 0.9, 3)) for s in (Space.PROMPT, Space.DIFF_PIX, Space.CLIP)}
    return [{MODEL: model, TRIPLET_SOURCE: source, TRIPLET_ID: triplet, UNIT_ID: f"{triplet}-s{seed}", VARIANT: v,
             UNIT_STATUS: status, GENERATION_STATUS: status, DETECTION_STATUS: "ok" if status == "ok" else "no_image",
             **{disparity_column(s): (x if status == "ok" else None) for s, x in sims.items()}} for v in Variant.ALL]


def images():
    """Two models; gcc: three triplets with 1-3 seeds (unequal weights), coco: two triplets with one
    seed each; one incomplete unit (left out)."""
    rows = []
    for model in ("m1", "m2"):
        for t, seeds in (("gcc-01", 3), ("gcc-02", 1), ("gcc-03", 2)):
            for k in range(seeds):
                rows += unit_rows(model, "gcc", t, k)
        rows += unit_rows(model, "coco", "coco-01", 0) + unit_rows(model, "coco", "coco-02", 0)
    rows += unit_rows("m2", "gcc", "gcc-02", 1, status="nsfw_blocked")
    return conform(pa.Table.from_pylist(rows), EXPOSED_IMAGES)


def objects_of(imgs: pd.DataFrame) -> pd.DataFrame:
    """One to three random detections per analysed image, none at all in the unit gcc-03-s1."""
    rows = []
    for _, r in imgs[imgs[GENERATION_STATUS] == "ok"].iterrows():
        if r[UNIT_ID] == "gcc-03-s1":
            continue
        for obj in RNG.choice(["hat", "tie", "dress", "tree"], size=RNG.integers(1, 4)):
            rows.append({MODEL: r[MODEL], TRIPLET_SOURCE: r[TRIPLET_SOURCE], UNIT_ID: r[UNIT_ID],
                         VARIANT: r[VARIANT], OBJECT: str(obj)})
    return pd.DataFrame(rows, columns=[MODEL, TRIPLET_SOURCE, UNIT_ID, VARIANT, OBJECT])


@pytest.fixture(scope="module")
def built():
    t = images()
    imgs = t.to_pandas()
    found = objects_of(imgs)
    cosines = O.unit_cosines(found, imgs)
    long = M.pair_values(t)
    subjects = HM.subjects(imgs, long, cosines, [{"role": "generator", "model": "m1", "detail": {}}], ["m1", "m2"])
    head = HL.summarize("paper004-exposed", subjects, {}, SETTINGS, True)
    return t, imgs, found, cosines, subjects, head


def weighted(metric: HL.Metric) -> float:
    return float(np.average(metric.values, weights=metric.weights))


def test_each_metric_is_the_weighted_mean_over_triplets_of_the_reported_number(built):
    t, imgs, found, cosines, subjects, _ = built
    disparities = M.disparity_table(t).to_pandas().set_index([MODEL, TRIPLET_SOURCE, PAIR, SPACE])[MEAN]
    direction = M.direction_table(M.disparity_table(t)).set_index([MODEL, TRIPLET_SOURCE, SPACE])[M.GAP]
    table4 = O.cooccurrence_similarity(found, imgs).set_index([MODEL, TRIPLET_SOURCE, PAIR])["s_o"]
    seen = set()
    for model, subject in zip(("m1", "m2"), subjects):
        for m in subject.metrics:
            kind, source, *rest = m.key.split("/")
            seen.add(kind)
            if kind == "disparity":
                expected = disparities[(model, source, rest[1], rest[0])]
            elif kind == "gap":
                expected = direction[(model, source, rest[0])]
            else:
                expected = table4[(model, source, rest[0])]
            assert weighted(m) == pytest.approx(expected, abs=1e-12), m.key
    assert seen == {"disparity", "gap", "s_o"}
    # every Table 3 cell and every Table 4 row has its metric
    assert sum(k.startswith("disparity/") for s in subjects for k in (m.key for m in s.metrics)) == len(disparities)
    assert sum(m.key.startswith("s_o/") for s in subjects for m in s.metrics) == table4.notna().sum()


def test_triplets_are_the_units_weighted_by_their_measured_seeds(built):
    _, _, _, _, subjects, _ = built
    m1, m2 = ({m.key: m for m in s.metrics} for s in subjects)
    prompt = m1[HM.disparity_key("gcc", Space.PROMPT, PAIR_NAMES[0])]
    assert dict(zip(prompt.units, prompt.weights)) == {"gcc-01": 3, "gcc-02": 1, "gcc-03": 2}
    assert prompt.unit == "triplet" and prompt.better == "higher"
    # m2's incomplete second seed of gcc-02 is left out: one measured seed
    assert dict(zip(m2[HM.gap_key("gcc", Space.PROMPT)].units, m2[HM.gap_key("gcc", Space.PROMPT)].weights))["gcc-02"] == 1
    assert subjects[1].excluded["incomplete units (nsfw_blocked)"] == 1 and "incomplete units" not in str(
        subjects[0].excluded)
    assert m1[HM.gap_key("gcc", Space.PROMPT)].better == "zero"
    assert m1[HM.disparity_key("gcc", Space.DIFF_PIX, PAIR_NAMES[1])].better == "lower"
    # s_O: gcc-03's second seed detected nothing in any image, so gcc-03 counts one seed
    s_o = m1[HM.s_o_key("gcc", PAIR_NAMES[0])]
    assert dict(zip(s_o.units, s_o.weights)) == {"gcc-01": 3, "gcc-02": 1, "gcc-03": 1}
    assert subjects[0].excluded["s_O pairs with nothing detected in either image"] == 3
    assert subjects[0].images == 3 * 8 and subjects[1].images == 3 * 8
    # the recorded generator's identity, a bare one for a model without a record
    assert subjects[0].identity != subjects[1].identity


def test_a_source_of_one_triplet_resamples_its_seeds():
    """§7's intra-prompt experiment (one caption, many seeds): the seeds are the sample."""
    rows = [r for k in range(4) for r in unit_rows("m1", "intra", "intra-01", k)]
    rows += [r for t in ("gcc-01", "gcc-02") for r in unit_rows("m1", "gcc", t, 0)]
    t = conform(pa.Table.from_pylist(rows), EXPOSED_IMAGES)
    metrics = {m.key: m for m in HM.subjects(t.to_pandas(), M.pair_values(t), None, [], ["m1"])[0].metrics}
    intra, gcc = metrics[HM.gap_key("intra", Space.CLIP)], metrics[HM.gap_key("gcc", Space.CLIP)]
    assert intra.unit == "seed" and intra.units == [f"intra-01-s{k}" for k in range(4)] and intra.weights == [1.0] * 4
    assert gcc.unit == "triplet" and gcc.units == ["gcc-01", "gcc-02"]
    assert intra.interval(SETTINGS).low is not None


def test_the_intervals_reach_the_tables(built):
    t, imgs, found, cosines, _, head = built
    ends = HM.intervals(head, ["m1", "m2"])
    d = M.with_intervals(M.disparity_table(t), HM.disparity_intervals(ends)).to_pandas()
    assert d[low_column(MEAN)].notna().all() and (d[low_column(MEAN)] <= d[MEAN] + 1e-12).all()
    assert (d[MEAN] <= d[high_column(MEAN)] + 1e-12).all()
    row = d[(d[MODEL] == "m2") & (d[TRIPLET_SOURCE] == "coco") & (d[PAIR] == PAIR_NAMES[2]) & (d[SPACE] == Space.CLIP)]
    m = next(x for x in head["subjects"][1]["metrics"] if x["key"] == HM.disparity_key("coco", Space.CLIP, PAIR_NAMES[2]))
    assert (row[low_column(MEAN)].iloc[0], row[high_column(MEAN)].iloc[0]) == (m["low"], m["high"])
    wide = M.table3(M.with_intervals(M.disparity_table(t), HM.disparity_intervals(ends)))
    for space in (Space.PROMPT, Space.DIFF_PIX, Space.CLIP):
        assert list(wide.columns).index(low_column(space)) == list(wide.columns).index(space) + 1
        assert (wide[low_column(space)] <= wide[space] + 1e-12).all() and (wide[space] <= wide[high_column(space)] + 1e-12).all()
    direction = M.direction_table(M.with_intervals(M.disparity_table(t), HM.disparity_intervals(ends)),
                                  HM.gap_intervals(ends))
    assert direction[low_column(M.GAP)].notna().all()
    assert ((direction[low_column(M.GAP)] <= direction[M.GAP] + 1e-12) & (direction[M.GAP] <= direction[high_column(M.GAP)] + 1e-12)).all()
    table4 = HM.with_s_o_intervals(O.cooccurrence_similarity(found, imgs, cosines), ends)
    at = list(table4.columns).index("s_o")
    assert list(table4.columns)[at + 1:at + 3] == ["s_o_low", "s_o_high"] and table4["s_o_low"].notna().any()
    cells = HM.interval_cells(table4, ("s_o",))
    assert cells["s_o"].str.fullmatch(r"\d\.\d{3} \[\d\.\d{3}, \d\.\d{3}\]").all() and "s_o_low" not in cells


def test_the_lead_numbers_are_the_gaps_and_table_4s_pairs(built):
    head = built[-1]
    lead = HM.lead_headline(head)
    keys = {m["key"].split("/")[0] for s in lead["subjects"] for m in s["metrics"]}
    assert keys == {"gap", "s_o"}
    assert not any(m["key"].endswith(PAIR_NAMES[2]) for s in lead["subjects"] for m in s["metrics"])
    text = HM.format_headline(head, {"m1": "A", "m2": "B"})
    assert "RQ1 gap, prompt (t), gcc" in text and " [" in text and "triplets" in text


def _settings(*flags):
    args = exposed.build_parser().parse_args(["run", "--output", "unused", "--max-triplets", "2", "--per-topic", "1",
                                              *flags])
    return study.ExposedStudy().settings(args)


def test_protocol_names_the_triplets_and_seeds_not_the_generators(tmp_path):
    base = study.headline_protocol(_settings("--generators", "CompVis/stable-diffusion-v1-4"))
    other_model = study.headline_protocol(_settings("--generators", "stabilityai/stable-diffusion-2-base", "--steps", "20"))
    assert base == other_model
    assert base["study"] == "paper004-exposed" and base["resampled_unit"].startswith("triplet")
    assert study.headline_protocol(_settings("--generation-seed", "7")) != base
    assert study.headline_protocol(_settings("--seeds-per-triplet", "profession=2")) != base
    assert study.headline_protocol(_settings("--per-topic", "2")) != base
    # stand-in models live in each run's own directory: their paths are written relative to it
    root = str(tmp_path / "standin_models")
    portable = study._portable({"a": [f"{root}/resnet", "x", 3], "b": {"c": f"local-dir:{root}/clip"}}, root)
    assert portable == {"a": ["<stand-ins>/resnet", "x", 3], "b": {"c": "local-dir:<stand-ins>/clip"}}

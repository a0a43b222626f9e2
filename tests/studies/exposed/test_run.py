"""`pipelines/exposed.py run` end to end on a local Ray instance with tiny random models (three
generators, ResNet, CLIP, DINO S/16 and B/8 built from the real classes and loaded through the
production path): files, units and seeds, three rows per unit, Table 3 recomputed from the per-image
table, the shared text encoder of the v2.0 / v2.1 stand-ins, objects and dependency groups with
their tables (tiny GroundingDINO and SAM), the report, and a resume after the driver is killed
midway."""

import contextlib
import io
import json

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from pipelines import exposed
from pipelines.engine.report.page import STANDIN_CONSOLE
from pipelines.studies.exposed import metrics as M
from schemas.exposed import PAIR_NAMES, Space, disparity_column

pytestmark = pytest.mark.ray

# flagged images recorded, not left out: every unit measured (the exclusion: test_model_families_run.py)
# two triplets per source, so each headline number has an interval over triplets
ARGS = ["--standin-models", "--max-triplets", "2", "--per-topic", "1", "--seeds-per-triplet", "profession=3",
        "--steps", "2", "--run-id", "r", "--no-exclude-nsfw", "--no-progress", "--interval-resamples", "500"]
UNITS = 2 + 2 * 3        # two sample caption triplets x 1 seed, two profession triplets x 3 seeds


@pytest.fixture(scope="module")
def run(tmp_path_factory, ray_local):
    out = tmp_path_factory.mktemp("exposed")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert exposed.main(["run", "--output", str(out), *ARGS]) == 0
    (out / "printed.txt").write_text(printed.getvalue())
    return out / "r"


def test_run_writes_tables_report_and_records(run):
    for name in ("triplets.parquet", "triplet_counts.csv", "images.parquet", "images.csv", "disparities.csv",
                 "table3_disparities.csv", "rq1_direction.csv", "metrics.json", "report.html", "run_summary.csv",
                 "run.json"):
        assert (run / name).is_file(), name
    m = json.loads((run / "metrics.json").read_text())
    assert m["study"] == "paper004-exposed"
    assert m["triplets"]["units"] == UNITS and m["images"]["requested_per_generator"] == 3 * UNITS
    assert m["images"]["generation_status"] == {"ok": 3 * 3 * UNITS}
    roles = [r["role"] for r in m["models"]]
    assert roles.count("generator") == 3
    assert {"disparity (ssim, diff_pix)", "disparity (resnet)", "disparity (clip)", "disparity (dino)",
            "disparity (split_product)"} <= set(roles)
    page = (run / "report.html").read_text()
    assert "Stand-in models" in page and "spaces_" in page and "Example triplets" in page
    # the example triplets' saved images embedded (downscaled), not linked: the page is self-contained
    assert "<img src='data:image/jpeg;base64," in page and "<img src='images/" not in page
    summary = pd.read_csv(run / "run_summary.csv")
    assert {"triplet filter", "units (x seeds)", "generate", "disparities (units)"} <= set(summary["stage"])
    filt = summary[summary["stage"] == "triplet filter"].set_index("branch")
    assert filt.loc["triplets: sample", "rows_in"] == 24      # every line of the bundled sample counted
    sample = summary[summary["branch"] == "triplets: sample"].set_index("stage")
    assert sample.loc["triplet filter", "kept"] == sample.loc["max triplets", "rows_in"] == 15
    assert sample.loc["max triplets", "kept"] == sample.loc["units (x seeds)", "rows_in"] == 2
    prof = summary[summary["branch"] == "triplets: profession"].set_index("stage")
    assert (prof.loc["triplet filter", "kept"], prof.loc["units (x seeds)", "kept"]) == (16, 6)
    for _, r in summary[summary["branch"].str.startswith("generated")].iterrows():
        expected = 3 * UNITS if r["stage"] in ("generate", "objects + groups") else UNITS
        assert r["rows_in"] == expected and r["kept"] + r["dropped"] == expected, r.to_dict()


def test_units_share_one_seed_and_images_are_saved(run):
    images = pq.read_table(run / "images.parquet").to_pandas()
    assert len(images) == 3 * 3 * UNITS
    for _, g in images.groupby(["model", "unit_id"]):
        assert sorted(g["variant"]) == ["feminine", "masculine", "neutral"]
        assert g["seed"].nunique() == 1
        for space in Space.ALL:
            values = g[disparity_column(space)].tolist()
            assert all(len(v) == 3 for v in values) and all(np.allclose(v, values[0]) for v in values)
    # the same unit has the same seed under every generator (seeds never depend on the model)
    assert images.groupby("unit_id")["seed"].nunique().max() == 1
    saved = list((run / "images").rglob("*.png"))
    assert len(saved) == len(images)


def test_table3_recomputed_from_the_per_image_table(run):
    images = pq.read_table(run / "images.parquet")
    table3 = pd.read_csv(run / "table3_disparities.csv")
    df = images.to_pandas()
    neutral = df[df["variant"] == "neutral"]
    for _, row in table3.iterrows():
        mine = neutral[(neutral["model"] == row["model"]) & (neutral["triplet_source"] == row["triplet_source"])]
        k = list(PAIR_NAMES).index(row["pair"])
        for space in Space.ALL:
            expected = np.mean([v[k] for v in mine[disparity_column(space)]])
            assert row[space] == pytest.approx(expected, abs=1e-9)
        assert row["units"] == len(mine)
    direction = pd.read_csv(run / "rq1_direction.csv")
    assert set(direction["closer_to"]) <= {"masculine", "feminine", "tie"}
    assert len(direction) == 3 * 2 * len(Space.ALL)


def test_standins_sharing_a_text_encoder_agree_in_the_prompt_space(run):
    """Stand-ins 2 and 3 play SD v2.0 and v2.1, which share OpenCLIP-H: equal prompt-space columns."""
    table3 = pd.read_csv(run / "table3_disparities.csv")
    models = list(dict.fromkeys(table3["model"]))
    by = {m: table3[table3["model"] == m].sort_values(["triplet_source", "pair"]) for m in models}
    assert np.allclose(by[models[1]]["prompt"], by[models[2]]["prompt"], atol=1e-9)
    assert not np.allclose(by[models[0]]["prompt"], by[models[1]]["prompt"], atol=1e-4)
    assert not np.allclose(by[models[1]]["denoising"], by[models[2]]["denoising"], atol=1e-9)


def test_headline_numbers_with_intervals_over_triplets(run):
    """metrics.json's headline: per generator, Table 3's means, the RQ1 gaps and s_O, each the
    weighted mean of its triplets in headline_units.parquet, with an interval that contains it; the
    same intervals beside the values in the CSVs, the page's opening box and the printed results."""
    m = json.loads((run / "metrics.json").read_text())
    h = m["headline"]
    assert h["study"] == "paper004-exposed" and h["standin"] and h["interval"]["resamples"] == 500
    assert h["protocol"]["resampled_unit"].startswith("triplet") and h["protocol"]["seeds_per_triplet"]["profession"] == 3
    assert "standin_models" not in json.dumps(h["protocol"])     # stand-in paths written relative to the run
    generators = [r for r in m["models"] if r["role"] == "generator"]
    assert [s["name"] for s in h["subjects"]] == [r["model"] for r in generators]
    assert len({s["key"] for s in h["subjects"]}) == 3
    units = pq.read_table(run / "headline_units.parquet").to_pandas()
    table3 = pd.read_csv(run / "table3_disparities.csv").set_index(["model", "triplet_source", "pair"])
    direction = pd.read_csv(run / "rq1_direction.csv").set_index(["model", "triplet_source", "space"])
    table4 = pd.read_csv(run / "table4_cooccurrence_similarity.csv").set_index(["model", "triplet_source", "pair"])
    kinds, with_interval = set(), 0
    for s in h["subjects"]:
        assert s["images"] == 3 * UNITS and s["kind"] == "model"
        for metric in s["metrics"]:
            mine = units[(units["subject"] == s["key"]) & (units["metric"] == metric["key"])]
            assert set(mine["unit"]) <= {"sample-0000000", "sample-0000001"} | {
                u for u in mine["unit"] if u.startswith("profession-")} and len(mine) == metric["n"] == 2
            assert np.average(mine["value"], weights=mine["weight"]) == pytest.approx(metric["value"], abs=1e-12)
            if metric["low"] is not None:
                with_interval += 1
                assert metric["low"] - 1e-12 <= metric["value"] <= metric["high"] + 1e-12, metric
            kind, source, *rest = metric["key"].split("/")
            kinds.add(kind)
            if kind == "disparity":
                space, pair = rest
                row = table3.loc[(s["name"], source, pair)]
                cols = (space, f"{space}_low", f"{space}_high")
            elif kind == "gap":
                row, cols = direction.loc[(s["name"], source, rest[0])], ("gap", "gap_low", "gap_high")
            else:
                row, cols = table4.loc[(s["name"], source, rest[0])], ("s_o", "s_o_low", "s_o_high")
            got = [None if pd.isna(row[c]) else float(row[c]) for c in cols]
            assert got == pytest.approx([metric["value"], metric["low"], metric["high"]], abs=1e-9), metric["key"]
        # a profession triplet counts its three seeds
        prof = units[(units["subject"] == s["key"]) & units["metric"].str.startswith("disparity/profession/")]
        assert set(prof["weight"]) == {3.0}
    assert kinds == {"disparity", "gap", "s_o"} and with_interval > 0
    disparities = pd.read_csv(run / "disparities.csv")
    assert list(disparities.columns[4:7]) == ["mean", "mean_low", "mean_high"] and disparities["mean_low"].notna().any()
    page = (run / "report.html").read_text()
    box = page[page.index("<section class=headline>"):page.index("</section>")]
    assert "headline-metrics" in box and "RQ1 gap" in box and "s_O(neutral, masculine)" in box and " [" in box
    printed = (run.parent / "printed.txt").read_text()
    assert "Headline numbers with 95% intervals" in printed and "RQ1 gap" in printed
    assert printed.index("Headline numbers") < printed.rindex(STANDIN_CONSOLE)   # the stand-in notice after them


OBJECT_FILES = ("objects.parquet", "objects.csv", "object_counts.csv", "object_chi2.csv",
                "table4_cooccurrence_similarity.csv", "bias_scores.csv", "group_counts.csv",
                "tables_s4_s6_group_chi2.csv", "table_s8_group_images.csv", "table_s9_group_objects.csv",
                "table_s10_group_intersections.csv", "group_bias_scores.csv")


def test_objects_groups_and_their_tables(run):
    """Sections 5-7: every image analysed on the generator's device; the object table is the images'
    lists exploded; bias scores and Table S8 recomputed from it; the report shows them."""
    for name in OBJECT_FILES:
        assert (run / name).is_file(), name
    images = pq.read_table(run / "images.parquet").to_pandas()
    assert set(images["detection_status"]) == {"ok"}
    objects = pq.read_table(run / "objects.parquet").to_pandas()
    found = objects[objects["dependency_group"] != "hidden"]
    assert len(found) == sum(len(x) for x in images["object_labels"]) > 0
    assert (objects["dependency_group"] == "hidden").sum() == sum(len(x) for x in images["hidden_nouns"])
    for _, r in images.iterrows():
        assert len(r["object_groups"]) == len(r["object_labels"]) == len(r["object_masks"])
        assert list(r["attention_words"]) == list(r["prompt_nouns"])
    # BS (Eq. 5) from the object table, with the configured minimum counts (profession 5, sample 5)
    bias = pd.read_csv(run / "bias_scores.csv")
    assert len(bias) > 0 and bias["bias_score"].between(0, 1).all()
    for _, b in bias.iterrows():
        mine = found[(found["model"] == b["model"]) & (found["triplet_source"] == b["triplet_source"])
                     & (found["object"] == b["object"])]
        c_m, c_f = (mine["variant"] == "masculine").sum(), (mine["variant"] == "feminine").sum()
        assert (b["masculine"], b["feminine"]) == (c_m, c_f) and max(c_m, c_f) >= 5
        n = images[(images["model"] == b["model"]) & (images["triplet_source"] == b["triplet_source"])]
        n_m, n_f = (n["variant"] == "masculine").sum(), (n["variant"] == "feminine").sum()
        assert b["bias_score"] == pytest.approx(c_m / (c_m + n_m / n_f * c_f))
    s8 = pd.read_csv(run / "table_s8_group_images.csv")
    for _, r in s8.iterrows():
        imgs = images[(images["model"] == r["model"]) & (images["triplet_source"] == r["triplet_source"])]
        assert r["images"] == len(imgs)
        with_hidden = sum(len(x) > 0 for x in imgs["hidden_nouns"])
        assert r["hidden"] == pytest.approx(100.0 * with_hidden / len(imgs))
    s4 = pd.read_csv(run / "tables_s4_s6_group_chi2.csv")
    assert set(s4["comparison"]) <= {"triplet", "neutral-feminine", "neutral-masculine", "feminine-masculine"}
    # the group tests (S4-S6) leave the individuals out (the prompt decides them by construction);
    # the RQ2 object tests and s_O keep them (a man detected in a neutral image is a measurement)
    from pipelines.studies.exposed import objects as O
    from schemas.exposed import INDIVIDUALS

    expected = O.group_chi_square_tests(objects[~objects["object"].isin(INDIVIDUALS)])
    expected = pd.read_csv(io.StringIO(expected.to_csv(index=False)))    # as the file holds it: None -> NaN
    pd.testing.assert_frame_equal(s4.reset_index(drop=True), expected, check_dtype=False)
    found = O.detected(objects)
    assert found["object"].isin(INDIVIDUALS).any()  # the stand-in run detects person words: the check bites
    rq2 = pd.read_csv(run / "object_chi2.csv")
    pd.testing.assert_frame_equal(rq2.reset_index(drop=True),
                                  O.chi_square_tests(O.cooccurrence(found)).reset_index(drop=True), check_dtype=False)
    without = O.chi_square_tests(O.cooccurrence(O.detected(objects[~objects["object"].isin(INDIVIDUALS)])))
    assert not rq2.reset_index(drop=True).equals(without.reset_index(drop=True))
    assert "object_masks" not in pd.read_csv(run / "images.csv", nrows=1).columns     # masks: parquet only
    assert "mask" not in pd.read_csv(run / "objects.csv", nrows=1).columns
    table4 = pd.read_csv(run / "table4_cooccurrence_similarity.csv")
    assert len(table4) == 3 * 2 * 3 and table4["s_o"].dropna().between(0, 1 + 1e-9).all()
    m = json.loads((run / "metrics.json").read_text())
    assert "objects" in m["results"] and m["objects"]["min_count"]["profession"] == 5
    assert any(r["role"].startswith("objects") for r in m["models"])
    page = (run / "report.html").read_text()
    assert "Prompt-image dependency groups" in page and "Table S10" in page and "objects_" in page
    assert "bias_implicitly_guided_" in page
    # Figure 4: the most frequent objects per group, recomputed from group_counts.csv, no individuals
    top = pd.read_csv(run / "figure4_top_objects.csv")
    pd.testing.assert_frame_equal(top, O.top_objects_per_group(pd.read_csv(run / "group_counts.csv")),
                                  check_dtype=False)
    assert not top["object"].isin(INDIVIDUALS).any() and len(top) > 0
    assert "Figure 4" in page and "figure4_" in page
    summary = pd.read_csv(run / "run_summary.csv")
    rows = summary[summary["stage"] == "objects + groups"]
    assert len(rows) == 3 and (rows["kept"] == 3 * UNITS).all()


def test_people_check_the_nouns_of_the_runs_images(run, tmp_path, capsys):
    """`t2i annotate plan --protocol exposed-nouns` (paper 004's human evaluation): analysed images
    with every prompt noun, the model's answer "yes" for a noun it found (not hidden); one person's
    answers imported; the both / model-only / people-only table recomputed from them."""
    from pipelines.annotate import cli
    from pipelines.annotate.tasks import TaskSet

    assert cli.main(["plan", str(run), "--protocol", "exposed-nouns", "--output", str(tmp_path / "t"), "--n", "6"]) == 0
    items = TaskSet.load(tmp_path / "t").items
    images = pq.read_table(run / "images.parquet").to_pandas().set_index(["model", "image_id"])
    assert items.groupby("model")["image_id"].nunique().sum() == 6
    for (model, image_id), part in items.groupby(["model", "image_id"]):
        row = images.loc[(model, image_id)]
        assert row["detection_status"] == "ok" and sorted(part["subject"]) == sorted(row["prompt_nouns"])
        hidden = set(row["hidden_nouns"])
        assert all((p == "no") == (n in hidden) for n, p in zip(part["subject"], part["prediction"]))
    # one person: says yes to every noun of even-numbered items
    answers = ["yes" if k % 2 == 0 else "no" for k in range(len(items))]
    pd.DataFrame({"item_id": items["item_id"], "annotator": "p1", "answer": answers}).to_csv(tmp_path / "l.csv",
                                                                                              index=False)
    assert cli.main(["import", str(tmp_path / "t"), str(tmp_path / "l.csv")]) == 0
    assert cli.main(["report", str(tmp_path / "t"), "--interval-resamples", "200"]) == 0
    doc = json.loads((tmp_path / "t" / "report" / "agreement.json").read_text())
    model, people = items["prediction"] == "yes", pd.Series(answers) == "yes"
    assert (doc["nouns"]["both"], doc["nouns"]["model_only"], doc["nouns"]["people_only"]) == (
        int((model & people).sum()), int((model & ~people).sum()), int((~model & people).sum()))
    assert doc["alpha"]["value"] is None and "n/a over 0 items" in capsys.readouterr().out   # one person: no alpha


def test_resume_after_a_kill_equals_an_uninterrupted_run(ray_local, tmp_path, capsys):
    """The run directory as a driver killed after its first checkpoint part leaves it (a copy taken
    then, during the uninterrupted run: helpers.SnapshotAtFirstPart), resumed: it generates only
    what the part lacks and ends with the uninterrupted run's tables."""
    from helpers import SnapshotAtFirstPart, resumed_counts

    args = ["--standin-models", "--no-captions", "--per-topic", "1", "--max-triplets", "3", "--steps", "2",
            "--generator", "one:family=unknown", "--gen-batch-size", "1", "--run-id", "k", "--no-progress",
            "--no-save-images",
            "--spaces", "ssim", "diff_pix", "dino"]
    out = tmp_path / "killed"     # both runs ran here: their stand-ins' paths (the model column) agree
    with SnapshotAtFirstPart(tmp_path / "at_first_part") as killed:
        assert exposed.main(["run", "--output", str(out), *args]) == 0
    assert 0 < killed.rows[0] < 3 * 15
    killed.swap(out / "k", tmp_path / "clean" / "k")
    assert json.loads((out / "k" / "run.json").read_text())["status"] == "running"
    assert not (out / "k" / "images.parquet").exists()
    capsys.readouterr()
    assert exposed.main(["run", "--output", str(out), *args]) == 0
    reused, total, now = resumed_counts(capsys.readouterr().out)
    assert reused == killed.rows[0] and now > 0 and reused + now == total      # only the rest generated
    a = pq.read_table(tmp_path / "clean" / "k" / "images.parquet").to_pandas()
    b = pq.read_table(out / "k" / "images.parquet").to_pandas()
    assert list(a["image_id"]) == list(b["image_id"]) and list(a["seed"]) == list(b["seed"])
    # the same images flagged and left out (their units unmeasured) in both runs
    assert list(a["generation_status"]) == list(b["generation_status"]) and list(a["nsfw"]) == list(b["nsfw"])
    for space in (Space.PROMPT, Space.PROMPT_POOLED, Space.DENOISING, Space.SSIM, Space.DIFF_PIX, Space.DINO):
        for x, y in zip(a[disparity_column(space)], b[disparity_column(space)]):
            assert (x is None) == (y is None) and (x is None or np.allclose(x, y, atol=1e-9)), space
    t_clean, t_killed = (pd.read_csv(tmp_path / d / "k" / "table3_disparities.csv") for d in ("clean", "killed"))
    pd.testing.assert_frame_equal(t_clean, t_killed)
    assert M.CLOSER in pd.read_csv(tmp_path / "killed" / "k" / "rq1_direction.csv").columns
    # the objects, masks and groups of the resumed run equal the uninterrupted run's
    for col in ("prompt_nouns", "object_labels", "object_groups", "hidden_nouns", "attention_words"):
        assert [None if x is None else list(x) for x in a[col]] == [None if x is None else list(x) for x in b[col]], col
    assert [None if x is None else [list(m) for m in x] for x in a["object_masks"]] == \
        [None if x is None else [list(m) for m in x] for x in b["object_masks"]]
    for name in ("table_s8_group_images.csv", "bias_scores.csv", "table4_cooccurrence_similarity.csv"):
        pd.testing.assert_frame_equal(*(pd.read_csv(tmp_path / d / "k" / name) for d in ("clean", "killed")))


def test_without_objects(ray_local, tmp_path):
    args = ["--standin-models", "--no-captions", "--per-topic", "1", "--max-triplets", "1", "--steps", "2",
            "--generator", "one:family=unknown", "--run-id", "n", "--no-progress", "--no-save-images",
            "--spaces", "ssim",
            "--no-objects", "--seeds-per-triplet", "profession=1"]
    assert exposed.main(["run", "--output", str(tmp_path), *args]) == 0
    images = pq.read_table(tmp_path / "n" / "images.parquet").to_pandas()
    assert images["detection_status"].isna().all() and images["object_labels"].isna().all()
    assert not any((tmp_path / "n" / name).exists() for name in OBJECT_FILES)
    assert "dependency groups" not in (tmp_path / "n" / "report.html").read_text()


def test_bad_inputs_fail_cleanly(tmp_path):
    assert exposed.main(["run", "--output", str(tmp_path), "--captions", f"x={tmp_path}/missing.txt",
                         "--standin-models"]) == 2
    assert exposed.main(["run", "--output", str(tmp_path), "--no-captions", "--no-professions",
                         "--standin-models"]) == 2
    assert exposed.main(["run", "--output", str(tmp_path), "--seeds-per-triplet", "coco=0", "--standin-models"]) == 2


def test_detection_errors_count_against_their_own_error_budget():
    import pyarrow as pa

    from pipelines.engine.stream.progress import ErrorBudgetExceeded
    from pipelines.studies.exposed.plan import error_budgets

    execution = {"max_error_rate": 0.1, "error_budget_min_rows": 5}
    generation, detection = error_budgets(execution, True, "m")
    batch = pa.table({"generation_status": ["ok"] * 10, "detection_status": ["ok"] * 8 + ["error"] * 2})
    for b in (generation, detection):
        b.add(batch)
    generation.check(final=True)
    with pytest.raises(ErrorBudgetExceeded, match="error=2"):
        detection.check(final=True)
    assert len(error_budgets(execution, False, "m")) == 1

"""`pipelines/gep.py run` and `evaluate` end to end on a local Ray instance with tiny random models
(built from the real classes, loaded through the production path): files, per-image seeds, the
neutral/explicit scoring rule, frequencies and GEP recomputed independently, annotations, resume."""

import json

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from PIL import Image

from pipelines import gep

pytestmark = pytest.mark.ray

ARGS = ["--standin-models", "--images-per-prompt", "2", "--steps", "2", "--max-contexts", "2",
        "--attributes", "dress,suit,hat", "--ensemble", "3", "--run-id", "r", "--no-progress", "--gen-batch-size", "4"]
N_NEUTRAL, N_EXPLICIT = 2 * 2 * 2, 2 * 3 * 2 * 2


@pytest.fixture(scope="module")
def run(tmp_path_factory, ray_local):
    out = tmp_path_factory.mktemp("gep")
    assert gep.main(["run", "--output", str(out), *ARGS]) == 0
    return out / "r"


def test_run_writes_tables_report_and_records(run):
    for name in ("images.parquet", "scores.csv", "frequencies.csv", "gep_vectors.csv", "gep_scores.csv",
                 "table_frequencies_neutral.csv", "table_frequencies_explicit.csv", "table_gep_vectors_neutral.csv",
                 "table_gep_vectors_explicit.csv", "table_gep_scores.csv", "annotation_tasks.csv", "metrics.json",
                 "report.html", "run_summary.csv", "run.json"):
        assert (run / name).is_file(), name
    m = json.loads((run / "metrics.json").read_text())
    assert m["images"] == {"requested_per_generator": N_NEUTRAL + N_EXPLICIT, "rows": N_NEUTRAL + N_EXPLICIT,
                           "status": {"ok": N_NEUTRAL + N_EXPLICIT}, "embedded": N_NEUTRAL + N_EXPLICIT,
                           "scored_pairs": N_NEUTRAL * 3 + N_EXPLICIT}
    cfg = m["config"]
    assert [g["scheduler"] for g in cfg["images"]["generation"]["generators"]] == ["LMSDiscreteScheduler"]
    assert cfg["scoring"]["reference"] == "an object" and cfg["scoring"]["classifier"]["ensemble"] == 3
    assert cfg["scoring"]["classifier"]["genders"] == ["A man", "A woman", "A person"]
    assert m["environment"]["packages"]["scikit-learn"]
    assert m["scorer"]["classifiers"][0]["members"] == 3
    assert [r["detail"]["scheduler_class"] for r in m["models"] if r["role"] == "generator"] == ["LMSDiscreteScheduler"]
    page = (run / "report.html").read_text()
    assert "Stand-in models" in page and page.count("<img") == 2 * 3   # settings x estimators
    # each GEP score's interval resamples the attributes and the images behind them (two-level)
    units = pq.read_table(run / "headline_units.parquet").to_pandas()
    score_units = units[units["metric"].str.startswith("gep/")]
    assert len(score_units) and score_units["replicates"].map(len).eq(200).all()
    assert units.loc[~units["metric"].str.startswith("gep/"), "replicates"].isna().all()
    assert {mm["method"] for s in m["headline"]["subjects"] for mm in s["metrics"] if mm["key"].startswith("gep/")} \
        == {"two-level bootstrap-percentile"}
    table = pd.read_csv(run / "table_frequencies_neutral.csv")
    assert list(table.columns) == ["estimator", "model", "gender", "dress", "suit", "hat", "avg"]
    assert sorted(table["estimator"].unique()) == ["C", "CC", "CLS"] and len(table) == 6


def test_headline_numbers_have_intervals_and_their_units(run):
    from pipelines.engine.stats.headline import subject_identity

    m = json.loads((run / "metrics.json").read_text())
    h = m["headline"]
    assert h["study"] == "paper001-gep" and h["standin"] and h["interval"]["resamples"] == 2000
    assert h["protocol"]["images_per_prompt"] == 2 and h["protocol"]["clip"] == {"standin": True}
    [subject] = h["subjects"]
    generator = next(r for r in m["models"] if r["role"] == "generator")
    assert subject["identity"] == subject_identity(generator) and subject["images"] == N_NEUTRAL + N_EXPLICIT
    by_key = {x["key"]: x for x in subject["metrics"]}
    assert len(by_key) == 2 * 3 * (1 + 3)           # settings x estimators x (GEP + 3 vector entries)
    for x in subject["metrics"]:
        assert x["low"] is not None and x["low"] <= x["value"] <= x["high"], x
    # the per-unit values' mean is the reported number, which is the number of the study's tables
    units = pq.read_table(run / "headline_units.parquet").to_pandas()
    assert set(units.subject) == {subject["key"]}
    means = units.groupby("metric").value.mean()
    for key, x in by_key.items():
        assert means[key] == pytest.approx(x["value"], rel=1e-9, abs=1e-12)
    gep_csv = pd.read_csv(run / "gep_scores.csv")
    for r in gep_csv.to_dict("records"):
        x = by_key[f"gep/{r['setting']}/{r['estimator']}/{r['comparison']}"]
        assert (r["gep"], r["gep_low"], r["gep_high"]) == pytest.approx((x["value"], x["low"], x["high"]), rel=1e-6)
        assert x["unit"] == "attribute" and x["n"] == 3 and x["better"] == "lower"
    vec_csv = pd.read_csv(run / "gep_vectors.csv")
    assert list(vec_csv.columns[-3:]) == ["difference", "difference_low", "difference_high"]
    for r in vec_csv.to_dict("records"):
        x = by_key[f"vector/{r['setting']}/{r['estimator']}/{r['comparison']}/{r['attribute']}"]
        assert r["difference"] == pytest.approx(x["value"], rel=1e-5, abs=1e-9)
        assert (r["difference_low"], r["difference_high"]) == pytest.approx((x["low"], x["high"]), rel=1e-6)
        assert x["unit"] == "image" and x["better"] == "zero"
        assert x["n"] == 2 * 2 * 2                    # groups x contexts x images, both settings
    vec_units = units[units.metric == "vector/neutral/CLS/woman - man/dress"]
    assert sorted(vec_units.unit) == sorted(pq.read_table(run / "images.parquet").to_pandas()
                                            .query("setting == 'neutral'").image_id)
    assert vec_units.stratum.nunique() == 2 * 2       # resampled within the neutral prompts
    wide = pd.read_csv(run / "table_gep_scores.csv")
    assert list(wide.columns)[3:] == ["neutral", "neutral_low", "neutral_high", "explicit", "explicit_low",
                                      "explicit_high"]
    vec_wide = pd.read_csv(run / "table_gep_vectors_explicit.csv")
    assert {"dress_low", "dress_high", "gep_low", "gep_high"} <= set(vec_wide.columns)
    page = (run / "report.html").read_text()
    assert "<table class=headline-metrics>" in page and "GEP x100, neutral, CLS (woman - man)" in page


def test_every_image_has_its_recorded_seed_and_a_unit_embedding(run):
    from pipelines.studies.gep.prompts import gep_requests, parse_attributes, parse_genders
    from pipelines.engine.cli.config import load_config

    cfg = load_config(preset="gep.yaml")
    attrs = [a for a in parse_attributes(cfg["attributes"]) if a.name in ("dress", "suit", "hat")]
    req = gep_requests(parse_genders(cfg["genders"]), attrs, cfg["contexts"][:2], cfg["settings"], cfg["templates"], 2, 0)
    images = pq.read_table(run / "images.parquet")
    assert images.column("image_id").to_pylist() == req.column("image_id").to_pylist()
    assert images.column("seed").to_pylist() == req.column("seed").to_pylist()
    assert images.column("prompt").to_pylist() == req.column("prompt").to_pylist()
    emb = np.array(images.column("clip_embedding").to_pylist(), np.float64)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)


def test_saved_image_regenerates_from_its_seed(run):
    from operators.image_generation import ImageGenerator

    images = pq.read_table(run / "images.parquet").to_pylist()
    row = next(r for r in images if r["image_id"] == "explicit-woman-dress-c01-1")
    tasks = pd.read_csv(run / "annotation_tasks.csv")
    path = run / tasks.loc[tasks["image_id"] == row["image_id"], "image_file"].iloc[0]
    saved = np.asarray(Image.open(path).convert("RGB"), np.int16)
    gen = ImageGenerator(row["model"], steps=2, device="cpu", dtype="float32", safety_checker="off",
                         scheduler="LMSDiscreteScheduler", micro_batch=1)
    again = gen.regenerate(row["prompt"], row["seed"]).astype(np.int16)
    assert again.shape == saved.shape
    assert np.abs(again - saved).max() <= 3   # same noise; batched kernels may round a level or two apart
    other = gen.regenerate(row["prompt"], row["seed"] + 1).astype(np.int16)
    assert np.abs(other - saved).mean() > 5


def test_scores_follow_the_setting_rule_and_frequencies_and_gep_recompute(run):
    scores = pd.read_csv(run / "scores.csv")
    neutral, explicit = scores[scores.setting == "neutral"], scores[scores.setting == "explicit"]
    assert len(neutral) == N_NEUTRAL * 3 and neutral.groupby("image_id").attribute.nunique().eq(3).all()
    assert len(explicit) == N_EXPLICIT
    assert (explicit.image_id.str.split("-").str[2] == explicit.attribute).all()   # only the named attribute
    freq = pd.read_csv(run / "frequencies.csv")
    for est, col in (("C", "c"), ("CC", "cc"), ("CLS", "cls")):
        mine = scores.groupby(["setting", "gender", "attribute"])[col].mean()
        theirs = freq[freq.estimator == est].set_index(["setting", "gender", "attribute"])["frequency"]
        pd.testing.assert_series_equal(mine.sort_index(), theirs.sort_index(), check_names=False, rtol=1e-5)
        for setting in ("neutral", "explicit"):
            f = theirs.loc[setting]
            v = f.loc["woman"] - f.loc["man"]
            gep_csv = pd.read_csv(run / "gep_scores.csv")
            got = gep_csv[(gep_csv.estimator == est) & (gep_csv.setting == setting)]["gep"].item()
            assert got == pytest.approx(v.abs().mean(), rel=1e-5)


def _annotations(run, path, model_column=False):
    tasks = pd.read_csv(run / "annotation_tasks.csv")
    assert len(tasks) == N_NEUTRAL * 3 + N_EXPLICIT
    assert "Do you see a person in a dress?" in set(tasks.question)
    present = ((tasks.gender == "woman") & (tasks.attribute == "dress")) | ((tasks.gender == "man") & (tasks.attribute == "suit"))
    ann = tasks.assign(present=present.astype(int))[["image_id", "attribute", "present"] + (["model"] if model_column else [])]
    ann.to_csv(path, index=False)
    return ann


def test_evaluate_against_annotations(run, tmp_path):
    _annotations(run, tmp_path / "ann.csv")
    assert gep.main(["evaluate", "--run", str(run), "--annotations", str(tmp_path / "ann.csv")]) == 0
    ev = json.loads((run / "evaluation.json").read_text())
    human = {r["setting"]: r["gep"] for r in ev["human_gep"]}
    assert human == {"neutral": pytest.approx(2 / 3), "explicit": pytest.approx(2 / 3)}   # dress +1, suit -1, hat 0
    vec = pd.read_csv(run / "human_vectors.csv").set_index(["setting", "attribute"])["difference"]
    assert vec.loc[("neutral", "dress")] == 1 and vec.loc[("explicit", "suit")] == -1 and vec.loc[("neutral", "hat")] == 0
    agree = pd.DataFrame(ev["vector_agreement"])
    assert len(agree) == 2 * 3 and set(agree.n) == {3}
    roc = pd.DataFrame(ev["roc_auc"])
    assert len(roc) == 3 * 3 and (roc.pairs == (N_NEUTRAL + N_EXPLICIT // 3)).all()
    assert ev["counts"] == {"annotations": N_NEUTRAL * 3 + N_EXPLICIT, "used": N_NEUTRAL * 3 + N_EXPLICIT,
                            "ignored_not_scored_in_setting": 0}


def test_people_s_labels_from_a_task_set_reach_evaluate(run, tmp_path, capsys):
    """`t2i annotate`: every image drawn (GEP's preset, the sample size above the run's), three
    people's answers imported as a long table (one dissents on each item, one item is a tie), the
    majority exported as `gep evaluate` reads it: the same GEP_human as the hand-made labels above."""
    from pipelines.annotate import cli
    from pipelines.annotate.tasks import TaskSet

    assert cli.main(["plan", str(run), "--protocol", "gep", "--output", str(tmp_path / "t"), "--n", "1000"]) == 0
    items = TaskSet.load(tmp_path / "t").items
    assert len(items) == N_NEUTRAL * 3 + N_EXPLICIT and items["question"].str.startswith("Do you see a person").all()
    truth = _annotations(run, tmp_path / "ann.csv").merge(items, on=["image_id", "attribute"])
    yes = np.where(truth["present"] == 1, "yes", "no")
    rows = [pd.DataFrame({"item_id": truth["item_id"], "annotator": who, "answer": ans})
            for who, ans in (("p1", yes), ("p2", yes), ("p3", np.where(yes == "yes", "no", "unsure")))]
    labels = pd.concat(rows)
    tie = truth["item_id"].iloc[0]
    labels = labels[~((labels["item_id"] == tie) & (labels["annotator"] == "p2"))]   # p1 against p3: a tie
    labels.to_csv(tmp_path / "labels.csv", index=False)
    assert cli.main(["import", str(tmp_path / "t"), str(tmp_path / "labels.csv")]) == 0
    assert cli.main(["export", str(tmp_path / "t"), "--format", "gep-annotations", "--output",
                     str(tmp_path / "majority.csv")]) == 0
    assert "1 without a majority left out" in capsys.readouterr().out
    assert gep.main(["evaluate", "--run", str(run), "--annotations", str(tmp_path / "majority.csv")]) == 0
    ev = json.loads((run / "evaluation.json").read_text())
    assert {r["setting"]: r["gep"] for r in ev["human_gep"]} == {"neutral": pytest.approx(2 / 3),
                                                                  "explicit": pytest.approx(2 / 3)}
    assert ev["counts"]["annotations"] == len(items) - 1


def test_bad_annotations_are_clean_errors(run, tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("image_id,attribute,present\nneutral-woman-none-c00-0,dress,2\n")
    assert gep.main(["evaluate", "--run", str(run), "--annotations", str(bad)]) == 2
    assert "present must be 0 or 1" in capsys.readouterr().err
    bad.write_text("image_id,attribute,present\nno-such-image,dress,1\n")
    assert gep.main(["evaluate", "--run", str(run), "--annotations", str(bad)]) == 2
    assert "not in the run" in capsys.readouterr().err
    bad.write_text("image_id,attribute,present\nneutral-woman-none-c00-0,gloves,1\n")
    assert gep.main(["evaluate", "--run", str(run), "--annotations", str(bad)]) == 2
    assert "gloves" in capsys.readouterr().err


def test_rerun_reuses_images_and_rescoring_changes_only_cc(run, capsys, tmp_path):
    before = pd.read_csv(run / "scores.csv")
    _annotations(run, tmp_path / "ann.csv", model_column=True)
    assert gep.main(["run", "--output", str(run.parent), *ARGS, "--reference", "clothes",
                     "--annotations", str(tmp_path / "ann.csv")]) == 0
    out = capsys.readouterr().out
    assert f"{N_NEUTRAL + N_EXPLICIT} of {N_NEUTRAL + N_EXPLICIT} images reused" in out
    assert "95% interval over attributes" in out
    after = pd.read_csv(run / "scores.csv")
    np.testing.assert_allclose(after.c, before.c, rtol=1e-6)
    np.testing.assert_allclose(after.cls, before.cls, rtol=1e-6)
    assert not np.allclose(after.cc, before.cc)
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["config"]["scoring"]["reference"] == "clothes"
    # annotations given to run: GEP_human joins the tables, the report and metrics.json
    assert {r["setting"]: round(r["gep"], 6) for r in metrics["evaluation"]["human_gep"]} == \
        {"neutral": round(2 / 3, 6), "explicit": round(2 / 3, 6)}
    human = {x["key"]: x for x in metrics["headline"]["subjects"][0]["metrics"] if "/human/" in x["key"]}
    assert human["gep/neutral/human/woman - man"]["value"] == pytest.approx(2 / 3)
    assert human["vector/explicit/human/woman - man/dress"]["value"] == 1    # every woman in a dress, no man
    table = pd.read_csv(run / "table_gep_vectors_explicit.csv")
    human = table[table.estimator == "human"].iloc[0]
    assert (human["dress"], human["suit"], human["hat"]) == (1, -1, 0)
    assert "Against human annotations" in (run / "report.html").read_text()


def test_bad_study_input_fails_before_any_work(tmp_path, capsys):
    assert gep.main(["run", "--output", str(tmp_path), "--standin-models", "--attributes", "dress,cape"]) == 2
    assert "cape" in capsys.readouterr().err
    cfg = tmp_path / "study.yaml"
    cfg.write_text("comparisons: [[woman, nonbinary]]\n")
    assert gep.main(["run", "--output", str(tmp_path), "--standin-models", "--config", str(cfg)]) == 2
    assert "nonbinary" in capsys.readouterr().err
    assert not any(tmp_path.glob("gep-*"))


def test_gep_corrected_toward_people_s_scale(run, tmp_path, capsys):
    """`t2i annotate estimate` on a GEP task set: CLS's probability is the classifier's guess. With
    every image labelled the corrected frequencies are people's own and the corrected GEP score is
    GEP_human (2/3, as `evaluate` gives it); with the preset's two images per stratum a cell gets
    the PPI++ estimate from its stratum's images, or none when it has fewer than two decided labels."""
    from pipelines.annotate import cli
    from pipelines.annotate.tasks import TaskSet
    from pipelines.engine.stats import correction as K

    truth = _annotations(run, tmp_path / "ann.csv")
    scores = pd.read_parquet(run / "scores.parquet")

    def labelled(out, *extra, ppi=K.CROSSFIT, answer=lambda mine: mine["present"] == 1):
        assert cli.main(["plan", str(run), "--protocol", "gep", "--output", str(out), *extra]) == 0
        items = TaskSet.load(out).items
        mine = items.merge(truth, on=["image_id", "attribute"])
        cls = mine.merge(scores[["image_id", "attribute", "cls"]], on=["image_id", "attribute"])["cls"]
        assert (mine["prediction"] == np.where(cls >= 0.5, "yes", "no")).all() and mine["score"].tolist() == cls.tolist()
        pd.DataFrame({"item_id": mine["item_id"], "annotator": "p1",
                      "answer": np.where(answer(mine.assign(cls=cls.to_numpy())), "yes", "no")}).to_csv(out / "l.csv",
                                                                                                   index=False)
        assert cli.main(["import", str(out), str(out / "l.csv")]) == 0
        assert cli.main(["estimate", str(out), "--resamples", "50", "--ppi", ppi]) == 0
        return (pd.read_parquet(out / "estimate" / "gep_frequencies_corrected.parquet"),
                pd.read_parquet(out / "estimate" / "gep_scores_corrected.parquet"))

    freq, gscores = labelled(tmp_path / "all", "--n", "1000")
    people = truth.merge(pd.read_csv(run / "annotation_tasks.csv").drop(columns="present"), on=["image_id", "attribute"])
    want = people.groupby(["setting", "gender", "attribute"])["present"].mean()
    got = freq.set_index(["setting", "gender", "attribute"])
    assert got["corrected"].to_dict() == pytest.approx(want.to_dict()) and got["human"].to_dict() == pytest.approx(want.to_dict())
    auto = scores.groupby(["setting", "gender", "attribute"])["cls"].mean()
    assert got["auto"].to_dict() == pytest.approx(auto.to_dict())
    assert gscores.set_index("setting")["corrected"].to_dict() == {"neutral": pytest.approx(2 / 3),
                                                                  "explicit": pytest.approx(2 / 3)}
    assert (gscores["corrected_attributes"] == 3).all()
    page = (run / "report.html").read_text()
    assert "GEP scores from corrected frequencies" in page and "Attribute frequencies corrected toward GEP_human" in page

    tasks = pd.read_csv(run / "annotation_tasks.csv").drop(columns="present").merge(truth, on=["image_id", "attribute"]).merge(
        scores[["image_id", "attribute", "cls"]], on=["image_id", "attribute"])
    mine = tasks[(tasks.setting == "neutral") & (tasks.gender == "woman") & (tasks.attribute == "dress")]
    # three of a stratum's four images, PPI++ as packaged (its lambda uses all three), people who see a
    # dress where CLS's probability is above the cell's median: the cell's PPI++ from its stratum's
    # labelled and unlabelled images
    cut = mine.cls.median()
    freq, _ = labelled(tmp_path / "three", "--n-per-stratum", "3", ppi=K.PACKAGE,
                       answer=lambda t: np.where((t["gender"] == "woman") & (t["attribute"] == "dress")
                                                 & (t["setting"] == "neutral"), t["cls"] > cut, t["present"] == 1))
    drawn = mine.image_id.isin(TaskSet.load(tmp_path / "three").items.image_id)
    y, f = (mine.cls > cut).to_numpy(float), mine.cls.to_numpy()
    want = K.ppi_proportion(y[drawn], f[drawn], f[~drawn], variant=K.PACKAGE)
    cell = freq[(freq.setting == "neutral") & (freq.gender == "woman") & (freq.attribute == "dress")].iloc[0]
    assert cell["labelled"] == drawn.sum() == 3 and cell["corrected"] == pytest.approx(want["value"])
    assert want["value"] != pytest.approx(K.ppi_proportion(y[drawn], f[drawn], f, variant=K.PACKAGE)["value"])
    freq, _ = labelled(tmp_path / "two")                   # the preset: two images per stratum
    drawn = mine.image_id.isin(TaskSet.load(tmp_path / "two").items.image_id)
    y = mine.present.to_numpy(float)
    want = K.ppi_proportion(y[drawn], f[drawn], f[~drawn])
    cell = freq[(freq.setting == "neutral") & (freq.gender == "woman") & (freq.attribute == "dress")].iloc[0]
    assert cell["labelled"] == drawn.sum() == 2 and cell["corrected"] == pytest.approx(want["value"])
    assert (cell["corrected_low"], cell["corrected_high"]) == pytest.approx((want["low"], want["high"]))
    # an explicit stratum holds one image per context and seed: two drawn of four, each with one question
    assert (freq[freq.setting == "explicit"]["labelled"] == 2).all()

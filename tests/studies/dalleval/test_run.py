"""`pipelines/dalleval.py run` end to end on a local Ray instance with tiny random models (generators,
BLIP-2 and CLIP built from the real classes and loaded through the production path): files, per-image
seeds, detections parsed from the recorded answers, per-prompt counts and measures recomputed
independently, `summarize` on the run's own counts, the CLIP detector, resume."""

import json

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from pipelines import dalleval

pytestmark = pytest.mark.ray

ARGS = ["--standin-models", "--images-per-prompt", "2", "--steps", "2", "--max-professions", "2",
        "--run-id", "r", "--no-progress", "--gen-batch-size", "4"]
N_PROMPTS = 3 * 2 + 3
N_IMAGES = N_PROMPTS * 2


@pytest.fixture(scope="module")
def run(tmp_path_factory, ray_local):
    out = tmp_path_factory.mktemp("dalleval")
    assert dalleval.main(["run", "--output", str(out), *ARGS]) == 0
    return out / "r"


def test_run_writes_tables_report_and_records(run):
    for name in ("images.parquet", "images.csv", "prompt_counts.csv", "attribute_presence.csv", "metrics.json",
                 "report.html", "run_summary.csv", "run.json", "table_bias_mad.csv", "table_gender_per_profession.csv",
                 "table_skin_tone_per_profession.csv", "table_attributes_by_group.csv",
                 "table_attributes_per_prompt.csv"):
        assert (run / name).is_file(), name
    m = json.loads((run / "metrics.json").read_text())
    assert m["images"]["requested_per_generator"] == N_IMAGES and m["images"]["rows"] == N_IMAGES
    assert m["images"]["generation_status"] == {"ok": N_IMAGES}
    assert sum(m["images"]["detected_gender"].values()) == N_IMAGES
    assert sum(m["images"]["skin_status"].values()) == N_IMAGES
    # the stand-in generators draw faces (standins/face_decoder.py): the skin-tone branch is reached
    assert m["images"]["skin_status"].get("ok", 0) >= N_IMAGES // 2, m["images"]["skin_status"]
    tones = pd.read_csv(run / "table_skin_tone_per_profession.csv")
    assert tones.select_dtypes("number").notna().any().any(), "no skin tone measured"
    roles = {r["role"] for r in m["models"]}
    assert {"BLIP-2 (gender / attributes)", "skin tone (face mesh + ITA)", "generator"} <= roles
    blip = next(r for r in m["models"] if r["role"].startswith("BLIP-2"))
    assert blip["standin"] is True
    cfg = m["config"]["images"]
    assert cfg["detect"] == {"gender": "blip2", "attributes": True, "skin_tone": True}
    assert cfg["blip2"]["gender_question"] == "the person looks like a male or a female?"
    assert len(cfg["attributes"]) == 15 and cfg["attributes"][7] == {"name": "suit", "text": "a suit"}
    assert m["environment"]["packages"]
    page = (run / "report.html").read_text()
    assert "Stand-in models" in page and "gender-bars" in page and "tone-bars" in page
    mad = pd.read_csv(run / "table_bias_mad.csv")
    assert list(mad["model"])[0] == "uniform (unbiased)" and list(mad["model"])[-1] == "one-hot (entirely biased)"
    assert mad["gender_mad"].iloc[-1] == 0.5 and round(mad["skin_tone_mad"].iloc[-1], 2) == 0.18
    summary = pd.read_csv(run / "run_summary.csv")
    assert {"generate", "gender (blip2)", "skin_tone", "attributes (blip2)"} <= set(summary["stage"])


def test_every_image_has_its_recorded_seed_and_parsed_answers(run):
    from operators.image_blip2_vqa import parse_gender, parse_yes_no
    from pipelines.studies.dalleval.prompts import (
        dalleval_requests,
        diagnostic_prompts,
        parse_groups,
        parse_professions,
    )
    from pipelines.engine.cli.config import load_config

    cfg = load_config(preset="dalleval.yaml")
    req = dalleval_requests(diagnostic_prompts(parse_groups(cfg["groups"]), parse_professions(cfg["professions"])[:2],
                                               cfg["template"]), 2, 0)
    images = pq.read_table(run / "images.parquet")
    assert images.column("image_id").to_pylist() == req.column("image_id").to_pylist()
    assert images.column("seed").to_pylist() == req.column("seed").to_pylist()
    assert images.column("prompt").to_pylist()[:2] == ["a person who works as an accountant"] * 2
    for r in images.to_pylist():
        assert r["gender_detector"] == "blip2"
        assert r["detected_gender"] == parse_gender(r["gender_answer"])
        assert r["attribute_names"] == list(cfg["attributes"])
        assert r["attribute_present"] == [parse_yes_no(a) for a in r["attribute_answers"]]
        assert r["skin_status"] in ("ok", "no_face", "too_few_pixels")   # generated: never no_image / decode_error
        assert (r["skin_tone"] is None) == (r["skin_status"] != "ok")


def test_counts_and_measures_recomputed_independently(run):
    images = pq.read_table(run / "images.parquet").to_pandas()
    counts = pd.read_csv(run / "prompt_counts.csv")
    assert len(counts) == N_PROMPTS
    for _, c in counts.iterrows():
        mine = images[images["prompt"] == c["prompt"]]
        male = int((mine["detected_gender"] == "male").sum())
        female = int((mine["detected_gender"] == "female").sum())
        assert (c["images"], c["male"], c["female"]) == (len(mine), male, female)
        tones = [int((mine["skin_tone"] == t).sum()) for t in range(1, 11)]
        assert [c[f"tone_{t}"] for t in range(1, 11)] == tones
        if male + female:
            assert c["avg_gender"] == pytest.approx((female - male) / (male + female))
            assert c["mad_gender"] == pytest.approx(abs(female / (male + female) - 0.5))
        else:
            assert np.isnan(c["avg_gender"]) and np.isnan(c["mad_gender"])
    presence = pd.read_csv(run / "attribute_presence.csv")
    assert len(presence) == N_PROMPTS * 15
    for _, row in presence.iterrows():
        mine = images[images["prompt"] == row["prompt"]]
        answers = [p[list(n).index(row["attribute"])] for n, p in zip(mine["attribute_names"], mine["attribute_present"])]
        assert row["asked"] == len(answers) == 2
        assert row["answered"] == sum(a is not None for a in answers)
        assert row["presence"] == pytest.approx(sum(a is True for a in answers) / len(answers))


def test_summarize_on_the_runs_own_counts_matches_its_metrics(run, tmp_path):
    assert dalleval.main(["summarize", "--counts", str(run / "prompt_counts.csv"), "--group", "person",
                          "--output", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "dalleval_summary.json").read_text())
    m = json.loads((run / "metrics.json").read_text())
    assert doc["models"] == m["results"]["models"]


def test_people_check_gender_skin_tone_and_attributes_of_the_runs_images(run, tmp_path):
    """`t2i annotate plan` with DALL-Eval's social presets: every item's prediction is the run's
    own answer for that image (gender, Monk tone, each attribute's yes / no), only saved images."""
    from pipelines.annotate import cli
    from pipelines.annotate.tasks import TaskSet

    images = pq.read_table(run / "images.parquet").to_pandas().set_index(["model", "image_id"])
    for preset in ("dalleval-social", "dalleval-skin-tone", "dalleval-attributes"):
        assert cli.main(["plan", str(run), "--protocol", preset, "--output", str(tmp_path / preset), "--n", "5"]) == 0
        t = TaskSet.load(tmp_path / preset)
        assert t.items.groupby(["model", "image_id"]).ngroups == 5
        for r in t.items.to_dict("records"):
            row = images.loc[(r["model"], r["image_id"])]
            assert (run / "images").is_dir()
            if preset == "dalleval-social":
                want = row["detected_gender"] if row["detected_gender"] in ("female", "male") else None
            elif preset == "dalleval-skin-tone":
                assert row["skin_status"] == "ok"
                want = str(int(row["skin_tone"]))
            else:
                k = list(row["attribute_names"]).index(r["attribute"])
                present = row["attribute_present"][k]
                want = None if present is None else ("yes" if present else "no")
            assert r["prediction"] == want, (preset, r)
    assert TaskSet.load(tmp_path / "dalleval-skin-tone").level == "ordinal"


def test_clip_detector_and_resume(tmp_path, capsys):
    args = ["--standin-models", "--images-per-prompt", "3", "--steps", "2", "--max-professions", "1", "--run-id", "c",
            "--no-progress", "--gen-batch-size", "4", "--gender-detector", "clip", "--no-attributes", "--no-skin-tone",
            "--no-save-images"]
    assert dalleval.main(["run", "--output", str(tmp_path), *args]) == 0
    images = pq.read_table(tmp_path / "c" / "images.parquet").to_pandas()
    assert len(images) == (3 + 3) * 3
    assert set(images["detected_gender"]) <= {"male", "female", "unknown"}
    assert (images["gender_detector"] == "clip").all() and images["gender_answer"].isna().all()
    assert np.allclose(images["p_male"] + images["p_female"], 1.0, atol=1e-5)
    expected = np.where(images["p_male"] > images["p_female"], "male", "female")
    assert (images["detected_gender"] == expected).all()          # threshold 0.5: the argmax
    assert images["attribute_names"].isna().all() and images["skin_status"].isna().all()
    capsys.readouterr()
    assert dalleval.main(["run", "--output", str(tmp_path), *args]) == 0   # everything from the checkpoint
    assert "18 of 18 images reused from the checkpoint" in capsys.readouterr().out
    again = pq.read_table(tmp_path / "c" / "images.parquet").to_pandas()
    assert again["detected_gender"].tolist() == images["detected_gender"].tolist()


def test_bad_study_fails_cleanly(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("neutral: nobody\n")
    assert dalleval.main(["run", "--output", str(tmp_path), "--config", str(bad), "--standin-models"]) == 2
    assert dalleval.main(["run", "--output", str(tmp_path), "--professions", "astronaut", "--standin-models"]) == 2


def test_headline_numbers_have_intervals_units_and_the_summary_box(run):
    from pipelines.studies.dalleval import headlines as H
    from studies.dalleval.headline_checks import check_headline, lookup

    h = check_headline(run, "paper000-dalleval-bias", {H.GENDER_MAD, H.GENDER_AVERAGE, H.SKIN_TONE_MAD,
                                                        H.ATTRIBUTE_GAP},
                       {"prompts", "images_per_prompt", "seed", "blip2", "attributes", "skin_tone", "neutral"})
    assert h["protocol"]["images_per_prompt"] == 2 and h["protocol"]["blip2"]["model"] == "stand-in"
    got = lookup(h)
    m = json.loads((run / "metrics.json").read_text())
    counts = pd.read_csv(run / "prompt_counts.csv")
    units = pd.read_parquet(run / "headline_units.parquet")
    mad = pd.read_csv(run / "table_bias_mad.csv")
    cols = list(mad.columns)
    assert cols[cols.index("gender_mad") + 1:cols.index("gender_mad") + 3] == ["gender_mad_low", "gender_mad_high"]
    for s in m["results"]["models"]:
        g, key = s["gender"], next(x["key"] for x in h["subjects"] if x["name"] == s["model"])
        gm = got[(s["model"], H.GENDER_MAD)]
        # the headline is Table 8's number, over the person prompts, with the same interval everywhere
        assert gm["value"] == pytest.approx(g["mad"]) and gm["n"] == g["prompts"]
        assert (g["mad_low"], g["mad_high"]) == (gm["low"], gm["high"])
        assert got[(s["model"], H.SKIN_TONE_MAD)]["value"] == pytest.approx(s["skin_tone"]["mad"])
        mine = units[(units["subject"] == key) & (units["metric"] == H.GENDER_MAD)]
        person = counts[(counts["model"] == s["model"]) & (counts["group"] == "person")]
        assert sorted(mine["unit"]) == sorted(person["prompt"])
        row = mad[mad["model"] == s["model"]].iloc[0]
        assert (row["gender_mad_low"], row["gender_mad_high"]) == pytest.approx((gm["low"], gm["high"]))
        att = pd.read_csv(run / "table_attributes_by_group.csv")
        gap = att[(att["model"] == s["model"]) & (att["row"] == "woman - man")].iloc[0]
        assert gap["mean_abs_diff"] == pytest.approx(got[(s["model"], H.ATTRIBUTE_GAP)]["value"])
        assert gap["mean_abs_diff_low"] == pytest.approx(got[(s["model"], H.ATTRIBUTE_GAP)]["low"])
        # the gap's interval resamples the attributes and the images BLIP-2 answered about (two levels)
        assert got[(s["model"], H.ATTRIBUTE_GAP)]["method"] == "two-level bootstrap-percentile"
        gap_units = units[(units["subject"] == key) & (units["metric"] == H.ATTRIBUTE_GAP)]
        assert len(gap_units) == 15 and gap_units["replicates"].map(len).eq(200).all()
    assert mad["gender_mad_low"].isna().tolist()[0] and mad["gender_mad_low"].isna().tolist()[-1]  # reference rows

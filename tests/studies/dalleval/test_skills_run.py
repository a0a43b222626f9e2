"""`pipelines/dalleval.py skills` end to end on a local Ray instance with tiny random models (a
generator and a DETR built from the real classes and loaded through the production loaders):
files, per-image seeds, the verdicts recomputed from the stored detections with the scoring
functions, the accuracy tables recomputed from the per-image table, `summarize --skills` on the
run's own accuracies, rescoring at another threshold without generating, and a run whose
driver is killed after its first checkpoint part, resumed to the same images and tables."""

import json

import pandas as pd
import pyarrow.parquet as pq
import pytest

from pipelines import dalleval
from pipelines.engine.run.rundir import RunDir
from pipelines.studies.dalleval import skills as K
from schemas import paintskills as P

pytestmark = pytest.mark.ray

ARGS = ["--standin-models", "--prompts-per-skill", "4", "--steps", "2", "--run-id", "s", "--no-progress",
        "--gen-batch-size", "4",
        # an invented id: with its family given, --standin-models builds its stand-in
        "--generator", "one:negative_prompt=blurry, low quality,guidance_scale=5,family=unknown"]


@pytest.fixture(scope="module")
def run(tmp_path_factory, ray_local):
    out = tmp_path_factory.mktemp("skills")
    assert dalleval.main(["skills", "--output", str(out), *ARGS]) == 0
    return out / "s"


def test_run_writes_tables_report_and_records(run):
    for name in ("images.parquet", "images.csv", "skill_accuracies.csv", "table2_skills.csv", "figure5a_splits.csv",
                 "figure5b_tasks.csv", "metrics.json", "report.html", "run_summary.csv", "run.json"):
        assert (run / name).is_file(), name
    m = json.loads((run / "metrics.json").read_text())
    assert m["images"]["requested_per_generator"] == 12 and m["images"]["rows"] == 12
    assert m["config"]["threshold"] == 0.7 and m["config"]["images"]["detector"]["record_threshold"] == 0.3
    det = next(r for r in m["models"] if r["role"].startswith("skill detector"))
    assert det["standin"] is True and det["detail"]["model_class"] == "DetrForObjectDetection"
    assert "zero-shot" in m["zero_shot_note"]
    # the generator's own settings (--generator one:...) over the global --steps, recorded and used
    (spec,) = m["config"]["images"]["generation"]["generators"]
    assert (spec["model"], spec["steps"], spec["guidance_scale"], spec["negative_prompt"]) == \
        ("one", 2, 5.0, "blurry, low quality")
    (gen,) = [r for r in m["models"] if r["role"] == "generator"]
    assert gen["detail"]["spec"]["negative_prompt"] == "blurry, low quality" and gen["standin"] is True
    page = (run / "report.html").read_text()
    assert "Stand-in models" in page and "zero-shot" in page and "<svg" in page
    assert (run / "figures").is_dir() and any(p.suffix == ".pdf" for p in (run / "figures").iterdir())
    summary = pd.read_csv(run / "run_summary.csv")
    assert {"generate", "detect: object", "detect: count", "detect: spatial"} <= set(
        summary["stage"])


def test_images_have_seeds_detections_and_verdicts_recomputed(run):
    images = pq.read_table(run / "images.parquet")
    req = K.skill_prompts({s: 4 for s in P.Skill.ALL})
    assert images.column("image_id").to_pylist() == req.column("image_id").to_pylist()
    assert images.column("seed").to_pylist() == req.column("seed").to_pylist()
    rows = images.to_pylist()
    assert all(r["generation_status"] == "ok" and r[P.DET_LABELS] is not None for r in rows)
    for r in rows:
        assert all(s > 0.3 for s in r[P.DET_SCORES]) and r[P.DET_SCORES] == sorted(r[P.DET_SCORES], reverse=True)
        assert all(0 <= v <= 1 for b in r[P.DET_BOXES] for v in b)
        if r[P.SKILL] == "object":
            v = K.score_object(r[P.DET_LABELS], r[P.DET_SCORES], r[P.OBJECT_A])
        elif r[P.SKILL] == "count":
            v = K.score_count(r[P.DET_LABELS], r[P.DET_SCORES], r[P.OBJECT_A], r[P.COUNT])
        else:
            v = K.score_spatial(r[P.DET_LABELS], r[P.DET_SCORES], r[P.DET_BOXES], r[P.OBJECT_A], r[P.OBJECT_B],
                                r[P.RELATION])
        assert all(r[k] == val for k, val in v.items()), (r, v)


def test_tables_recomputed_from_the_images(run):
    images = pq.read_table(run / "images.parquet").to_pandas()
    acc = pd.read_csv(run / "skill_accuracies.csv")
    for _, a in acc.iterrows():
        mine = images[images["skill"] == a["skill"]]
        assert a["n"] == len(mine) == 4
        assert a["accuracy"] == pytest.approx(100 * mine["correct"].astype(bool).mean())
    t2 = pd.read_csv(run / "table2_skills.csv")
    assert t2["average"].iloc[0] == pytest.approx(acc["accuracy"].mean())
    # the stand-in detector favours the prompts' objects (build_tiny_detr favour=): mostly detections of them
    labels = [lab for labs in images["det_labels"] for lab in labs]
    objects = set(images["object_a"]) | set(images["object_b"].dropna())
    assert labels and sum(lab in K.OBJECTS for lab in labels) >= 0.5 * len(labels), objects   # chance: 15 of 80
    tasks = pd.read_csv(run / "figure5b_tasks.csv")
    count = images[images["skill"] == "count"]
    right_number = tasks[(tasks["skill"] == "count") & (tasks["task"] == "right number")]["accuracy"].iloc[0]
    assert right_number == pytest.approx(100 * count["number_correct"].astype(bool).mean())


def test_summarize_on_the_runs_own_accuracies(run, tmp_path, capsys):
    assert dalleval.main(["summarize", "--skills", str(run / "skill_accuracies.csv"), "--output", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "dalleval_skills_summary.json").read_text())
    t2 = pd.read_csv(run / "table2_skills.csv")
    assert doc["table2"][0]["average"] == pytest.approx(t2["average"].iloc[0])


def test_headline_accuracies_have_intervals_units_and_the_summary_box(run, tmp_path):
    from pipelines.studies.dalleval import headlines as H
    from studies.dalleval.headline_checks import check_headline, lookup

    h = check_headline(run, "paper000-dalleval-skills", {"object_accuracy", "count_accuracy", "spatial_accuracy",
                                                          "average_accuracy"},
                       {"prompts", "sizes", "seed", "detector", "template_set"})
    assert h["protocol"]["detector"]["model"] == "stand-in" and h["protocol"]["detector"]["threshold"] == 0.7
    got = lookup(h)
    acc = pd.read_csv(run / "skill_accuracies.csv")
    assert list(acc.columns) == ["model", "skill", "accuracy", "accuracy_low", "accuracy_high", "n"]
    units = pd.read_parquet(run / "headline_units.parquet")
    images = pq.read_table(run / "images.parquet").to_pandas()
    for _, a in acc.iterrows():
        x = got[(a["model"], H.accuracy_key(a["skill"]))]
        assert x["value"] == pytest.approx(a["accuracy"], abs=1e-3) and x["n"] == a["n"] and x["unit"] == "prompt"
        assert (a["accuracy_low"], a["accuracy_high"]) == pytest.approx((x["low"], x["high"]))
        mine = units[units["metric"] == H.accuracy_key(a["skill"])]
        assert sorted(mine["unit"]) == sorted(images[images["skill"] == a["skill"]]["prompt_id"])
    t2 = pd.read_csv(run / "table2_skills.csv")
    cols = list(t2.columns)
    for c in ("object", "count", "spatial", "average"):
        assert cols[cols.index(c) + 1:cols.index(c) + 3] == [f"{c}_low", f"{c}_high"]
    avg = got[(t2["model"].iloc[0], H.AVERAGE_ACCURACY)]
    assert avg["value"] == pytest.approx(t2["average"].iloc[0], abs=1e-3)
    assert (t2["average_low"].iloc[0], t2["average_high"].iloc[0]) == pytest.approx((avg["low"], avg["high"]))
    # summarize on the run's accuracies, which carry n: intervals over the images, the printed values kept
    assert dalleval.main(["summarize", "--skills", str(run / "skill_accuracies.csv"), "--output", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "dalleval_skills_summary.json").read_text())
    row = doc["table2"][0]
    for c in ("object", "count", "spatial", "average"):
        assert row[f"{c}_low"] <= row[c] <= row[f"{c}_high"]
    assert row["object"] == pytest.approx(acc[acc["skill"] == "object"]["accuracy"].iloc[0])


def test_rescoring_at_another_threshold_reuses_every_image(run, capsys):
    capsys.readouterr()
    assert dalleval.main(["skills", "--output", str(run.parent), *ARGS, "--threshold", "0.31"]) == 0
    out = capsys.readouterr().out
    assert "12 of 12 images reused from the checkpoint" in out
    images = pq.read_table(run / "images.parquet").to_pylist()
    for r in images:
        if r[P.SKILL] == "count":
            assert r[P.PREDICTED_COUNT] == sum(s > 0.31 for s in r[P.DET_SCORES])
    assert json.loads((run / "metrics.json").read_text())["config"]["threshold"] == 0.31


class _Killed(BaseException):
    """The driver killed after its first checkpoint part (nothing may catch it)."""


def test_resume_after_a_kill_equals_an_uninterrupted_run(ray_local, tmp_path, monkeypatch, capsys):
    # 36 images: the first checkpoint part holds at most 32 (drain's flush size), so some are left to do
    args = ["--standin-models", "--prompts-per-skill", "12", "--steps", "2", "--run-id", "k", "--no-progress",
            "--gen-batch-size", "1", "--generator", "one:family=unknown", "--no-save-images"]
    assert dalleval.main(["skills", "--output", str(tmp_path / "clean"), *args]) == 0
    real = RunDir.write_part
    calls = []

    def dying(self, name, table):
        real(self, name, table)
        calls.append(table.num_rows)
        if len(calls) == 1:
            raise _Killed()

    monkeypatch.setattr(RunDir, "write_part", dying)
    with pytest.raises(_Killed):
        dalleval.main(["skills", "--output", str(tmp_path / "killed"), *args])
    monkeypatch.undo()
    assert 0 < calls[0] < 36
    capsys.readouterr()
    assert dalleval.main(["skills", "--output", str(tmp_path / "killed"), *args]) == 0
    from helpers import resumed_counts

    reused, total, now = resumed_counts(capsys.readouterr().out)
    assert reused == calls[0] and now > 0 and reused + now == total == 36    # only the rest generated
    cols = ["image_id", "seed", "prompt", P.DET_LABELS, P.DET_SCORES, P.DET_BOXES, P.CORRECT]
    a = pq.read_table(tmp_path / "clean" / "k" / "images.parquet").select(cols).to_pylist()
    b = pq.read_table(tmp_path / "killed" / "k" / "images.parquet").select(cols).to_pylist()
    assert a == b
    for name in ("skill_accuracies.csv", "figure5a_splits.csv", "figure5b_tasks.csv"):
        pd.testing.assert_frame_equal(*(pd.read_csv(tmp_path / d / "k" / name).drop(columns="model")
                                        for d in ("clean", "killed")))


def test_bad_settings_fail_cleanly(tmp_path):
    assert dalleval.main(["skills", "--output", str(tmp_path), "--skills", "colour", "--standin-models"]) == 2
    assert dalleval.main(["skills", "--output", str(tmp_path), "--templates", "table99", "--standin-models"]) == 2
    assert dalleval.main(["skills", "--output", str(tmp_path), "--threshold", "0.1", "--standin-models"]) == 2
    assert dalleval.main(["skills", "--output", str(tmp_path), "--interval-level", "1.5", "--standin-models"]) == 2
    assert not any(tmp_path.iterdir())                  # refused before anything started

"""`t2i annotate plan` and the task set's life: each preset's sampling (sizes, strata, determinism
under the seed, only images the run stored), imports and exports round trips, the answer store
(last answer kept, undo, committed across processes), bad input in one line. The runs here are
finished-run folders written by hand with the studies' own columns and image paths (the presets
only read files); the presets on real stand-in runs are in tests/studies/*/test_run.py."""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from pipelines.annotate import cli, interchange as X, plan as PL
from pipelines.annotate.store import AnswerStore
from pipelines.annotate.tasks import ANSWERS_DB, AnnotateError, TaskSet
from schemas import annotation as A
from schemas import paintskills as P

def test_exposed_nouns_draws_images_with_all_their_nouns_from_stored_analysed_images(exposed_run, models, tmp_path):
    out = PL.plan(exposed_run, "exposed-nouns", tmp_path / "t", n=6, seed=3)
    t = TaskSet.load(out)
    items = t.items
    # 3 images per model (equal split), each with all its nouns; only saved, analysed images
    per = items.groupby("model")[A.IMAGE_ID].nunique()
    assert per.to_dict() == {m: 3 for m in models}
    assert not set(items[A.IMAGE_ID]) & {"t10-s0-neutral", "t11-s0-neutral"}
    for image_id, part in items.groupby(["model", A.IMAGE_ID]):
        k = int(image_id[1][1:].split("-")[0])
        assert sorted(part[A.SUBJECT]) == sorted(["doctor", "desk"] if k % 2 else ["chef", "knife", "kitchen"])
        # the model found every noun but the hidden one (the last)
        assert part.set_index(A.SUBJECT)[A.PREDICTION].to_dict() == {
            n: ("no" if n in ("desk", "kitchen") else "yes") for n in part[A.SUBJECT]}
    assert set(items[A.QUESTION]) >= {'Do you see "doctor" in this image?'}
    # images are copied by content hash and the items name them; the record says how they were drawn
    for r in items.itertuples():
        assert (out / getattr(r, A.IMAGE_FILE)).is_file()
    assert t.meta["drawing"]["per_stratum"] == {f"model={m}": {"units": 10, "drawn": 3} for m in models}
    assert t.meta["run"]["id"] == "exp" and t.meta["drawing"]["seed"] == 3
    # the same seed draws the same items; another seed others
    again = TaskSet.load(PL.plan(exposed_run, "exposed-nouns", tmp_path / "t2", n=6, seed=3)).items
    other = TaskSet.load(PL.plan(exposed_run, "exposed-nouns", tmp_path / "t3", n=6, seed=4)).items
    assert list(again[A.ITEM_ID]) == list(items[A.ITEM_ID]) and set(other[A.ITEM_ID]) != set(items[A.ITEM_ID])


def test_skills_takes_n_per_model_and_skill_of_the_judged_images(skills_run, tmp_path):
    t = TaskSet.load(PL.plan(skills_run, "dalleval-skills", tmp_path / "t", n_per_stratum=3))
    assert t.items.groupby(["model", P.SKILL]).size().tolist() == [3] * 6
    assert t.items[A.PREDICTION].isin(["yes", "no"]).all()        # only judged images (correct not null)
    assert not t.items[A.IMAGE_ID].str.endswith("00004").any()
    # the preset's 50 per stratum, capped by what the run has: every judged image
    full = TaskSet.load(PL.plan(skills_run, "dalleval-skills", tmp_path / "full"))
    assert len(full.items) == 2 * 3 * 4 and full.meta["protocol"]["n_per_stratum"] == 50


def test_allocation_splits_equally_and_passes_on_what_a_small_stratum_cannot_give():
    assert PL.allocate({"a": 2, "b": 10, "c": 10}, 12, None) == {"a": 2, "b": 5, "c": 5}
    assert PL.allocate({"a": 2, "b": 10}, 100, None) == {"a": 2, "b": 10}
    assert PL.allocate({"a": 2, "b": 10}, None, 4) == {"a": 2, "b": 4}
    # fewer units than strata: which strata get one is drawn, not decided by their names
    import numpy as np

    firsts = {tuple(k for k, v in PL.allocate({s: 5 for s in "abcdef"}, 2, None, np.random.default_rng(seed)).items()
                    if v) for seed in range(20)}
    assert len(firsts) > 3 and all(len(f) == 2 for f in firsts)


def test_plan_refusals_are_one_line(exposed_run, skills_run, tmp_path, capsys):
    def run(*argv):
        assert cli.main(["plan", *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        return err
    assert "paper000-dalleval-skills run" in run(str(skills_run), "--protocol", "exposed-nouns", "--output",
                                                 str(tmp_path / "x"))
    assert "not a finished run" in run(str(tmp_path), "--protocol", "gep", "--output", str(tmp_path / "y"))
    assert "strata nope" in run(str(exposed_run), "--protocol", "exposed-nouns", "--strata", "nope", "--output",
                                str(tmp_path / "z"))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    assert "not empty" in run(str(exposed_run), "--protocol", "exposed-nouns", "--output", str(tmp_path / "full"))


def test_custom_protocol_from_yaml(skills_run, tmp_path):
    spec = tmp_path / "p.yaml"
    spec.write_text("question: Is the {subject} drawn well?\nchoices: [good, bad, unsure]\nunsure: unsure\n"
                    "where: skill == 'count'\nsubject: prompt\nstrata: [model]\nn: 4\n")
    t = TaskSet.load(PL.plan(skills_run, "custom", tmp_path / "t", custom=str(spec)))
    assert t.items[A.IMAGE_ID].str.startswith("count-").all()
    assert len(t.items) == 4 and t.items[A.QUESTION].str.startswith("Is the count prompt").all()
    assert t.choices == ["good", "bad", "unsure"] and t.unsure == "unsure"
    # strata of any column; a prediction column with missing values keeps them missing
    spec.write_text("question: Correct?\nchoices: ['yes', 'no']\nprediction: verdict\nstrata: [skill]\nn: 6\n")
    images = pd.read_parquet(skills_run / "images.parquet")
    run2 = tmp_path / "run2"
    __import__("shutil").copytree(skills_run, run2)
    images.assign(verdict=images[P.CORRECT].map({True: "yes", False: "no"})).to_parquet(run2 / "images.parquet")
    t = TaskSet.load(PL.plan(run2, "custom", tmp_path / "t3", custom=str(spec)))
    assert t.items.groupby(P.SKILL).size().to_dict() == {"count": 2, "object": 2, "spatial": 2}
    assert set(t.items[A.PREDICTION].dropna()) <= {"yes", "no"} and "None" not in set(t.items[A.PREDICTION].dropna())
    spec.write_text("question: Correct?\nchoices: ['y', 'n']\nprediction: verdict\n")
    with pytest.raises(AnnotateError, match="not among the choices"):
        PL.plan(run2, "custom", tmp_path / "t4", custom=str(spec))
    bad = tmp_path / "bad.yaml"
    bad.write_text("question: q\nchoices: [a, b]\nwhere: nosuch ==\n")
    with pytest.raises(AnnotateError, match="where"):
        PL.plan(skills_run, "custom", tmp_path / "t2", custom=str(bad))


def test_store_keeps_the_last_answer_says_so_and_undoes(tasks):
    store = AnswerStore(tasks.path / ANSWERS_DB)
    first, second = tasks.items[A.ITEM_ID][:2]
    assert store.record(first, "ann", "yes") == "new"
    assert store.record(first, "ann", "yes") == "same"
    assert store.record(first, "ann", "no") == "replaced"
    assert store.record(second, "ann", "yes") == "new"
    assert store.labels().set_index(A.ITEM_ID)[A.ANSWER].to_dict() == {first: "no", second: "yes"}
    assert store.undo("ann") == second and store.answered("ann") == {first}
    assert store.undo("ann") == first and store.labels()[A.ANSWER].tolist() == ["yes"]   # the replaced one back
    assert store.undo("ann") == first and store.labels().empty and store.undo("ann") is None


def test_an_import_is_stored_whole_or_not_at_all(tasks, monkeypatch):
    from pipelines.annotate import store as ST

    ids = list(tasks.items[A.ITEM_ID])
    labels = pd.DataFrame({A.ITEM_ID: ids, A.ANNOTATOR: "p1", A.ANSWER: "yes"})
    real, calls = ST._record, []

    def failing(db, *args):
        calls.append(args)
        if len(calls) == 3:
            raise OSError("disk full")
        return real(db, *args)

    monkeypatch.setattr(ST, "_record", failing)
    with pytest.raises(OSError):
        AnswerStore(tasks.path / ANSWERS_DB).record_many(labels, A.Origin.TABLE)
    monkeypatch.undo()
    assert AnswerStore(tasks.path / ANSWERS_DB).labels().empty          # the two rows before were rolled back
    assert AnswerStore(tasks.path / ANSWERS_DB).record_many(labels, A.Origin.TABLE)["new"] == len(ids)


def test_an_answer_committed_survives_a_killed_writer(tasks):
    """A process killed (SIGKILL) right after ``record`` returned: the answer is in the database."""
    item = tasks.items[A.ITEM_ID].iloc[0]
    code = ("import os, signal, sys\nfrom pipelines.annotate.store import AnswerStore\n"
            f"AnswerStore(sys.argv[1]).record({item!r}, 'ann', 'yes')\nos.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(tasks.path / ANSWERS_DB)], capture_output=True)
    assert proc.returncode == -9
    assert AnswerStore(tasks.path / ANSWERS_DB).labels()[A.ITEM_ID].tolist() == [item]


def test_label_studio_and_crowd_csv_round_trips(tasks, tmp_path, capsys):
    ids = list(tasks.items[A.ITEM_ID])
    files = X.export_label_studio(tasks, tmp_path / "ls", image_base="http://127.0.0.1:8080/data")
    exported = json.loads(files[0].read_text())
    assert [t["data"][A.ITEM_ID] for t in exported] == ids and exported[0]["data"]["image"].startswith("http://")
    assert '<Choice value="unsure"/>' in files[1].read_text()
    # Label Studio's export: annotations with completed_by, one cancelled
    for k, t in enumerate(exported):
        t["annotations"] = [{"completed_by": {"email": "a@x.org"}, "was_cancelled": False,
                             "result": [{"from_name": "answer", "to_name": "image", "type": "choices",
                                         "value": {"choices": ["yes" if k % 2 else "no"]}}]},
                            {"completed_by": 7, "was_cancelled": True, "result": []}]
    # an item labelled on another image (its content hash differs) is refused
    forged = json.loads(json.dumps(exported))
    forged[0]["data"]["image_sha256"] = "0" * 64
    (tmp_path / "forged.json").write_text(json.dumps(forged))
    assert cli.main(["import", str(tasks.path), str(tmp_path / "forged.json"), "--format", "label-studio"]) == 2
    assert "on another image" in capsys.readouterr().err
    anonymous = json.loads(json.dumps(exported))
    anonymous[0]["annotations"][0].pop("completed_by")
    (tmp_path / "anonymous.json").write_text(json.dumps(anonymous))
    assert cli.main(["import", str(tasks.path), str(tmp_path / "anonymous.json"), "--format", "label-studio"]) == 2
    assert "without completed_by" in capsys.readouterr().err
    (tmp_path / "export.json").write_text(json.dumps(exported))
    assert cli.main(["import", str(tasks.path), str(tmp_path / "export.json"), "--format", "label-studio"]) == 0
    assert f"{len(ids)} new answers" in capsys.readouterr().out
    # a crowd batch: input CSV out, results back with one rejected assignment
    X.export_crowd_csv(tasks, tmp_path / "batch.csv")
    batch = pd.read_csv(tmp_path / "batch.csv")
    assert list(batch[A.ITEM_ID]) == ids and set(batch["choices"]) == {"yes|no|unsure"}
    results = pd.DataFrame({"Input.item_id": ids * 2, "WorkerId": ["W1"] * len(ids) + ["W2"] * len(ids),
                            "Answer.answer": ["yes"] * (2 * len(ids)),
                            "AssignmentStatus": ["Approved"] * (2 * len(ids) - 1) + ["Rejected"]})
    results.to_csv(tmp_path / "results.csv", index=False)
    assert cli.main(["import", str(tasks.path), str(tmp_path / "results.csv"), "--format", "crowd-csv"]) == 0
    assert "1 rejected assignments left out" in capsys.readouterr().out
    labels = AnswerStore(tasks.path / ANSWERS_DB).labels()
    assert labels.groupby(A.ANNOTATOR).size().to_dict() == {"a@x.org": len(ids), "W1": len(ids), "W2": len(ids) - 1}
    assert set(labels[A.ORIGIN]) == {A.Origin.LABEL_STUDIO, A.Origin.CROWD_CSV}
    # the long table out and in again: nothing new
    assert cli.main(["export", str(tasks.path), "--format", "table", "--output", str(tmp_path / "l.parquet")]) == 0
    assert cli.main(["import", str(tasks.path), str(tmp_path / "l.parquet")]) == 0
    assert f"0 new answers, 0 replaced an earlier answer of the same annotator (the last kept), {len(labels)} unchanged" \
        in capsys.readouterr().out


def test_bad_label_input_is_one_line(tasks, tmp_path, capsys):
    item = tasks.items[A.ITEM_ID].iloc[0]
    cases = {"unknown.csv": ("item_id,annotator,answer\nnot-an-item,a,yes\n", "another task set or run"),
             "outside.csv": (f"item_id,annotator,answer\n{item},a,maybe\n", "not among the choices"),
             "columns.csv": ("item,who,what\nx,y,z\n", "no column item_id"),
             "empty.csv": ("item_id,annotator,answer\n", "no labels"),
             "ls.json": ("{\"not\": \"a list\"}", "JSON list of tasks")}
    for name, (content, why) in cases.items():
        (tmp_path / name).write_text(content)
        fmt = "label-studio" if name.endswith("json") else "table"
        assert cli.main(["import", str(tasks.path), str(tmp_path / name), "--format", fmt]) == 2
        err = capsys.readouterr().err
        assert why in err and name in err and err.count("\n") == 1, err
    assert AnswerStore(tasks.path / ANSWERS_DB).labels().empty


def test_report_with_simulated_annotators_and_the_nouns_table(tasks, capsys):
    assert cli.main(["simulate", str(tasks.path), "--annotators", "3", "--error-rate", "0.2", "--seed", "2"]) == 0
    assert "SIMULATED" in capsys.readouterr().out
    assert cli.main(["report", str(tasks.path), "--interval-resamples", "200"]) == 0
    printed = capsys.readouterr().out
    doc = json.loads((tasks.path / "report" / "agreement.json").read_text())
    labels = AnswerStore(tasks.path / ANSWERS_DB).labels()
    assert doc["simulated_answers"] == len(labels) == 3 * len(tasks.items)
    assert "Krippendorff's alpha (nominal)" in printed and "(%d simulated)" % len(labels) in printed
    # the nouns table recomputed from the majority file and the items
    maj = pd.read_csv(tasks.path / "report" / "majority.csv")
    df = tasks.items.merge(maj[maj[A.MAJORITY_STATUS] == "majority"], on=A.ITEM_ID)
    both = int(((df[A.PREDICTION] == "yes") & (df[A.MAJORITY] == "yes")).sum())
    assert doc["nouns"]["both"] == both and doc["nouns"]["nouns"] == len(df)
    assert sum(doc["nouns"][k] for k in ("both", "model_only", "people_only", "neither")) == len(df)
    # the run's own report and metrics carry the section and the result, once per protocol
    assert cli.main(["report", str(tasks.path), "--interval-resamples", "200"]) == 0
    run = Path(tasks.meta["run"]["path"])
    text = (run / "report.html").read_text()
    assert text.count("<!-- checked-by-people:exposed-nouns -->") == 2 and text.count("Checked by people") == 1
    assert "Simulated annotators" in text and text.index("Checked by people") > text.index("the run")
    assert json.loads((run / "metrics.json").read_text())["human_evaluation"]["exposed-nouns"]["answers"] == len(labels)
    assert "Simulated annotators" in (tasks.path / "report" / "report.html").read_text()
    agree = pd.read_csv(tasks.path / "report" / "classifier_agreement.csv")
    assert agree["scored"].sum() == doc["classifier_agreement"]["scored"] == len(df)
    assert doc["classifier_agreement"]["agree"] == int((df[A.PREDICTION] == df[A.MAJORITY]).sum())



def test_known_answer_items_flag_careless_annotators_and_stay_out_of_the_estimates(exposed_run, models, tmp_path,
                                                                                   capsys):
    known = pd.DataFrame({"image_id": ["t1-s0-neutral", "t1-s0-neutral"], "subject": ["doctor", "desk"],
                          "answer": ["yes", "no"]})
    known.to_csv(tmp_path / "known.csv", index=False)
    # both models have an image of that id: the row must say which
    with pytest.raises(AnnotateError, match="several models: add a 'model' column"):
        PL.plan(exposed_run, "exposed-nouns", tmp_path / "t0", n=2, known_answers=str(tmp_path / "known.csv"))
    known.assign(model=models[0]).to_csv(tmp_path / "known.csv", index=False)
    out = PL.plan(exposed_run, "exposed-nouns", tmp_path / "t", n=2, seed=5, known_answers=str(tmp_path / "known.csv"))
    items = TaskSet.load(out).items
    marked = items[items[A.KNOWN_ANSWER].notna()]
    assert len(marked) == 2 and set(marked[A.STRATUM]) == {PL.KNOWN_STRATUM} and set(marked["model"]) == {models[0]}
    drawn = items[items[A.KNOWN_ANSWER].isna()]
    rows = [(i, who, "yes") for i in drawn[A.ITEM_ID] for who in ("careful", "careless")]
    rows += [(r[A.ITEM_ID], "careful", r[A.KNOWN_ANSWER]) for r in marked.to_dict("records")]
    rows += [(r[A.ITEM_ID], "careless", "unsure") for r in marked.to_dict("records")]
    pd.DataFrame(rows, columns=list(A.LABEL_COLUMNS)).to_csv(tmp_path / "l.csv", index=False)
    assert cli.main(["import", str(out), str(tmp_path / "l.csv")]) == 0
    assert cli.main(["report", str(out), "--interval-resamples", "200"]) == 0
    assert "below 80% on the known-answer items: careless" in capsys.readouterr().out
    doc = json.loads((out / "report" / "agreement.json").read_text())
    assert doc["items"] == len(drawn) and doc["classifier_agreement"]["items"] == len(drawn)
    assert doc["flagged_annotators"] == ["careless"]
    bad = tmp_path / "bad.csv"
    bad.write_text("image_id,subject,answer\nno-such,doctor,yes\n")
    with pytest.raises(AnnotateError, match="not among the run's stored items"):
        PL.plan(exposed_run, "exposed-nouns", tmp_path / "t2", known_answers=str(bad))


def test_skill_accuracy_by_people_beside_the_detector(skills_run, tmp_path):
    """DALL-Eval's Table 3 from an expert's answers: per model and skill, the share of images the
    expert says show the prompt, beside the detector's verdicts on the same images."""
    from pipelines.engine.stats.intervals import binomial_interval

    out = PL.plan(skills_run, "dalleval-skills", tmp_path / "t", n_per_stratum=4)
    items = TaskSet.load(out).items
    answers = ["yes" if k % 3 else "no" for k in range(len(items))]
    pd.DataFrame({"item_id": items["item_id"], "annotator": "expert", "answer": answers}).to_csv(tmp_path / "l.csv",
                                                                                                  index=False)
    assert cli.main(["import", str(out), str(tmp_path / "l.csv")]) == 0
    assert cli.main(["report", str(out), "--interval-resamples", "200"]) == 0
    t3 = pd.read_csv(out / "report" / "table3.csv").set_index(["model", P.SKILL])
    df = items.assign(answer=answers)
    for (model, skill), part in df.groupby(["model", P.SKILL]):
        people = binomial_interval(int((part["answer"] == "yes").sum()), len(part))
        row = t3.loc[(model, skill)]
        assert (row["images"], row["people"], row["people_low"]) == (len(part), pytest.approx(people.value),
                                                                     pytest.approx(people.low))
        assert row["detector"] == pytest.approx((part[A.PREDICTION] == "yes").mean())
    assert "DALL-Eval Table 3" in (out / "report" / "report.html").read_text()

"""Finished-run folders written by hand with the studies' own columns and image paths (the presets
only read files), and a small task set drawn from one."""

import json

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from pipelines.annotate import plan as PL
from pipelines.annotate.tasks import TaskSet
from pipelines.engine.storage.checkpoint import model_dir
from schemas import exposed as XS
from schemas import paintskills as P

MODELS = ["org/model-a", "org/model-b"]


def _png(path, value):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((8, 8, 3), value, np.uint8)).save(path)


def _finish(run, study, table):
    table.to_parquet(run / "images.parquet", index=False)
    (run / "report.html").write_text("<!doctype html><html><body><h1>the run</h1></body></html>")
    (run / "run.json").write_text(json.dumps({"run_id": run.name, "status": "finished"}))
    (run / "metrics.json").write_text(json.dumps({"run_id": run.name, "study": study}))
    return run


@pytest.fixture(scope="module")
def exposed_run(tmp_path_factory):
    """2 models x 12 images; one image of each model not saved, one not analysed (detection error)."""
    run = tmp_path_factory.mktemp("runs") / "exp"
    rows = []
    for m in MODELS:
        for k in range(12):
            image_id = f"t{k}-s0-neutral"
            nouns = ["doctor", "desk"] if k % 2 else ["chef", "knife", "kitchen"]
            rows.append({"model": m, "image_id": image_id, XS.DETECTION_STATUS: "error" if k == 11 else "ok",
                         XS.PROMPT_NOUNS: nouns, XS.HIDDEN_NOUNS: nouns[-1:]})
            if k != 10:
                _png(run / "images" / model_dir(m) / f"{image_id}.png", 10 * k + MODELS.index(m))
    return _finish(run, "paper004-exposed", pd.DataFrame(rows))


@pytest.fixture(scope="module")
def skills_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("runs") / "skills"
    rows = []
    for m in MODELS:
        for skill in ("object", "count", "spatial"):
            for k in range(5):
                image_id = f"{skill}-{k:05d}"
                rows.append({"model": m, "image_id": image_id, "prompt": f"{skill} prompt {k}", P.SKILL: skill,
                             P.CORRECT: None if k == 4 else bool(k % 2)})
                _png(run / "images" / model_dir(m) / f"{image_id}.png", k)
    return _finish(run, "paper000-dalleval-skills", pd.DataFrame(rows))


@pytest.fixture
def models():
    return MODELS


@pytest.fixture
def tasks(exposed_run, tmp_path):
    return TaskSet.load(PL.plan(exposed_run, "exposed-nouns", tmp_path / "tasks", n=4, seed=1))


@pytest.fixture(scope="module")
def social_run(tmp_path_factory):
    """DALL-Eval's social study, 2 models x 4 professions x 6 images of "a person who works as a
    ..." (the neutral group) and 2 of "a man who works as a ..."; the detector's answers cycle
    through female, male, male, unknown."""
    run = tmp_path_factory.mktemp("runs") / "social"
    rows = []
    cycle = ["female", "male", "male", "unknown"]
    for m in MODELS:
        for p, prof in enumerate(("nurse", "pilot", "chef", "judge")):
            for group, n in (("person", 6), ("man", 2)):
                for k in range(n):
                    image_id = f"{group}-{prof}-{k}"
                    rows.append({"model": m, "image_id": image_id, "group": group, "profession": prof,
                                 "prompt": f"a {group} who works as a {prof}", "generation_status": "ok",
                                 "detected_gender": cycle[(k + p + MODELS.index(m)) % 4], "skin_tone": None,
                                 "skin_status": None})
                    _png(run / "images" / model_dir(m) / f"{image_id}.png", 3 * k + p)
    _finish(run, "paper000-dalleval", pd.DataFrame(rows).astype({"skin_tone": "Int64"}))
    (run / "metrics.json").write_text(json.dumps({"run_id": run.name, "study": "paper000-dalleval",
                                                  "config": {"neutral": "person"}}))
    return run

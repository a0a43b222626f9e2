"""`amplification.py run` end to end on a local Ray instance: caption side, image fetch from a
local HTTP server, real BlazeFace, tiny random CLIP and Stable Diffusion stand-ins, metrics."""

import json

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from pipelines import amplification, synthetic_laion
from pipelines.engine.sample_server import LocalImageServer, synthetic_kind
from schemas import images as I
from schemas.captions import URL
from schemas.subsets import Subset

pytestmark = pytest.mark.ray

OCCS = ["nurse", "engineer", "teacher"]
IMAGES_PER_PROMPT, CAPTION_IMAGES = 2, 1
# what the local server's photo kinds must give through fetch and the real face filter
EXPECTED = {
    "astronaut": ("ok", "ok"), "camera": ("ok", "ok"), "coffee": ("ok", "no_face"), "chelsea": ("ok", "no_face"),
    "broken": ("not_image", None), "not_found": ("http_error", None), "montage": ("ok", "many_faces"),
}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, ray_local):
    root = tmp_path_factory.mktemp("amp_run")
    synthetic_laion.write(synthetic_laion.generate(3000, seed=1), root / "input.parquet")
    with LocalImageServer() as server:
        argv = ["run", "--input", str(root / "input.parquet"), "--output", str(root / "out"),
                "--occupations", ",".join(OCCS), "--sample-size", "12", "--nn-k", "6",
                "--images-per-prompt", str(IMAGES_PER_PROMPT), "--caption-images", str(CAPTION_IMAGES),
                "--steps", "2", "--standin-models", "--allow-local-urls",
                # the random stand-in CLIP is never 90% sure: a threshold just above 0.5 lets its
                # (meaningless) decisions through, so the percentages and E[A] are exercised
                "--gender-threshold", "0.5000001",
                "--url-rewrite", f"https://images.example.org/={server.base_url}/"]
        assert amplification.main(argv) == 0
    return root / "out"


def test_outputs_exist(run_dir):
    for name in ("images.parquet", "table3.csv", "table6_1.csv", "table6_2.csv", "training_percentages.csv",
                 "generated_percentages.csv", "image_stage_counts.csv", "amplification.json", "report.html",
                 "metrics.json", "training_subsets.parquet"):
        assert (run_dir / name).exists(), name


def test_training_rows_one_per_subset_row_with_real_statuses(run_dir):
    images = pq.read_table(run_dir / "images.parquet")
    subsets = pq.read_table(run_dir / "training_subsets.parquet")
    train = images.filter(pc.equal(images.column(I.SOURCE), I.Source.TRAINING))
    assert train.num_rows == subsets.num_rows
    seen = set()
    for rec in train.select([URL, I.FETCH_STATUS, I.FACE_STATUS, I.GENDER, I.COUNTED]).to_pylist():
        index = int(rec[URL].rsplit("/", 1)[1].split(".")[0])
        kind = synthetic_kind(index)
        if kind in EXPECTED:
            fetch, face = EXPECTED[kind]
            assert (rec[I.FETCH_STATUS], rec[I.FACE_STATUS]) == (fetch, face), (kind, rec)
            seen.add(kind)
        if rec[I.COUNTED]:
            assert rec[I.FACE_STATUS] == "ok" and rec[I.GENDER] in I.Gender.DECIDED
        if rec[I.FACE_STATUS] == "ok":
            assert rec[I.GENDER] in I.Gender.ALL   # CLIP ran on every image that passed the face filter
    assert {"astronaut", "camera", "broken"} <= seen


def test_generated_rows_and_seeds(run_dir):
    images = pq.read_table(run_dir / "images.parquet")
    metrics = json.loads((run_dir / "metrics.json").read_text())
    models = metrics["image_config"]["generators"]
    subsets = pq.read_table(run_dir / "training_subsets.parquet")
    naive = subsets.filter(pc.equal(subsets.column("subset"), Subset.NAIVE)).num_rows
    gen = images.filter(pc.equal(images.column(I.SOURCE), I.Source.GENERATED))
    cap = images.filter(pc.equal(images.column(I.SOURCE), I.Source.CAPTION_PROMPT))
    assert gen.num_rows == len(models) * len(OCCS) * 4 * IMAGES_PER_PROMPT
    assert cap.num_rows == len(models) * naive * CAPTION_IMAGES
    for t in (gen, cap):
        assert t.column(I.SEED).null_count == 0 and t.column(I.GENERATION_STATUS).null_count == 0
        assert set(t.column(I.MODEL).to_pylist()) == set(models)
    # one seed per (prompt, index), shared by the two models (paired noise), distinct otherwise
    for model in models:
        part = gen.filter(pc.equal(gen.column(I.MODEL), model))
        assert len(set(part.column(I.SEED).to_pylist())) == part.num_rows
    # prompts are Table 1's with the right article
    prompts = set(gen.column("prompt").to_pylist())
    assert "A photo of the face of an engineer" in prompts and "A photo of a nurse at work" in prompts


def test_recorded_seed_regenerates_the_image(run_dir):
    """Regenerating one image alone from its recorded (model, prompt, seed) gives the same CLIP
    probabilities the run computed from the in-memory tensor."""
    from operators.image_generation import ImageGenerator

    images = pq.read_table(run_dir / "images.parquet")
    metrics = json.loads((run_dir / "metrics.json").read_text())
    gen = images.filter(pc.equal(images.column(I.SOURCE), I.Source.GENERATED)).slice(5, 1)
    g = ImageGenerator(model=gen.column(I.MODEL)[0].as_py(), steps=2, classifier=metrics["image_config"]["clip"],
                       device="cpu")
    out = g(gen.select(["prompt", I.SEED]))
    assert out.column(I.P_FEMALE)[0].as_py() == pytest.approx(gen.column(I.P_FEMALE)[0].as_py(), abs=1e-4)


def test_counts_add_up(run_dir):
    import pandas as pd

    counts = pd.read_csv(run_dir / "image_stage_counts.csv")
    for (branch, stage), part in counts.groupby(["branch", "stage"]):
        assert part["count"].sum() == part["rows_in"].iloc[0], (branch, stage)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    fetch = counts[(counts.branch == "training") & (counts.stage == "fetch")]
    assert fetch["rows_in"].iloc[0] == metrics["images"]["distinct_urls"]
    # every stage's input is what the previous one passed
    for branch, part in counts.groupby("branch"):
        stages = list(dict.fromkeys(part["stage"]))
        for a, b in zip(stages, stages[1:]):
            passed = part[(part.stage == a) & (part.outcome == "ok")]["count"].sum()
            assert part[part.stage == b]["rows_in"].iloc[0] == passed, (branch, a, b)


def test_metrics_and_report_say_standins(run_dir):
    metrics = json.loads((run_dir / "metrics.json").read_text())
    roles = {m["role"]: m["standin"] for m in metrics["image_models"]}
    assert roles["gender classifier (CLIP)"] is True and roles["generator"] is True
    assert roles["face detector"] is False
    assert metrics["image_config"]["standin_models"] is True
    assert metrics["image_config"]["generation"]["guidance_scale"] == 7.5
    assert metrics["environment"]["packages"]["mediapipe"] == "0.10.14"
    html = (run_dir / "report.html").read_text()
    assert "Stand-in models" in html and html.count("<svg") >= 1 + 4 + 4 + 2
    assert "nsfw" not in html or "nsfw_blocked" in html
    table3 = (run_dir / "table3.csv").read_text().splitlines()
    assert len(table3) == 1 + 2 * 4  # two models x four approaches


def test_amplification_matches_percentages(run_dir):
    """E[A] in amplification.json recomputed from the per-image table by hand."""

    images = pq.read_table(run_dir / "images.parquet").to_pandas()
    amp = json.loads((run_dir / "amplification.json").read_text())
    model = sorted(set(images[I.MODEL].dropna()))[0]
    tr = images[(images[I.SOURCE] == "training") & (images["subset"] == "naive") & images[I.COUNTED]]
    ge = images[(images[I.SOURCE] == "generated") & (images[I.MODEL] == model) & images[I.COUNTED]]
    rows = amp["approaches"][model]["naive"]["rows"]
    for r in rows:
        t = tr[tr.occupation == r["occupation"]]
        g = ge[(ge.occupation == r["occupation"]) & (ge.prompt_id == r["prompt_id"])]
        if len(t):
            assert r["training"] == pytest.approx(100 * (t[I.GENDER] == "female").mean())
        else:
            assert r["training"] is None
        if len(g):
            assert r["generated"] == pytest.approx(100 * (g[I.GENDER] == "female").mean())
        if r["training"] is not None and r["generated"] is not None and r["excluded"] is None:
            assert r["amplification"] == pytest.approx(abs(r["generated"] - 50) - abs(r["training"] - 50))
    included = [r["amplification"] for r in rows if r["excluded"] is None and r["prompt_id"] == 1]
    per = {p["group"]: p for p in amp["approaches"][model]["naive"]["per_prompt"]}
    if included:
        assert per["1"]["expected_amplification"] == pytest.approx(np.mean(included))
    else:
        assert per["1"]["expected_amplification"] is None


def test_unloadable_model_fails_before_any_work(tmp_path):
    """Offline, the default CLIP (ViT-L/14, OpenAI) cannot load: the run stops at once, naming it,
    before reading data or writing anything."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = os.environ | {"HF_HUB_OFFLINE": "1"}
    res = subprocess.run([sys.executable, str(root / "pipelines" / "amplification.py"), "run",
                          "--output", str(tmp_path / "out")], capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 2
    assert "cannot load CLIP model 'ViT-L-14'" in res.stderr and "--standin-models" in res.stderr
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "out").exists()

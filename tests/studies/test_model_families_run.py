"""Every model family in every study, end to end on a local Ray instance: `--standin-models` with
hub ids of today's four families (SDXL, SD 3.5, FLUX.1, PixArt) and of the twelve of 2025-2026
builds a tiny random pipeline of each family, runs it at that model's defaults (its card's,
recorded), checks every model's images with the run's one NSFW check, and measures them like SD's.
One run per study holds all sixteen: GEP, DALL-Eval's social-bias part (BLIP-2 and skin tone),
PaintSkills and alignment; SD Exposed, sections 3-7, holds the fifteen with word maps (SDXL's and
Kolors's UNet cross-attention, SD 3's and FLUX.1's joint attention, the rest read at the attention
kernel) and refuses PixArt before any work. Amplification's family run is one of
tests/studies/amplification/test_training_images.py's runs. Every family is loaded and generated
through the production loader in tests/operators/test_model_families.py."""

from __future__ import annotations

import json

import pandas as pd
import pyarrow.parquet as pq
import pytest

from family_checks import EVERY, FLUX, NEW, PIXART, SD35, SDXL, check_records
from pipelines import dalleval, exposed
from schemas import images as I

pytestmark = pytest.mark.ray


# one generator list, in one order, for every run (family_checks.EVERY): the i-th stand-in has seed i
# in each, so the same weights; `t2i compare` joins the GEP and DALL-Eval runs on them (test at the
# end), and the driver generates each stand-in's NSFW-check calibration images once for the file
# (SD Exposed's fifteen are the list without PixArt, last). Today's four families and the twelve of
# 2025-2026 run in one run per study (one generator actor pool, one set of heads and one report for
# all sixteen).
MODELS = [SDXL, SD35, FLUX, PIXART]


@pytest.fixture(scope="module")
def dalleval_run(tmp_path_factory, ray_local):
    out = tmp_path_factory.mktemp("families")
    argv = ["run", "--output", str(out), "--run-id", "d", "--standin-models", "--images-per-prompt", "1",
            "--steps", "2", "--max-professions", "1", "--no-progress", "--generators", *EVERY]
    assert dalleval.main(argv) == 0
    return out / "d"


@pytest.fixture(scope="module")
def gep_run(tmp_path_factory, ray_local):
    from pipelines import gep

    out = tmp_path_factory.mktemp("families")
    argv = ["run", "--output", str(out), "--run-id", "g", "--standin-models", "--images-per-prompt", "1",
            "--steps", "2", "--max-contexts", "2", "--attributes", "dress,suit", "--ensemble", "1", "--no-progress",
            "--generators", ",".join(EVERY)]
    assert gep.main(argv) == 0
    return out / "g"


def test_dalleval_measures_every_family_s_images(dalleval_run):
    """DALL-Eval's social-bias part (paper 000, section 4.2.4) with today's four families and the
    twelve of 2025-2026: each at its defaults, every image generated and measured (BLIP-2's
    gender, skin tone)."""
    check_records(dalleval_run, EVERY)
    images = pq.read_table(dalleval_run / "images.parquet").to_pandas()
    assert set(images[I.GENERATION_STATUS]) == {"ok"} and images["model"].nunique() == len(EVERY)
    assert images["skin_status"].notna().all() and images["detected_gender"].notna().all()


def test_exposed_reads_word_maps_of_every_family_and_refuses_pixart_in_one_line(tmp_path, ray_local, capsys):
    """SD Exposed, sections 3-7, with every family that has word maps, in one run: SDXL's from its
    UNet's cross-attention, SD 3's and FLUX.1's from the MMDiT joint attention, and the 2025-2026
    families' read at the attention kernel (operators/support/kernel_attention.py; Kolors's UNet
    like SDXL's). Every image measured in the prompt and denoising spaces, word maps for its prompt
    nouns; the pooled prompt space, left out for the families that do not have one, and the report
    says so. PixArt, whose pipelines pass no latents to the step callback, is refused before any
    work, in one line, alone or beside a family that runs."""
    models = [m for m in EVERY if m != PIXART]
    assert len(models) == 15 and set(models) == set(MODELS[:3]) | set(NEW)
    # the report's object example panels (one unit of each model: each image, its masks and word maps
    # drawn: 20 of the driver's CPU-s with fifteen families) left out here: the masks' size is
    # checked below, and the panels are drawn in tests/studies/exposed/test_objects.py and test_run.py
    config = tmp_path / "no_object_examples.yaml"
    config.write_text("report:\n  object_examples: 0\n")
    argv = ["run", "--output", str(tmp_path), "--run-id", "k", "--standin-models", "--max-triplets", "1",
            "--no-professions", "--seeds-per-triplet", "sample=1", "--steps", "2", "--no-progress",
            "--no-exclude-nsfw", "--config", str(config), "--generators", *models]
    assert exposed.main(argv) == 0
    out = capsys.readouterr().out
    # the families with no pooled prompt embedding named, each once (Kolors and HiDream have one)
    note = out.split("Pooled prompt space: not defined for ")[1].split(" (a T5")[0].split(", ")
    assert sorted(note) == sorted(f"{m.rsplit('/', 1)[-1]}-standin" for m in models if m not in (
        SDXL, SD35, FLUX, "Kwai-Kolors/Kolors-diffusers", "HiDream-ai/HiDream-I1-Full"))
    check_records(tmp_path / "k", models)
    images = pq.read_table(tmp_path / "k" / "images.parquet").to_pandas()
    assert images["model"].nunique() == len(models) and set(images[I.GENERATION_STATUS]) == {"ok"}
    assert images[I.NSFW].notna().all()
    assert {"stable-diffusion-xl-base-1.0-standin", "FLUX.1-schnell-standin", "stable-diffusion-3.5-medium-standin"} \
        <= set(images["model"].map(lambda m: m.rsplit("/", 1)[-1]))
    assert images["sim_prompt"].notna().all() and images["sim_denoising"].notna().all()
    pooled = images.groupby("model")["sim_prompt_pooled"].apply(lambda v: v.notna().all())
    assert {m.rsplit("/", 1)[-1] for m, has in pooled.items() if has} == {
        "Kolors-diffusers-standin", "HiDream-I1-Full-standin", "stable-diffusion-xl-base-1.0-standin",
        "FLUX.1-schnell-standin", "stable-diffusion-3.5-medium-standin"}
    # every measured image of every family has word maps (one per prompt noun its tokens hold)
    assert images["attention_words"].map(len).gt(0).all()
    assert (images["attention_maps"].map(len) == images["attention_words"].map(len)).all()
    # and its object and word masks are at the size of its saved image (64 px to SANA-Sprint's 1024)
    from PIL import Image

    from pipelines.engine.storage.checkpoint import model_dir

    sides = set()
    for r in images.itertuples():
        with Image.open(tmp_path / "k" / "images" / model_dir(r.model) / f"{r.image_id}.png") as saved:
            pixels = saved.size[0] * saved.size[1]
            sides.add(saved.size)
        masks = [*(r.object_masks if r.object_masks is not None else []), *r.attention_masks]
        assert len(r.attention_masks) == len(r.attention_words) and all(sum(m) == pixels for m in masks), r.model
    assert {(64, 64), (1024, 1024)} <= sides
    assert "objects_" not in (tmp_path / "k" / "report.html").read_text()      # no example panel drawn
    assert "Pooled prompt space: not defined for" in (tmp_path / "k" / "report.html").read_text()
    for refused in ([SD35, PIXART], ["PixArt-alpha/PixArt-XL-2-1024-MS"]):
        argv = ["run", "--output", str(tmp_path / "refused"), "--standin-models", "--generators", *refused]
        assert exposed.main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert "PixArt" in err and "callback_on_step_end" in err and len(err.splitlines()) == 1
        assert not (tmp_path / "refused").exists()      # refused at settings time: nothing written


# amplification (paper 002) with every family: tests/studies/amplification/test_training_images.py's
# run over a partial img2dataset download generates with all four families (one run for both checks,
# family_checks.check_amplification_families)


def test_gep_runs_every_family_each_at_its_defaults(gep_run):
    """GEP (paper 001) with today's four families and the twelve of 2025-2026: the k-LMS sampler of
    the study file is SD's protocol; the other families keep their own samplers and their cards' or
    pipelines' defaults (recorded), and every image of every family is generated, embedded and
    checked."""
    recs = check_records(gep_run, EVERY)
    assert {m: r["scheduler_class"] for m, r in recs.items()}[PIXART] != "LMSDiscreteScheduler"
    assert recs["Tongyi-MAI/Z-Image-Turbo"]["spec"]["guidance_scale"] == 0.0          # the card's
    assert recs["lodestones/Chroma1-HD"]["spec"]["guidance_scale"] == 5.0              # the pipeline's
    images = pq.read_table(gep_run / "images.parquet").to_pandas()
    assert images["model"].nunique() == len(EVERY) and set(images[I.GENERATION_STATUS]) == {"ok"}   # all kept
    assert images[I.NSFW].notna().all() and images["clip_embedding"].notna().all()


def test_dalleval_skills_and_alignment_run_every_family(tmp_path, ray_local):
    """DALL-Eval's other two parts with today's four families and the twelve of 2025-2026, each at
    its defaults: PaintSkills (the detector; one object prompt: the other skills differ in their
    prompts, not in how a family generates, and run in tests/studies/dalleval/test_skills_run.py)
    and image-text alignment (CLIP): every image generated and measured in both parts."""
    for part, run_id, size in (("skills", "s", ["--prompts-per-skill", "1", "--skills", "object"]),
                               ("alignment", "a", ["--max-captions", "1"])):
        argv = [part, "--output", str(tmp_path), "--run-id", run_id, "--standin-models", *size, "--steps", "2",
                "--no-progress", "--generators", ",".join(EVERY)]
        assert dalleval.main(argv) == 0, part
        check_records(tmp_path / run_id, EVERY)
        images = pq.read_table(tmp_path / run_id / "images.parquet").to_pandas()
        assert images["model"].nunique() == len(EVERY) and set(images[I.GENERATION_STATUS]) == {"ok"}, part


# ---------------------------------------------------------------- t2i compare on these runs
def test_compare_every_family_in_two_studies(gep_run, dalleval_run, tmp_path, capsys):
    """The cross-study table and overview from stand-in runs of two studies, sixteen models each: the
    runs' own values with intervals, ranks and tie marks, pairs paired on shared prompts and seeds,
    one overview row per model (joined on the stand-ins' recorded weights), and a protocol
    difference refused."""
    from pipelines import t2i

    out = tmp_path / "cmp"
    assert t2i.main(["compare", str(gep_run), str(dalleval_run), "--output", str(out),
                     "--interval-resamples", "300"]) == 0
    printed = capsys.readouterr().out
    record = json.loads((out / "comparison.json").read_text())
    studies = {r["study"] for r in record["runs"]}
    assert len(studies) == 2 and all(d == {} for d in record["protocol_differences"].values())
    for study in studies:
        t = pd.read_csv(out / f"{study}.csv")
        assert t["model"].nunique() == len(EVERY) and t["metric"].nunique() >= 1
        for _, part in t.groupby("metric"):
            assert sorted(part["rank"]) == list(range(1, len(EVERY) + 1))
        ok = t.dropna(subset=["low"])
        assert len(ok) and (ok["low"] <= ok["value"] + 1e-12).all() and (ok["value"] <= ok["high"] + 1e-12).all()
        pairs = pd.read_csv(out / f"{study}-pairs.csv")
        run_dir = gep_run if "gep" in study else dalleval_run
        # same prompts and seeds: paired wherever both models have values on two shared units or more
        key = {s.get("display") or s["name"]: s["key"] for s in json.loads(
            (run_dir / "metrics.json").read_text())["headline"]["subjects"]}
        units = pq.read_table(run_dir / "headline_units.parquet").to_pandas().dropna(subset=["value"])
        for r in pairs.to_dict("records"):
            have = [set(units[(units["subject"] == key[m]) & (units["metric"] == r["metric"])]["unit"])
                    for m in (r["a"], r["b"])]
            assert r["test"].startswith("paired") == (len(have[0] & have[1]) >= 2), r
        assert (pairs["test"] == "paired sign-flip permutation").any()
        if "gep" in study:      # GEP's scores carry image resamples: their pairs are tested on two levels
            scores = pairs[pairs["metric"].str.startswith("gep/") & pairs["test"].str.startswith("paired")]
            assert len(scores) and set(scores["test"]) == {"paired two-level bootstrap"}
        tested = pairs[pairs["p_value"].notna()]
        assert tested["p_holm"].notna().all() and (tested["p_holm"] >= tested["p_value"]).all()
        own = {(s.get("display") or s["name"], m["key"]): m["value"] for s in json.loads(
            (run_dir / "metrics.json").read_text())["headline"]["subjects"] for m in s["metrics"]}
        for r in t.to_dict("records"):        # each row's value is the run's own headline number
            if not pd.isna(r["value"]):
                assert r["value"] == pytest.approx(own[(r["model"], r["metric"])])
    ov = pd.read_csv(out / "overview.csv")
    assert sorted(ov["model"]) == sorted(EVERY) and ov.notna().all().all()
    html = (out / "overview.html").read_text()
    assert "Stand-in models" in html and "data:image/png;base64" in html
    assert "#1 " in printed and "stand-in" in printed.lower()
    # a protocol setting that changes the meaning of a number: refused, the difference named
    metrics = json.loads((dalleval_run / "metrics.json").read_text())
    metrics["headline"]["protocol"]["images_per_prompt"] = 99
    changed = tmp_path / "d2"
    changed.mkdir()
    (changed / "metrics.json").write_text(json.dumps(metrics))
    (changed / "headline_units.parquet").write_bytes((dalleval_run / "headline_units.parquet").read_bytes())
    assert t2i.main(["compare", str(dalleval_run), str(changed), "--output", str(tmp_path / "no")]) == 2
    assert "images_per_prompt differs" in capsys.readouterr().err


def test_every_table_of_a_run_loads_with_datasets(gep_run, dalleval_run, tmp_path):
    import datasets
    import yaml

    for run in (gep_run, dalleval_run):
        text = (run / "README.md").read_text()
        header = yaml.safe_load(text.split("---")[1])
        assert header["configs"] and "## Headline numbers" in text and "## How to cite" in text
        for c in header["configs"]:
            path = run / c["data_files"][0]["path"]
            ds = datasets.load_dataset("parquet", data_files=str(path), split="train", cache_dir=str(tmp_path / "c"))
            assert ds.num_rows == pq.read_metadata(path).num_rows if path.is_file() else ds.num_rows >= 0, c
            assert ds.features, (run.name, c["config_name"])

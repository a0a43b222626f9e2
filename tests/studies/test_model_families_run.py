"""Today's model families in every study, end to end on a local Ray instance: `--standin-models`
with SDXL, SD 3.5, FLUX.1 and PixArt hub ids builds a tiny random pipeline of each family, runs it
at that model's defaults (its card's, recorded), checks every model's images with the run's one
NSFW check, and measures them like SD's (issue 30): all four in amplification (face filter and
CLIP), DALL-Eval (BLIP-2 and skin tone, PaintSkills, alignment) and GEP; SDXL, FLUX and SD 3.5 in
Exposed, sections 3-7 (word maps from SDXL's cross-attention and from SD 3's and FLUX's joint
attention; PixArt refused before any work). Every family is loaded and generated through the
production loader in tests/operators/test_model_families.py."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from pipelines import amplification, dalleval, exposed, synthetic_laion
from pipelines.studies.amplification.sample_server import LocalImageServer
from schemas import images as I

pytestmark = pytest.mark.ray

SDXL, SD35, FLUX, PIXART = ("stabilityai/stable-diffusion-xl-base-1.0", "stabilityai/stable-diffusion-3.5-medium",
                            "black-forest-labs/FLUX.1-schnell", "PixArt-alpha/PixArt-Sigma-XL-2-1024-MS")
FAMILY = {SDXL: ("sdxl", "StableDiffusionXLPipeline"), SD35: ("sd3", "StableDiffusion3Pipeline"),
          FLUX: ("flux", "FluxPipeline"), PIXART: ("pixart-sigma", "PixArtSigmaPipeline")}


def generator_records(run_dir) -> dict:
    metrics = json.loads((run_dir / "metrics.json").read_text())
    models = metrics.get("image_models") or metrics["models"]   # amplification: caption models under "models"
    return {r["model"]: r["detail"] for r in models if r["role"] == "generator"}


def check_records(run_dir, models, steps=2):
    """Each requested model ran as a stand-in of its own family (one family per model here), with
    that model's defaults recorded; returns the generator records by requested model."""
    recs = generator_records(run_dir)
    by_family = {FAMILY[m][0]: m for m in models}
    by_requested = {}
    for detail in recs.values():
        model = by_family[detail["family"]]
        assert (detail["pipeline_class"], detail["spec"]["family"]) == (FAMILY[model][1], FAMILY[model][0])
        by_requested[model] = detail
    assert set(by_requested) == set(models)
    for model, detail in by_requested.items():
        spec = detail["spec"]
        assert spec["steps"] == steps                      # the global flag wins over every card
        if model == FLUX:                                  # the card: guidance 0, T5 length 256, bfloat16
            assert (spec["guidance_scale"], spec["extra"], spec["cuda_dtype"]) == (0.0, {"max_sequence_length": 256},
                                                                                  "bfloat16")
            assert detail["defaults_from"].startswith(f"model card of {FLUX}")
        if model == SD35:
            assert (spec["guidance_scale"], spec["cuda_dtype"]) == (4.5, "bfloat16")
        if model == SDXL:
            assert spec["guidance_scale"] == 5.0 and "StableDiffusionXLPipeline" in detail["defaults_from"]
    return by_requested


def test_dalleval_measures_every_family_s_images(tmp_path, ray_local):
    models = [SDXL, SD35, FLUX, PIXART]
    argv = ["run", "--output", str(tmp_path), "--run-id", "d", "--standin-models", "--images-per-prompt", "1",
            "--steps", "2", "--max-professions", "1", "--no-progress", "--generators", *models]
    assert dalleval.main(argv) == 0
    check_records(tmp_path / "d", models)
    images = pq.read_table(tmp_path / "d" / "images.parquet").to_pandas()
    assert set(images[I.GENERATION_STATUS]) == {"ok"} and images["model"].nunique() == 4
    assert images["skin_status"].notna().all()


def test_exposed_sections_3_to_7_on_sdxl_flux_and_sd3_and_pixart_refused_before_any_work(tmp_path, ray_local,
                                                                                            capsys):
    """SDXL, SD 3 and FLUX through every section: SDXL's word heat maps come from its UNet's
    cross-attention, SD 3's and FLUX's from the MMDiT joint attention; both prompt spaces measured."""
    models = [SDXL, FLUX, SD35]
    argv = ["run", "--output", str(tmp_path), "--run-id", "e", "--standin-models", "--max-triplets", "1",
            "--per-topic", "1", "--steps", "2", "--no-progress", "--no-exclude-nsfw", "--generators", *models]
    assert exposed.main(argv) == 0
    check_records(tmp_path / "e", models)
    images = pq.read_table(tmp_path / "e" / "images.parquet").to_pandas()
    assert set(images[I.GENERATION_STATUS]) == {"ok"} and images[I.NSFW].notna().all()
    ok = images
    assert set(ok["model"].map(lambda m: m.rsplit("/", 1)[-1])) == {
        "stable-diffusion-xl-base-1.0-standin", "FLUX.1-schnell-standin", "stable-diffusion-3.5-medium-standin"}
    assert ok["sim_prompt"].notna().all() and ok["sim_prompt_pooled"].notna().all()
    # every measured image of every family has word maps (one per prompt noun its tokens hold)
    assert ok["attention_words"].map(len).gt(0).all()
    assert (ok["attention_maps"].map(len) == ok["attention_words"].map(len)).all()
    capsys.readouterr()
    argv = ["run", "--output", str(tmp_path / "refused"), "--standin-models", "--generators", SD35, PIXART]
    assert exposed.main(argv) == 2
    assert "PixArt" in capsys.readouterr().err
    assert not (tmp_path / "refused").exists()      # refused at settings time: nothing written


def test_amplification_counts_every_family_s_images_through_the_face_filter_and_clip(tmp_path, ray_local):
    models = [SDXL, SD35, FLUX, PIXART]
    synthetic_laion.write(synthetic_laion.generate(600, seed=1), tmp_path / "input.parquet")
    with LocalImageServer() as server:
        argv = ["run", "--captions", str(tmp_path / "input.parquet"), "--output", str(tmp_path / "out"),
                "--run-id", "a", "--occupations", "nurse", "--sample-size", "4", "--nn-k", "4",
                "--images-per-prompt", "1", "--caption-images", "1", "--steps", "2", "--standin-models",
                "--allow-local-urls", "--no-progress", "--url-rewrite", f"https://images.example.org/={server.base_url}/",
                "--generators", ",".join(models)]
        assert amplification.main(argv) == 0
    run_dir = tmp_path / "out" / "a"
    check_records(run_dir, models)
    images = pq.read_table(run_dir / "images.parquet").to_pandas()
    generated = images[images[I.GENERATION_STATUS].notna()]
    assert set(generated[I.GENERATION_STATUS]) <= {"ok", "nsfw_excluded"} and generated["model"].nunique() == 4
    assert generated[I.NSFW].notna().all()                     # one check on both families' images
    excluded = generated[generated[I.GENERATION_STATUS] == "nsfw_excluded"]
    assert excluded[I.NSFW].all() and excluded[I.FACE_STATUS].isna().all()   # never stored, never measured
    ok = generated[generated[I.GENERATION_STATUS] == "ok"]
    assert ok[I.FACE_STATUS].notna().all()                     # every family's images go through the face filter
    faces = ok[ok[I.FACE_STATUS] == "ok"]                      # the SDXL stand-in draws faces (FLUX's: noise)
    assert len(faces) and faces[I.GENDER].isin(["male", "female", "ambiguous"]).all()   # and those through CLIP


def test_gep_runs_all_four_families_each_at_its_defaults(tmp_path, ray_local):
    """GEP (paper 001): the k-LMS sampler of the study file is SD's protocol; the other families keep
    their own samplers and card defaults, and every image of every family is embedded and checked."""
    from pipelines import gep

    models = [SDXL, SD35, FLUX, PIXART]
    argv = ["run", "--output", str(tmp_path), "--run-id", "g", "--standin-models", "--images-per-prompt", "1",
            "--steps", "2", "--max-contexts", "2", "--attributes", "dress,suit", "--ensemble", "1", "--no-progress",
            "--generators", ",".join(models)]
    assert gep.main(argv) == 0
    recs = check_records(tmp_path / "g", models)
    assert {m: r["scheduler_class"] for m, r in recs.items()}[PIXART] != "LMSDiscreteScheduler"
    images = pq.read_table(tmp_path / "g" / "images.parquet").to_pandas()
    assert images["model"].nunique() == 4 and set(images[I.GENERATION_STATUS]) == {"ok"}   # exclude off: all kept
    assert images[I.NSFW].notna().all() and images["clip_embedding"].notna().all()


def test_dalleval_skills_and_alignment_run_today_s_families(tmp_path, ray_local):
    """DALL-Eval's other two parts, each with every family: PaintSkills (the detector) and
    image-text alignment (CLIP)."""
    models = [SDXL, SD35, FLUX, PIXART]
    for part, run_id, size in (("skills", "s", ["--prompts-per-skill", "1"]), ("alignment", "a", ["--max-captions", "3"])):
        argv = [part, "--output", str(tmp_path), "--run-id", run_id, "--standin-models", *size, "--steps", "2",
                "--no-progress", "--generators", ",".join(models)]
        assert dalleval.main(argv) == 0, part
        check_records(tmp_path / run_id, models)
        images = pq.read_table(tmp_path / run_id / "images.parquet").to_pandas()
        assert images["model"].nunique() == 4 and set(images[I.GENERATION_STATUS]) == {"ok"}, part

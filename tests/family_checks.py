"""The model-family matrix's shared checks: which stand-in family ran for which requested
hub id, with that model's card defaults recorded; and paper 002's per-family image checks. Used by
tests/studies/test_model_families_run.py and tests/studies/amplification/test_training_images.py."""

from __future__ import annotations

import json

import pyarrow.parquet as pq

from schemas import images as I

SDXL, SD35, FLUX, PIXART = ("stabilityai/stable-diffusion-xl-base-1.0", "stabilityai/stable-diffusion-3.5-medium",
                            "black-forest-labs/FLUX.1-schnell", "PixArt-alpha/PixArt-Sigma-XL-2-1024-MS")
FAMILY = {SDXL: ("sdxl", "StableDiffusionXLPipeline"), SD35: ("sd3", "StableDiffusion3Pipeline"),
          FLUX: ("flux", "FluxPipeline"), PIXART: ("pixart-sigma", "PixArtSigmaPipeline")}
# the 2025-2026 families with tiny stand-ins (pipelines/standins/families.py)
NEW = {"lodestones/Chroma1-HD": ("chroma", "ChromaPipeline"),
       "Alpha-VLLM/Lumina-Image-2.0": ("lumina2", "Lumina2Pipeline"),
       "Efficient-Large-Model/Sana_1600M_1024px_BF16_diffusers": ("sana", "SanaPipeline"),
       "Efficient-Large-Model/Sana_Sprint_1.6B_1024px_diffusers": ("sana-sprint", "SanaSprintPipeline"),
       "Tongyi-MAI/Z-Image-Turbo": ("z-image", "ZImagePipeline"),
       "black-forest-labs/FLUX.2-klein-4B": ("flux2-klein", "Flux2KleinPipeline"),
       "THUDM/CogView4-6B": ("cogview4", "CogView4Pipeline"),
       "HiDream-ai/HiDream-I1-Full": ("hidream", "HiDreamImagePipeline"),
       "black-forest-labs/FLUX.2-dev": ("flux2", "Flux2Pipeline"),
       "Qwen/Qwen-Image": ("qwen-image", "QwenImagePipeline"),
       "hunyuanvideo-community/HunyuanImage-2.1-Diffusers": ("hunyuan-image", "HunyuanImagePipeline"),
       "Kwai-Kolors/Kolors-diffusers": ("kolors", "KolorsPipeline")}
FAMILY.update(NEW)
# one generator list, in one order, for every family run: the i-th stand-in has seed i in each, so the
# same weights, and a test process generates each stand-in's NSFW-check calibration images once, in
# whichever family run comes first (pipelines/engine/generation/loading.py, calibration_key)
EVERY = [SDXL, SD35, FLUX, *NEW, PIXART]


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


def check_amplification_families(run_dir, models):
    """Every family's images counted through the face filter and CLIP, for a paper 002
    run with ``models`` (the four of 2024 and the 2025-2026 families with stand-ins)."""
    check_records(run_dir, models)
    images = pq.read_table(run_dir / "images.parquet").to_pandas()
    generated = images[images[I.GENERATION_STATUS].notna()]
    assert set(generated[I.GENERATION_STATUS]) <= {"ok", "nsfw_excluded"} and generated["model"].nunique() == len(models)
    assert generated[I.NSFW].notna().all()                     # one check on both families' images
    excluded = generated[generated[I.GENERATION_STATUS] == "nsfw_excluded"]
    assert excluded[I.NSFW].all() and excluded[I.FACE_STATUS].isna().all()   # never stored, never measured
    ok = generated[generated[I.GENERATION_STATUS] == "ok"]
    assert ok[I.FACE_STATUS].notna().all()                     # every family's images go through the face filter
    faces = ok[ok[I.FACE_STATUS] == "ok"]                      # the SDXL stand-in draws faces (FLUX's: noise)
    assert len(faces) and faces[I.GENDER].isin(["male", "female", "ambiguous"]).all()   # and those through CLIP

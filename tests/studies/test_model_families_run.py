"""Today's model families in every study, end to end on a local Ray instance: `--standin-models`
with SDXL, SD 3.5, FLUX.1 and PixArt hub ids builds a tiny random pipeline of each family, runs it
at that model's defaults (its card's, recorded), checks every model's images with the run's one
NSFW check, and measures them like SD's (issue 30): all four in amplification (face filter and
CLIP), DALL-Eval (BLIP-2 and skin tone, PaintSkills, alignment) and GEP; SDXL, FLUX and SD 3.5 in
Exposed, sections 3-7 (word maps from SDXL's cross-attention and from SD 3's and FLUX's joint
attention; PixArt refused before any work). Amplification's family run is one of
tests/studies/amplification/test_training_images.py's runs. Every family is loaded and generated through the
production loader in tests/operators/test_model_families.py."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from family_checks import FLUX, PIXART, SD35, SDXL, check_records
from pipelines import dalleval, exposed
from schemas import images as I

pytestmark = pytest.mark.ray


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


# amplification (paper 002) with every family: tests/studies/amplification/test_training_images.py's
# run over a partial img2dataset download generates with all four families (one run for both checks,
# family_checks.check_amplification_families)


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

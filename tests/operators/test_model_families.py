"""Today's model families: each family's defaults (card, else pipeline), tiny random SDXL,
SD 3, FLUX and PixArt pipelines built offline and loaded through the production loader, the
per-model settings reaching the pipeline call, NaN images as ``invalid_image``, the denoiser's speed
options, and the one-line error of a gated repository."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow as pa

import pytest
import torch

from operators.image_generation import ImageGenerator
from operators.support import families as F
from operators.support.codec import batch_images
from pipelines.standins.families import FAMILIES as STANDIN_FAMILIES, STANDIN_SIZE, build_tiny_pipeline
from schemas.images import GENDER, GENDER_COLUMNS, GENERATION_DETAIL, GENERATION_STATUS, IMAGE, P_FEMALE, P_MALE, \
    SEED, GenerationStatus
from schemas.subsets import PROMPT, PROMPT_ID

PIPELINE = {"sdxl": "StableDiffusionXLPipeline", "sd3": "StableDiffusion3Pipeline", "flux": "FluxPipeline",
            "pixart": "PixArtSigmaPipeline", "chroma": "ChromaPipeline", "lumina2": "Lumina2Pipeline",
            "sana": "SanaPipeline", "sana-sprint": "SanaSprintPipeline", "z-image": "ZImagePipeline",
            "flux2-klein": "Flux2KleinPipeline", "cogview4": "CogView4Pipeline", "hidream": "HiDreamImagePipeline",
            "flux2": "Flux2Pipeline", "qwen-image": "QwenImagePipeline", "hunyuan-image": "HunyuanImagePipeline",
            "kolors": "KolorsPipeline"}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {f: build_tiny_pipeline(f, root / f, seed=0) for f in STANDIN_FAMILIES}


def test_a_stand_in_is_built_once_per_process_and_copied_byte_for_byte(tmp_path, monkeypatch):
    """A second build of the same family, seed and options writes the first one's files (as they
    were built: the caller may change its own directory); they are what a new build writes."""
    from operators.support.models import file_sha256
    from pipelines.standins import families as SF

    def files(d):
        return {p.relative_to(d).as_posix(): file_sha256(p) for p in sorted(Path(d).rglob("*")) if p.is_file()}

    built = []
    real = SF.build_tiny_stable_diffusion
    monkeypatch.setattr(SF, "build_tiny_stable_diffusion", lambda d, seed=0, **kw: built.append(seed) or real(d, seed=seed, **kw))
    monkeypatch.setattr(SF, "_BUILT", {})
    first = build_tiny_pipeline("sd", tmp_path / "a", seed=5, faces=True)
    (Path(first) / "unet" / "config.json").write_text("{}")          # the first caller changes its copy
    again = build_tiny_pipeline("sd", tmp_path / "b", seed=5, faces=True)
    build_tiny_pipeline("sd", tmp_path / "c", seed=5, faces=False)
    assert again == str(tmp_path / "b") and built == [5, 5]             # other options: built
    monkeypatch.setattr(SF, "_BUILT", {})
    fresh = build_tiny_pipeline("sd", tmp_path / "d", seed=5, faces=True)
    assert built == [5, 5, 5] and files(again) == files(fresh) and len(files(fresh)) >= 10


def rows(prompts, seeds) -> pa.Table:
    return pa.table({PROMPT_ID: [f"p{i}" for i in range(len(prompts))], PROMPT: prompts,
                     SEED: pa.array(seeds, pa.int64())})


class MeanHead:
    """A device head that reads each image's mean (it must never see an invalid image)."""

    stage_name = "mean_head"
    output_fields = GENDER_COLUMNS

    def __init__(self):
        self.seen = 0

    def classify_tensor(self, images):
        assert torch.isfinite(images).all(), "an invalid image reached a head"
        self.seen += len(images)
        m = images.float().mean(dim=(1, 2, 3)).cpu().numpy().astype(np.float32)
        return {GENDER: np.array(["female"] * len(m)), P_MALE: m, P_FEMALE: 1 - m}


# -- defaults ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model, family, steps, guidance, size, seq, dtype, source", [
    ("black-forest-labs/FLUX.1-schnell", "flux", 4, 0.0, 1024, 256, "bfloat16", "card"),
    ("black-forest-labs/FLUX.1-dev", "flux", 50, 3.5, 1024, 512, "bfloat16", "card"),
    ("stabilityai/stable-diffusion-3.5-medium", "sd3", 40, 4.5, None, 256, "bfloat16", "card"),
    ("stabilityai/stable-diffusion-3.5-large-turbo", "sd3", 4, 0.0, None, 256, "bfloat16", "card"),
    ("stabilityai/stable-diffusion-3-medium-diffusers", "sd3", 28, 7.0, None, 256, "float16", "card"),
    ("stabilityai/stable-diffusion-xl-base-1.0", "sdxl", 50, 5.0, None, None, "float16", "family"),
    ("playgroundai/playground-v2.5-1024px-aesthetic", "sdxl", 50, 3.0, None, None, "float16", "card"),
    ("stabilityai/sdxl-turbo", "sdxl", 1, 0.0, 512, None, "float16", "card"),
    ("stabilityai/sd-turbo", "sd", 1, 0.0, 512, None, "float16", "card"),
    ("CompVis/stable-diffusion-v1-4", "sd", 50, 7.5, None, None, "float16", "family"),
    ("PixArt-alpha/PixArt-XL-2-1024-MS", "pixart-alpha", 20, 4.5, None, 120, "float16", "family"),
    ("PixArt-alpha/PixArt-Sigma-XL-2-1024-MS", "pixart-sigma", 20, 4.5, None, 300, "float16", "family"),
    ("someone/a-model-nobody-knows", "unknown", None, None, None, None, "float16", "unknown"),
    ("black-forest-labs/FLUX.2-dev", "flux2", 50, 2.5, None, 512, "bfloat16", "card"),
    ("black-forest-labs/FLUX.2-klein-4B", "flux2-klein", 50, 4.0, None, 512, "bfloat16", "family"),
    ("Qwen/Qwen-Image", "qwen-image", 50, 4.0, None, 512, "bfloat16", "card"),
    ("HiDream-ai/HiDream-I1-Full", "hidream", 50, 5.0, 1024, 128, "bfloat16", "card"),
    ("HiDream-ai/HiDream-I1-Fast", "hidream", 50, 5.0, None, 128, "bfloat16", "family"),
    ("Efficient-Large-Model/Sana_1600M_1024px_BF16_diffusers", "sana", 20, 4.5, 1024, 300, "bfloat16", "family"),
    ("Efficient-Large-Model/Sana_Sprint_1.6B_1024px_diffusers", "sana-sprint", 2, 4.5, 1024, 300, "bfloat16", "family"),
    ("Alpha-VLLM/Lumina-Image-2.0", "lumina2", 30, 4.0, None, 256, "bfloat16", "family"),
    ("Kwai-Kolors/Kolors-diffusers", "kolors", 50, 5.0, None, 256, "float16", "card"),
    ("lodestones/Chroma1-HD", "chroma", 35, 5.0, None, 512, "bfloat16", "family"),
    ("THUDM/CogView4-6B", "cogview4", 50, 5.0, None, 1024, "bfloat16", "family"),
    ("hunyuanvideo-community/HunyuanImage-2.1-Diffusers", "hunyuan-image", 50, None, None, None, "bfloat16", "card"),
    ("Tongyi-MAI/Z-Image-Turbo", "z-image", 8, 0.0, 1024, 512, "bfloat16", "card"),
    ("Qwen/Qwen-Image-Edit", "unknown", None, None, None, None, "float16", "unknown"),   # an editing pipeline
])
def test_each_model_gets_its_cards_or_its_familys_defaults(model, family, steps, guidance, size, seq, dtype, source):
    d = F.defaults(model)
    assert (d["family"], d["steps"], d["guidance_scale"], d["height"], d["width"], d["max_sequence_length"],
            d["cuda_dtype"]) == (family, steps, guidance, size, size, seq, dtype)
    expected = {"card": f"model card of {model}", "family": F.FAMILIES.get(family, F.UNKNOWN).source,
                "unknown": F.UNKNOWN.source}[source]
    if d["cpu_offload"] and source == "family":
        expected += f"; CPU offload as the model card of {model}"
    assert d["defaults_from"] == expected
    # CPU offload where the card's example (the installed pipeline's docstring, when it shows this
    # model) enables it, and nowhere else
    fam = F.FAMILIES.get(family)
    example = _example_docstring(fam.pipelines[0]) if fam else ""
    if model.lower() in example.lower():
        # (PixArt's examples leave it commented out: "# pipe.enable_model_cpu_offload()")
        assert bool(d["cpu_offload"]) == bool(re.search(r">>> \w+\.enable_model_cpu_offload\(\)", example)), model
    else:
        assert d["cpu_offload"] is None, model


def _example_docstring(name: str) -> str:
    """The ``EXAMPLE_DOC_STRING`` of the installed diffusers module that defines pipeline class
    ``name``, read from its source (importing it would import its text encoders' modules)."""
    import ast
    import importlib
    import importlib.util

    import diffusers.pipelines as P

    sub = next(k for k, names in P._import_structure.items() if name in names)
    inner = importlib.import_module(f"diffusers.pipelines.{sub}")._import_structure
    module = next(k for k, names in inner.items() if name in names)
    tree = ast.parse(Path(importlib.util.find_spec(f"diffusers.pipelines.{sub}.{module}").origin).read_text())
    return next((node.value.value for node in tree.body if isinstance(node, ast.Assign)
                 and any(getattr(t, "id", None) == "EXAMPLE_DOC_STRING" for t in node.targets)
                 and isinstance(node.value, ast.Constant)), "")


def _pipeline_class(name: str):
    import importlib

    import diffusers

    cls = getattr(diffusers, name)
    if cls.__module__.startswith("diffusers.utils.dummy"):       # Kolors without sentencepiece: its module
        cls = getattr(importlib.import_module("diffusers.pipelines.kolors.pipeline_kolors"), name)
    return cls


@pytest.mark.parametrize("family", [f for f in F.FAMILIES])
def test_each_family_s_defaults_are_its_installed_pipeline_s(family):
    """The installed diffusers' ``__call__`` signature of the family's pipeline: steps, the guidance
    scale under the family's argument (none for HunyuanImage), the size where the signature fixes
    it, the prompt length, whether it takes a negative prompt; and the dtype its docstring example
    loads it in (bfloat16 or float16)."""
    import importlib
    import inspect

    fam = F.FAMILIES[family]
    cls = _pipeline_class(fam.pipelines[0])
    params = inspect.signature(cls.__call__).parameters
    default = {k: v.default for k, v in params.items()}
    assert default["num_inference_steps"] == fam.steps
    if fam.cfg_argument is None:
        assert "guidance_scale" not in default and "true_cfg_scale" not in default and fam.guidance_scale is None
    else:
        assert default[fam.cfg_argument] == fam.guidance_scale
    if default.get("height") is not None:
        assert default["height"] == default["width"] == fam.size
    assert default.get("max_sequence_length") == fam.max_sequence_length
    # FLUX.1's call takes a negative prompt that acts only with a true_cfg_scale above 1, which this
    # project does not pass (its guidance_scale is the distilled guidance): no negative prompt here
    assert ("negative_prompt" in default) == (fam.negative_prompt or family == "flux")
    example = getattr(importlib.import_module(cls.__module__), "EXAMPLE_DOC_STRING", "")
    loads = [d for d in ("bfloat16", "float16", "float32") if f"torch_dtype=torch.{d}" in example]
    # SANA's example loads float32 and casts its parts to bfloat16; SD 3's is SD 3 medium, float16 by
    # its card entry (CARDS), where the family follows the SD 3.5 cards
    if loads and loads[0] != "float32" and family != "sd3":
        assert fam.cuda_dtype == loads[0], (family, loads)


@pytest.mark.parametrize("family", [f for f in F.FAMILIES])
def test_each_family_is_found_from_a_local_model_index(family, tmp_path):
    fam = F.FAMILIES[family]
    (tmp_path / "model_index.json").write_text(f'{{"_class_name": "{fam.pipelines[0]}"}}')
    found, how = F.detect(str(tmp_path))
    assert found is fam and fam.pipelines[0] in how


def test_the_guidance_scale_goes_under_the_family_s_argument_or_is_refused():
    from operators.support import diffusion as Df

    assert Df.sampling(30, 4.0) == {"num_inference_steps": 30, "guidance_scale": 4.0}
    assert Df.sampling(30, 4.0, "true_cfg_scale") == {"num_inference_steps": 30, "true_cfg_scale": 4.0}
    assert Df.sampling(30, None, None) == {"num_inference_steps": 30}
    with pytest.raises(ValueError, match="takes none"):
        Df.sampling(30, 5.0, None)
    qwen = F.FAMILIES["qwen-image"]
    assert Df.guided_call(qwen, 4.0, {})["negative_prompt"] == Df.BLANK_NEGATIVE
    assert Df.guided_call(qwen, 4.0, {"negative_prompt": "blurry"})["negative_prompt"] == "blurry"
    assert "negative_prompt" not in Df.guided_call(qwen, 1.0, {})
    assert "negative_prompt" not in Df.guided_call(F.FAMILIES["flux2"], 4.0, {})


def test_a_local_directory_is_known_by_its_pipeline_class_and_a_family_can_be_named(tiny, tmp_path):
    for fam, path in tiny.items():
        found, how = F.detect(path)
        assert found.pipelines and PIPELINE[fam] in found.pipelines and PIPELINE[fam] in how
    assert F.detect(str(tmp_path))[0] is F.UNKNOWN
    assert F.defaults("someone/my-sd15-finetune", family="sd")["steps"] == 50
    with pytest.raises(ValueError, match="unknown family"):
        F.defaults("x/y", family="dalle")


def test_in_a_study_the_papers_settings_go_to_its_family_and_card_defaults_to_the_others():
    from pipelines import amplification
    from pipelines.studies.amplification.study import AmplificationStudy

    study = AmplificationStudy()
    args = amplification.build_parser().parse_args(
        ["run", "--output", "x", "--generators", "CompVis/stable-diffusion-v1-4,black-forest-labs/FLUX.1-schnell",
         "stabilityai/stable-diffusion-xl-base-1.0"])
    sd, flux, sdxl = study.settings(args).image.generators
    assert (sd.family, sd.steps, sd.guidance_scale, sd.cuda_dtype) == ("sd", 50, 7.5, "float16")
    assert "study file" in sd.defaults_from
    assert (flux.family, flux.steps, flux.guidance_scale, flux.height, flux.cuda_dtype) == ("flux", 4, 0.0, 1024,
                                                                                          "bfloat16")
    assert dict(flux.extra) == {"max_sequence_length": 256} and "model card" in flux.defaults_from
    assert (sdxl.family, sdxl.steps, sdxl.guidance_scale) == ("sdxl", 50, 5.0)
    # a flag and a per-model setting still win over the card
    args = amplification.build_parser().parse_args(
        ["run", "--output", "x", "--generator", "black-forest-labs/FLUX.1-schnell:steps=2,max_sequence_length=64",
         "--guidance-scale", "1.5"])
    (flux,) = study.settings(args).image.generators
    assert (flux.steps, flux.guidance_scale, dict(flux.extra)) == (2, 1.5, {"max_sequence_length": 64})
    assert flux.record()["family"] == "flux" and "defaults_from" not in flux.record()


# -- the tiny pipelines through the production loader ---------------------------------------------------


@pytest.mark.parametrize("family", STANDIN_FAMILIES)
def test_each_family_generates_through_the_loader_with_its_settings_in_the_call(tiny, family, monkeypatch):
    from operators.support import families

    fam = families.family_of_pipeline(PIPELINE[family])
    extra = {"max_sequence_length": 16} if fam.max_sequence_length else {}
    size = STANDIN_SIZE.get(family, 64)
    guidance = 3.0 if fam.cfg_argument else None      # HunyuanImage's guidance is its guider component
    gen = ImageGenerator(tiny[family], steps=2, guidance_scale=guidance, height=size, width=size, device="cpu",
                         micro_batch=2, heads=[MeanHead()], call_kwargs=extra, cuda_dtype=fam.cuda_dtype)
    assert gen.record["pipeline_class"] == PIPELINE[family] and gen.record["family"] == fam.name
    calls = []
    real = type(gen.pipe).__call__

    def spy(pipe, *a, **kw):
        calls.append(kw)
        return real(pipe, *a, **kw)

    monkeypatch.setattr(type(gen.pipe), "__call__", spy)
    out = gen(rows(["a photo of a nurse", "a photo of a pilot", "a photo of a chef"], [1, 2, 3]))
    assert out.column(GENERATION_STATUS).to_pylist() == ["ok"] * 3
    assert [img.shape for img in batch_images(out)] == [(size, size, 3)] * 3
    assert [c["num_inference_steps"] for c in calls] == [2, 2]
    if fam.cfg_argument:
        assert {c[fam.cfg_argument] for c in calls} == {3.0}
    else:
        assert not {"guidance_scale", "true_cfg_scale"} & {k for c in calls for k in c}
    if fam.cfg_argument == "true_cfg_scale":   # Qwen-Image guides only with a negative prompt: a blank one
        assert all(c["negative_prompt"] == [" "] * len(c["prompt"]) for c in calls)
    for key, value in extra.items():
        assert all(c[key] == value for c in calls)
    assert gen.heads[0].seen == 3


def test_unknown_settings_are_left_to_the_pipeline(tiny, monkeypatch):
    gen = ImageGenerator(tiny["flux"], steps=None, guidance_scale=None, height=64, width=64, device="cpu")
    seen = []
    real = type(gen.pipe).__call__
    monkeypatch.setattr(type(gen.pipe), "__call__", lambda pipe, *a, **kw: seen.append(kw) or real(
        pipe, *a, **{**kw, "num_inference_steps": 1}))
    gen(rows(["a cat"], [0]))
    assert "guidance_scale" not in seen[0] and "num_inference_steps" not in seen[0]
    assert gen.record["steps"] is None and gen.record["guidance_scale"] is None


@pytest.mark.parametrize("family", STANDIN_FAMILIES)
def test_nan_latents_give_invalid_image_never_measured_nor_saved(tiny, family):
    """Every family: NaN in one image's denoiser output (inside the real transformer or UNet, on
    every call) is that image's invalid_image status, never measured nor saved; the others are ok."""
    from operators.support import families

    size = STANDIN_SIZE.get(family, 64)
    head = MeanHead()
    fam = families.family_of_pipeline(PIPELINE[family])
    gen = ImageGenerator(tiny[family], steps=2, guidance_scale=0.0 if fam.cfg_argument else None, height=size,
                         width=size, device="cpu", micro_batch=3, heads=[head])
    denoiser = getattr(gen.pipe, "transformer", None) or gen.pipe.unet

    def poison(module, args, output):   # NaN into the second image's latents, inside the real denoiser
        sample = output[0] if isinstance(output, tuple) else output.sample
        if isinstance(sample, (list, tuple)):       # Z-Image: one tensor per image
            sample[1].fill_(float("nan"))
        else:                                       # the second image of each half of a doubled batch too
            sample[1::3] = float("nan")
        return output

    hook = denoiser.register_forward_hook(poison)
    try:
        out = gen(rows(["a photo of a nurse", "a photo of a pilot", "a photo of a chef"], [1, 2, 3]))
    finally:
        hook.remove()
    status = out.column(GENERATION_STATUS).to_pylist()
    assert status == ["ok", GenerationStatus.INVALID_IMAGE, "ok"]
    assert "NaN" in out.column(GENERATION_DETAIL)[1].as_py()
    assert out.column(IMAGE)[1].as_py() is None and out.column(GENDER)[1].as_py() is None
    assert out.column(GENDER)[0].as_py() == "female" and head.seen == 2
    assert GenerationStatus.INVALID_IMAGE in GenerationStatus.FAILURES   # counts against the error budget


def test_an_all_black_image_is_invalid_unless_the_checker_blanked_it():
    from operators.support.diffusion import invalid_images

    images = torch.rand(3, 3, 8, 8)
    images[1] = 0.0
    images[2] = 0.0
    assert invalid_images(images) == [None, invalid_images(images)[1], invalid_images(images)[2]]
    assert "all black" in invalid_images(images)[1]
    assert invalid_images(images, blocked=[False, False, True])[2] is None


def test_the_denoiser_compiles_whatever_it_is_and_channels_last_is_refused_for_a_transformer(tiny):
    from operators.support.diffusion import apply_speed_options, load_text2image

    pipe, _ = load_text2image(tiny["flux"], device="cpu", dtype="float32")
    rec = apply_speed_options(pipe, False, "default", False)
    assert rec["compile_unet"] == "default" and getattr(pipe.transformer, "_compiled_call_impl", None) is not None
    with pytest.raises(ValueError, match="transformer"):
        apply_speed_options(pipe, True, None, False)


def test_a_gated_or_missing_repository_is_one_line_naming_the_licence_page_and_the_token(monkeypatch):
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    from operators.support import diffusion
    from operators.support.models import ModelLoadError

    def fails(error):
        def download(*a, **k):
            exc = error.__new__(error)           # as huggingface_hub raises it, without an HTTP response
            Exception.__init__(exc, "401 Client Error: Unauthorized")
            raise OSError("could not download") from exc
        return download

    import diffusers

    for error, words in ((GatedRepoError, "is gated"), (RepositoryNotFoundError, "no repository")):
        monkeypatch.setattr(diffusers.DiffusionPipeline, "download", staticmethod(fails(error)))
        with pytest.raises(ModelLoadError) as info:
            diffusion.load_text2image("black-forest-labs/FLUX.1-dev", device="cpu")
        text = str(info.value)
        assert words in text and "https://huggingface.co/black-forest-labs/FLUX.1-dev" in text
        assert "HF_TOKEN" in text and "huggingface-cli login" in text and "\n" not in text


def test_the_fp16_weight_files_are_asked_for_only_when_the_model_runs_in_float16(monkeypatch):
    import diffusers

    from operators.support import diffusion
    from operators.support.models import ModelLoadError

    asked = []

    def download(model, **kwargs):
        asked.append(kwargs.get("variant"))
        raise OSError("offline")

    monkeypatch.setattr(diffusers.DiffusionPipeline, "download", staticmethod(download))
    for dtype in ("float16", "float32"):
        with pytest.raises(ModelLoadError):
            diffusion.load_text2image("stabilityai/stable-diffusion-xl-base-1.0", device="cpu", dtype=dtype,
                                      variant="fp16")
    assert asked == ["fp16", None]
    assert F.defaults("stabilityai/stable-diffusion-xl-base-1.0")["variant"] == "fp16"
    assert F.defaults("black-forest-labs/FLUX.1-schnell")["variant"] is None


def test_a_model_too_large_for_the_card_is_refused_before_loading_with_the_options(tiny):
    from operators.support.diffusion import MEMORY_HEADROOM, check_fits, pipeline_parameters
    from safetensors import safe_open

    from operators.support.models import ModelLoadError

    params = pipeline_parameters(tiny["flux"])
    counted = 0
    for comp in ("transformer", "text_encoder", "text_encoder_2", "vae"):
        for f in (Path(tiny["flux"]) / comp).glob("*.safetensors"):
            with safe_open(str(f), "pt") as fh:
                counted += sum(fh.get_tensor(k).numel() for k in fh.keys())
    assert params == counted > 0
    need = params * 2 * MEMORY_HEADROOM
    check_fits("x/flux", tiny["flux"], torch.bfloat16, "cuda", total_bytes=int(need) + 1)   # fits
    with pytest.raises(ModelLoadError) as info:
        check_fits("x/flux", tiny["flux"], torch.bfloat16, "cuda", total_bytes=int(need) - 1)
    text = str(info.value)
    assert "x/flux" in text and "bfloat16" in text and "cluster.yaml" in text and "\n" not in text
    check_fits("x/flux", tiny["flux"], torch.float32, "cpu")   # nothing to check on a CPU


def test_cpu_offload_needs_only_the_largest_component_to_fit_and_a_gpu(tiny, monkeypatch):
    """--gen-cpu-offload: the card must hold the largest component, not the whole pipeline; on a CPU
    it is refused in one line; on a GPU the pipeline is offloaded (enable_model_cpu_offload), never
    moved whole (.to)."""
    import diffusers

    from operators.support import diffusion
    from operators.support.diffusion import MEMORY_HEADROOM, check_fits, component_parameters, load_text2image
    from operators.support.models import ModelLoadError

    counts = component_parameters(tiny["flux"])
    assert set(counts) >= {"transformer", "text_encoder", "text_encoder_2", "vae"}
    largest, total = max(counts.values()), sum(counts.values())
    card = int((largest + total) / 2 * 2 * MEMORY_HEADROOM)        # between the two needs, in bfloat16
    check_fits("x/flux", tiny["flux"], torch.bfloat16, "cuda", total_bytes=card, offload=True)
    with pytest.raises(ModelLoadError, match="--gen-cpu-offload"):
        check_fits("x/flux", tiny["flux"], torch.bfloat16, "cuda", total_bytes=card)
    with pytest.raises(ModelLoadError, match="largest component"):
        check_fits("x/flux", tiny["flux"], torch.bfloat16, "cuda", total_bytes=int(largest * 2), offload=True)
    with pytest.raises(ValueError, match="cpu_offload moves .* runs on cpu"):
        load_text2image(tiny["sdxl"], device="cpu", cpu_offload=True)
    # on a GPU (faked: the device check and the hooks are CUDA's), the offload call, not .to(device)
    calls = []
    monkeypatch.setattr(diffusion, "pick_device", lambda d: "cuda:0")
    monkeypatch.setattr(diffusion, "resolve_dtype", lambda *a, **k: torch.float32)
    monkeypatch.setattr(diffusion, "check_fits", lambda *a, **k: calls.append(("fits", k.get("offload"))))
    monkeypatch.setattr(diffusers.DiffusionPipeline, "enable_model_cpu_offload",
                        lambda self, gpu_id=None, device=None: calls.append(("offload", str(device))))
    monkeypatch.setattr(diffusers.DiffusionPipeline, "to", lambda self, *a, **k: calls.append(("to", a)) or self)
    _, rec = load_text2image(tiny["sdxl"], device="cuda", cpu_offload=True)
    assert calls == [("fits", True), ("offload", "cuda:0")] and rec["cpu_offload"] is True


@pytest.mark.parametrize("family", ["sdxl", "sd3", "flux"])
def test_the_pooled_prompt_space_is_what_the_denoiser_receives(tiny, family):
    """Exposed's pooled prompt space: SDXL's add_text_embeds and SD 3's pooled_prompt_embeds from the
    step callback, FLUX's from its own encode_prompt; the conditional half, one per image; the
    images are those of a plain call."""
    from operators.image_triplet_generation import generate_units, pooled_space_text
    from operators.support.diffusion import load_text2image

    pipe, _ = load_text2image(tiny[family], device="cpu", dtype="float32")
    triplet = ("a photo of a person", "a photo of a woman", "a photo of a man")
    size = STANDIN_SIZE.get(family, 64)
    guidance = 0.0 if family == "flux" else 5.0
    images, embeds, _, _, pooled = generate_units(pipe, [triplet], [5], 2, guidance, size, size)
    gens = [torch.Generator("cpu").manual_seed(5) for _ in range(3)]
    plain = pipe(prompt=list(triplet), num_inference_steps=2, guidance_scale=guidance, height=size, width=size,
                 generator=gens, output_type="pt").images
    assert torch.equal(images.reshape(3, *images.shape[2:]), plain)
    if family == "flux":
        expected = pipe.encode_prompt(prompt=list(triplet), prompt_2=None, device="cpu")[1]
    elif family == "sdxl":
        expected = pipe.encode_prompt(list(triplet), device="cpu", do_classifier_free_guidance=True)[2]
    else:
        expected = pipe.encode_prompt(list(triplet), None, None, device="cpu", do_classifier_free_guidance=True)[2]
    assert pooled.shape == (1, 3, expected.shape[-1]) and embeds.ndim == 4   # pooled: one vector per image
    assert torch.allclose(pooled.reshape(3, -1), expected, atol=1e-5)
    assert pooled_space_text(pipe).startswith({"sdxl": "SDXL:", "sd3": "SD 3:", "flux": "FLUX:"}[family])

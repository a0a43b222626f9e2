"""Text-to-image model families and the defaults each runs with unless a study or the user sets them.

A generator's settings come, per setting, from the first of: the user's per-model settings
(``--generator MODEL:key=value``, a ``models:`` entry of a study file), the global flags
(``--steps``, ...), the study file's generation block (only for the models that file lists: the
paper's models with the paper's settings), and finally the defaults here, by model: the values its
model card recommends (``CARDS``, quoted with their sources in docs/method.md, "Model families"),
else its family's pipeline defaults (``FAMILIES``: what the diffusers pipeline's ``__call__`` uses
when the argument is not given). A model of no known family loads through
``AutoPipelineForText2Image`` with the library's own defaults (nothing is passed), and its record
says so.

The family of a model is found without the network: a local directory's ``model_index.json``
(its pipeline class), else a hub id known here (``KNOWN_IDS``), else the hub cache's copy of its
``model_index.json``; otherwise it is unknown until it loads (the loaded pipeline's class is
recorded either way).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Family:
    """One family of diffusers text-to-image pipelines and its pipeline defaults."""

    name: str
    pipelines: tuple[str, ...]      # diffusers pipeline class names
    steps: int | None               # None: not passed (the library's default)
    guidance_scale: float | None
    size: int | None                # None: the model's own (its denoiser's sample size x the VAE's factor)
    max_sequence_length: int | None  # the T5 prompt length (None: no T5 encoder)
    cuda_dtype: str                 # dtype "auto" on a GPU: float16, or bfloat16 where float16 fails
    denoiser: str                   # "unet" or "transformer"
    safety_checker: bool            # ships the Stable Diffusion safety checker
    negative_prompt: bool           # the pipeline takes a negative prompt
    pooled: bool                    # the denoiser also receives a pooled text embedding
    source: str
    cfg_argument: str | None = "guidance_scale"   # the call argument of the guidance scale (None: none)


FAMILIES = {
    f.name: f for f in (
        Family("sd", ("StableDiffusionPipeline",), 50, 7.5, None, None, "float16", "unet", True, True, False,
               "StableDiffusionPipeline.__call__ defaults (the SD 1.x/2.x cards give no steps or guidance)"),
        Family("sdxl", ("StableDiffusionXLPipeline",), 50, 5.0, None, None, "float16", "unet", False, True, True,
               "StableDiffusionXLPipeline.__call__ defaults; the VAE runs in float32 (force_upcast) as the "
               "SDXL VAE overflows in float16"),
        Family("sd3", ("StableDiffusion3Pipeline",), 28, 7.0, None, 256, "bfloat16", "transformer", False, True,
               True, "StableDiffusion3Pipeline.__call__ defaults; bfloat16 as in the SD 3.5 cards"),
        Family("flux", ("FluxPipeline",), 28, 3.5, 1024, 512, "bfloat16", "transformer", False, False, True,
               "FluxPipeline.__call__ defaults; bfloat16: FLUX overflows in float16 (black or NaN images)"),
        Family("pixart-alpha", ("PixArtAlphaPipeline",), 20, 4.5, None, 120, "float16", "transformer", False, True,
               False, "PixArtAlphaPipeline.__call__ defaults"),
        Family("pixart-sigma", ("PixArtSigmaPipeline",), 20, 4.5, None, 300, "float16", "transformer", False, True,
               False, "PixArtSigmaPipeline.__call__ defaults"),
        # the families of 2025-2026 (diffusers 0.42): their pipelines' __call__ defaults (tested against the
        # installed signatures), bfloat16 as every one of their examples loads them
        Family("flux2", ("Flux2Pipeline",), 50, 4.0, None, 512, "bfloat16", "transformer", False, False, False,
               "Flux2Pipeline.__call__ defaults (Mistral 3 text encoder, no negative prompt)"),
        Family("flux2-klein", ("Flux2KleinPipeline",), 50, 4.0, None, 512, "bfloat16", "transformer", False, False,
               False, "Flux2KleinPipeline.__call__ defaults (Qwen3 text encoder, no negative prompt)"),
        Family("qwen-image", ("QwenImagePipeline",), 50, 4.0, None, 512, "bfloat16", "transformer", False, True, False,
               "QwenImagePipeline.__call__ defaults; its classifier-free guidance scale is true_cfg_scale (4.0), "
               "active with a negative prompt; guidance_scale is for guidance-distilled variants",
               "true_cfg_scale"),
        Family("hidream", ("HiDreamImagePipeline",), 50, 5.0, None, 128, "bfloat16", "transformer", False, True, True,
               "HiDreamImagePipeline.__call__ defaults (two CLIP, T5 and Llama 3.1 text encoders)"),
        Family("sana", ("SanaPipeline",), 20, 4.5, 1024, 300, "bfloat16", "transformer", False, True, False,
               "SanaPipeline.__call__ defaults (Gemma 2 text encoder, DC-AE)"),
        Family("sana-sprint", ("SanaSprintPipeline",), 2, 4.5, 1024, 300, "bfloat16", "transformer", False, False,
               False, "SanaSprintPipeline.__call__ defaults (guidance embedded, no negative prompt)"),
        Family("lumina2", ("Lumina2Pipeline",), 30, 4.0, None, 256, "bfloat16", "transformer", False, True, False,
               "Lumina2Pipeline.__call__ defaults (Gemma 2 text encoder)"),
        Family("kolors", ("KolorsPipeline",), 50, 5.0, None, 256, "float16", "unet", False, True, True,
               "KolorsPipeline.__call__ defaults (ChatGLM3 text encoder; needs the sentencepiece package)"),
        Family("chroma", ("ChromaPipeline",), 35, 5.0, None, 512, "bfloat16", "transformer", False, True, False,
               "ChromaPipeline.__call__ defaults (T5 only)"),
        Family("cogview4", ("CogView4Pipeline",), 50, 5.0, None, 1024, "bfloat16", "transformer", False, True, False,
               "CogView4Pipeline.__call__ defaults (GLM-4 text encoder)"),
        Family("hunyuan-image", ("HunyuanImagePipeline",), 50, None, None, None, "bfloat16", "transformer", False,
               True, False, "HunyuanImagePipeline.__call__ defaults; its guidance is a guider component, not a "
               "call argument", None),
        Family("z-image", ("ZImagePipeline",), 50, 5.0, None, 512, "bfloat16", "transformer", False, True, False,
               "ZImagePipeline.__call__ defaults (Qwen3 text encoder)"),
    )
}
UNKNOWN = Family("unknown", (), None, None, None, None, "float16", "unknown", False, True, False,
                 "AutoPipelineForText2Image with the library's defaults (a family this project does not know)")

# What the model cards recommend where they say (docs/method.md quotes each): steps, guidance,
# size, max_sequence_length, dtype on a GPU. Keys: hub ids, lower case.
# ``cpu_offload``: the card's example enables diffusers' model CPU offload (applied when the generator actors
# get a GPU; a spec's ``cpu_offload=false`` turns it off).
# ``variant``: the repository has float16 weight files (``variant="fp16"``), downloaded instead of
# the float32 ones when the model runs in float16 (half the download: 7 GB instead of 14 for SDXL).
CARDS: dict[str, dict] = {
    "black-forest-labs/flux.1-schnell": {"steps": 4, "guidance_scale": 0.0, "max_sequence_length": 256},
    "black-forest-labs/flux.1-dev": {"steps": 50, "guidance_scale": 3.5, "max_sequence_length": 512, "size": 1024},
    "stabilityai/stable-diffusion-3-medium-diffusers": {"steps": 28, "guidance_scale": 7.0, "cuda_dtype": "float16"},
    "stabilityai/stable-diffusion-3.5-medium": {"steps": 40, "guidance_scale": 4.5},
    "stabilityai/stable-diffusion-3.5-large": {"steps": 28, "guidance_scale": 3.5},
    "stabilityai/stable-diffusion-3.5-large-turbo": {"steps": 4, "guidance_scale": 0.0},
    "playgroundai/playground-v2.5-1024px-aesthetic": {"steps": 50, "guidance_scale": 3.0, "variant": "fp16"},
    "stabilityai/sd-turbo": {"steps": 1, "guidance_scale": 0.0, "size": 512, "variant": "fp16"},
    "stabilityai/sdxl-turbo": {"steps": 1, "guidance_scale": 0.0, "size": 512, "variant": "fp16"},
    "stabilityai/stable-diffusion-xl-base-1.0": {"variant": "fp16"},
    # the 2025-2026 families: their pipelines' docstring examples in diffusers 0.42 (docs/method.md)
    "black-forest-labs/flux.2-dev": {"steps": 50, "guidance_scale": 2.5},
    "black-forest-labs/flux.2-klein-base-9b": {"steps": 50, "guidance_scale": 4.0},
    "qwen/qwen-image": {"steps": 50},
    "hidream-ai/hidream-i1-full": {"steps": 50, "guidance_scale": 5.0, "size": 1024, "cpu_offload": True},
    "alpha-vllm/lumina-image-2.0": {"cpu_offload": True},
    "lodestones/chroma1-hd": {"cpu_offload": True},
    "pixart-alpha/pixart-xl-2-1024-ms": {"cpu_offload": True},
    "z-a-o/z-image-turbo": {"steps": 8, "guidance_scale": 0.0, "size": 1024},
    "tongyi-mai/z-image-turbo": {"steps": 8, "guidance_scale": 0.0, "size": 1024},
    "kwai-kolors/kolors-diffusers": {"variant": "fp16", "cuda_dtype": "float16"},
    "hunyuanvideo-community/hunyuanimage-2.1-diffusers": {"steps": 50},
}

# hub ids whose family is known without reading their model_index.json (regular expressions on the
# lower-case id)
KNOWN_IDS: tuple[tuple[str, str], ...] = (
    (r"^stabilityai/sdxl-turbo$", "sdxl"),
    (r"^stabilityai/sd-turbo$", "sd"),
    (r"stable-diffusion-xl|^playgroundai/playground-v2", "sdxl"),
    (r"stable-diffusion-3", "sd3"),
    (r"^black-forest-labs/flux\.1", "flux"),
    (r"^pixart-alpha/pixart-sigma", "pixart-sigma"),
    (r"^pixart-alpha/pixart-xl", "pixart-alpha"),
    (r"stable-diffusion-v1|stable-diffusion-2|^compvis/stable-diffusion", "sd"),
    (r"^black-forest-labs/flux\.2-klein", "flux2-klein"),
    (r"^black-forest-labs/flux\.2", "flux2"),
    (r"^qwen/qwen-image(-\d+)?$", "qwen-image"),
    (r"^hidream-ai/hidream-i1-(full|dev|fast)$", "hidream"),
    (r"^efficient-large-model/sana_sprint", "sana-sprint"),
    (r"^efficient-large-model/sana", "sana"),
    (r"^alpha-vllm/lumina-image-2\.0$", "lumina2"),
    (r"^kwai-kolors/kolors", "kolors"),
    (r"^lodestones/chroma", "chroma"),
    (r"^(thudm|zai-org)/cogview4", "cogview4"),
    (r"hunyuanimage-2\.1", "hunyuan-image"),
    (r"/z-image", "z-image"),
)

SETTING_KEYS = ("steps", "guidance_scale", "size", "max_sequence_length", "cuda_dtype")
# the families whose denoiser's attention gives word heat maps here (SD Exposed, sections 5-7): a
# UNet's cross-attention (DAAM), SD 3's and FLUX.1's joint attention (operators.support.joint_attention)
# and the joint attention of Chroma, FLUX.2, Qwen-Image, HunyuanImage, CogView4, Lumina 2 and Z-Image and
# SANA's and PixArt's cross-attention read at the attention kernel (operators.support.kernel_attention),
# Kolors's UNet cross-attention over its left-padded ChatGLM3 tokens (operators.support.kolors_attention);
# SD Exposed still refuses PixArt, whose pipelines pass no latents to the step callback
WORD_MAPS = ("sd", "sdxl", "sd3", "flux", "chroma", "flux2", "flux2-klein", "qwen-image", "hunyuan-image", "cogview4",
             "lumina2", "z-image", "sana", "sana-sprint", "pixart-alpha", "pixart-sigma", "kolors", "hidream")


def family_of_pipeline(class_name: str | None) -> Family:
    for f in FAMILIES.values():
        if class_name in f.pipelines:
            return f
    return UNKNOWN


def _index_class(path: str | os.PathLike) -> str | None:
    try:
        return json.loads(Path(path).read_text()).get("_class_name")
    except (OSError, ValueError, AttributeError):
        return None


def detect(model: str, revision: str | None = None) -> tuple[Family, str]:
    """(family, how it was found) for a hub id or a local directory, without the network."""
    if os.path.isdir(model):
        cls = _index_class(Path(model) / "model_index.json")
        return family_of_pipeline(cls), f"model_index.json ({cls})" if cls else "no model_index.json"
    key = model.strip().lower()
    for pattern, name in KNOWN_IDS:
        if re.search(pattern, key):
            return FAMILIES[name], "known hub id"
    try:
        from huggingface_hub import try_to_load_from_cache  # deferred: huggingface_hub

        cached = try_to_load_from_cache(model, "model_index.json", revision=revision)
        if isinstance(cached, str):
            cls = _index_class(cached)
            return family_of_pipeline(cls), f"cached model_index.json ({cls})"
    except Exception:  # noqa: BLE001 -- an id that is not a repo name: unknown until it loads
        pass
    return UNKNOWN, "not known before loading"


def defaults(model: str, revision: str | None = None, family: str | None = None) -> dict:
    """The default settings of ``model``: its card's where it gives them, else its family's.
    Returns {family, family_from, defaults_from, steps, guidance_scale, height, width,
    max_sequence_length, cuda_dtype, variant, cpu_offload} (None where the library decides)."""
    if family:
        if family not in FAMILIES and family != UNKNOWN.name:
            raise ValueError(f"unknown family {family!r}; known: {', '.join(FAMILIES)}")
        fam, how = FAMILIES.get(family, UNKNOWN), "set by the user"
    else:
        fam, how = detect(model, revision)
    values = {"steps": fam.steps, "guidance_scale": fam.guidance_scale, "size": fam.size,
              "max_sequence_length": fam.max_sequence_length, "cuda_dtype": fam.cuda_dtype, "variant": None,
              "cpu_offload": None}
    card = CARDS.get(model.strip().lower(), {})
    values.update(card)
    from_card = bool(set(card) - {"variant", "cpu_offload"})   # a weight variant alone is no card default
    size = values.pop("size")
    source = f"model card of {model}" if from_card else fam.source
    if "cpu_offload" in card and not from_card:
        source += f"; CPU offload as the model card of {model}"
    return {"family": fam.name, "family_from": how, "defaults_from": source,
            **values, "height": size, "width": size}

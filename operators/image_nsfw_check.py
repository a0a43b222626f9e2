"""One NSFW check for every model's images: the Stable Diffusion safety checker as a head.

Stable Diffusion 1.x/2.x ship a safety checker (``StableDiffusionSafetyChecker``: CLIP ViT-L/14
image embeddings compared with 17 concept and 3 "special care" embeddings, each with its own
threshold) that blanks the images it flags; SDXL, SD 3, FLUX and PixArt ship none. Left to the
models, which images a study measures would depend on the model, and per-model denominators
would differ. Under the run-level policy ``check-all`` (``pipelines.engine.generation``) no
model's own checker runs; this head runs on every generated image of every model alike, on the
generator's device, before any other head, and records NSFW per image. Whether flagged images are
left out of every measurement is one run-level setting (``generation.nsfw_check.exclude``).

The check is the same computation the Stable Diffusion pipeline runs (``run_safety_checker``):
the image as 8-bit RGB, through the checker's own ``CLIPImageProcessor`` (PIL resize and centre
crop to 224), then ``StableDiffusionSafetyChecker.forward`` (its scores, rounding and the 0.01
special-care adjustment), so with the weights of SD 1.4's ``safety_checker`` folder it flags
exactly the images SD 1.4's pipeline blanks (tested against the pipeline's own checker).

``model``: a diffusers pipeline (directory or hub id) with ``safety_checker/`` and
``feature_extractor/`` folders (e.g. ``CompVis/stable-diffusion-v1-4``: of a hub repository only
those two folders are downloaded), or a standalone checker (``config.json`` and
``preprocessor_config.json`` at its root, e.g. ``CompVis/stable-diffusion-safety-checker``).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa

from operators.base import DeviceHead, Resources, Stage, declares
from operators.support.codec import rgb_levels
from operators.support.models import (
    ModelLoadError,
    check_loading_info,
    dtype_kwarg,
    loaded_weight_files,
    loading,
    pick_device,
    resolve_dtype,
    weights_provenance,
)
from schemas.images import NSFW, GenerationStatus

STAGE_NSFW_CHECK = "nsfw_check"
DEFAULT_CHECKER = "CompVis/stable-diffusion-v1-4"   # SD 1.4's own checker (paper 002's first model)
PIPELINE_FOLDERS = ("safety_checker", "feature_extractor")
# a hub repository's files the check reads: the two folders of a pipeline, or a standalone checker's
# root files (never a pipeline's other components or its single-file checkpoints)
HUB_PATTERNS = ["safety_checker/*", "feature_extractor/*", "config.json", "preprocessor_config.json",
                "model.safetensors", "pytorch_model.bin"]


def checker_folders(root: str | os.PathLike) -> tuple[Path, Path]:
    """(checker folder, image processor folder) of a local pipeline or standalone checker."""
    root = Path(root)
    if (root / "safety_checker" / "config.json").is_file():
        return root / "safety_checker", root / "feature_extractor"
    if (root / "config.json").is_file():
        return root, root
    raise ValueError(f"{root} has neither safety_checker/config.json (a Stable Diffusion pipeline) nor config.json "
                     f"(a standalone StableDiffusionSafetyChecker)")


def load_safety_checker(model: str = DEFAULT_CHECKER, revision: str | None = None, device: str = "auto",
                        dtype: str = "auto"):
    """``(checker, image_processor, record)`` of a Stable Diffusion safety checker (module docstring)."""
    device = pick_device(device)
    torch_dtype = resolve_dtype(dtype, device)

    def error(exc):
        return ModelLoadError(
            f"cannot load the NSFW check {model!r} (revision {revision!r}): {type(exc).__name__}: "
            f"{str(exc).rstrip('. ')}. Give a Stable Diffusion pipeline with safety_checker/ and feature_extractor/ "
            f"folders, or a StableDiffusionSafetyChecker directory, as a local path or a hub id in the cache; or set "
            f"generation.safety_checker to off (no check) or model-default (each model's own checker)")

    with loading(error):
        # deferred: diffusers
        from diffusers.pipelines.stable_diffusion.safety_checker import StableDiffusionSafetyChecker
        from transformers import CLIPImageProcessor  # deferred: transformers

        if os.path.isdir(model):
            root = model
        else:
            from huggingface_hub import snapshot_download  # deferred: huggingface_hub

            root = snapshot_download(model, revision=revision, allow_patterns=HUB_PATTERNS)
        checker_dir, processor_dir = checker_folders(root)
        checker, info = StableDiffusionSafetyChecker.from_pretrained(checker_dir, output_loading_info=True,
                                                                     **dtype_kwarg(torch_dtype))
        check_loading_info(info)
        processor = CLIPImageProcessor.from_pretrained(processor_dir)
        checker = checker.to(device).eval()
    record = {"model": model, "revision": revision, "source": "directory" if os.path.isdir(model) else "hub",
              "class": type(checker).__name__, "dtype": str(torch_dtype).replace("torch.", ""), "device": device,
              "path": os.path.abspath(root),
              **weights_provenance(loaded_weight_files(checker_dir), root)}
    return checker, processor, record


class NsfwCheck:
    """A DeviceHead: NSFW (bool) per generated image, from a Stable Diffusion safety checker."""

    stage_name = STAGE_NSFW_CHECK
    output_fields = (pa.field(NSFW, pa.bool_()),)
    resources = Resources(num_cpus=1, num_gpus=1, batch_size=8, actors=1)

    def __init__(self, model: str = DEFAULT_CHECKER, revision: str | None = None, device: str = "auto",
                 dtype: str = "auto"):
        self.checker, self.processor, self.record = load_safety_checker(model, revision, device, dtype)
        self.device = self.record["device"]

    def flags(self, images) -> list[bool]:
        """Per image of a (B, 3, H, W) float batch in [0, 1]: whether the checker flags it."""
        import torch  # deferred: torch
        from PIL import Image  # deferred: PIL

        levels = rgb_levels(images.detach().float()).to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
        pil = [Image.fromarray(a) for a in levels]   # what the SD pipeline hands its feature extractor
        pixels = self.processor(pil, return_tensors="pt").pixel_values
        pixels = pixels.to(self.device, dtype=self.checker.dtype)
        placeholders = [np.zeros(1) for _ in pil]    # forward blanks these, never the images measured
        with torch.inference_mode():
            _, flagged = self.checker(clip_input=pixels, images=placeholders)
        return [bool(f) for f in flagged]

    def classify_tensor(self, images, **_) -> dict:
        return {NSFW: self.flags(images)}


def generator_head(nsfw_check, exclude: bool, device: str):
    """A generator's NSFW check (a Stage, built here on ``device``, or a built head; None: no check),
    checked against the DeviceHead contract; ``exclude`` needs one."""
    if exclude and nsfw_check is None:
        raise ValueError("exclude_nsfw needs an nsfw_check to flag images")
    head = nsfw_check.build(device=device) if isinstance(nsfw_check, Stage) else nsfw_check
    if head is not None and not isinstance(head, DeviceHead):
        raise TypeError(f"nsfw_check {type(head).__name__} lacks {declares(type(head), DeviceHead)} of the "
                        f"DeviceHead contract")
    return head


def check_generated(head, images, unusable, exclude: bool):
    """Run a generator's NSFW check ``head`` (or nothing, when None) on the usable images of a
    (B, 3, H, W) batch: (per image its flag or None where it was not checked, ``unusable`` with
    the flagged images added when ``exclude``)."""
    import torch  # deferred: torch

    checked = np.full(len(unusable), None, dtype=object)
    if head is None or unusable.all():
        return checked, unusable
    keep = np.flatnonzero(~unusable)
    sub = images if len(keep) == len(unusable) else images[torch.as_tensor(keep, device=images.device)]
    for k, f in zip(keep, head.classify_tensor(sub)[NSFW]):
        checked[k] = bool(f)
    if exclude:
        unusable = unusable | (checked == True)  # noqa: E712 -- None (unchecked) is not flagged
    return checked, unusable


def not_stored(status) -> np.ndarray:
    """Per row of a status array: its image is never stored (GenerationStatus.NOT_STORED)."""
    return np.isin(np.asarray(status, dtype=object), GenerationStatus.NOT_STORED)

"""Text-to-image generation: prompt + seed -> image (paper 002, sections 3.1 and 6, App. A.3).

The paper generates 500 images per (occupation, prompt) with Stable Diffusion 1.4 and 1.5, "using
various random seeds to initialize random noise", guidance scale 7.5 and 50 inference steps. This
stage loads any diffusers text-to-image pipeline (``AutoPipelineForText2Image``: SD 1.x/2.x, SDXL,
...) from a hub id or a local directory and generates one image per row.

Reproducibility: every row gets its own ``torch.Generator`` seeded with the row's SEED, so its
initial noise depends only on that seed, never on which rows share its micro-batch or in which
order. By default the generators live on the CPU (``noise_device="cpu"``): the same seed then
gives the same initial noise on a CPU and on a GPU. :func:`regenerate` re-creates one image
alone from (model, prompt, seed, settings).

Bit-exactness: with ``micro_batch=1`` every pipeline call has the same shapes, so an image is
bit-for-bit the one :func:`regenerate` produces on the same device, dtype and library versions,
whatever its neighbours in the Ray batch. With ``micro_batch > 1`` the initial noise is still
identical, but the batched kernels (GEMM row tiling, SIMD tails, conv algorithm choice) round a
sample differently depending on its position and the batch size, so pixels can differ by a
level or two from the image generated alone; that is floating-point, not a different image.

Images stay on the device as a float tensor in [0, 1] (``output_type="pt"``); the
``heads`` (CLIP gender, CLIP embedding, BLIP-2, object detection, FID features) run on that
tensor directly (no encode/decode round trip; a head with ``takes_prompts = True`` also gets the
images' prompts, as ``classify_tensor(images, prompts=...)``), then the images move to the CPU once as raw RGB8 payloads
(``operators.support.codec.pack_rgb8``).

Rows whose prompt is null or blank are not generated: they get GENERATION_STATUS
``invalid_prompt`` and a null payload. Where the pipeline's safety checker flags an image it
blanks it; that row gets ``nsfw_blocked`` and NSFW true (and no gender). NSFW is null when no
checker ran (none shipped, or ``safety_checker="off"``).

Out of memory (``torch.cuda.OutOfMemoryError``, or a RuntimeError saying "out of memory") does not
end the job: the micro-batch is retried in halves, down to one image, with the allocator's cache
emptied between tries; an image that still fails alone gets ``generation_error`` and the message in
GENERATION_DETAIL, and counts against the generation error budget. Other errors propagate.

Speed options (keyword arguments of :class:`ImageGenerator`; all off by default, so the default
generator runs exactly as before). Each is recorded in ``ImageGenerator.record``:

* attention: diffusers' default processor, ``AttnProcessor2_0`` (PyTorch's
  ``scaled_dot_product_attention``: flash / memory-efficient kernels on CUDA), is what runs; the
  record lists the processor classes the UNet and the VAE actually hold (``attention_processors``).
* ``channels_last=True``: the UNet's and the VAE's weights in channels-last memory format (NHWC
  convolutions, what tensor cores prefer). Same images up to floating-point rounding.
* ``compile_unet``: ``torch.compile`` of the UNet (``nn.Module.compile``, in place, so
  ``pipe.unet`` stays the UNet); True is torch's default mode, a string names the mode
  (``"reduce-overhead"``, ``"max-autotune"``, ``"max-autotune-no-cudagraphs"``). The first call at
  each new batch shape compiles (tens of seconds to minutes); later calls are fast.
* ``vae_slicing``: decode the latents one image at a time (``AutoencoderKL.enable_slicing``), which
  bounds the VAE's memory at large micro-batches. False: one decode per micro-batch (as before);
  True: always sliced; ``"auto"``: sliced for calls of ``VAE_SLICING_AUTO_MIN_BATCH`` or more images
  (an out-of-memory retry in halves then decodes unsliced again below that size). Each image is
  decoded alone, so its pixels equal those of a batch-1 decode; against an unsliced batched decode
  they differ by floating-point rounding at most (the ``micro_batch > 1`` note above).
"""

from __future__ import annotations

import importlib.metadata
import os
from typing import Sequence

import numpy as np
import pyarrow as pa

from operators.support.models import ModelLoadError, loaded_weight_files, pick_device, resolve_dtype, weights_provenance
from operators.base import Resources, Stage, with_column
from operators.support.codec import pack_rgb8, rgb_levels
from schemas.images import (
    GENERATION_DETAIL,
    GENERATION_STATUS,
    IMAGE,
    IMAGE_ENCODING,
    IMAGE_HEIGHT,
    IMAGE_WIDTH,
    MODEL,
    NSFW,
    SAFETY_CHECKER,
    SEED,
    GenerationStatus,
)
from schemas.subsets import PROMPT

STAGE_GENERATE = "generate"

# vae_slicing="auto": decode calls of this many images or more one image at a time. The VAE
# decoder's full-resolution activations grow with the number of images decoded together; slicing
# bounds them to one image's, at the cost of smaller decoder kernels.
VAE_SLICING_AUTO_MIN_BATCH = 8
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


class SafetyCheckerPolicy:
    MODEL_DEFAULT = "model-default"  # keep whatever checker the model ships (none for SDXL)
    OFF = "off"                      # load without a checker: every image is returned as generated
    ALL = (MODEL_DEFAULT, OFF)


def _dtype_keyword() -> str:
    """``dtype`` where diffusers accepts it (it deprecates ``torch_dtype``), else ``torch_dtype``."""
    try:
        from diffusers.utils import deprecation_utils

        return "dtype" if hasattr(deprecation_utils, "_resolve_dtype") else "torch_dtype"
    except ImportError:
        return "torch_dtype"


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def load_text2image(model: str, revision: str | None = None, device: str = "auto", dtype: str = "auto",
                    safety_checker: str = SafetyCheckerPolicy.MODEL_DEFAULT, scheduler: str | None = None):
    """Load a diffusers text-to-image pipeline; return ``(pipe, record)``.

    ``model`` is a hub id (pinned to ``revision``: a commit, branch or tag) or a local directory
    written by ``save_pretrained``. A hub id is loaded from the cache snapshot it resolves to, so
    the record names that commit and the sha256 of each weight file the pipeline read.
    ``device="auto"``: cuda when available, else cpu; ``dtype="auto"``: float16 on CUDA, float32 on CPU. ``safety_checker``: "model-default" keeps the checker the model
    ships (if any), "off" loads it without one. ``scheduler``: None keeps the model's sampler, a
    diffusers scheduler class name (``LMSDiscreteScheduler``, the k-LMS sampler of paper 001 App. A)
    replaces it, built from the model's scheduler config. ``record`` is the provenance of what was loaded.
    """
    if safety_checker not in SafetyCheckerPolicy.ALL:
        raise ValueError(f"safety_checker must be one of {SafetyCheckerPolicy.ALL}, got {safety_checker!r}")
    device = pick_device(device)
    torch_dtype = resolve_dtype(dtype, device)
    kwargs = {_dtype_keyword(): torch_dtype, "revision": revision}
    if safety_checker == SafetyCheckerPolicy.OFF:
        kwargs["safety_checker"] = None  # never loaded; pipelines without one ignore the argument
    try:
        from diffusers import AutoPipelineForText2Image, DiffusionPipeline

        # a hub id: fetch (or find in the cache) the files this pipeline loads, at ``revision``, and
        # load from that snapshot directory: its name is the commit, its files the weights recorded
        source = model if os.path.isdir(model) else str(DiffusionPipeline.download(model, **kwargs))
        pipe = AutoPipelineForText2Image.from_pretrained(source, **kwargs)
        pipe = pipe.to(device)
    except Exception as exc:  # OSError, ValueError, EnvironmentError, HTTP errors, CUDA errors...
        raise ModelLoadError(
            f"cannot load text-to-image model {model!r} (revision {revision!r}): {type(exc).__name__}: {str(exc).rstrip('. ')}. "
            f"Provide it as a local directory written by DiffusionPipeline.save_pretrained() (with "
            f"model_index.json), as a hub id already in the Hugging Face cache (pre-fill HF_HOME / "
            f"HF_HUB_CACHE on every node; HF_HUB_OFFLINE=1 then loads it from there), or as a hub id "
            f"with network access to the Hugging Face hub (pin it with a revision)."
        ) from exc
    if safety_checker == SafetyCheckerPolicy.OFF and getattr(pipe, "safety_checker", None) is not None:
        pipe.safety_checker = None
    if scheduler:
        pipe.scheduler = _scheduler(scheduler, pipe)
    pipe.set_progress_bar_config(disable=True)
    record = {
        "model": model,
        "revision": revision,
        "source": "directory" if os.path.isdir(model) else "hub",
        "pipeline_class": type(pipe).__name__,
        "scheduler_class": type(pipe.scheduler).__name__ if getattr(pipe, "scheduler", None) is not None else None,
        "dtype": str(torch_dtype).replace("torch.", ""),
        "device": device,
        "safety_checker_policy": safety_checker,
        "safety_checker_present": getattr(pipe, "safety_checker", None) is not None,
        "diffusers_version": _package_version("diffusers"),
        "transformers_version": _package_version("transformers"),
        "torch_version": _package_version("torch"),
        "path": os.path.abspath(source),
        # commit, weight_files, weights_sha256: of the components loaded (a checker turned off is not)
        **weights_provenance(_loaded_files(pipe, source), source),
    }
    return pipe, record


def _loaded_files(pipe, root: str) -> list:
    """The weight files the pipeline's model components were read from: each component's folder,
    with the file its library prefers there (operators.base.LOADED_WEIGHT_NAMES)."""
    import torch

    return [f for name, component in sorted(pipe.components.items()) if isinstance(component, torch.nn.Module)
            for f in loaded_weight_files(os.path.join(root, name))]


def _scheduler(name: str, pipe):
    import diffusers

    cls = getattr(diffusers, name, None)
    if cls is None or not hasattr(cls, "from_config") or not name.endswith("Scheduler"):
        raise ValueError(f"unknown diffusers scheduler {name!r} (e.g. LMSDiscreteScheduler, DDIMScheduler, "
                         f"PNDMScheduler, EulerDiscreteScheduler)")
    if getattr(pipe, "scheduler", None) is None:
        raise ValueError(f"scheduler {name!r} given, but the pipeline {type(pipe).__name__} has none to replace")
    return cls.from_config(pipe.scheduler.config)


def _generate(pipe, prompts: list[str], seeds: list[int], steps: int, guidance_scale: float,
              height: int | None, width: int | None, noise_device: str):
    """One pipeline call: (B, 3, H, W) images in [0, 1] on the pipeline's device, and the safety
    checker's per-image flags (None when no checker ran). Row ``i`` is seeded with ``seeds[i]``
    alone."""
    import torch

    generators = [torch.Generator(noise_device).manual_seed(int(s)) for s in seeds]
    out = pipe(prompt=list(prompts), num_inference_steps=int(steps), guidance_scale=float(guidance_scale),
               height=height, width=width, generator=generators, num_images_per_prompt=1, output_type="pt")
    flags = getattr(out, "nsfw_content_detected", None)
    return image_tensor(out.images), (None if flags is None else [bool(f) for f in flags])


def image_tensor(images):
    """A pipeline's output images as (B, 3, H, W) floats in [0, 1]: as they are for
    ``output_type="pt"``, converted for a pipeline that ignores it (PIL images or arrays)."""
    import torch

    if torch.is_tensor(images):
        return images
    arr = np.stack([np.asarray(a) for a in images])
    arr = arr.astype(np.float32) / 255.0 if arr.dtype == np.uint8 else arr.astype(np.float32)
    return torch.from_numpy(arr).permute(0, 3, 1, 2)


def _to_uint8(images):
    """(B, 3, H, W) floats in [0, 1] -> (B, H, W, 3) uint8, still on the images' device."""
    import torch

    return rgb_levels(images).to(torch.uint8).permute(0, 2, 3, 1)


def regenerate(pipe_or_generator, prompt: str, seed: int, steps: int = 50, guidance_scale: float = 7.5,
               height: int | None = None, width: int | None = None, noise_device: str = "cpu") -> np.ndarray:
    """Re-create one image alone: (H, W, 3) uint8, equal to the image the stage produced for
    (prompt, seed) with the same model and settings. Given an :class:`ImageGenerator`, its own
    settings are used (the keyword arguments are ignored)."""
    if isinstance(pipe_or_generator, ImageGenerator):
        return pipe_or_generator.regenerate(prompt, seed)
    images, _ = _generate(pipe_or_generator, [prompt], [seed], steps, guidance_scale, height, width, noise_device)
    return _to_uint8(images)[0].cpu().numpy()


def _compile_mode(compile_unet) -> str | None:
    """``compile_unet`` as a torch.compile mode: None (off), "default" for True, or the mode named."""
    if compile_unet is False or compile_unet is None:
        return None
    if compile_unet is True:
        return "default"
    if isinstance(compile_unet, str) and compile_unet in COMPILE_MODES:
        return compile_unet
    raise ValueError(f"compile_unet must be False, True or one of {COMPILE_MODES}, got {compile_unet!r}")


def attention_processors(pipe) -> dict[str, list[str]]:
    """The attention processor classes each of the pipeline's attention-bearing models holds (e.g.
    {"unet": ["AttnProcessor2_0"], "vae": ["AttnProcessor2_0"]}): what runs, not what was asked for."""
    out = {}
    for name in ("unet", "transformer", "vae"):
        module = getattr(pipe, name, None)
        procs = getattr(module, "attn_processors", None)
        if isinstance(procs, dict):
            out[name] = sorted({type(p).__name__ for p in procs.values()})
    return out


def set_vae_slicing(pipe, on: bool) -> None:
    """Decode one image at a time (``on``) or the whole call at once."""
    vae = pipe.vae
    if on:
        vae.enable_slicing()
    else:
        vae.disable_slicing()


def apply_speed_options(pipe, channels_last: bool, compile_mode: str | None, vae_slicing) -> dict:
    """Apply the generator's speed options to a loaded pipeline (module docstring); returns what to
    record. Raises ValueError when the pipeline lacks what an option needs."""
    import torch

    unet = getattr(pipe, "unet", None)
    vae = getattr(pipe, "vae", None)
    if (channels_last or compile_mode) and not isinstance(unet, torch.nn.Module):
        raise ValueError(f"channels_last / compile_unet need a pipeline with a UNet; {type(pipe).__name__} has none")
    if vae_slicing is not False and not hasattr(vae, "use_slicing"):
        raise ValueError(f"vae_slicing needs a VAE that decodes in slices; {type(pipe).__name__}'s "
                         f"{type(vae).__name__} does not")
    # recorded before compiling: what the (compiled) modules will run
    record = {"attention_processors": attention_processors(pipe)}
    converted = []
    if channels_last:
        for name in ("unet", "vae"):
            module = getattr(pipe, name, None)
            if isinstance(module, torch.nn.Module):
                module.to(memory_format=torch.channels_last)
                converted.append(name)
    if compile_mode:
        # in place: pipe.unet stays the UNet (its config, processors and hooks as before)
        unet.compile(mode=None if compile_mode == "default" else compile_mode)
    record.update({
        "channels_last": converted if channels_last else False,
        "compile_unet": compile_mode or False,
        "vae_slicing": vae_slicing,
        "vae_slicing_auto_min_batch": VAE_SLICING_AUTO_MIN_BATCH if vae_slicing == "auto" else None,
    })
    return record


def _valid_prompt(p) -> bool:
    return isinstance(p, str) and bool(p.strip())


def _out_of_memory(exc: BaseException) -> bool:
    """CUDA's OutOfMemoryError, or a RuntimeError saying "out of memory" (cuBLAS/cuDNN workspaces,
    other backends)."""
    import torch

    return isinstance(exc, torch.cuda.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower())


def _free_device_memory(device: str) -> None:
    """Give the allocator's cached blocks back before a smaller retry."""
    import gc

    import torch

    gc.collect()
    if str(device).startswith("cuda") and torch.cuda.is_available():
        torch.cuda.empty_cache()


class ImageGenerator:
    """Adds GENERATION_COLUMNS (and the ``output_fields`` of each head: GENDER_COLUMNS from
    ``Stage(ClipGenderClassifier, ...)``, the CLIP embedding from ``Stage(ClipImageEmbedder, ...)``,
    BLIP-2 answers from ``Stage(Blip2Detector, ...)``): one image per row from its PROMPT and SEED."""

    stage_name = STAGE_GENERATE
    resources = Resources(num_cpus=1, num_gpus=1, batch_size=8, actors=1)

    def __init__(self, model: str, revision: str | None = None, steps: int = 50, guidance_scale: float = 7.5,
                 height: int | None = None, width: int | None = None, device: str = "auto", dtype: str = "auto",
                 safety_checker: str = SafetyCheckerPolicy.MODEL_DEFAULT, heads: Sequence = (), micro_batch: int = 8,
                 noise_device: str = "cpu", scheduler: str | None = None, channels_last: bool = False,
                 compile_unet: bool | str = False, vae_slicing: bool | str = False):
        """The speed options ``channels_last``, ``compile_unet`` and ``vae_slicing`` are described in
        the module docstring; all are off by default."""
        if micro_batch < 1:
            raise ValueError(f"micro_batch must be >= 1, got {micro_batch}")
        compile_mode = _compile_mode(compile_unet)
        if not (vae_slicing is False or vae_slicing is True or vae_slicing == "auto"):
            raise ValueError(f"vae_slicing must be False, True or 'auto', got {vae_slicing!r}")
        self.model = model
        self.steps = int(steps)
        self.guidance_scale = float(guidance_scale)
        self.height = height
        self.width = width
        self.micro_batch = int(micro_batch)
        self.safety_checker = safety_checker
        self.pipe, load_record = load_text2image(model, revision, device, dtype, safety_checker, scheduler)
        self.device = load_record["device"]
        # noise on the CPU by default: the same seed gives the same initial noise on any device
        self.noise_device = pick_device(noise_device)
        self.channels_last = bool(channels_last)
        self.compile_mode = compile_mode
        self.vae_slicing = vae_slicing
        speed = apply_speed_options(self.pipe, self.channels_last, self.compile_mode, self.vae_slicing)
        # what runs on every generated image while it is still on the device (CLIP gender, a CLIP
        # embedding, BLIP-2 questions): Stage specs built here, on this device, or built operators;
        # each has ``classify_tensor`` returning the columns of its ``output_fields``
        self.heads = [h.build(device=self.device) if isinstance(h, Stage) else h for h in heads]
        for h in self.heads:
            if not hasattr(h, "classify_tensor"):
                raise TypeError(f"head {type(h).__name__} has no classify_tensor(images): it cannot run on the "
                                f"generator's device tensor")
        self.record = {
            **load_record,
            "steps": self.steps,
            "guidance_scale": self.guidance_scale,
            "height": height,
            "width": width,
            "default_size": self._default_size(),
            "micro_batch": self.micro_batch,
            "noise_device": self.noise_device,
            **speed,
            "heads": {getattr(h, "stage_name", type(h).__name__): getattr(h, "record", None) for h in self.heads},
        }

    def _default_size(self) -> list[int] | None:
        """(height, width) the pipeline generates when none is configured, where it can be read."""
        unet = getattr(self.pipe, "unet", None)
        scale = getattr(self.pipe, "vae_scale_factor", None)
        size = getattr(getattr(unet, "config", None), "sample_size", None)
        if isinstance(size, int) and isinstance(scale, int):
            return [size * scale, size * scale]
        return None

    def _generate(self, prompts: list[str], seeds: list[int]):
        if self.vae_slicing is not False:  # off: the VAE is left as loaded (one decode per call)
            set_vae_slicing(self.pipe, self.vae_slicing is True or len(prompts) >= VAE_SLICING_AUTO_MIN_BATCH)
        return _generate(self.pipe, prompts, seeds, self.steps, self.guidance_scale, self.height, self.width,
                         self.noise_device)

    def regenerate(self, prompt: str, seed: int) -> np.ndarray:
        """The (H, W, 3) uint8 image this stage produces for (prompt, seed), generated alone."""
        images, _ = self._generate([prompt], [seed])
        return _to_uint8(images)[0].cpu().numpy()

    def _micro_batch(self, rows: list[int], prompts: list, seeds: list):
        """Generate ``rows`` in one call and run the heads on the unblocked images: (uint8 images,
        blocked flags, checker flags or None, {column: (row indices, values)})."""
        import torch

        images, flags = self._generate([prompts[i] for i in rows], [seeds[i] for i in rows])
        blocked = np.zeros(len(rows), bool) if flags is None else np.asarray(flags, bool)
        heads = {}
        if self.heads and not blocked.all():
            keep = np.flatnonzero(~blocked)
            sub = images if len(keep) == len(rows) else images[torch.as_tensor(keep, device=images.device)]
            idx = np.asarray(rows)[keep]
            for head in self.heads:
                # a head that reads the prompts too (CLIP image-text alignment) declares takes_prompts
                kw = {"prompts": [prompts[i] for i in idx]} if getattr(head, "takes_prompts", False) else {}
                for name, values in head.classify_tensor(sub, **kw).items():
                    heads[name] = (idx, values)
        return _to_uint8(images), blocked, flags, heads

    def __call__(self, batch: pa.Table) -> pa.Table:
        import torch

        n = batch.num_rows
        prompts = batch.column(PROMPT).to_pylist()
        seeds = batch.column(SEED).to_pylist()
        todo = [i for i in range(n) if _valid_prompt(prompts[i])]
        missing = [i for i in todo if seeds[i] is None]
        if missing:
            raise ValueError(f"rows {missing[:10]} have a prompt but a null {SEED}: every image needs a recorded seed")

        status = np.full(n, GenerationStatus.INVALID_PROMPT, dtype=object)
        detail: list[str | None] = [None] * n
        nsfw: list[bool | None] = [None] * n
        outputs = {f.name: np.full(n, None, dtype=object) for h in self.heads for f in h.output_fields}
        classified = np.zeros(n, bool)
        pixels = []  # uint8 (b, H, W, 3) device tensors, in ``generated`` order
        generated: list[int] = []
        # out of memory: the micro-batch is retried in halves down to one image; an image that
        # fails alone gets generation_error (counted by the error budget), never a lost row or job
        pending = [todo[s:s + self.micro_batch] for s in range(0, len(todo), self.micro_batch)]
        with torch.inference_mode():
            while pending:
                rows = pending.pop(0)
                failure = None
                try:
                    images, blocked, flags, heads = self._micro_batch(rows, prompts, seeds)
                except Exception as exc:
                    if not _out_of_memory(exc):
                        raise
                    failure = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:500]
                if failure is not None:  # outside the except: its traceback no longer holds the tensors
                    images = heads = None
                    _free_device_memory(self.device)
                    if len(rows) > 1:
                        half = (len(rows) + 1) // 2
                        pending[:0] = [rows[:half], rows[half:]]
                    else:
                        status[rows[0]] = GenerationStatus.ERROR
                        detail[rows[0]] = f"out of memory with one image per call: {failure}"
                    continue
                for j, i in enumerate(rows):
                    status[i] = GenerationStatus.NSFW_BLOCKED if blocked[j] else GenerationStatus.OK
                    nsfw[i] = None if flags is None else bool(blocked[j])
                for name, (idx, values) in heads.items():
                    column = outputs[name]
                    for j, i in enumerate(idx):
                        column[i] = values[j]
                    classified[idx] = True
                pixels.append(images)
                generated += rows
            arrays = list(torch.cat(pixels).cpu().numpy()) if pixels else []  # one device -> host copy

        payload = pack_rgb8(arrays)
        # scatter the generated rows' payload back to all rows (null where nothing was generated)
        where = np.full(n, -1, np.int64)
        where[generated] = np.arange(len(generated))
        take = pa.array(where, mask=where < 0)
        out = batch
        for name in (IMAGE, IMAGE_ENCODING, IMAGE_HEIGHT, IMAGE_WIDTH):
            out = with_column(out, name, payload[name].take(take))
        out = with_column(out, GENERATION_STATUS, pa.array(status.tolist(), pa.string()))
        out = with_column(out, GENERATION_DETAIL, pa.array(detail, pa.string()))
        out = with_column(out, NSFW, pa.array(nsfw, pa.bool_()))
        out = with_column(out, SAFETY_CHECKER, pa.array([self.safety_checker] * n, pa.string()))
        out = with_column(out, MODEL, pa.array([self.model] * n, pa.string()))
        for head in self.heads:
            for f in head.output_fields:
                values = [v if classified[i] else None for i, v in enumerate(outputs[f.name])]
                out = with_column(out, f.name, pa.array(values, f.type))
        return out

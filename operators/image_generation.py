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
``invalid_prompt`` and a null payload. An image with NaN or infinite values (a float16 overflow:
FLUX in float16 decodes to NaN) or all black without the checker having blanked it gets
``invalid_image`` with the reason in GENERATION_DETAIL and a null payload: it is never classified or
measured, and counts against the generation error budget. Where the pipeline's safety checker flags an image it
blanks it; that row gets ``nsfw_blocked`` and NSFW true (and no gender). With ``nsfw_check`` (the
run's one NSFW check, ``operators.image_nsfw_check``: policy ``check-all``, the model's own checker
off) NSFW is that head's flag, computed on every valid image before the other heads; with
``exclude_nsfw`` a flagged image gets ``nsfw_excluded``: no other head runs on it and its payload
is null (never stored, measured or passed on; its recorded seed regenerates it). NSFW is null when no check ran (none shipped, or ``safety_checker="off"``).

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

from typing import Sequence

import numpy as np
import pyarrow as pa

from operators.base import DeviceHead, Resources, Stage, declares, with_column
from operators.image_nsfw_check import check_generated, generator_head, not_stored
from operators.support.codec import pack_rgb8
from operators.support.models import pick_device
from operators.support.diffusion import (
    VAE_SLICING_AUTO_MIN_BATCH,
    SafetyCheckerPolicy,
    _compile_mode,
    _free_device_memory,
    _generate,
    _out_of_memory,
    _to_uint8,
    _valid_prompt,
    apply_speed_options,
    invalid_images,
    load_text2image,
    sampling,
    set_vae_slicing,
)
from operators.support.families import family_of_pipeline
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



def regenerate(pipe_or_generator, prompt: str, seed: int, steps: int = 50, guidance_scale: float = 7.5,
               height: int | None = None, width: int | None = None, noise_device: str = "cpu") -> np.ndarray:
    """Re-create one image alone: (H, W, 3) uint8, equal to the image the stage produced for
    (prompt, seed) with the same model and settings. Given an :class:`ImageGenerator`, its own
    settings are used (the keyword arguments are ignored)."""
    if isinstance(pipe_or_generator, ImageGenerator):
        return pipe_or_generator.regenerate(prompt, seed)
    images, _ = _generate(pipe_or_generator, [prompt], [seed], steps, guidance_scale, height, width, noise_device)
    return _to_uint8(images)[0].cpu().numpy()


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
                 compile_unet: bool | str = False, vae_slicing: bool | str = False, call_kwargs: dict | None = None,
                 cuda_dtype: str = "float16", variant: str | None = None, nsfw_check=None, exclude_nsfw: bool = False,
                 cpu_offload: bool = False):
        """The speed options ``channels_last``, ``compile_unet`` and ``vae_slicing`` are described in
        the module docstring; all are off by default. ``call_kwargs``: further pipeline call
        arguments of the generator's spec (a negative prompt, ``max_sequence_length``, ...).
        ``steps`` / ``guidance_scale`` None: the pipeline's own defaults. ``cuda_dtype``: the dtype
        ``dtype="auto"`` means on a GPU (the family's). ``nsfw_check``: the run's NSFW check head
        (a Stage or built ``NsfwCheck``), run first on every valid image; ``exclude_nsfw``: its
        flagged images are left out (module docstring)."""
        if micro_batch < 1:
            raise ValueError(f"micro_batch must be >= 1, got {micro_batch}")
        compile_mode = _compile_mode(compile_unet)
        if not (vae_slicing is False or vae_slicing is True or vae_slicing == "auto"):
            raise ValueError(f"vae_slicing must be False, True or 'auto', got {vae_slicing!r}")
        self.model = model
        self.steps = None if steps is None else int(steps)
        self.guidance_scale = None if guidance_scale is None else float(guidance_scale)
        self.height = height
        self.width = width
        self.micro_batch = int(micro_batch)
        self.safety_checker = safety_checker
        self.call_kwargs = dict(call_kwargs or {})
        self.pipe, load_record = load_text2image(model, revision, device, dtype, safety_checker, scheduler,
                                                 cuda_dtype=cuda_dtype, variant=variant,
                                                 cpu_offload=cpu_offload)
        self.device = load_record["device"]
        sampling(self.steps, self.guidance_scale, family_of_pipeline(type(self.pipe).__name__).cfg_argument)  # refuses now
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
        self.nsfw_check = generator_head(nsfw_check, exclude_nsfw, self.device)
        self.exclude_nsfw = bool(exclude_nsfw)
        for h in self.heads:
            if not isinstance(h, DeviceHead):
                raise TypeError(f"head {type(h).__name__} lacks {declares(type(h), DeviceHead)} of the DeviceHead "
                                f"contract (operators/base.py): it cannot run on the generator's device tensor")
        self.record = {
            **load_record,
            "steps": self.steps,
            "guidance_scale": self.guidance_scale,
            "height": height,
            "width": width,
            "call_kwargs": self.call_kwargs,
            "default_size": self._default_size(),
            "micro_batch": self.micro_batch,
            "noise_device": self.noise_device,
            **speed,
            "heads": {getattr(h, "stage_name", type(h).__name__): getattr(h, "record", None) for h in self.heads},
            "nsfw_check": None if self.nsfw_check is None else getattr(self.nsfw_check, "record", None),
            "exclude_nsfw": self.exclude_nsfw,
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
                         self.noise_device, self.call_kwargs)

    def regenerate(self, prompt: str, seed: int) -> np.ndarray:
        """The (H, W, 3) uint8 image this stage produces for (prompt, seed), generated alone."""
        images, _ = self._generate([prompt], [seed])
        return _to_uint8(images)[0].cpu().numpy()

    def _micro_batch(self, rows: list[int], prompts: list, seeds: list):
        """Generate ``rows`` in one call and run the heads on the unblocked, valid images: (uint8
        images, blocked flags, checker flags or None, {column: (row indices, values)}, why each
        image is invalid or None, the NSFW check's flags (None where it did not run))."""
        import torch

        images, flags = self._generate([prompts[i] for i in rows], [seeds[i] for i in rows])
        blocked = np.zeros(len(rows), bool) if flags is None else np.asarray(flags, bool)
        invalid = invalid_images(images, blocked)
        unusable = blocked | np.asarray([w is not None for w in invalid], bool)
        checked, unusable = check_generated(self.nsfw_check, images, unusable, self.exclude_nsfw)
        heads = {}
        if self.heads and not unusable.all():
            keep = np.flatnonzero(~unusable)
            sub = images if len(keep) == len(rows) else images[torch.as_tensor(keep, device=images.device)]
            idx = np.asarray(rows)[keep]
            for head in self.heads:
                # a head that reads the prompts too (CLIP image-text alignment) declares takes_prompts
                kw = {"prompts": [prompts[i] for i in idx]} if getattr(head, "takes_prompts", False) else {}
                for name, values in head.classify_tensor(sub, **kw).items():
                    heads[name] = (idx, values)
        return _to_uint8(torch.nan_to_num(images, nan=0.0)), blocked, flags, heads, invalid, checked

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
                    images, blocked, flags, heads, invalid, checked = self._micro_batch(rows, prompts, seeds)
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
                    if self.nsfw_check is not None:
                        nsfw[i] = checked[j]
                        if self.exclude_nsfw and checked[j]:
                            status[i] = GenerationStatus.NSFW_EXCLUDED
                    if invalid[j] is not None:   # never classified, measured or saved as an image
                        status[i], detail[i] = GenerationStatus.INVALID_IMAGE, invalid[j]
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
        where[not_stored(status)] = -1
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

"""Triplet generation and representational disparities (papers 003/004, sections 3 and 4).

One input row is a *unit*: a triplet (neutral, feminine, masculine prompt) and one seed. Its three
images are generated in one pipeline call on one device, each with its own ``torch.Generator``
seeded with the unit's seed, so the three share the initial noise z_T (section 3: "the seed is
the same within each triplet"). While the call runs, a ``callback_on_step_end`` hook keeps two
tensors the pipeline already computes and changes nothing:

- the prompt embeddings t: the text encoder's full output *sequence* (77 tokens x width), the
  tensor the UNet's cross-attention reads (for SD v1.x CLIP ViT-L/14's last layer, for SD v2.x
  OpenCLIP ViT-H/14's penultimate layer, as each pipeline feeds its UNet); with classifier-free
  guidance the conditional half. Cosine over the flattened sequence is the prompt space (Eq. 1).
  The pooled embedding is not used: the UNet never sees it (SD 1.x/2.x).
- the final latents z_0, after the last denoising step and before the VAE decodes them: cosine
  over the flattened latents is the denoising space (Eq. 2).

The images stay on the device as (units, 3, C, H, W) floats in [0, 1] and the *disparity heads*
(``operators.support.disparity``: SSIM / Diff. Pix., ResNet-50, CLIP, DINO, split-product)
measure each pair on them before they leave it; then they move to the CPU once as RGB8 payloads.

With ``dependency`` (an ``operators.image_prompt_dependency.PromptDependency``), the call also runs
inside its cross-attention recorder, and the images are analysed on the device for sections 5-6:
noun set, objects (boxes, SAM masks), word masks and dependency groups
(``schemas.exposed.DEPENDENCY_COLUMNS`` on each row; null columns without it).

Output: three rows per input row (``schemas.exposed.Variant.ALL`` order), one per image, with its
prompt, seed and GENERATION_STATUS, and the unit's pair similarities in the ``sim_<space>``
columns (list of three values in ``schemas.exposed.PAIRS`` order, the same on the unit's three
rows). UNIT_STATUS is ``ok`` when all three images are; otherwise the disparities are null (a
blanked NSFW image or a failed one would make them meaningless) and UNIT_STATUS is the first
non-ok image status. With ``nsfw_check`` (the run's one NSFW check: ``operators.image_nsfw_check``)
NSFW is its flag per valid image; with ``exclude_nsfw`` a flagged image gets ``nsfw_excluded`` and
its unit no disparities (as a blanked one); like an invalid image, it is not stored (null payload).

A unit with a null or blank prompt is not generated (``invalid_prompt`` on its three rows). Out of
memory halves the micro-batch down to one unit (three images: a unit is never split); a unit
that still fails gets ``generation_error`` on its three rows. Other errors propagate.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa

from operators.base import DisparityHead, Resources, Stage, declares
from operators.image_nsfw_check import check_generated, generator_head, not_stored
from operators.support.diffusion import (
    SafetyCheckerPolicy,
    _free_device_memory,
    _out_of_memory,
    _to_uint8,
    _valid_prompt,
    guided_call,
    image_tensor,
    invalid_images,
    load_text2image,
    per_prompt,
    sampling,
)
from operators.image_prompt_dependency import no_image
from operators.support.codec import pack_rgb8
from operators.support.disparity import pair_cosines
from operators.support.families import family_of_pipeline
from operators.support.models import pick_device
from schemas.exposed import (
    DEPENDENCY_COLUMNS,
    FEMININE,
    IMAGE_ID,
    MASCULINE,
    NEUTRAL,
    PROFESSION,
    SEED_INDEX,
    TRIPLET_ID,
    TRIPLET_SOURCE,
    UNIT_ID,
    UNIT_STATUS,
    VARIANT,
    Space,
    Variant,
    disparity_column,
)
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

STAGE_GENERATE_TRIPLETS = "generate_triplets"
PROMPT_COLUMNS = (NEUTRAL, FEMININE, MASCULINE)   # Variant.ALL order
PASSED_ON = (UNIT_ID, TRIPLET_ID, TRIPLET_SOURCE, SEED_INDEX)


class _Capture:
    """``callback_on_step_end``: keeps the conditional prompt embeddings (first step) and the
    latest latents (after the last step: z_0). It returns nothing, so the pipeline's tensors are
    left as they are: the images are exactly those generated without it."""

    tensor_inputs = ["latents", "prompt_embeds"]
    # the pooled prompt embedding the denoiser receives, where the pipeline hands it to the callback
    # (SDXL: add_text_embeds, SD 3: pooled_prompt_embeds; FLUX hands none: see pooled_embeddings)
    POOLED = ("add_text_embeds", "pooled_prompt_embeds")
    # the prompt sequence where a pipeline names it otherwise: HiDream-I1's T5 sequence (its Llama
    # states are the same prompt again, a different layer per block; project choice)
    PROMPT = ("prompt_embeds", "prompt_embeds_t5")

    def __init__(self, pipe=None):
        self.prompt_embeds = None
        self.pooled = None
        self.latents = None
        offered = set(getattr(pipe, "_callback_tensor_inputs", None) or ())
        self.pooled_name = next((n for n in self.POOLED if n in offered), None)
        self.prompt_name = next((n for n in self.PROMPT if n in offered), "prompt_embeds")
        self.inputs = ["latents", self.prompt_name] + ([self.pooled_name] if self.pooled_name else [])

    def __call__(self, pipe, step, timestep, kwargs):
        if self.prompt_embeds is None:
            # [unconditional, conditional] where the pipeline doubles the batch (SD, SDXL, SD 3 with
            # CFG): twice the latents' rows. Chroma, FLUX.2 klein and Qwen-Image guide with a second
            # call, and hand the conditional embeddings alone although their CFG flag is set.
            images = kwargs["latents"].shape[0]
            embeds = kwargs[self.prompt_name]
            if isinstance(embeds, (list, tuple)):        # Z-Image: each prompt's valid tokens alone
                embeds = _padded(embeds)
            doubled = getattr(pipe, "do_classifier_free_guidance", False) and embeds.shape[0] == 2 * images
            self.prompt_embeds = embeds[embeds.shape[0] // 2:] if doubled else embeds
            if self.pooled_name:
                pooled = kwargs[self.pooled_name]
                self.pooled = pooled[pooled.shape[0] // 2:] if doubled else pooled
        self.latents = kwargs["latents"]
        return {}


def _padded(sequences):
    """(N, L, d): per-prompt (L_i, d) sequences zero-padded to the longest (a zero position adds
    nothing to a dot product, so each pair's cosine is over the positions both hold)."""
    from torch.nn.utils.rnn import pad_sequence  # deferred: torch

    return pad_sequence(list(sequences), batch_first=True)


def pooled_space_text(pipe) -> str:
    """What the pooled prompt space of ``pipe`` is (the generator's record)."""
    offered = _Capture(pipe).pooled_name
    if offered == "add_text_embeds":
        return "SDXL: the pooled text embedding of the second text encoder (add_text_embeds), conditional half"
    if offered == "pooled_prompt_embeds" and type(pipe).__name__ == "HiDreamImagePipeline":
        return "HiDream-I1: the pooled CLIP-L and CLIP-G embeddings, concatenated (pooled_prompt_embeds), conditional half"
    if offered == "pooled_prompt_embeds":
        return "SD 3: the pooled CLIP-L and CLIP-G embeddings, concatenated (pooled_prompt_embeds), conditional half"
    if type(pipe).__name__ == "FluxPipeline":
        return "FLUX: CLIP-L's pooled embedding (the pipeline's encode_prompt), which the transformer receives"
    if not _clip_encoder(pipe):
        encoder = type(getattr(pipe, "text_encoder", None)).__name__
        return (f"not defined for {type(pipe).__name__}: its denoiser receives no pooled embedding and its text "
                f"encoder ({encoder}) has none; the space is left out (NaN)")
    return ("the text encoder's pooled output (final-layer end-of-text token after the final layer norm); this "
            "denoiser does not receive it")


def _clip_encoder(pipe) -> bool:
    return type(getattr(pipe, "text_encoder", None)).__name__.startswith("CLIPText")


def pooled_embeddings(pipe, prompts: list[str], call_kwargs: dict | None = None):
    """(N, d) pooled prompt embeddings of a pipeline that does not hand them to the step callback:
    FLUX's CLIP pooled embedding (the pipeline's own ``encode_prompt``, as its call computes it),
    or, for a UNet pipeline (SD 1.x/2.x, whose UNet receives no pooled embedding), the text
    encoder's pooled output (CLIP's final-layer end-of-text token, after the final layer norm); None
    for a pipeline with neither (Chroma, FLUX.2, Qwen-Image, HunyuanImage, CogView4, Lumina 2, Z-Image, SANA: a T5 or
    language-model encoder whose denoiser receives no pooled embedding: the space is not defined for
    them)."""
    import torch

    device = getattr(pipe, "_execution_device", None) or pipe.device
    if type(pipe).__name__ == "FluxPipeline":
        kw = {k: v for k, v in (call_kwargs or {}).items() if k == "max_sequence_length"}
        return pipe.encode_prompt(prompt=prompts, prompt_2=None, device=device, **kw)[1]
    if not _clip_encoder(pipe):
        return None
    tok = pipe.tokenizer(prompts, padding="max_length", max_length=pipe.tokenizer.model_max_length, truncation=True,
                         return_tensors="pt")
    with torch.inference_mode():
        return pipe.text_encoder(tok.input_ids.to(device)).pooler_output


def check_capture(pipe, model: str) -> None:
    """The pipeline must hand ``latents`` and ``prompt_embeds`` to ``callback_on_step_end`` (every
    Stable Diffusion / SDXL pipeline of diffusers does): refuse others before any work."""
    inputs = set(getattr(pipe, "_callback_tensor_inputs", None) or ())
    missing = sorted(set(_Capture(pipe).inputs) - inputs)
    if missing:
        raise ValueError(f"{model}: the diffusers pipeline {type(pipe).__name__} does not pass {missing} to "
                         f"callback_on_step_end (it passes {sorted(inputs)}), so the prompt and denoising spaces "
                         f"cannot be measured with it")


def generate_units(pipe, triplets: list[tuple[str, str, str]], seeds: list[int], steps: int, guidance_scale: float,
                   height: int | None = None, width: int | None = None, noise_device: str = "cpu", attention=None,
                   call_kwargs: dict | None = None):
    """One pipeline call for whole units: (images (U, 3, C, H, W) in [0, 1] on the device, prompt
    embeddings (U, 3, ...), final latents z_0 (U, 3, ...), safety-checker flags (U, 3) or None).
    ``attention``: a context (``CrossAttentionCapture``) the call runs inside; ``call_kwargs``: the
    generator spec's further call arguments."""
    import contextlib

    import torch

    prompts = [p for t in triplets for p in t]
    generators = [torch.Generator(noise_device).manual_seed(int(s)) for s in seeds for _ in range(3)]
    capture = _Capture(pipe)
    family = family_of_pipeline(type(pipe).__name__)     # the guidance's argument (Qwen-Image: true_cfg_scale)
    with attention if attention is not None else contextlib.nullcontext():
        out = pipe(prompt=prompts, **sampling(steps, guidance_scale, family.cfg_argument),
                   height=height, width=width, generator=generators, num_images_per_prompt=1, output_type="pt",
                   callback_on_step_end=capture, callback_on_step_end_tensor_inputs=capture.inputs,
                   **per_prompt(guided_call(family, guidance_scale, call_kwargs), len(prompts)))
    pooled = capture.pooled if capture.pooled is not None else pooled_embeddings(pipe, prompts, call_kwargs)
    if pooled is None:                                   # no pooled prompt space for this family: NaN
        pooled = torch.full((len(prompts), 1), float("nan"))
    images = image_tensor(out.images)
    if capture.latents is None or capture.prompt_embeds is None:
        raise RuntimeError(f"{type(pipe).__name__} did not call callback_on_step_end with latents and prompt_embeds: "
                           f"the prompt and denoising spaces cannot be measured with this pipeline")
    u = len(triplets)
    flags = getattr(out, "nsfw_content_detected", None)
    flags = None if flags is None else np.asarray([bool(f) for f in flags], bool).reshape(u, 3)
    return (images.reshape(u, 3, *images.shape[1:]), capture.prompt_embeds.reshape(u, 3, *capture.prompt_embeds.shape[1:]),
            capture.latents.reshape(u, 3, *capture.latents.shape[1:]), flags, pooled.reshape(u, 3, *pooled.shape[1:]))


class TripletGenerator:
    """Three rows per unit row (NEUTRAL, FEMININE, MASCULINE, SEED): images, statuses and the unit's
    disparities in every configured space (prompt and denoising always; the heads' spaces)."""

    stage_name = STAGE_GENERATE_TRIPLETS
    resources = Resources(num_cpus=1, num_gpus=1, batch_size=2, actors=1)

    def __init__(self, model: str, revision: str | None = None, steps: int = 50, guidance_scale: float = 7.5,
                 height: int | None = None, width: int | None = None, device: str = "auto", dtype: str = "auto",
                 safety_checker: str = SafetyCheckerPolicy.MODEL_DEFAULT, heads: Sequence = (), micro_batch: int = 2,
                 noise_device: str = "cpu", scheduler: str | None = None, dependency=None,
                 call_kwargs: dict | None = None, cuda_dtype: str = "float16", variant: str | None = None,
                 nsfw_check=None, exclude_nsfw: bool = False,
                 cpu_offload: bool = False):
        if micro_batch < 1:
            raise ValueError(f"micro_batch must be >= 1 unit, got {micro_batch}")
        self.model = model
        self.steps = None if steps is None else int(steps)
        self.guidance_scale = None if guidance_scale is None else float(guidance_scale)
        self.height, self.width = height, width
        self.micro_batch = int(micro_batch)
        self.safety_checker = safety_checker
        self.call_kwargs = dict(call_kwargs or {})
        self.pipe, load_record = load_text2image(model, revision, device, dtype, safety_checker, scheduler,
                                                 cuda_dtype=cuda_dtype, variant=variant,
                                                 cpu_offload=cpu_offload)
        self.device = load_record["device"]
        check_capture(self.pipe, model)
        self.noise_device = pick_device(noise_device)
        self.heads = [h.build(device=self.device) if isinstance(h, Stage) else h for h in heads]
        self.nsfw_check = generator_head(nsfw_check, exclude_nsfw, self.device)
        self.exclude_nsfw = bool(exclude_nsfw)
        spaces = list(Space.GENERATOR)
        for h in self.heads:
            if not isinstance(h, DisparityHead):
                raise TypeError(f"head {type(h).__name__} lacks {declares(type(h), DisparityHead)} of the DisparityHead "
                                f"contract (operators/base.py): it is not a disparity head")
            spaces += list(h.spaces)
        unknown = sorted(set(spaces) - set(Space.ALL))
        if unknown or len(set(spaces)) != len(spaces):
            raise ValueError(f"disparity heads measure unknown or repeated spaces: {spaces}")
        self.spaces = tuple(spaces)
        # sections 5-6: objects and dependency groups of the images while they are on the device
        self.dependency = dependency.build(device=self.device) if isinstance(dependency, Stage) else dependency
        if self.dependency is not None:   # a family without word heat maps fails here, in one line, not mid-run
            self.dependency.capture(self.pipe, self._guidance())
        self.record = {**load_record, "steps": self.steps, "guidance_scale": self.guidance_scale, "height": height,
                       "width": width, "call_kwargs": self.call_kwargs, "micro_batch_units": self.micro_batch, "noise_device": self.noise_device,
                       "prompt_space": "the text encoder output sequence the denoiser attends to (conditional half), "
                                       "flattened",
                       "prompt_pooled_space": pooled_space_text(self.pipe),
                       "denoising_space": "latents after the last denoising step, before the VAE, flattened",
                       # by the spaces each head measures (two heads may share one operator class)
                       "heads": {"+".join(h.spaces): getattr(h, "record", None) for h in self.heads},
                       "dependency": getattr(self.dependency, "record", None),
                       "nsfw_check": None if self.nsfw_check is None else getattr(self.nsfw_check, "record", None),
                       "exclude_nsfw": self.exclude_nsfw}

    def _guidance(self) -> bool:
        """Whether the pipeline runs classifier-free guidance (a conditional and an unconditional half)."""
        unet_config = getattr(getattr(self.pipe, "unet", None), "config", None)
        return (self.guidance_scale is None or self.guidance_scale > 1) and \
            getattr(unet_config, "time_cond_proj_dim", None) is None

    def _units(self, units: list[int], triplets, seeds, professions=None):
        """Generate ``units`` in one call and measure them: (uint8 images (U*3, H, W, 3), blocked
        (U, 3), flags or None, {space: (U, 3)} with NaN rows for units with a blocked image,
        {dependency column: list of U*3} or None, why each image is invalid or None (U, 3), the
        NSFW check's flags (U, 3), None where it did not run)."""
        import torch

        chosen = [triplets[u] for u in units]
        attention = self.dependency.capture(self.pipe, self._guidance()) if self.dependency is not None else None
        images, embeds, latents, flags, pooled = generate_units(self.pipe, chosen, [seeds[u] for u in units], self.steps,
                                                        self.guidance_scale, self.height, self.width,
                                                        self.noise_device, attention, self.call_kwargs)
        blocked = np.zeros((len(units), 3), bool) if flags is None else flags
        flat = images.reshape(-1, *images.shape[2:])
        invalid = np.asarray(invalid_images(flat, blocked.reshape(-1)), dtype=object).reshape(len(units), 3)
        unusable = blocked.reshape(-1) | np.asarray([w is not None for w in invalid.reshape(-1)], bool)
        checked, unusable = check_generated(self.nsfw_check, flat, unusable, self.exclude_nsfw)
        sims = {Space.PROMPT: pair_cosines(embeds), Space.PROMPT_POOLED: pair_cosines(pooled),
                Space.DENOISING: pair_cosines(latents)}
        for head in self.heads:
            for space, values in head.triplet_similarities(images).items():
                sims[space] = np.asarray(values, np.float64)
        flat_images = images.reshape(-1, *images.shape[2:])
        objects = None
        if self.dependency is not None:
            prof = None if professions is None else [professions[u] for u in units for _ in range(3)]
            # the latent grid of (U, 3, C, H, W) latents (UNet, SD 3); FLUX's are packed (U, 3, seq, 64):
            # its recorder reads the token grid from the transformer's call instead
            latent_hw = tuple(latents.shape[-2:]) if latents.ndim == 5 else None
            objects = self.dependency.analyse(flat_images, [p for t in chosen for p in t], attention,
                                              attention.tokenizer, latent_hw, unusable,
                                              unit_size=3, professions=prof)
        return (_to_uint8(torch.nan_to_num(flat_images, nan=0.0)), blocked, flags, sims, objects, invalid,
                checked.reshape(len(units), 3))

    def __call__(self, batch: pa.Table) -> pa.Table:
        import torch

        n = batch.num_rows
        triplets = list(zip(*(batch.column(c).to_pylist() for c in PROMPT_COLUMNS))) if n else []
        seeds = batch.column(SEED).to_pylist()
        # the unit's profession (Profession triplets): its noun sets are read with it (dependency analysis)
        professions = batch.column(PROFESSION).to_pylist() if PROFESSION in batch.column_names else None
        todo = [u for u in range(n) if all(_valid_prompt(p) for p in triplets[u])]
        missing = [u for u in todo if seeds[u] is None]
        if missing:
            raise ValueError(f"units {missing[:10]} have prompts but a null {SEED}: every image needs a recorded seed")
        status = np.full((n, 3), GenerationStatus.INVALID_PROMPT, dtype=object)
        detail = np.full((n, 3), None, dtype=object)
        nsfw = np.full((n, 3), None, dtype=object)
        sims = {s: np.full((n, 3), np.nan) for s in self.spaces}
        objects = None
        if self.dependency is not None:   # images never made: no_image, empty object lists
            objects = {f.name: np.full((n, 3), None, dtype=object) for f in DEPENDENCY_COLUMNS}
            for name, value in no_image().items():
                for u in range(n):
                    for v in range(3):
                        objects[name][u, v] = value
        pixels, generated = [], []   # uint8 device tensors (3 images per unit), unit indices in that order
        pending = [todo[s:s + self.micro_batch] for s in range(0, len(todo), self.micro_batch)]
        with torch.inference_mode():
            while pending:
                units = pending.pop(0)
                failure = None
                try:
                    images, blocked, flags, measured, found, invalid, checked = self._units(units, triplets, seeds,
                                                                                            professions)
                except Exception as exc:
                    if not _out_of_memory(exc):
                        raise
                    failure = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:500]
                if failure is not None:
                    images = measured = found = None
                    _free_device_memory(self.device)
                    if len(units) > 1:
                        half = (len(units) + 1) // 2
                        pending[:0] = [units[:half], units[half:]]
                    else:
                        status[units[0]] = GenerationStatus.ERROR
                        detail[units[0]] = f"out of memory with one unit (3 images) per call: {failure}"
                    continue
                for j, u in enumerate(units):
                    status[u] = np.where(blocked[j], GenerationStatus.NSFW_BLOCKED, GenerationStatus.OK)
                    if flags is not None:
                        nsfw[u] = blocked[j].tolist()
                    bad = [v for v in range(3) if invalid[j][v] is not None]
                    if self.nsfw_check is not None:
                        nsfw[u] = checked[j].tolist()
                        if self.exclude_nsfw:
                            flagged = [v for v in range(3) if checked[j][v] is True]
                            status[u][flagged] = GenerationStatus.NSFW_EXCLUDED
                            bad += flagged
                    for v in bad:   # never measured: the unit's disparities stay NaN
                        if invalid[j][v] is not None:
                            status[u][v], detail[u][v] = GenerationStatus.INVALID_IMAGE, invalid[j][v]
                    if not blocked[j].any() and not bad:
                        for space in self.spaces:
                            sims[space][u] = measured[space][j]
                    if found is not None:
                        for name, values in found.items():
                            for v in range(3):
                                objects[name][u, v] = values[3 * j + v]
                pixels.append(images)
                generated += units
            arrays = list(torch.cat(pixels).cpu().numpy()) if pixels else []
        return self._rows(batch, status, detail, nsfw, sims, arrays, generated, objects)

    def _rows(self, batch, status, detail, nsfw, sims, arrays, generated, objects=None) -> pa.Table:
        n = batch.num_rows
        unit_of_row = np.repeat(np.arange(n), 3)
        variant_of_row = np.tile(np.arange(3), n)
        take_units = pa.array(unit_of_row, pa.int64())
        columns = {c: batch.column(c).take(take_units) for c in PASSED_ON if c in batch.column_names}
        prompts = [batch.column(c).to_pylist() for c in PROMPT_COLUMNS]
        columns[VARIANT] = pa.array([Variant.ALL[v] for v in variant_of_row], pa.string())
        unit_ids = batch.column(UNIT_ID).to_pylist() if UNIT_ID in batch.column_names else [str(u) for u in range(n)]
        columns[IMAGE_ID] = pa.array([f"{unit_ids[u]}-{Variant.ALL[v]}" for u, v in zip(unit_of_row, variant_of_row)],
                                     pa.string())
        columns[PROMPT] = pa.array([prompts[v][u] for u, v in zip(unit_of_row, variant_of_row)], pa.string())
        columns[MODEL] = pa.array([self.model] * (3 * n), pa.string())
        columns[SEED] = batch.column(SEED).take(take_units).cast(pa.int64())
        # payload: the generated units' images, in (unit, variant) order, null elsewhere
        where = np.full(3 * n, -1, np.int64)
        for k, u in enumerate(generated):
            where[3 * u:3 * u + 3] = np.arange(3 * k, 3 * k + 3)
        # an invalid or excluded image is never stored (its recorded seed regenerates it)
        where[not_stored(status.reshape(-1))] = -1
        payload = pack_rgb8(arrays)
        take = pa.array(where, mask=where < 0)
        for name in (IMAGE, IMAGE_ENCODING, IMAGE_HEIGHT, IMAGE_WIDTH):
            columns[name] = payload[name].take(take)
        columns[GENERATION_STATUS] = pa.array(status.reshape(-1).tolist(), pa.string())
        columns[GENERATION_DETAIL] = pa.array(detail.reshape(-1).tolist(), pa.string())
        columns[NSFW] = pa.array(nsfw.reshape(-1).tolist(), pa.bool_())
        columns[SAFETY_CHECKER] = pa.array([self.safety_checker] * (3 * n), pa.string())
        unit_status = [next((s for s in status[u] if s != GenerationStatus.OK), GenerationStatus.OK) for u in range(n)]
        columns[UNIT_STATUS] = pa.array([unit_status[u] for u in unit_of_row], pa.string())
        for space in Space.ALL:
            values = sims.get(space)
            lists = [None if values is None or np.isnan(values[u]).any() else values[u].tolist() for u in unit_of_row]
            columns[disparity_column(space)] = pa.array(lists, pa.list_(pa.float64()))
        if objects is not None:
            for f in DEPENDENCY_COLUMNS:
                columns[f.name] = pa.array(objects[f.name].reshape(-1).tolist(), f.type)
        return pa.table(columns)

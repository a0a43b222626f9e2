"""diffusers text-to-image pipelines for every generator stage: loading (any
``AutoPipelineForText2Image`` family from a hub id or a local directory, revision, dtype, device,
scheduler, safety-checker policy, weights provenance), seeded generation of one micro-batch with a
per-image ``torch.Generator``, re-creating one image alone (``regenerate``), the speed options
(channels-last, ``torch.compile`` of the UNet, VAE slicing), and out-of-memory handling. The
single-image generator (``operators.image_generation``) and the triplet generator
(``operators.image_triplet_generation``) are stages built on it."""

from __future__ import annotations

import gc
import importlib.metadata
import json
import os
import struct
from pathlib import Path

import numpy as np

from operators.support.codec import rgb_levels
from operators.support.families import family_of_pipeline
from operators.support.models import ModelLoadError, loaded_weight_files, pick_device, resolve_dtype, weights_provenance

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
        from diffusers.utils import deprecation_utils  # deferred: diffusers

        return "dtype" if hasattr(deprecation_utils, "_resolve_dtype") else "torch_dtype"
    except ImportError:
        return "torch_dtype"


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def load_text2image(model: str, revision: str | None = None, device: str = "auto", dtype: str = "auto",
                    safety_checker: str = SafetyCheckerPolicy.MODEL_DEFAULT, scheduler: str | None = None,
                    cuda_dtype: str = "float16", variant: str | None = None, cpu_offload: bool = False):
    """Load a diffusers text-to-image pipeline; return ``(pipe, record)``.

    ``model`` is a hub id (pinned to ``revision``: a commit, branch or tag) or a local directory
    written by ``save_pretrained``. A hub id is loaded from the cache snapshot it resolves to, so
    the record names that commit and the sha256 of each weight file the pipeline read.
    ``device="auto"``: cuda when available, else cpu; ``dtype="auto"``: ``cuda_dtype`` on CUDA (the
    family's: bfloat16 for FLUX and SD 3, which overflow in float16), float32 on CPU. ``variant``
    ("fp16"): a hub repository's float16 weight files, used only when the model runs in float16
    (otherwise the full-precision files are read); recorded. ``safety_checker``: "model-default" keeps the checker the model
    ships (if any), "off" loads it without one. ``scheduler``: None keeps the model's sampler, a
    diffusers scheduler class name (``LMSDiscreteScheduler``, the k-LMS sampler of paper 001 App. A)
    replaces it, built from the model's scheduler config. ``cpu_offload``: the components stay in host
    memory and each moves to the GPU while it runs (diffusers' ``enable_model_cpu_offload``, through
    accelerate): a model larger than the card runs if its largest component fits (``check_fits``),
    slower by the transfers; a GPU only. ``record`` is the provenance of what was loaded.
    """
    if safety_checker not in SafetyCheckerPolicy.ALL:
        raise ValueError(f"safety_checker must be one of {SafetyCheckerPolicy.ALL}, got {safety_checker!r}")
    device = pick_device(device)
    if cpu_offload and not str(device).startswith("cuda"):
        raise ValueError(f"cpu_offload moves a generator's components between host memory and a GPU; {model} runs on "
                         f"{device} (leave cpu_offload off, or run on a GPU)")
    torch_dtype = resolve_dtype(dtype, device, cuda_auto=cuda_dtype)
    kwargs = {_dtype_keyword(): torch_dtype, "revision": revision}
    import torch  # deferred: torch

    used_variant = variant if (variant and torch_dtype == torch.float16 and not os.path.isdir(model)) else None
    if used_variant:
        kwargs["variant"] = used_variant
    if safety_checker == SafetyCheckerPolicy.OFF:
        kwargs["safety_checker"] = None  # never loaded; pipelines without one ignore the argument
    try:
        from diffusers import AutoPipelineForText2Image, DiffusionPipeline  # deferred: diffusers

        # a hub id: fetch (or find in the cache) the files this pipeline loads, at ``revision``, and
        # load from that snapshot directory: its name is the commit, its files the weights recorded
        source = model if os.path.isdir(model) else str(DiffusionPipeline.download(model, **kwargs))
        check_fits(model, source, torch_dtype, device, offload=cpu_offload)
        loader = AutoPipelineForText2Image if auto_loads(source) else DiffusionPipeline
        pipe = loader.from_pretrained(source, **kwargs)
        if cpu_offload:
            pipe.enable_model_cpu_offload(device=device)
        else:
            pipe = pipe.to(device)
    except ModelLoadError:
        raise
    except Exception as exc:  # OSError, ValueError, EnvironmentError, HTTP errors, CUDA errors...
        gated = _gated_message(model, exc)
        if gated:
            raise ModelLoadError(gated) from exc
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
    return pipe, text2image_record(pipe, model, revision, source, torch_dtype, used_variant, device, cpu_offload,
                                   safety_checker)


def text2image_record(pipe, model: str, revision: str | None, source: str, torch_dtype, variant: str | None,
                      device: str, cpu_offload: bool, safety_checker: str) -> dict:
    """The provenance of ``pipe`` as ``load_text2image`` loaded it from ``source`` (the local
    directory, or the hub snapshot ``model`` resolved to)."""
    return {
        "model": model,
        "revision": revision,
        "source": "directory" if os.path.isdir(model) else "hub",
        "pipeline_class": type(pipe).__name__,
        "family": family_of_pipeline(type(pipe).__name__).name,
        "scheduler_class": type(pipe.scheduler).__name__ if getattr(pipe, "scheduler", None) is not None else None,
        "dtype": str(torch_dtype).replace("torch.", ""),
        "variant": variant,
        "device": device,
        "cpu_offload": bool(cpu_offload),
        "safety_checker_policy": safety_checker,
        "safety_checker_present": getattr(pipe, "safety_checker", None) is not None,
        "diffusers_version": _package_version("diffusers"),
        "transformers_version": _package_version("transformers"),
        "torch_version": _package_version("torch"),
        "path": os.path.abspath(source),
        # commit, weight_files, weights_sha256: of the components loaded (a checker turned off is not)
        **weights_provenance(_loaded_files(pipe, source), source),
    }


# room a generator needs beyond its weights on the GPU (activations, the VAE decode, CUDA context)
MEMORY_HEADROOM = 1.25


def pipeline_parameters(source: str) -> int | None:
    """The number of parameters in a pipeline directory's model components, read from their
    safetensors headers (no weights are loaded); None where a component's files are not
    safetensors (their size says nothing certain)."""
    counts = component_parameters(source)
    return None if counts is None else sum(counts.values())


def component_parameters(source: str) -> dict[str, int] | None:
    """{component: parameters} of a pipeline directory (``pipeline_parameters``)."""
    out: dict[str, int] = {}
    root = Path(source)
    try:
        components = [k for k, v in json.loads((root / "model_index.json").read_text()).items()
                      if not k.startswith("_") and isinstance(v, list) and v[0] is not None]
    except (OSError, ValueError):
        return None
    for name in components:
        total = 0
        for f in loaded_weight_files(root / name):
            if f.suffix != ".safetensors":
                return None
            with open(f, "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(n))
            for key, info in header.items():
                if key != "__metadata__":
                    count = 1
                    for d in info["shape"]:
                        count *= int(d)
                    total += count
        if total:
            out[name] = total
    return out


def check_fits(model: str, source: str, torch_dtype, device: str, total_bytes: int | None = None,
               offload: bool = False) -> None:
    """Before loading onto a GPU: refuse, in one line with the options, a pipeline whose weights in
    ``torch_dtype`` (times MEMORY_HEADROOM) exceed the card's memory; with ``offload`` (one component
    on the GPU at a time), one whose largest component does. ``total_bytes``: the card's memory
    (default: what torch reports for ``device``)."""
    import torch  # deferred: torch

    if not str(device).startswith("cuda") and total_bytes is None:
        return
    counts = component_parameters(source)
    if not counts:
        return
    params = max(counts.values()) if offload else sum(counts.values())
    if total_bytes is None:
        total_bytes = torch.cuda.get_device_properties(torch.device(device)).total_memory
    need = params * torch.tensor([], dtype=torch_dtype).element_size() * MEMORY_HEADROOM
    if need > total_bytes:
        dtype = str(torch_dtype).replace("torch.", "")
        raise ModelLoadError(
            f"text-to-image model {model!r} has {params / 1e9:.1f} B parameters"
            + (" in its largest component (CPU offload)" if offload else "")
            + f": about {need / 2**30:.0f} GiB in {dtype} with activations, more than this GPU's "
            f"{total_bytes / 2**30:.0f} GiB. Run it on a larger GPU (cluster.yaml: gpu_worker_large, L40S 48 GB; or "
            f"p4d/p5, A100/H100 80 GB)"
            + ("" if offload else ", or with --gen-cpu-offload (one component on the GPU at a time, slower)")
            + ", or, where the card allows it, a smaller dtype (dtype=float16/bfloat16 instead of float32).")


def _gated_message(model: str, exc: BaseException) -> str | None:
    """One line for a repository this machine may not read: gated (huggingface_hub's GatedRepoError)
    or private / not there (RepositoryNotFoundError: the hub answers 401 to both without a token),
    anywhere in the exception's chain; None for any other failure."""
    chain, e = [], exc
    while e is not None and len(chain) < 10:
        chain.append(e)
        e = e.__cause__ or e.__context__
    names = {type(c).__name__ for c in chain}
    token = ("give a token: export HF_TOKEN=... (on a cluster on every node, e.g. in cluster.yaml's setup) "
             "or run `huggingface-cli login`")
    if "GatedRepoError" in names or any("gated repo" in str(c).lower() for c in chain):
        return (f"cannot load text-to-image model {model!r}: its Hugging Face repository is gated. Accept its licence "
                f"at https://huggingface.co/{model} with your account, then {token}.")
    if "RepositoryNotFoundError" in names:
        return (f"cannot load text-to-image model {model!r}: the Hugging Face hub has no repository by that name that "
                f"this machine may read. Check the id; if it is private or gated, accept its licence at "
                f"https://huggingface.co/{model} with your account, then {token}.")
    return None


def _loaded_files(pipe, root: str) -> list:
    """The weight files the pipeline's model components were read from: each component's folder,
    with the file its library prefers there (operators.base.LOADED_WEIGHT_NAMES)."""
    import torch  # deferred: torch

    return [f for name, component in sorted(pipe.components.items()) if isinstance(component, torch.nn.Module)
            for f in loaded_weight_files(os.path.join(root, name))]


def _scheduler(name: str, pipe):
    import diffusers  # deferred: diffusers

    cls = getattr(diffusers, name, None)
    if cls is None or not hasattr(cls, "from_config") or not name.endswith("Scheduler"):
        raise ValueError(f"unknown diffusers scheduler {name!r} (e.g. LMSDiscreteScheduler, DDIMScheduler, "
                         f"PNDMScheduler, EulerDiscreteScheduler)")
    if getattr(pipe, "scheduler", None) is None:
        raise ValueError(f"scheduler {name!r} given, but the pipeline {type(pipe).__name__} has none to replace")
    return cls.from_config(pipe.scheduler.config)


def _generate(pipe, prompts: list[str], seeds: list[int], steps: int, guidance_scale: float,
              height: int | None, width: int | None, noise_device: str, call_kwargs: dict | None = None):
    """One pipeline call: (B, 3, H, W) images in [0, 1] on the pipeline's device, and the safety
    checker's per-image flags (None when no checker ran). Row ``i`` is seeded with ``seeds[i]``
    alone. ``call_kwargs``: the generator spec's further call arguments (a negative prompt, ...)."""
    import torch  # deferred: torch

    generators = [torch.Generator(noise_device).manual_seed(int(s)) for s in seeds]
    family = family_of_pipeline(type(pipe).__name__)
    kwargs = guided_call(family, guidance_scale, call_kwargs)
    out = pipe(prompt=list(prompts), height=height, width=width, generator=generators, num_images_per_prompt=1,
               output_type="pt", **sampling(steps, guidance_scale, family.cfg_argument), **per_prompt(kwargs, len(prompts)))
    flags = getattr(out, "nsfw_content_detected", None)
    return image_tensor(out.images), (None if flags is None else [bool(f) for f in flags])


def auto_loads(source: str) -> bool:
    """Whether ``AutoPipelineForText2Image`` knows the pipeline class of the local ``source``; the
    families it does not map (HiDream, SANA-Sprint, Kolors, HunyuanImage in diffusers 0.42) load
    through ``DiffusionPipeline``, by their ``model_index.json`` class."""
    from diffusers.pipelines.auto_pipeline import AUTO_TEXT2IMAGE_PIPELINES_MAPPING  # deferred: diffusers

    try:
        cls = json.loads((Path(source) / "model_index.json").read_text()).get("_class_name")
    except (OSError, ValueError, AttributeError):
        return True
    known = {c.__name__ for c in AUTO_TEXT2IMAGE_PIPELINES_MAPPING.values()}
    return cls in known or family_of_pipeline(cls).name == "unknown"


def sampling(steps: int | None, guidance_scale: float | None, cfg_argument: str | None = "guidance_scale") -> dict:
    """num_inference_steps and the guidance scale as call arguments (under the family's name for it,
    ``cfg_argument``: Qwen-Image's is ``true_cfg_scale``), left out where None (the pipeline's own
    default: a model of no known family). A scale for a family whose call takes none is refused."""
    out = {}
    if steps is not None:
        out["num_inference_steps"] = int(steps)
    if guidance_scale is not None:
        if cfg_argument is None:
            raise ValueError(f"a guidance scale ({guidance_scale}) was set, but this pipeline's call takes none "
                             "(HunyuanImage: its guider component holds it): leave the guidance unset for it")
        out[cfg_argument] = float(guidance_scale)
    return out


BLANK_NEGATIVE = " "    # Qwen-Image's guidance runs only with a negative prompt: the card's example passes a blank one


def guided_call(family, guidance_scale: float | None, call_kwargs: dict | None) -> dict:
    """The call arguments with what the family's guidance needs: for a ``true_cfg_scale`` above 1
    without a negative prompt, a blank one (else Qwen-Image runs without guidance and warns)."""
    out = dict(call_kwargs or {})
    if family.cfg_argument == "true_cfg_scale" and guidance_scale is not None and guidance_scale > 1 \
            and out.get("negative_prompt") is None:
        out["negative_prompt"] = BLANK_NEGATIVE
    return out


def invalid_images(images, blocked=None) -> list[str | None]:
    """Per image of a (B, 3, H, W) float batch, why it is not a usable image, or None: non-finite
    values (a NaN/inf decode: float16 overflow), or all black without the safety checker having
    blanked it (``blocked``), which is what a NaN decode becomes once clamped and cast."""
    import torch  # deferred: torch

    flat = images.detach().flatten(1)
    finite = torch.isfinite(flat)
    bad = (~finite).sum(dim=1).tolist()
    peak = torch.where(finite, flat, torch.zeros((), dtype=flat.dtype, device=flat.device)).amax(dim=1).tolist()
    out: list[str | None] = []
    for i, (n_bad, top) in enumerate(zip(bad, peak)):
        if n_bad:
            out.append(f"{n_bad} of {flat.shape[1]} values are NaN or infinite (a float16 overflow decodes to "
                       f"NaN: run the model in bfloat16 or float32)")
        elif top <= 0 and not (blocked is not None and bool(blocked[i])):
            out.append("all black (a NaN decode clamped to 0, or a blank output)")
        else:
            out.append(None)
    return out


def per_prompt(call_kwargs: dict | None, n: int) -> dict:
    """A spec's call arguments for a call with ``n`` prompts: a negative prompt is given per prompt
    (diffusers wants the type of ``prompt``, a list here)."""
    out = dict(call_kwargs or {})
    for key in ("negative_prompt", "negative_prompt_2", "negative_prompt_3"):
        if isinstance(out.get(key), str):
            out[key] = [out[key]] * n
    return out


def image_tensor(images):
    """A pipeline's output images as (B, 3, H, W) floats in [0, 1]: as they are for
    ``output_type="pt"``, converted for a pipeline that ignores it (PIL images or arrays)."""
    import torch  # deferred: torch

    if torch.is_tensor(images):
        return images
    arr = np.stack([np.asarray(a) for a in images])
    arr = arr.astype(np.float32) / 255.0 if arr.dtype == np.uint8 else arr.astype(np.float32)
    return torch.from_numpy(arr).permute(0, 3, 1, 2)


def _to_uint8(images):
    """(B, 3, H, W) floats in [0, 1] -> (B, H, W, 3) uint8, still on the images' device."""
    import torch  # deferred: torch

    return rgb_levels(images).to(torch.uint8).permute(0, 2, 3, 1)




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
    import torch  # deferred: torch

    unet = getattr(pipe, "unet", None)
    vae = getattr(pipe, "vae", None)
    denoiser = unet if isinstance(unet, torch.nn.Module) else getattr(pipe, "transformer", None)
    if channels_last and not isinstance(unet, torch.nn.Module):
        raise ValueError(f"channels_last is for a UNet's convolutions; {type(pipe).__name__} denoises with a "
                         f"transformer (leave it off)")
    if compile_mode and not isinstance(denoiser, torch.nn.Module):
        raise ValueError(f"compile_unet needs a denoiser (UNet or transformer); {type(pipe).__name__} has none")
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
        # in place: pipe.unet / pipe.transformer stays itself (its config, processors and hooks unchanged)
        denoiser.compile(mode=None if compile_mode == "default" else compile_mode)
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
    import torch  # deferred: torch

    return isinstance(exc, torch.cuda.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower())


def _free_device_memory(device: str) -> None:
    """Give the allocator's cached blocks back before a smaller retry."""
    import torch  # deferred: torch

    gc.collect()
    if str(device).startswith("cuda") and torch.cuda.is_available():
        torch.cuda.empty_cache()

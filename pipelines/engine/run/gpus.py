"""How many GPUs the model actors of a study ask for, and refusing to run real models on a CPU.

The GPUs an actor asks for come from the study's configuration (``execution.gpus_per_model_actor``,
default 1) or ``--gpus-per-actor``, never from what the cluster happens to hold when the job
connects: on an autoscaling cluster (``cluster.yaml``: a CPU head, ``gpu_worker`` with
``min_workers: 0``) there is no GPU at that moment, and it is the pending GPU actors themselves
that make the autoscaler launch ``gpu_worker`` nodes. Asking for none would put SD, CLIP and
BLIP-2 on CPU workers in fp32, where the paper's configuration never finishes.

So:

- ``--device cpu`` runs every model on the CPU on purpose (no GPU asked for);
- real models asked to run with 0 GPUs per actor, without ``--device cpu``, are refused;
- real models whose GPUs this Ray instance cannot provide (a local instance, which has no
  autoscaler, with fewer GPUs than one actor needs; or a cluster whose autoscaler has no node
  type with GPUs) are refused before any work starts;
- on a cluster with no GPU up yet, the job says it is waiting for the autoscaler and how to check;
- tiny random stand-in models follow the same request when GPUs are there, and otherwise run on
  the CPU (they are smoke-test models; a laptop has no GPU);
- inside the actor, a real model is put on ``cuda`` explicitly, so a GPU node whose torch cannot
  see its GPU fails with a message instead of silently computing on the CPU
  (``operators.base.pick_device``);
- a generator too large for the ordinary GPU node's card (FLUX.1, SD 3.5 large in bf16: see
  ``needs_large_gpu``) also asks for the custom resource ``LARGE_GPU_RESOURCE``, which only
  ``cluster.yaml``'s ``gpu_worker_large`` declares (``actor_resources``); a run with such a model
  on a Ray instance that cannot provide that resource is refused before any work
  (``check_cluster(..., specs=...)``).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable

import yaml

from operators.support import diffusion
from operators.support.families import detect
from operators.support.models import GPU_HINT, ModelLoadError

DEFAULT_GPUS_PER_MODEL_ACTOR = 1.0

# The custom Ray resources of the node types whose GPUs hold the big text-to-image models: only
# cluster.yaml's gpu_worker_large declares LARGE_GPU_RESOURCE ({CPU: 8, GPU: 1, large_gpu: 1}) and
# only gpu_worker_xlarge XLARGE_GPU_RESOURCE ({CPU: 16, GPU: 1, xlarge_gpu: 1}); only the generator
# actors of those models ask for them (actor_resources), so they never land on a smaller card.
LARGE_GPU_RESOURCE = "large_gpu"
XLARGE_GPU_RESOURCE = "xlarge_gpu"
# The GPU memory of cluster.yaml's gpu_worker (g5.2xlarge: one A10G, "24 GB"; CUDA reports about
# 22.5 GiB of it, so 24e9 bytes = 22.4 GiB stays under what the loader's check_fits compares with).
# A generator that needs more than this asks for LARGE_GPU_RESOURCE.
GPU_WORKER_MEMORY = 24 * 10**9
# The GPU memory of cluster.yaml's gpu_worker_large (g6e.2xlarge: one L40S, 48 GB): a generator
# that needs more asks for XLARGE_GPU_RESOURCE.
LARGE_GPU_WORKER_MEMORY = 48 * 10**9
# The GPU memory of cluster.yaml's gpu_worker_xlarge (p5.4xlarge: one H100 "80GB", which is 80 GiB
# of HBM; CUDA reports 79.2 GiB = 85.0e9 bytes of it, as on an A100 80GB, so 84e9 stays under what
# check_fits compares with): Qwen-Image, HiDream-I1, HunyuanImage 2.1, and FLUX.2-dev with CPU
# offload (its 32B transformer: 80.6e9 bytes with the headroom). Beyond it, refused before any work.
XLARGE_GPU_WORKER_MEMORY = 84 * 10**9


@dataclass(frozen=True)
class NodeTier:
    """A GPU node type of cluster.yaml by the card its generators need."""

    memory: int                 # bytes of its card that a generator may fill
    resource: str | None        # the custom resource its generator actors ask for (None: none)
    node_type: str
    instance: str


NODE_TIERS = (NodeTier(GPU_WORKER_MEMORY, None, "gpu_worker", "g5.2xlarge, one A10G 24 GB"),
              NodeTier(LARGE_GPU_WORKER_MEMORY, LARGE_GPU_RESOURCE, "gpu_worker_large", "g6e.2xlarge, one L40S 48 GB"),
              NodeTier(XLARGE_GPU_WORKER_MEMORY, XLARGE_GPU_RESOURCE, "gpu_worker_xlarge",
                       "p5.4xlarge, one H100 80 GB"))

# Parameters of whole pipelines (denoiser, text encoders, VAE) by lower-case hub id, so the node a
# generator needs is known without the network. From benchmarks/bench_family_sizes.py (full-size
# networks on the meta device; docs/benchmarks.md, "Today's model families at full size") unless
# said otherwise. Models not here (SD 1.x/2.x, PixArt, Playground, any other id) are not routed
# (needs_large_gpu: False), except FLUX.1 by family (FAMILY_PARAMETERS).
PIPELINE_PARAMETERS: dict[str, int] = {
    "black-forest-labs/flux.1-dev": 16_870_600_467,                      # docs/benchmarks.md: 16.87B
    # the same builder with guidance_embeds=False (schnell has no guidance embedder): 16.86B
    "black-forest-labs/flux.1-schnell": 16_860_370_707,
    "stabilityai/stable-diffusion-3.5-large": 13_721_069_331,            # docs/benchmarks.md: 13.72B
    # the large transformer's config.json (the turbo is a step-distilled large, same network)
    "stabilityai/stable-diffusion-3.5-large-turbo": 13_721_069_331,
    # the benchmark's builders with the published medium transformer config (24 layers, 24 heads,
    # caption_projection_dim 1536, pos_embed_max_size 384, qk_norm rms_norm, dual attention in
    # layers 0-12): 2.24B transformer parameters (plus a 0.23B positional-embedding buffer, not
    # counted, as the benchmark counts parameters) + CLIP-L, CLIP-G, T5-XXL, VAE: 7.91B
    "stabilityai/stable-diffusion-3.5-medium": 7_907_613_331,
    "stabilityai/stable-diffusion-3-medium-diffusers": 7_692_769_811,   # docs/benchmarks.md: 7.69B
    "stabilityai/stable-diffusion-xl-base-1.0": 3_468_837_867,          # docs/benchmarks.md: 3.47B
    # the 2025-2026 families, from the same benchmark (docs/benchmarks.md, "The families of
    # 2025-2026 at full size"; which configs are the diffusers classes' defaults and which are
    # written out from the published config.json files is said there)
    "black-forest-labs/flux.2-dev": 56_318_688_547,          # 32.2B transformer + Mistral Small 3.1 24.0B
    "black-forest-labs/flux.2-klein-base-9b": 17_353_362_723,  # 9.1B transformer + Qwen3 8B
    "black-forest-labs/flux.2-klein-9b": 17_353_362_723,     # the distilled klein 9B: the same networks
    "black-forest-labs/flux.2-klein-base-4b": 7_982_058_787,   # 3.9B transformer + Qwen3 4B
    "black-forest-labs/flux.2-klein-4b": 7_982_058_787,      # the distilled klein 4B: the same networks
    "qwen/qwen-image": 28_849_460_275,                       # 20.4B transformer + Qwen2.5-VL 7B
    "hidream-ai/hidream-i1-full": 30_800_786_451,            # 17.1B transformer + CLIP-L, CLIP-G, T5-XXL, Llama 3.1 8B
    "hidream-ai/hidream-i1-dev": 30_800_786_451,             # dev and fast: the full model distilled, same networks
    "hidream-ai/hidream-i1-fast": 30_800_786_451,
    "efficient-large-model/sana_1600m_1024px_diffusers": 4_531_054_915,      # 1.6B transformer + Gemma 2 2B + DC-AE
    "efficient-large-model/sana_1600m_1024px_bf16_diffusers": 4_531_054_915,
    "alpha-vllm/lumina-image-2.0": 5_307_932_051,            # 2.6B transformer + Gemma 2 2B
    "kwai-kolors/kolors-diffusers": 8_906_696_683,           # 2.6B UNet + ChatGLM3 6B
    "lodestones/chroma": 13_746_115_091,                     # 8.9B transformer + T5-XXL
    "lodestones/chroma1-hd": 13_746_115_091,
    "thudm/cogview4-6b": 15_554_413_283,                     # 6.4B transformer + GLM-4 9B
    "zai-org/cogview4-6b": 15_554_413_283,
    "hunyuanvideo-community/hunyuanimage-2.1-diffusers": 26_342_852_611,   # 17.4B transformer + Qwen2.5-VL 7B + ByT5
    "tongyi-mai/z-image-turbo": 10_261_197_843,              # 6.2B transformer + Qwen3 4B
}
# The largest single component of each (what the GPU holds at a time with CPU offload, diffusers'
# enable_model_cpu_offload), from the same builds: the denoiser, or T5-XXL's encoder (4.76B) where
# that is larger.
LARGEST_COMPONENT: dict[str, int] = {
    "black-forest-labs/flux.1-dev": 11_901_408_320,                      # transformer (docs: 11.90B)
    "black-forest-labs/flux.1-schnell": 11_891_178_560,                  # transformer
    "stabilityai/stable-diffusion-3.5-large": 8_056_627_520,             # transformer (docs: 8.06B)
    "stabilityai/stable-diffusion-3.5-large-turbo": 8_056_627_520,
    "stabilityai/stable-diffusion-3.5-medium": 4_762_310_656,            # T5-XXL (transformer 2.24B)
    "stabilityai/stable-diffusion-3-medium-diffusers": 4_762_310_656,    # T5-XXL (transformer 2.03B)
    "stabilityai/stable-diffusion-xl-base-1.0": 2_567_463_684,           # UNet (docs: 2.57B)
    "black-forest-labs/flux.2-dev": 32_223_281_152,                      # transformer
    "black-forest-labs/flux.2-klein-base-9b": 9_078_581_248,             # transformer
    "black-forest-labs/flux.2-klein-9b": 9_078_581_248,
    "black-forest-labs/flux.2-klein-base-4b": 4_022_468_096,             # Qwen3 4B (the transformer: 3.88B)
    "black-forest-labs/flux.2-klein-4b": 4_022_468_096,
    "qwen/qwen-image": 20_430_401_088,                                   # transformer
    "hidream-ai/hidream-i1-full": 17_105_733_184,                        # transformer
    "hidream-ai/hidream-i1-dev": 17_105_733_184,
    "hidream-ai/hidream-i1-fast": 17_105_733_184,
    "efficient-large-model/sana_1600m_1024px_diffusers": 2_614_341_888,  # Gemma 2 2B
    "efficient-large-model/sana_1600m_1024px_bf16_diffusers": 2_614_341_888,
    "alpha-vllm/lumina-image-2.0": 2_614_341_888,                        # Gemma 2 2B (the transformer: 2.61B)
    "kwai-kolors/kolors-diffusers": 6_243_584_000,                       # ChatGLM3 6B
    "lodestones/chroma": 8_899_983_424,                                  # transformer
    "lodestones/chroma1-hd": 8_899_983_424,
    "thudm/cogview4-6b": 8_779_194_368,                                  # GLM-4 9B
    "zai-org/cogview4-6b": 8_779_194_368,
    "hunyuanvideo-community/hunyuanimage-2.1-diffusers": 17_425_795_520,  # transformer
    "tongyi-mai/z-image-turbo": 6_154_908_736,                           # transformer
}
# A family every member of which is at least this large: another FLUX.1 (a fine-tune, a new id)
# carries the same 12B transformer and T5-XXL, so it is taken to be FLUX.1-schnell's size.
# Likewise FLUX.2 (dev's 32B transformer and Mistral 3), Qwen-Image (its later releases keep the
# 20B MMDiT and Qwen2.5-VL), HiDream-I1 (full, dev, fast) and HunyuanImage 2.1 (and its distilled
# variant) under any id.
_FAMILY_IDS = {"flux": "black-forest-labs/flux.1-schnell", "flux2": "black-forest-labs/flux.2-dev",
               "qwen-image": "qwen/qwen-image", "hidream": "hidream-ai/hidream-i1-full",
               "hunyuan-image": "hunyuanvideo-community/hunyuanimage-2.1-diffusers"}
FAMILY_PARAMETERS: dict[str, int] = {f: PIPELINE_PARAMETERS[m] for f, m in _FAMILY_IDS.items()}
FAMILY_LARGEST_COMPONENT: dict[str, int] = {f: LARGEST_COMPONENT[m] for f, m in _FAMILY_IDS.items()}
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass
class GpuPlan:
    """What every model actor of a run asks for, and the device its model is put on."""

    per_actor: float      # GPUs per generator / CLIP / BLIP-2 / scorer actor
    device: str           # the ``device`` argument of the model operators: cuda, cpu or auto
    source: str           # where ``per_actor`` came from (recorded in metrics.json)
    note: str = ""        # what the console says about it

    def as_dict(self) -> dict:
        return asdict(self)


def add_arguments(group, actors: str) -> None:
    """--gpus-per-actor and --device of a study whose model actors are ``actors``."""
    group.add_argument("--gpus-per-actor", type=float,
                       help=f"GPUs per {actors} actor (default: execution.gpus_per_model_actor of the study file, 1; "
                            "asked for even when no GPU is up yet, so the autoscaler starts GPU nodes)")
    group.add_argument("--device", default="auto",
                       help="auto (real models on GPU actors), cuda, or cpu (every model on the CPU on purpose; real "
                            "models are otherwise refused on a CPU)")


def add_generation_options(group) -> None:
    """The generator's speed options (``operators.image_generation``; all off by default)."""
    group.add_argument("--gen-channels-last", action="store_true",
                       help="UNet and VAE in channels-last memory format (faster convolutions on GPUs; same images "
                            "up to rounding)")
    group.add_argument("--gen-vae-slicing", choices=["off", "on", "auto"], default="off",
                       help="decode generated images one at a time (bounds the VAE's memory at large batches); auto: "
                            "for calls of 8 or more images (default off)")
    group.add_argument("--gen-compile", choices=["off", "default", "reduce-overhead", "max-autotune",
                                                 "max-autotune-no-cudagraphs"], default="off",
                       help="torch.compile the UNet in this mode (each new batch shape compiles first; pays off on "
                            "long runs; default off)")


def add_offload(group) -> None:
    """--gen-cpu-offload: a generator larger than its GPU (every generator stage)."""
    group.add_argument("--gen-cpu-offload", action="store_true",
                       help="keep the generator's components in host memory and move each to the GPU while it runs "
                            "(diffusers' enable_model_cpu_offload): a model larger than the card runs when its largest "
                            "component fits; slower by the transfers; GPUs only")


def plan(execution: dict, gpus_per_actor: float | None, device: str | None, standin: bool) -> GpuPlan:
    """The request from configuration and flags alone (no Ray): what the README's commands ask for."""
    device = (device or "auto").lower()
    if device not in ("auto", "cpu", "cuda") and not device.startswith("cuda:"):
        raise ValueError(f"--device {device!r}: expected auto, cpu or cuda")
    if gpus_per_actor is not None and gpus_per_actor < 0:
        raise ValueError(f"--gpus-per-actor {gpus_per_actor}: must be >= 0")
    if device == "cpu":
        if gpus_per_actor:
            raise ValueError(f"--device cpu with --gpus-per-actor {gpus_per_actor}: a CPU run asks for no GPU")
        return GpuPlan(0.0, "cpu", "--device cpu")
    if gpus_per_actor is not None:
        per, source = float(gpus_per_actor), "--gpus-per-actor"
    else:
        per = float(execution.get("gpus_per_model_actor", DEFAULT_GPUS_PER_MODEL_ACTOR))
        source = "execution.gpus_per_model_actor" if "gpus_per_model_actor" in execution else "default"
    if per <= 0 and not standin:
        raise ModelLoadError(
            f"{source} = {per:g}: the real models (generators, CLIP, BLIP-2) would run on a CPU, where the "
            f"paper's configuration takes days. {GPU_HINT}")
    # a stand-in is tiny: "auto" lets it use the GPU it was given, or the CPU
    return GpuPlan(per, "auto" if standin or per <= 0 else (device if device != "auto" else "cuda"), source)


def check_cluster(ray, gp: GpuPlan, standin: bool, local: bool, specs: Iterable = (),
                  offload: bool | None = None) -> GpuPlan:
    """Hold ``gp`` against the Ray instance the job runs on, before any work starts.

    ``local``: a Ray instance this process started (no autoscaler: its GPUs are all it will ever
    have). On a cluster, GPUs that are not up yet are fine when the autoscaler can add them.
    ``specs``: the run's generators (``GeneratorSpec``); those that need a large GPU
    (``needs_large_gpu``, with the run's CPU ``offload``) must find ``LARGE_GPU_RESOURCE`` (see
    ``check_large_gpus``).
    """
    gp = _check_gpus(ray, gp, standin, local)
    return check_large_gpus(ray, gp, standin, local, specs, offload)


def _check_gpus(ray, gp: GpuPlan, standin: bool, local: bool) -> GpuPlan:
    if gp.per_actor <= 0:
        return gp
    gpus_now = float(ray.cluster_resources().get("GPU", 0))
    if gpus_now >= gp.per_actor:
        gp.note = f"{gpus_now:g} GPU(s) in the cluster now; each model actor asks for {gp.per_actor:g}"
        return gp
    if local:
        can_add = False
    else:
        can_add = autoscaler_max_gpus(ray)
        can_add = True if can_add is None else can_add >= gp.per_actor  # unknown: trust the cluster config
    if standin:
        if not can_add:
            gp.per_actor, gp.device = 0.0, "auto"
            gp.note = "no GPU in this Ray instance: the stand-in models run on the CPU"
        return gp
    if not can_add:
        where = "this local Ray instance" if local else "this cluster (and its autoscaler has no node type with GPUs)"
        raise ModelLoadError(
            f"each model actor asks for {gp.per_actor:g} GPU(s) ({gp.source}), but {where} has "
            f"{gpus_now:g}: the job would wait forever or the real models would run on a CPU. {GPU_HINT}")
    gp.note = (f"no GPU in the cluster yet: the model actors ask for {gp.per_actor:g} GPU each and wait "
               f"until the autoscaler starts GPU nodes (`ray status` shows them pending, then running)")
    return gp


def autoscaler_node_types(ray) -> dict[str, dict[str, float]] | None:
    """{node type: its resources} of the cluster's autoscaler, or None when this cannot be read
    (no autoscaler information published, or a Ray without the API)."""
    try:  # the cluster config the autoscaler reports to the GCS (Ray >= 2.10)
        from ray._private import state  # deferred: ray

        cfg = state.state.get_cluster_config()
        if cfg is not None and len(cfg.node_group_configs):
            return {str(getattr(g, "name", "") or i): {str(k): float(v) for k, v in dict(g.resources).items()}
                    for i, g in enumerate(cfg.node_group_configs)}
    except Exception:
        pass
    try:  # `ray up` leaves the launcher config on the head, where `ray submit` runs this driver
        path = Path.home() / "ray_bootstrap_config.yaml"
        if path.is_file():
            types = (yaml.safe_load(path.read_text()) or {}).get("available_node_types") or {}
            if types:
                return {str(name): {str(k): float(v) for k, v in (t.get("resources") or {}).items()}
                        for name, t in types.items()}
    except Exception:
        pass
    return None


def autoscaler_max_gpus(ray) -> float | None:
    """The most GPUs one node type of the cluster's autoscaler offers, or None when this cannot
    be read (no autoscaler information published, or a Ray without the API)."""
    types = autoscaler_node_types(ray)
    if not types:
        return None
    return max(r.get("GPU", 0.0) for r in types.values())


# --- generators too large for the ordinary GPU node ---------------------------------------------

def _is_standin(model: str) -> bool:
    """A tiny random stand-in (pipelines/standins: a directory with STANDIN.txt)."""
    return os.path.isdir(model) and (Path(model) / "STANDIN.txt").is_file()


def spec_dtype(spec) -> str:
    """The dtype ``spec`` runs in on a GPU: its ``dtype``, or its ``cuda_dtype`` for "auto"."""
    return spec.cuda_dtype if spec.dtype == "auto" else spec.dtype


def _offload(spec, offload: bool | None) -> bool:
    """CPU offload of ``spec``'s generator: ``offload`` where given, else the spec's own
    ``cpu_offload`` (if it has one)."""
    return bool(getattr(spec, "cpu_offload", False)) if offload is None else bool(offload)


def pipeline_size(spec, offload: bool = False) -> tuple[int | None, str]:
    """(parameters of ``spec``'s whole pipeline, or with ``offload`` of its largest component; or
    None), and where the count comes from, without the network: a local directory's safetensors
    headers, else ``PIPELINE_PARAMETERS`` / ``LARGEST_COMPONENT`` by hub id, else
    ``FAMILY_PARAMETERS`` / ``FAMILY_LARGEST_COMPONENT`` by the spec's family."""
    model = str(spec.model)
    if os.path.isdir(model):
        counts = getattr(diffusion, "component_parameters", None)
        if offload and counts is not None:
            parts = counts(model)
            return (max(parts.values()) if parts else None), "its safetensors headers (largest component)"
        return diffusion.pipeline_parameters(model), "its safetensors headers"
    key = model.strip().lower()
    table, by_family = (LARGEST_COMPONENT, FAMILY_LARGEST_COMPONENT) if offload else \
        (PIPELINE_PARAMETERS, FAMILY_PARAMETERS)
    if key in table:
        return table[key], "bench_family_sizes (docs/benchmarks.md)"
    family = spec.family
    if family is None:
        family = detect(model, getattr(spec, "revision", None))[0].name
    if family in by_family:
        return by_family[family], f"its family ({family})"
    return None, "unknown"


def memory_needed(spec, offload: bool | None = None) -> int | None:
    """Bytes ``spec``'s generator needs on a GPU: its parameters (with CPU offload, its largest
    component's) times the bytes of the dtype it runs in on CUDA, times the loader's headroom
    (``check_fits``); None when its size is unknown. Stand-ins: None (never routed)."""
    if _is_standin(str(spec.model)):
        return None
    params, _ = pipeline_size(spec, _offload(spec, offload))
    if not params:
        return None
    return int(params * DTYPE_BYTES.get(spec_dtype(spec), 4) * diffusion.MEMORY_HEADROOM)


def needs_large_gpu(spec, offload: bool | None = None) -> bool:
    """Whether ``spec``'s generator needs more GPU memory than cluster.yaml's gpu_worker has
    (``GPU_WORKER_MEMORY``): FLUX.1 and SD 3.5 large in bf16, SD 3 / 3.5 medium in float32, and of
    the 2025-2026 families FLUX.2, Qwen-Image, HiDream-I1, HunyuanImage 2.1, Chroma, CogView4 and
    FLUX.2 klein 9B; with CPU offload (``offload``, default the spec's ``cpu_offload`` if it has one)
    only those whose largest component alone outgrows the card (FLUX.1's 12B transformer: ~28 GiB).
    A model of unknown size and a stand-in: False."""
    need = memory_needed(spec, offload)
    return need is not None and need > GPU_WORKER_MEMORY


def node_tier(spec, offload: bool | None = None) -> NodeTier | None:
    """The smallest of ``NODE_TIERS`` whose card holds ``spec``'s generator (with ``offload``: its
    largest component); the largest tier when none does (``check_large_gpus`` refuses it then);
    None when its size is unknown or it is a stand-in (never routed)."""
    need = memory_needed(spec, offload)
    return None if need is None else (_tier_for(need) or NODE_TIERS[-1])


def _tier_for(need: int) -> NodeTier | None:
    """The smallest of ``NODE_TIERS`` whose card holds ``need`` bytes, or None."""
    return next((t for t in NODE_TIERS if need <= t.memory), None)


def gpu_resource(spec, offload: bool | None = None) -> str | None:
    """The custom resource ``spec``'s generator actor asks for: ``LARGE_GPU_RESOURCE``,
    ``XLARGE_GPU_RESOURCE``, or None (gpu_worker, or a size unknown here)."""
    tier = node_tier(spec, offload)
    return None if tier is None else tier.resource


def offloaded(spec, gp: GpuPlan | None, forced: bool = False) -> bool:
    """Whether ``spec``'s generator runs with CPU offload: every generator with --gen-cpu-offload
    (``forced``; the loader refuses it on a CPU), else the spec's own ``cpu_offload`` (its model
    card's recommendation, or the user's per-model setting) when its actors get a GPU. On a CPU
    there is nothing to offload from, so a spec's own is not applied there (the run says so)."""
    if forced:
        return True
    return bool(getattr(spec, "cpu_offload", None)) and gp is not None and gp.per_actor > 0


def actor_resources(spec, gp: GpuPlan | None = None, offload: bool | None = None) -> dict[str, float]:
    """The custom Ray resources of ``spec``'s generator actor: {its tier's resource: 1} when it
    needs a card larger than gpu_worker's, else {} (its GPU count stays ``gp.per_actor``). ``gp``:
    the run's GPU plan; an actor that asks for no GPU (``--device cpu``, a stand-in run on the CPU)
    asks for nothing."""
    if gp is not None and gp.per_actor <= 0:
        return {}
    resource = gpu_resource(spec, offload)
    return {resource: 1.0} if resource else {}


def _large_offered(ray, per_actor: float, resource: str = LARGE_GPU_RESOURCE) -> bool | None:
    """Whether a node type of the cluster's autoscaler declares ``resource`` with at least
    ``per_actor`` GPUs; None when the autoscaler's config cannot be read."""
    types = autoscaler_node_types(ray)
    if types is None:
        return None
    return any(r.get(resource, 0) >= 1 and r.get("GPU", 0) >= per_actor for r in types.values())


def check_large_gpus(ray, gp: GpuPlan, standin: bool, local: bool, specs: Iterable = (),
                     offload: bool | None = None) -> GpuPlan:
    """Refuse, before any work and in one line, a run whose generators need a larger card than
    gpu_worker's on a Ray instance that cannot provide their tier's resource (``NODE_TIERS``): a
    local instance without it (it has no autoscaler), or a cluster without it whose autoscaler has
    no node type declaring it. An autoscaler whose config cannot be read is trusted. A generator
    too large for every tier's card is refused unless a node with the largest tier's resource is up
    (a machine whose own GPU is larger: the loader's ``check_fits`` then decides). Stand-in runs and
    runs that ask for no GPU never need any of this."""
    if standin or gp.per_actor <= 0:
        return gp
    needs = [(s, memory_needed(s, offload)) for s in specs]      # each spec sized once (headers read once)
    big = [(s, need, _tier_for(need) or NODE_TIERS[-1]) for s, need in needs
           if need is not None and need > GPU_WORKER_MEMORY]
    if not big:
        return gp
    for tier in NODE_TIERS[1:]:
        mine = [(s, need) for s, need, t in big if t is tier]
        if mine:
            gp = _check_tier(ray, gp, local, tier, mine, offload)
    return gp


def _what(mine, offload) -> str:
    return ", ".join(f"{s.model} (~{need / 2**30:.0f} GiB in {spec_dtype(s)}"
                     f"{', its largest component with CPU offload' if _offload(s, offload) else ''})"
                     for s, need in mine)


def _check_tier(ray, gp: GpuPlan, local: bool, tier: NodeTier, mine, offload) -> GpuPlan:
    what, resource = _what(mine, offload), tier.resource
    plural = len(mine) > 1
    up = float(ray.cluster_resources().get(resource, 0))
    if up >= 1:
        note = f"{what} on nodes with {resource} ({up:g} in the cluster now)"
        gp.note = "; ".join(x for x in (gp.note, note) if x)
        return gp
    offerable = [s.model for s, _ in mine if not _offload(s, offload) and not needs_large_gpu(s, True)]
    smaller = [s.model for s, _ in mine if not _offload(s, offload) and needs_large_gpu(s, True)
               and node_tier(s, True) is not tier]
    too_big = [(s, need) for s, need in mine if need > tier.memory]      # only ever at the largest tier
    if too_big:
        _refuse_too_big(too_big, offload, resource)
    offered = False if local else _large_offered(ray, gp.per_actor, resource)
    if offered is False:
        largest = NODE_TIERS[-1]
        where, remedy = (
            (f"this local Ray instance (no autoscaler) has no custom resource {resource}",
             f"run on the cluster with cluster.yaml's {tier.node_type} node type") if local else
            (f"this cluster's autoscaler has no node type with the custom resource {resource} and "
             f"{gp.per_actor:g} GPU(s)", f"add cluster.yaml's {tier.node_type} node type to the cluster"))
        raise ModelLoadError(
            f"{what} {'need' if plural else 'needs'} more GPU memory than gpu_worker's "
            f"{GPU_WORKER_MEMORY / 1e9:.0f} GB card"
            + (f" and {'than ' if tier is largest else ''}{NODE_TIERS[1].node_type}'s "
               f"{NODE_TIERS[1].memory / 1e9:.0f} GB" if tier is not NODE_TIERS[1] else "")
            + f", and {where}: {remedy} ({tier.instance}: resources {{GPU: 1, {resource}: 1}})"
            + f"; on a machine whose own GPU is large enough, start Ray there first with `ray start --head "
            f"--resources='{{\"{resource}\": 1}}'`"
            + (f"; or run {', '.join(offerable)} with CPU offload (one component on the GPU at a time: it "
               f"then fits a 24 GB card, slower)" if offerable else "")
            + (f"; or run {', '.join(smaller)} with CPU offload (its largest component then fits a smaller "
               f"card, slower)" if smaller else "")
            + "; or use a model that fits a 24 GB card (SDXL, SD 3 / 3.5 medium).")
    note = (f"{what} wait for a node with {resource} (cluster.yaml {tier.node_type}), which the "
            f"autoscaler starts")
    gp.note = "; ".join(x for x in (gp.note, note) if x)
    return gp


def _refuse_too_big(mine, offload, resource: str) -> None:
    """One line for generators larger than every card of cluster.yaml (FLUX.2-dev whole: ~131 GiB),
    with the remedy: CPU offload where the largest component then fits a card, else bfloat16."""
    largest = NODE_TIERS[-1]
    remedies = []
    for s, _ in mine:
        if not _offload(s, offload):
            part = memory_needed(s, True)
            tier = None if part is None else _tier_for(part)
            if tier is not None:
                remedies.append(f"run {s.model} with CPU offload (--generator {s.model}:cpu_offload=true, or "
                                f"--gen-cpu-offload for every generator: its largest component, "
                                f"~{part / 2**30:.0f} GiB, then fits {tier.node_type})")
                continue
        if spec_dtype(s) == "float32":
            remedies.append(f"run {s.model} in bfloat16")
    plural = len(mine) > 1
    raise ModelLoadError(
        f"{_what(mine, offload)} {'need' if plural else 'needs'} more GPU memory than any node type of "
        f"cluster.yaml has (the largest, {largest.node_type}: {largest.instance})"
        + (f": {'; '.join(remedies)}" if remedies else "")
        + f"; or, on a machine whose own GPU holds {'them' if plural else 'it'}, start Ray there first with "
        f"`ray start --head --resources='{{\"{resource}\": 1}}'`.")

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
  (``operators.base.pick_device``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from operators.support.models import GPU_HINT, ModelLoadError

DEFAULT_GPUS_PER_MODEL_ACTOR = 1.0


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


def generation_options(args) -> dict:
    """``ImageGenerator`` keyword arguments from ``add_generation_options``' flags."""
    slicing = {"off": False, "on": True, "auto": "auto"}[getattr(args, "gen_vae_slicing", "off") or "off"]
    mode = getattr(args, "gen_compile", "off") or "off"
    return {"channels_last": bool(getattr(args, "gen_channels_last", False)), "vae_slicing": slicing,
            "compile_unet": False if mode == "off" else (True if mode == "default" else mode)}


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


def check_cluster(ray, gp: GpuPlan, standin: bool, local: bool) -> GpuPlan:
    """Hold ``gp`` against the Ray instance the job runs on, before any work starts.

    ``local``: a Ray instance this process started (no autoscaler: its GPUs are all it will ever
    have). On a cluster, GPUs that are not up yet are fine when the autoscaler can add them.
    """
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


def autoscaler_max_gpus(ray) -> float | None:
    """The most GPUs one node type of the cluster's autoscaler offers, or None when this cannot
    be read (no autoscaler information published, or a Ray without the API)."""
    try:  # the cluster config the autoscaler reports to the GCS (Ray >= 2.10)
        from ray._private import state

        cfg = state.state.get_cluster_config()
        if cfg is not None and len(cfg.node_group_configs):
            return max(float(g.resources.get("GPU", 0)) for g in cfg.node_group_configs)
    except Exception:
        pass
    try:  # `ray up` leaves the launcher config on the head, where `ray submit` runs this driver
        from pathlib import Path

        import yaml

        path = Path.home() / "ray_bootstrap_config.yaml"
        if path.is_file():
            types = (yaml.safe_load(path.read_text()) or {}).get("available_node_types") or {}
            if types:
                return max(float((t.get("resources") or {}).get("GPU", 0)) for t in types.values())
    except Exception:
        pass
    return None

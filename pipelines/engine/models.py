"""Model settings and model checks every study shares: CLIP settings with their command-line
overrides, the tiny random CLIP stand-in, and loading a model once on the driver before any data
is read (an unloadable model fails the run then, naming it). Generators: pipelines/engine/generation.py."""

from __future__ import annotations

import contextlib
import gc
from pathlib import Path

STANDIN_GENERATORS = ("stable-diffusion-v1-4-standin", "stable-diffusion-v1-5-standin")


def build_standin_clip(root: str) -> str:
    """A tiny random open_clip CLIP (seed 0) under ``root``: its directory."""
    from pipelines.standins.clip import build_tiny_open_clip

    return build_tiny_open_clip(str(Path(root) / "clip-vit-standin"), seed=0)


@contextlib.contextmanager
def standin_hint(standin: bool):
    """A model that cannot load, outside a stand-in run, also says how to run without it."""
    from operators.support.models import ModelLoadError

    try:
        yield
    except ModelLoadError as exc:
        if standin:
            raise
        raise ModelLoadError(f"{exc}\n(For an offline smoke run of the pipeline without these models, "
                             f"--standin-models uses tiny random-weight stand-ins.)") from exc


def clip_record(clip: dict, standin: bool, role: str) -> dict:
    """Load CLIP on the CPU once (and let it go): its provenance record (hub commit, weight
    sha256s, its activation)."""
    from operators.support.clip import load_clip

    bundle = load_clip(clip["model"], clip.get("pretrained"), device="cpu", revision=clip.get("revision"))
    record = {"role": role, "model": clip["model"], "standin": standin, "detail": bundle.record}
    del bundle
    gc.collect()
    return record


def clip_revision(clip: dict, args) -> dict:
    """``clip`` with --clip-revision applied; a revision belongs to the weights it was set for, so
    --clip-model or --clip-pretrained without one drops the study file's."""
    clip = dict(clip)
    if getattr(args, "clip_model", None) or getattr(args, "clip_pretrained", None) is not None:
        clip["revision"] = None
    if getattr(args, "clip_revision", None) is not None:
        clip["revision"] = args.clip_revision
    clip.setdefault("revision", None)
    return clip


def clip_settings(clip: dict, args) -> dict:
    """A study's CLIP with --clip-model / --clip-pretrained applied (a directory or local-dir: /
    hf-hub: model needs no pretrained tag)."""
    clip = dict(clip)
    if getattr(args, "clip_model", None):
        clip["model"] = args.clip_model
        if args.clip_pretrained is None and (args.clip_model.startswith(("local-dir:", "hf-hub:"))
                                             or Path(args.clip_model).is_dir()):
            clip["pretrained"] = None
    if getattr(args, "clip_pretrained", None) is not None:
        clip["pretrained"] = args.clip_pretrained
    return clip_revision(clip, args)


def quiet_model_libraries() -> None:
    """No download/loading progress bars or advice from the model libraries (--verbose keeps them)."""
    import diffusers
    import transformers

    for lib in (diffusers, transformers):
        lib.utils.logging.set_verbosity_error()
        lib.utils.logging.disable_progress_bar()


def print_models(records: list[dict]) -> None:
    """One line per loaded model: its role, real or STAND-IN, and its id."""
    width = max([26] + [len(r["role"]) for r in records])
    for r in records:
        tag = "STAND-IN (random weights, meaningless outputs)" if r["standin"] else "real"
        print(f"model {r['role']:<{width}} {tag:<46} {r['model']}")

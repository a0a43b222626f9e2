"""Model settings and model checks every study shares: generation and CLIP settings with their
command-line overrides, the tiny random stand-ins, and loading each model once on the driver
before any data is read (an unloadable model fails the run then, naming it)."""

from __future__ import annotations

import contextlib
import gc
from pathlib import Path

STANDIN_GENERATORS = ("stable-diffusion-v1-4-standin", "stable-diffusion-v1-5-standin")


def build_standins(root: str, names=STANDIN_GENERATORS) -> tuple[str, list[str]]:
    """A tiny random CLIP and one tiny random generator per name (seeds 0, 1, ...) under ``root``."""
    from pipelines.standins.clip import build_tiny_open_clip
    from pipelines.standins.diffusion import build_tiny_stable_diffusion

    clip = build_tiny_open_clip(str(Path(root) / "clip-vit-standin"), seed=0)
    gens = [build_tiny_stable_diffusion(str(Path(root) / name), seed=i) for i, name in enumerate(names)]
    return clip, gens


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


def load_clip_and_generators(clip: dict, generators: list[str], safety_checker: str, standin: bool, clip_role: str,
                             scheduler: str | None = None, revisions: dict | None = None) -> list[dict]:
    """Load CLIP and each generator (hub ones at their ``revisions``) on the CPU once (and let them
    go): their provenance records (hub commit, weight sha256s, CLIP's activation)."""
    from operators.support.clip import load_clip

    bundle = load_clip(clip["model"], clip.get("pretrained"), device="cpu", revision=clip.get("revision"))
    records = [{"role": clip_role, "model": clip["model"], "standin": standin, "detail": bundle.record}]
    del bundle
    return records + load_generators(generators, safety_checker, standin, scheduler, revisions)


def load_generators(generators: list[str], safety_checker: str, standin: bool, scheduler: str | None = None,
                    revisions: dict | None = None) -> list[dict]:
    """Load each generator (hub ones at their ``revisions``) on the CPU once (and let it go): their
    provenance records (hub commit, weight sha256s)."""
    from operators.support.diffusion import load_text2image

    records = []
    for model in generators:
        pipe, rec = load_text2image(model, (revisions or {}).get(model), device="cpu", dtype="float32",
                                    safety_checker=safety_checker, scheduler=scheduler)
        records.append({"role": "generator", "model": model, "standin": standin, "detail": rec})
        del pipe
        gc.collect()
    return records


def generation_settings(generation: dict, args) -> dict:
    """A study's generation settings with the command line's overrides (flags given, not defaults);
    height and width from a study file are kept unless a flag replaces them."""
    gen = dict(generation)
    for key, attr in (("images_per_prompt", "images_per_prompt"), ("steps", "steps"),
                      ("guidance_scale", "guidance_scale"), ("seed", "generation_seed"),
                      ("safety_checker", "safety_checker"), ("scheduler", "scheduler"),
                      ("height", "height"), ("width", "width")):
        value = getattr(args, attr, None)
        if value is not None:
            gen[key] = value
    if gen.get("scheduler") in ("model", "", "none"):
        gen["scheduler"] = None
    if getattr(args, "generators", None):
        gen["models"] = list(args.generators)
    gen["revisions"] = generator_revisions(gen, args)
    gen.setdefault("height", None)
    gen.setdefault("width", None)
    return gen


def generator_revisions(gen: dict, args) -> dict:
    """{model: hub revision} for the generators of ``gen["models"]`` that have one: the study
    file's ``revisions`` with --generator-revision MODEL=REVISION (a bare REVISION when there is
    one generator) applied."""
    models = list(gen["models"])
    revisions = dict(gen.get("revisions") or {})
    for spec in getattr(args, "generator_revision", None) or []:
        model, eq, revision = spec.rpartition("=")
        if not eq:
            if len(models) != 1:
                raise ValueError(f"--generator-revision {spec!r}: say which of the {len(models)} generators it pins "
                                 f"(MODEL=REVISION)")
            model, revision = models[0], spec
        if model not in models:
            raise ValueError(f"--generator-revision {spec!r}: {model!r} is not one of the generators {models}")
        revisions[model] = revision or None
    return {m: str(revisions[m]) for m in models if revisions.get(m)}


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

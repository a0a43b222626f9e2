"""The run's generators on the driver: tiny random stand-ins of each spec's family, and loading
every generator once (its provenance record) before the run starts."""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import inspect
import json
import shutil
from pathlib import Path
from typing import Any, Callable, Sequence

from operators.base import collect_let_go, weak_parts
from operators.image_nsfw_check import load_safety_checker
from operators.support.diffusion import _generate, load_text2image, text2image_record
from operators.support.models import file_sha256
from pipelines.engine.generation.safety import SafetySettings
from pipelines.engine.generation.specs import GeneratorSpec
from pipelines.standins.diffusion import build_tiny_safety_checker, checker_levels
from pipelines.standins.families import STANDIN_SIZE, build_tiny_pipeline, standin_family


def build_standin_generators(specs: Sequence[GeneratorSpec], root: str, names: Sequence[str] | None = None,
                             shared_text_encoder: Sequence[int] = ()) -> list[GeneratorSpec]:
    """Tiny random generators under ``root`` (seed i for the i-th), each of its spec's family
    (SD 1.x draws faces, see ``pipelines.standins.face_decoder``; SDXL, SD3, FLUX and PixArt are
    ``pipelines.standins.families``), the specs pointed at them with their settings kept, except a
    size larger than the stand-in's (its own is used). ``shared_text_encoder``: indices whose text
    encoder is copied from the first of them (models that share one, as SD v2.0 and v2.1 share
    OpenCLIP-H)."""
    own = [f"{spec.name}-standin" for spec in specs]   # the requested model's name, when the names are unique
    if len(set(own)) < len(own):
        own = [f"generator-{i + 1}-standin" for i in range(len(specs))]
    names = list(names or own)
    if len(names) < len(specs):
        names += own[len(names):]
    paths, out = [], []
    for i, spec in enumerate(specs):
        family = standin_family(spec.family)
        target = str(Path(root) / names[i])
        # sd: the fitted face decoder, so that the studies' face steps find faces; flux: FLUX.1-dev is
        # guidance-distilled (a guidance embedding), schnell is not
        options = {"sd": {"faces": True}, "flux": {"guidance_embeds": bool(spec.guidance_scale)}}.get(family, {})
        paths.append(build_tiny_pipeline(family, target, seed=i, **options))
        size = STANDIN_SIZE.get(family, 64)
        fit = {side: None if family == "sd" else size for side in ("height", "width")
               if getattr(spec, side) is None or getattr(spec, side) > size}
        out.append(dataclasses.replace(spec.at(paths[-1]), standin_for=spec.model, **fit))
    shared = [i for i in shared_text_encoder if i < len(paths) and standin_family(specs[i].family) == "sd"]
    for i in shared[1:]:
        target = Path(paths[i]) / "text_encoder"
        shutil.rmtree(target)
        shutil.copytree(Path(paths[shared[0]]) / "text_encoder", target)
    for spec, path in zip(specs, paths):   # a requested model is never replaced without a word
        print(f"  generator {spec.model} -> tiny random {standin_family(spec.family)} stand-in {Path(path).name} "
              f"(its settings kept; the requested model is recorded, not run)")
    return out


def check_call_arguments(pipe, spec: GeneratorSpec) -> None:
    """Every extra argument (and a negative prompt) is one the pipeline's call accepts: a typo
    fails on the driver, naming the model and the arguments it takes, not inside a worker."""
    wanted = set(spec.call_kwargs)
    if not wanted:
        return
    # named parameters only: Stable Diffusion pipelines take **kwargs for deprecated callbacks and
    # ignore anything else silently, so a misspelt argument would change nothing without a word
    params = {n for n, p in inspect.signature(type(pipe).__call__).parameters.items()
              if p.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)}
    unknown = sorted(wanted - set(params))
    if unknown:
        known = sorted(p for p in params if p not in ("self", "prompt", "generator", "output_type", "return_dict"))
        raise ValueError(f"generator {spec.model} ({type(pipe).__name__}): its pipeline takes no {unknown}; it takes "
                         f"{known}")


STANDINS_LOADED_KEPT = 256 * 2**20    # the stand-in generators a process keeps loaded (bytes of their files)
_LOADED: collections.OrderedDict[str, tuple[Any, int, tuple]] = collections.OrderedDict()


def directory_digest(root: Path) -> tuple[str, int]:
    """One sha256 over every file under ``root`` (its path there and its sha256), and their bytes."""
    h, size = hashlib.sha256(), 0
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(f"{f.relative_to(root).as_posix()}\0{file_sha256(f)}\0".encode())
        size += f.stat().st_size
    return h.hexdigest(), size


def _components(pipe) -> tuple:
    """Which object each of ``pipe``'s components is: a kept stand-in whose components were
    replaced since (a safety checker or a sampler set on it) is not used again."""
    return tuple(sorted((name, id(part)) for name, part in pipe.components.items()))


def _load_generator(spec: GeneratorSpec, standin: bool) -> tuple[Any, dict, bool]:
    """``spec``'s pipeline on the CPU in float32, its provenance record, and whether the process
    keeps it. A stand-in (a local directory) is kept by what decides it (its files, the revision,
    the safety-checker policy and the sampler): a driver that runs several stand-in runs (the test
    suite, a notebook) loads each stand-in once, and records each run's own directory."""
    safety = spec.operator_kwargs()["safety_checker"]
    root = Path(spec.model)
    if not (standin and root.is_dir()):
        return (*load_text2image(spec.model, spec.revision, device="cpu", dtype="float32", safety_checker=safety,
                                 scheduler=spec.scheduler), False)
    digest, size = directory_digest(root)
    key = json.dumps([digest, spec.revision, safety, spec.scheduler])
    pipe, _, components = _LOADED.pop(key, (None, 0, ()))
    if pipe is not None and _components(pipe) == components:
        import torch   # deferred: torch

        record = text2image_record(pipe, spec.model, spec.revision, spec.model, torch.float32, None, "cpu", False,
                                   safety)
    else:
        pipe, record = load_text2image(spec.model, spec.revision, device="cpu", dtype="float32",
                                       safety_checker=safety, scheduler=spec.scheduler)
    _LOADED[key] = (pipe, size, _components(pipe))
    while len(_LOADED) > 1 and sum(n for _, n, _ in _LOADED.values()) > STANDINS_LOADED_KEPT:
        _LOADED.popitem(last=False)      # the oldest let go first
    return pipe, record, True


def load_generators(specs: Sequence[GeneratorSpec], standin: bool,
                    check: Callable[[Any, GeneratorSpec], None] | None = None,
                    calibrate: Callable[[Any, GeneratorSpec], None] | None = None) -> list[dict]:
    """Load every generator on the CPU once (and let it go, a stand-in kept: ``_load_generator``),
    as its spec says: their provenance records (hub commit, weight sha256s, the spec).
    ``check(pipe, spec)``: a study's own check; ``calibrate(pipe, spec)``: a stand-in NSFW check's
    calibration (``StandinChecker``)."""
    records = []
    for spec in specs:
        pipe, rec, kept = _load_generator(spec, standin)
        check_call_arguments(pipe, spec)
        if check is not None:
            check(pipe, spec)
        if calibrate is not None:
            calibrate(pipe, spec)
        records.append({"role": "generator", "model": spec.model, "standin": standin,
                        "detail": {**rec, "spec": spec.record(), "defaults_from": spec.defaults_from},
                        **({"standin_for": spec.standin_for} if spec.standin_for else {})})
        parts = [] if kept else weak_parts(pipe)
        del pipe
        collect_let_go(parts)
    return records


CALIBRATION_PROMPTS = ("a photo of a person", "a photo of a doctor", "a photo of a nurse", "a photo of a chef",
                       "a photo of a pilot", "a photo of a baker", "a photo of a judge", "a photo of a farmer")
STANDIN_CHECKER_DIR = "nsfw-check-standin"

CALIBRATION_BYTES_KEPT = 256 * 2**20   # the stand-ins' calibration levels a process keeps (uint8)
_CALIBRATED: dict[str, Any] = {}


def calibration_key(pipe, spec: GeneratorSpec) -> str | None:
    """What decides a stand-in's calibration images, as one sha256: every file of its directory
    (weights, configs, tokenizers), its pipeline and sampler (class and config), the spec's call
    settings and torch's intra-op threads (float sums may round otherwise with other thread
    counts). None for a model that is not a local directory."""
    import torch   # deferred: torch

    root = Path(spec.model)
    if not root.is_dir():
        return None
    h = hashlib.sha256(directory_digest(root)[0].encode())
    scheduler = getattr(pipe, "scheduler", None)
    settings = {"pipeline": type(pipe).__name__, "steps": spec.steps, "guidance_scale": spec.guidance_scale,
                "height": spec.height, "width": spec.width, "call_kwargs": spec.call_kwargs,
                "scheduler": [type(scheduler).__name__, dict(getattr(scheduler, "config", {}) or {})],
                "threads": torch.get_num_threads(), "prompts": CALIBRATION_PROMPTS}
    h.update(json.dumps(settings, sort_keys=True, default=repr).encode())
    return h.hexdigest()


@dataclasses.dataclass(eq=False)
class StandinChecker:
    """A stand-in run's tiny random NSFW check under ``root``, calibrated on a few images of each
    stand-in generator at its settings, so that it flags some of what the run generates
    (meaninglessly) and the demo reaches every branch (flagged, left out). The images come from the
    pipelines ``load_generators`` loads anyway (``calibrate``), so each generator is loaded once on
    the driver; ``build`` writes the checker once they all have."""
    root: str
    images: list = dataclasses.field(default_factory=list)

    @property
    def path(self) -> str:
        return str(Path(self.root) / STANDIN_CHECKER_DIR)

    def calibrate(self, pipe, spec: GeneratorSpec) -> None:
        """A few images of ``pipe`` at ``spec``'s settings, unchecked: its own safety checker (if
        any) off meanwhile, as a stand-in generator runs (stand-ins have none). The checker is
        swapped on the object itself: diffusers' ``__setattr__`` would also rewrite the pipeline's
        config, and not back. Kept as the 8-bit levels the checker reads (``checker_levels``), and
        remembered for the process by what decides them (``calibration_key``): a driver that runs
        several stand-in runs (the test suite, a notebook) generates each stand-in's once."""
        key = calibration_key(pipe, spec)
        levels = _CALIBRATED.get(key) if key else None
        if levels is None:
            levels = checker_levels(self._images(pipe, spec))
            if key:
                _CALIBRATED[key] = levels
                while len(_CALIBRATED) > 1 and sum(v.numel() for v in _CALIBRATED.values()) > CALIBRATION_BYTES_KEPT:
                    _CALIBRATED.pop(next(iter(_CALIBRATED)))      # the oldest let go first
        self.images.append(levels)

    @staticmethod
    def _images(pipe, spec: GeneratorSpec):
        import torch   # deferred: torch

        own = getattr(pipe, "safety_checker", None)
        if own is not None:
            object.__setattr__(pipe, "safety_checker", None)
        try:
            with torch.inference_mode():
                out, _ = _generate(pipe, list(CALIBRATION_PROMPTS), list(range(len(CALIBRATION_PROMPTS))), spec.steps,
                                   spec.guidance_scale, spec.height, spec.width, "cpu", spec.call_kwargs)
        finally:
            if own is not None:
                object.__setattr__(pipe, "safety_checker", own)
        return out

    def build(self, generators: int) -> str:
        """The checker, calibrated on the images of each of the run's ``generators`` (a run's
        generators all calibrate it: one batch each, or the builder's default images for none)."""
        if len(self.images) != generators:
            raise RuntimeError(f"stand-in NSFW check: calibration images of {len(self.images)} generator(s), "
                               f"the run has {generators}")
        return build_tiny_safety_checker(self.path, images=self.images or None)


def standin_checker(safety: SafetySettings, root: str) -> tuple[SafetySettings, StandinChecker | None]:
    """The settings of a stand-in run's NSFW check (its own settings kept, the model a tiny random
    checker under ``root``) and the checker to calibrate and build while the generators load
    (None when the run checks nothing)."""
    if not safety.checks:
        return safety, None
    checker = StandinChecker(root)
    print(f"  NSFW check {safety.model} -> tiny random stand-in {Path(checker.path).name} (flags meaninglessly)")
    return dataclasses.replace(safety, model=checker.path, revision=None), checker


def load_nsfw_check(safety: SafetySettings | None, standin: bool) -> list[dict]:
    """The provenance record of the run's NSFW check, loaded once on the driver ([] without one)."""
    if safety is None or not safety.checks:
        return []
    checker, _, rec = load_safety_checker(safety.model, safety.revision, device="cpu", dtype="float32")
    parts = weak_parts(checker)
    del checker
    collect_let_go(parts)
    return [{"role": "NSFW check (every model's images)", "model": safety.model, "standin": standin,
             "detail": {**rec, "policy": safety.policy, "exclude_flagged": safety.exclude}}]



"""Generation, owned by the engine: generator specs, the plan a study hands over, and running it.

A *generator spec* is one text-to-image model with its own settings (steps, guidance, size,
dtype, negative prompt, scheduler, revision, extra pipeline arguments). A study's YAML gives the
paper's values as the defaults of every generator; each model may override them, in the file
(``generation.models: [{model: ID, steps: 4, ...}]``) or on the command line
(``--generator ID:steps=4,guidance_scale=0``). The specs are what is fingerprinted and recorded.

A *generation plan* is what an image study asks for: its requests (prompt, seed, ids), the heads
that run on the generator's device, the stages after the generator, and the image schema. The
engine (``generate``) runs it for every spec: builds the generator stage, applies the resource
overrides, checkpoints, counts failures against the error budget, and returns the rows.

Precedence of a generator's settings, lowest first: the model's own defaults (its model card's
values where the card gives them, else its family's pipeline defaults: ``operators.support.families``),
the study's preset ``generation:`` block and the --config file's block (these two only for the
models the study file lists and others of their family: the paper's settings are the paper's
protocol for its kind of model; a model of another family runs at its card's defaults), the per-model entry of the file, the command line's global flags (--steps,
--guidance-scale, ...: they apply to every generator, as a smoke run needs), the per-model
``--generator`` settings. The resolved values are what the spec holds, records and fingerprints.
"""

from __future__ import annotations

import dataclasses
import gc
import inspect
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import pyarrow as pa

from operators.base import Stage, conform
from operators.support import families

# the spec's own keys (with the spelling a user may type for some); anything else is an extra
# pipeline argument, checked against the loaded pipeline's signature on the driver
SPEC_KEYS = ("revision", "dtype", "steps", "guidance_scale", "height", "width", "negative_prompt", "scheduler",
             "safety_checker", "family", "cuda_dtype", "variant")
KEY_ALIASES = {"guidance": "guidance_scale", "num_inference_steps": "steps", "cfg": "guidance_scale"}
# one safety policy per run, the same for every model (operators.image_nsfw_check):
# check-all: no model's own checker; the run's NSFW check runs on every model's images alike
# model-default: each model's own checker as it ships (SD 1.x blanks what it flags; SDXL, SD 3,
#   FLUX and PixArt ship none): paper 002's protocol read literally
# off: no checker and no check
SAFETY_POLICIES = ("check-all", "model-default", "off")
DTYPES = ("auto", "float32", "float16", "bfloat16")
# generation-block keys of a study file that are not generator settings
PLAN_KEYS = ("models", "revisions", "images_per_prompt", "caption_images", "seed", "extra", "nsfw_check")


@dataclass(frozen=True)
class GeneratorSpec:
    """One text-to-image model and the settings it generates with (what is fingerprinted)."""

    model: str
    revision: str | None = None
    dtype: str = "auto"                 # auto: cuda_dtype on CUDA, float32 on a CPU
    steps: int | None = 50              # None: the pipeline's own default (a model of no known family)
    guidance_scale: float | None = 7.5
    height: int | None = None           # None: the model's own size
    width: int | None = None
    negative_prompt: str | None = None
    scheduler: str | None = None        # None: the model's own sampler; else a diffusers class name
    safety_checker: str = "check-all"  # the run's policy (SAFETY_POLICIES), the same for every generator
    extra: tuple[tuple[str, Any], ...] = ()   # further pipeline call arguments, sorted by name
    family: str | None = None           # sd, sdxl, sd3, flux, pixart-alpha, pixart-sigma, unknown
    cuda_dtype: str = "float16"         # dtype "auto" on a GPU (bfloat16 for families that overflow in float16)
    variant: str | None = None          # "fp16": the repository's float16 weight files, when running in float16
    # where the settings not given came from (a card, a family, a study file): recorded, not compared
    defaults_from: str | None = field(default=None, compare=False)
    # a stand-in's requested model (hub id): recorded and shown, not run, not compared
    standin_for: str | None = field(default=None, compare=False)

    def __post_init__(self):
        if not str(self.model or "").strip():
            raise ValueError("a generator needs a model (hub id or directory)")
        if self.dtype not in DTYPES:
            raise ValueError(f"generator {self.model}: dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.safety_checker not in SAFETY_POLICIES:
            raise ValueError(f"generator {self.model}: safety_checker must be one of {SAFETY_POLICIES}, "
                             f"got {self.safety_checker!r}")
        if self.steps is not None and int(self.steps) < 1:
            raise ValueError(f"generator {self.model}: steps must be >= 1, got {self.steps}")
        if self.cuda_dtype not in ("float16", "bfloat16", "float32"):
            raise ValueError(f"generator {self.model}: cuda_dtype must be float16, bfloat16 or float32, "
                             f"got {self.cuda_dtype!r}")
        for side in ("height", "width"):
            v = getattr(self, side)
            if v is not None and (int(v) < 8 or int(v) % 8):
                raise ValueError(f"generator {self.model}: {side} must be a multiple of 8, got {v}")

    @property
    def name(self) -> str:
        """The model's short name (its last path part), for tables and progress lines."""
        return Path(self.model.rstrip("/")).name

    @property
    def call_kwargs(self) -> dict:
        """Pipeline call arguments beyond prompt, steps, guidance, size and seeds."""
        out = dict(self.extra)
        if self.negative_prompt is not None:
            out["negative_prompt"] = self.negative_prompt
        return out

    def record(self) -> dict:
        """The spec as JSON (fingerprint, metrics.json, the report)."""
        d = dataclasses.asdict(self)
        d["extra"] = dict(self.extra)
        d.pop("defaults_from")   # how the defaults were found is recorded with the model, not fingerprinted
        d.pop("standin_for")     # (recorded with the model)
        return d

    def operator_kwargs(self) -> dict:
        """The keyword arguments of a generator operator (ImageGenerator, TripletGenerator)."""
        return {"model": self.model, "revision": self.revision, "dtype": self.dtype,
                "steps": None if self.steps is None else int(self.steps),
                "guidance_scale": None if self.guidance_scale is None else float(self.guidance_scale),
                "height": self.height, "width": self.width,
                # check-all: the model's own checker is not loaded (the run's NSFW check runs instead)
                "safety_checker": "model-default" if self.safety_checker == "model-default" else "off",
                "scheduler": self.scheduler, "call_kwargs": self.call_kwargs, "cuda_dtype": self.cuda_dtype,
                "variant": self.variant}

    def at(self, model: str) -> "GeneratorSpec":
        """The same settings for another copy of the model (a stand-in directory): no hub revision
        and no weight variant (a directory holds the files it holds)."""
        return dataclasses.replace(self, model=model, revision=None, variant=None)


DEFAULT_NSFW_CHECK = "CompVis/stable-diffusion-v1-4"   # its safety_checker folder: SD 1.4's own checker


@dataclass(frozen=True)
class SafetySettings:
    """The run's one safety policy (SAFETY_POLICIES): under ``check-all``, the NSFW check (a Stable
    Diffusion safety checker: ``operators.image_nsfw_check``) and whether its flagged images are
    left out of every measurement (``exclude``), the same for every model."""

    policy: str = "check-all"
    model: str = DEFAULT_NSFW_CHECK
    revision: str | None = None
    exclude: bool = False

    def __post_init__(self):
        if self.policy not in SAFETY_POLICIES:
            raise ValueError(f"generation.safety_checker must be one of {SAFETY_POLICIES}, got {self.policy!r}")
        if not str(self.model or "").strip():
            raise ValueError("generation.nsfw_check.model: a safety checker (hub id or directory) is needed")

    @property
    def checks(self) -> bool:
        return self.policy == "check-all"

    def job(self) -> dict:
        """What the images' NSFW flags and statuses depend on (part of the run's fingerprint)."""
        if not self.checks:
            return {"policy": self.policy}
        return {"policy": self.policy, "model": self.model, "revision": self.revision, "exclude": bool(self.exclude)}

    def operator_kwargs(self) -> dict:
        """The generator operators' ``nsfw_check`` and ``exclude_nsfw``."""
        if not self.checks:
            return {}
        from operators.image_nsfw_check import NsfwCheck

        return {"nsfw_check": Stage(NsfwCheck, {"model": self.model, "revision": self.revision}),
                "exclude_nsfw": bool(self.exclude)}


@dataclass(frozen=True)
class GenerationSettings:
    """A study's generation block, typed: the generators and what the requests depend on."""

    generators: tuple[GeneratorSpec, ...]
    seed: int = 0
    images_per_prompt: int = 1
    caption_images: int = 0             # amplification, section 6
    safety: SafetySettings = field(default_factory=SafetySettings)

    @property
    def models(self) -> list[str]:
        return [g.model for g in self.generators]

    def job(self) -> dict:
        """What generated images depend on: part of a run's fingerprint (one definition for every study)."""
        return {"generators": [g.record() for g in self.generators], "seed": int(self.seed),
                "images_per_prompt": int(self.images_per_prompt), "caption_images": int(self.caption_images),
                "safety": self.safety.job()}


# ------------------------------------------------------------------------------ settings
def _coerce(key: str, value: Any, where: str) -> Any:
    """A setting's value in its type (a command line gives strings)."""
    if isinstance(value, str) and key not in ("negative_prompt", "model"):
        low = value.strip().lower()
        if low in ("none", "null", "", "model"):
            return None if key != "safety_checker" else value
    try:
        if key == "steps":
            return int(value)
        if key == "guidance_scale":
            return float(value)
        if key in ("height", "width"):
            return None if value is None else int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {key}={value!r} is not a number") from None
    if key in ("revision", "scheduler", "negative_prompt", "family", "variant") and value is not None:
        return str(value)
    if key in ("dtype", "cuda_dtype"):
        return {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}.get(str(value), str(value))
    return value


def _extra_value(text: str) -> Any:
    """A command-line value of an extra pipeline argument: a number, a boolean, null, or the text."""
    import yaml

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return value if isinstance(value, (int, float, bool, str)) or value is None else text


def _split_settings(settings: Mapping, where: str) -> tuple[dict, dict]:
    """(spec settings, extra pipeline arguments) of a mapping a user wrote."""
    own, extra = {}, {}
    for key, value in settings.items():
        key = KEY_ALIASES.get(str(key), str(key))
        if key in SPEC_KEYS:
            own[key] = _coerce(key, value, where)
        elif key == "extra":
            if not isinstance(value, Mapping):
                raise ValueError(f"{where}: extra must be a mapping of pipeline arguments, got {value!r}")
            extra.update({str(k): v for k, v in value.items()})
        elif key == "model":
            continue
        else:
            extra[key] = value
    return own, extra


def parse_generator(text: str) -> tuple[str, dict]:
    """``MODEL[:key=value,...]`` (the --generator flag): the model and its settings.

    A value may hold commas (a negative prompt): a comma starts a new setting only when
    ``key=`` follows it."""
    m = re.match(r"^(?P<model>.+?)(?::(?P<rest>[A-Za-z_][\w.]*=.*))?$", text.strip())
    if not m or not m.group("model").strip() or text.strip().startswith(":"):
        raise ValueError(f"--generator {text!r}: expected MODEL or MODEL:key=value,...")
    settings: dict[str, Any] = {}
    rest = m.group("rest")
    if rest:
        for part in re.split(r",(?=\s*[A-Za-z_][\w.]*=)", rest):
            key, eq, value = part.partition("=")
            key = key.strip()
            if not eq or not key:
                raise ValueError(f"--generator {text!r}: {part!r} is not key=value")
            if key.startswith("extra."):
                key = key[len("extra."):]
            settings[key] = value if KEY_ALIASES.get(key, key) in SPEC_KEYS else _extra_value(value)
    return m.group("model").strip(), settings


# the global command-line flags and the spec key each sets
GLOBAL_FLAGS = (("steps", "steps"), ("guidance_scale", "guidance_scale"), ("height", "height"), ("width", "width"),
                ("scheduler", "scheduler"), ("safety_checker", "safety_checker"),
                ("negative_prompt", "negative_prompt"), ("dtype", "dtype"))


def generation_settings(generation: Mapping, args=None) -> GenerationSettings:
    """The generators of a study's ``generation:`` block with the command line applied (see the
    module docstring for the order)."""
    block = dict(generation)
    where = "generation"
    defaults, default_extra = _split_settings({k: v for k, v in block.items() if k not in PLAN_KEYS}, where)
    default_extra.update(dict(block.get("extra") or {}))
    entries: list[tuple[str, dict, dict]] = []   # (model, file settings, command-line settings)
    for entry in block.get("models") or []:
        if isinstance(entry, Mapping):
            if not entry.get("model"):
                raise ValueError(f"{where}.models: {dict(entry)} has no 'model'")
            entries.append((str(entry["model"]), dict(entry), {}))
        else:
            entries.append((str(entry), {}, {}))
    flag_models = list(getattr(args, "generators", None) or [])
    flag_specs = [parse_generator(t) for t in (getattr(args, "generator", None) or [])]
    if flag_models and flag_specs:
        raise ValueError("give the generators with --generator (one per model, with settings) or with --generators, "
                         "not both")
    if flag_models or flag_specs:
        by_model = {m: s for m, s, _ in entries}
        # a model the file configures keeps its file settings; the command line picks which run
        entries = [(m, by_model.get(m, {}), {}) for m in flag_models] + \
                  [(m, by_model.get(m, {}), s) for m, s in flag_specs]
    file_models = {str(e["model"]) if isinstance(e, Mapping) else str(e) for e in block.get("models") or []}
    file_families = {model_defaults(m)["spec"]["family"] for m in file_models}
    models = [m for m, _, _ in entries]
    dupes = sorted({m for m in models if models.count(m) > 1})
    if dupes:
        raise ValueError(f"generators listed twice: {dupes} (one spec per model in a run)")
    if not models:
        raise ValueError("no generators: set generation.models or --generator")
    globals_ = {}
    for attr, key in GLOBAL_FLAGS:
        value = getattr(args, attr, None) if args is not None else None
        if value is not None:
            globals_[key] = _coerce(key, value, f"--{attr.replace('_', '-')}")
    for model in models:   # before any work: a model no run could load is one line now, not a failure later
        problem = model_id_problem(model)
        if problem:
            raise ValueError(problem)
    standin = bool(getattr(args, "standin_models", False)) if args is not None else False
    file_revisions = {str(k): str(v) for k, v in dict(block.get("revisions") or {}).items() if v}
    flag_revisions = _revisions(models, args)
    specs, per_model_policy = [], []
    for model, file_settings, cli_settings in entries:
        own_file, extra_file = _split_settings(file_settings, f"{where}.models[{model}]")
        own_cli, extra_cli = _split_settings(cli_settings, f"--generator {model}")
        per_model_policy.append("safety_checker" in own_file or "safety_checker" in own_cli)
        # revision: the file's revisions map, its per-model entry, --generator-revision, --generator's own
        pins = {"revision": file_revisions[model]} if model in file_revisions else {}
        flag_pin = {"revision": flag_revisions[model]} if model in flag_revisions else {}
        picked = {**pins, **own_file, **globals_, **flag_pin, **own_cli}
        own = model_defaults(model, picked.get("revision"), picked.get("family") or defaults.get("family"))
        family_given = bool(picked.get("family") or defaults.get("family"))
        if standin and own["spec"]["family"] == families.UNKNOWN.name and not family_given and not Path(model).is_dir():
            raise ValueError(unknown_standin(model))
        # the study file's settings are the paper's protocol: for its models and their family's
        in_file = model in file_models or own["spec"]["family"] in file_families
        given = {**(defaults if in_file else {}), **picked}
        values = {**own["spec"], **given}
        extra = {**own["extra"], **(default_extra if in_file else {}), **extra_file, **extra_cli}
        from_ = own["defaults_from"] if not in_file else f"the study file's generation block, then {own['defaults_from']}"
        specs.append(GeneratorSpec(model=model, **values, extra=tuple(sorted(extra.items())), defaults_from=from_))
    safety = safety_settings(block, globals_.get("safety_checker", defaults.get("safety_checker")), args)
    own_policy = [s.model for s, m in zip(specs, per_model_policy) if m and s.safety_checker != safety.policy]
    if own_policy:
        raise ValueError(f"generators {own_policy}: safety_checker is one setting for the whole run (every model's "
                         f"images are checked alike): set generation.safety_checker or --safety-checker, not per model")
    specs = [dataclasses.replace(s, safety_checker=safety.policy) for s in specs]
    seed = getattr(args, "generation_seed", None) if args is not None else None
    ipp = getattr(args, "images_per_prompt", None) if args is not None else None
    cap = getattr(args, "caption_images", None) if args is not None else None
    return GenerationSettings(tuple(specs), int(block.get("seed", 0) if seed is None else seed),
                              int(block.get("images_per_prompt", 1) if ipp is None else ipp),
                              int(block.get("caption_images", 0) if cap is None else cap), safety)


def model_id_problem(model: str) -> str | None:
    """Why ``model`` cannot name a generator, known without the network (None when it can): a path
    (absolute, relative with ``./`` or ``../``, ``~``, a backslash, more than one ``/``, a file) that
    is not a directory, or a name that is neither a directory nor a valid Hugging Face repo id
    (``NAME`` or ``ORG/NAME``; huggingface_hub's own rules). Whether a valid hub id exists on the
    hub cannot be known offline: a real run finds out when it loads the model, before any work."""
    import os

    if os.path.isdir(model):
        return None
    if model.startswith(("/", ".", "~")) or "\\" in model or model.count("/") > 1 or model.endswith("/") \
            or os.path.exists(model):
        return (f"generator {model!r}: no such directory (a local model is the folder diffusers' save_pretrained "
                f"writes; a hub id is NAME or ORG/NAME)")
    try:
        from huggingface_hub.utils import HFValidationError, validate_repo_id
    except ImportError:   # pragma: no cover -- diffusers depends on huggingface_hub
        return None
    try:
        validate_repo_id(model)
    except HFValidationError as exc:
        return f"generator {model!r} is neither a local directory nor a Hugging Face repo id ({exc})"
    return None


def unknown_standin(model: str) -> str:
    """Why --standin-models refuses a hub id of no known family: a stand-in replaces the model
    without looking for it, so a mistyped or invented id would run as if it existed, and the
    stand-in's family would be a guess."""
    known = ", ".join([*families.FAMILIES, families.UNKNOWN.name])
    return (f"generator {model!r}: not a local directory, not a hub id this project knows (operators/support/"
            f"families.py KNOWN_IDS) and not in the hub cache, so --standin-models cannot tell that it exists nor "
            f"which family's stand-in replaces it: check the id, or give its family: --generator "
            f"{model}:family=FAMILY ({known}; unknown runs an SD 1.x stand-in at the library's defaults)")


def safety_settings(block: Mapping, policy: str | None, args=None) -> SafetySettings:
    """The run's safety policy: ``generation.safety_checker`` (or --safety-checker) and the
    ``generation.nsfw_check`` block (model, revision, exclude; --nsfw-check, --exclude-nsfw)."""
    check = block.get("nsfw_check") or {}
    if not isinstance(check, Mapping):
        raise ValueError(f"generation.nsfw_check must be a mapping (model, revision, exclude), got {check!r}")
    unknown = sorted(set(check) - {"model", "revision", "exclude"})
    if unknown:
        raise ValueError(f"generation.nsfw_check: unknown keys {unknown} (model, revision, exclude)")
    model = getattr(args, "nsfw_check", None) or check.get("model") or DEFAULT_NSFW_CHECK
    revision = None if getattr(args, "nsfw_check", None) else check.get("revision")
    exclude = getattr(args, "exclude_nsfw", None)
    exclude = bool(check.get("exclude", False)) if exclude is None else bool(exclude)
    return SafetySettings(policy=str(policy or "check-all"), model=str(model),
                          revision=None if revision is None else str(revision), exclude=exclude)


def _revisions(models: list[str], args) -> dict:
    """{model: hub revision} of --generator-revision MODEL=REVISION (a bare REVISION when there is
    one generator); an empty REVISION unpins (the hub's main)."""
    revisions: dict = {}
    for text in getattr(args, "generator_revision", None) or []:
        model, eq, revision = text.rpartition("=")
        if not eq:
            if len(models) != 1:
                raise ValueError(f"--generator-revision {text!r}: say which of the {len(models)} generators it pins "
                                 f"(MODEL=REVISION)")
            model, revision = models[0], text
        if model not in models:
            raise ValueError(f"--generator-revision {text!r}: {model!r} is not one of the generators {models}")
        revisions[model] = str(revision) if revision else None
    return revisions


def model_defaults(model: str, revision: str | None = None, family: str | None = None) -> dict:
    """A model's own defaults as spec values and extra call arguments: {"spec": {...}, "extra":
    {max_sequence_length}, "defaults_from": text} (``operators.support.families.defaults``)."""

    d = families.defaults(model, revision, family)
    spec = {"family": d["family"], "steps": d["steps"], "guidance_scale": d["guidance_scale"],
            "height": d["height"], "width": d["width"], "cuda_dtype": d["cuda_dtype"], "variant": d["variant"]}
    extra = {} if d["max_sequence_length"] is None else {"max_sequence_length": int(d["max_sequence_length"])}
    return {"spec": spec, "extra": extra, "defaults_from": f"{d['defaults_from']} (family {d['family']}: {d['family_from']})"}


# ------------------------------------------------------------------------------ models
def build_standin_generators(specs: Sequence[GeneratorSpec], root: str, names: Sequence[str] | None = None,
                             shared_text_encoder: Sequence[int] = ()) -> list[GeneratorSpec]:
    """Tiny random generators under ``root`` (seed i for the i-th), each of its spec's family
    (SD 1.x draws faces, see ``pipelines.standins.face_decoder``; SDXL, SD3, FLUX and PixArt are
    ``pipelines.standins.families``), the specs pointed at them with their settings kept, except a
    size larger than the stand-in's (its own is used). ``shared_text_encoder``: indices whose text
    encoder is copied from the first of them (models that share one, as SD v2.0 and v2.1 share
    OpenCLIP-H)."""
    import shutil

    from pipelines.standins.families import STANDIN_SIZE, build_tiny_pipeline

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


def standin_family(family: str | None) -> str:
    """The tiny stand-in family for a spec's family (SD 1.x for unknown ones)."""
    return {"sdxl": "sdxl", "sd3": "sd3", "flux": "flux", "pixart-alpha": "pixart", "pixart-sigma": "pixart"}.get(
        family or "", "sd")


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


def load_generators(specs: Sequence[GeneratorSpec], standin: bool,
                    check: Callable[[Any, GeneratorSpec], None] | None = None) -> list[dict]:
    """Load every generator on the CPU once (and let it go), as its spec says: their provenance
    records (hub commit, weight sha256s, the spec). ``check(pipe, spec)``: a study's own check."""
    from operators.support.diffusion import load_text2image

    records = []
    for spec in specs:
        pipe, rec = load_text2image(spec.model, spec.revision, device="cpu", dtype="float32",
                                    safety_checker=spec.operator_kwargs()["safety_checker"], scheduler=spec.scheduler)
        check_call_arguments(pipe, spec)
        if check is not None:
            check(pipe, spec)
        records.append({"role": "generator", "model": spec.model, "standin": standin,
                        "detail": {**rec, "spec": spec.record(), "defaults_from": spec.defaults_from},
                        **({"standin_for": spec.standin_for} if spec.standin_for else {})})
        del pipe
        gc.collect()
    return records


# ------------------------------------------------------------------------------ the plan
@dataclass
class GenerationPlan:
    """What an image study asks the engine to generate, for every generator of the run.

    ``heads`` run on the generator's device on the image tensor (CLIP, BLIP-2, detectors); ``after``
    are Ray Data stages over the generated rows before they are saved (skin tone, face filter).
    ``key`` names one image; with ``request_key`` a request is ``per_request`` images (a triplet
    unit). With ``share_key`` (columns), requests equal on them are one image: generated and
    checkpointed once, keyed by those columns, its row given to each such request (paper 002's
    section 6: a caption naming two occupations is in both occupations' requests with one seed).
    ``order``: the sort order of the requests generated (their batches; default by the key).
    ``finish`` turns a drained batch into stored rows (default: conformed to ``schema``)."""

    requests: pa.Table
    schema: pa.Schema
    heads: Sequence[Stage] = ()
    after: Sequence[Stage] = ()
    operator: type | None = None                 # default ImageGenerator
    operator_kwargs: Mapping = field(default_factory=dict)
    key: str = "image_id"
    request_key: str | None = None
    per_request: int = 1
    share_key: Sequence[str] | None = None
    order: Sequence[tuple[str, str]] | None = None
    finish: Callable[[pa.Table], pa.Table] | None = None
    save_images: bool = True
    images_dir: str = "images"                   # under the run directory
    # stage name -> resource values, or a function of --gen-batch-size giving them
    overrides: Mapping[str, Mapping | Callable[[int], Mapping]] = field(default_factory=dict)
    resource_flags: Mapping[str, list] = field(default_factory=dict)  # flag -> [(stage name, key)]
    budgets_of: Callable[[str], list] | None = None
    what: str = "generating"


def _plain(v):
    """An argument value as a fingerprint sees it: stages as ``stage_job``, functions and classes by
    their qualified name, containers element by element."""
    if isinstance(v, Stage):
        return stage_job(v)
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if callable(v):
        return f"{getattr(v, '__module__', '')}.{getattr(v, '__qualname__', type(v).__name__)}"
    return v


def stage_job(stage: Stage) -> dict:
    """A stage as its run's fingerprint sees it: operator and arguments (nested stages too)."""
    return {"op": _plain(stage.op), "kwargs": _plain(dict(stage.kwargs))}


def plan_job(plan: GenerationPlan) -> dict:
    """What a plan's rows depend on besides the generators: its heads, the stages after the
    generator and the generator operator's own arguments (part of the run's fingerprint, so a new
    head or a head's changed setting is another run, never rows without its columns)."""
    return {"operator": None if plan.operator is None else _plain(plan.operator),
            "operator_kwargs": _plain(dict(plan.operator_kwargs)),
            "heads": [stage_job(s) for s in plan.heads], "after": [stage_job(s) for s in plan.after]}


@dataclass
class Generated:
    """The rows of every generator (in request order per generator), their phases and budgets."""

    images: pa.Table | None
    phases: dict
    budgets: list


def _execution(run) -> Mapping:
    """The study's execution settings (retries, error budgets, execution.stages)."""
    return run.st.execution


def generator_pipeline(run, plan: GenerationPlan, spec: GeneratorSpec) -> list[Stage]:
    """The stage list of one generator: the generator with the plan's heads on its device (pinned to
    the spec's revision, on the run's device, with the speed options), the plan's stages after it,
    the image sink; resources from execution.stages, the flags and the GPU plan."""
    from operators.image_generation import ImageGenerator
    from operators.image_sink import ImageSink
    from pipelines.engine import gpus, stages
    from pipelines.engine.checkpoint import model_dir

    args = run.args
    op = plan.operator or ImageGenerator
    batch = max(1, int(getattr(args, "gen_batch_size", 1) or 1))
    speed = gpus.generation_options(args) if op is ImageGenerator else {}
    # the run's policy (run_study sets it from the settings); a run built by hand without one: the spec's
    safety = getattr(run, "safety", None) or getattr(run.st, "safety", None) \
        or getattr(getattr(run.st, "generation", None), "safety", None) or SafetySettings(policy=spec.safety_checker)
    offload = bool(getattr(args, "gen_cpu_offload", False))
    gen = Stage(op, {**spec.operator_kwargs(), "micro_batch": batch, "device": run.gpu.device if run.gpu else "auto",
                     "heads": list(plan.heads), **safety.operator_kwargs(), **speed,
                     **({"cpu_offload": True} if offload else {}), **dict(plan.operator_kwargs)})
    sink = [Stage(ImageSink, {"uri": f"{run.rd.uri}/{plan.images_dir}/{model_dir(spec.model)}", "keys": [],
                              "name_column": plan.key})] if plan.save_images else []
    pipeline = [gen, *plan.after, *sink]
    name = op.stage_name
    values = {name: {"num_gpus": run.gpu.per_actor if run.gpu else 0.0, "batch_size": batch}}
    extra = gpus.actor_resources(spec, run.gpu, offload=offload) if run.gpu else {}
    if extra:   # too large for gpu_worker's card: only cluster.yaml's gpu_worker_large declares it
        values[name]["resources"] = extra
    for stage, v in plan.overrides.items():
        values[stage] = {**values.get(stage, {}), **dict(v(batch) if callable(v) else v)}
    flags = {"gen_actors": [(name, "actors")], **dict(plan.resource_flags)}
    return stages.configure(pipeline, stages.overrides(_execution(run), args, flags, values))


def generation_budget(execution: Mapping, model: str):
    """The error budget of ``model``'s generation failures (over --max-error-rate)."""
    from pipelines.engine.progress import ErrorBudget
    from schemas import images as I

    return ErrorBudget(f"generation ({model})", {I.GENERATION_STATUS: I.GenerationStatus.FAILURES},
                       float(execution["max_error_rate"]), int(execution["error_budget_min_rows"]))


def generate(run, plan: GenerationPlan) -> Generated:
    """Run ``plan`` with every generator of the run (``run.generators``), each with its own error
    budgets (default: generation failures over --max-error-rate), checkpointed per image."""
    from pipelines.engine import checkpoint

    execution = _execution(run)
    batch = max(1, int(getattr(run.args, "gen_batch_size", 1) or 1))
    finish = plan.finish or (lambda t: conform(t, plan.schema))
    parts, phases, budgets = [], {}, []
    requests, key = plan.requests, plan.key
    if plan.share_key:   # one image per share key: generated once, given to each of its requests
        key = list(plan.share_key)
        requests = checkpoint.first_per_key(requests, key)
    for spec in run.generators:
        print(f"{plan.what} {plan.requests.num_rows * plan.per_request:,} images with {spec.name} ...")
        mine = plan.budgets_of(spec.model) if plan.budgets_of else [generation_budget(execution, spec.model)]
        images, phase = checkpoint.generate(run.ray, run.rd, requests, spec.model,
                                            generator_pipeline(run, plan, spec), plan.schema, key, batch, mine,
                                            run.echo, finish=finish, request_key=plan.request_key,
                                            per_request=plan.per_request, order=plan.order)
        if plan.share_key:
            images = checkpoint.per_request_rows(images, plan.requests, key)
        if phase.reused:
            print(f"  {phase.name}: {phase.reused:,} of {phase.total:,} {phase.unit} reused from the checkpoint, "
                  f"{phase.processed:,} processed now")
        parts.append(images)
        phases[spec.model] = phase
        budgets += mine
        record_safety(run, spec.model, images)
    return Generated(pa.concat_tables(parts) if parts else None, phases, budgets)


def safety_counts(images: pa.Table) -> dict:
    """One model's images under the run's safety policy: generated, checked (NSFW not null),
    flagged, left out by the run's NSFW check (nsfw_excluded), blanked by the model's own checker."""
    import pyarrow.compute as pc

    from schemas.images import GENERATION_STATUS, NSFW, GenerationStatus

    def count(mask) -> int:
        return int(pc.sum(pc.fill_null(mask, False).cast(pa.int64())).as_py() or 0) if images.num_rows else 0

    status = images.column(GENERATION_STATUS)
    nsfw = images.column(NSFW) if NSFW in images.column_names else pa.nulls(images.num_rows, pa.bool_())
    return {"images": images.num_rows, "checked": count(pc.is_valid(nsfw)), "flagged": count(nsfw),
            "excluded": count(pc.equal(status, GenerationStatus.NSFW_EXCLUDED)),
            "blocked": count(pc.equal(status, GenerationStatus.NSFW_BLOCKED))}


def record_safety(run, model: str, images: pa.Table) -> None:
    """Count ``model``'s images under the run's safety policy into ``run.safety_counts`` and onto
    its generator record (the report's model table shows it; metrics.json's "safety" holds it)."""
    safety = getattr(run, "safety", None)
    if safety is None or not hasattr(run, "safety_counts"):
        return
    counts = safety_counts(images)
    run.safety_counts[model] = counts
    for rec in run.models or []:
        if rec.get("role") == "generator" and rec.get("model") == model:
            rec["nsfw"] = safety_text(safety.policy, counts, safety.exclude)


def safety_text(policy: str, counts: Mapping, exclude: bool) -> str:
    """One model's NSFW counts as the report's model table shows them."""
    if policy == "off":
        return "no check (safety_checker off)"
    if policy == "model-default":
        return (f"model's own checker: {counts['blocked']:,} of {counts['images']:,} blanked (left out)"
                if counts["checked"] else "model's own checker: none shipped, nothing checked")
    return (f"{counts['flagged']:,} of {counts['checked']:,} checked flagged; "
            + (f"{counts['excluded']:,} left out" if exclude else "kept in (exclude off)"))


CALIBRATION_PROMPTS = ("a photo of a person", "a photo of a doctor", "a photo of a nurse", "a photo of a chef",
                       "a photo of a pilot", "a photo of a baker", "a photo of a judge", "a photo of a farmer")


def build_standin_checker(safety: SafetySettings, root: str, generators: Sequence[GeneratorSpec] = ()
                          ) -> SafetySettings:
    """A tiny random safety checker under ``root`` for a stand-in run (its settings kept), calibrated
    on a few images of each stand-in generator at its settings, so that it flags some of what
    the run generates (meaninglessly) and the demo reaches every branch (flagged, left out)."""
    if not safety.checks:
        return safety
    import torch

    from operators.support.diffusion import _generate, load_text2image
    from pipelines.standins.diffusion import build_tiny_safety_checker

    images = []
    for spec in generators:
        pipe, _ = load_text2image(spec.model, device="cpu", dtype="float32", safety_checker="off",
                                  scheduler=spec.scheduler)
        with torch.inference_mode():
            out, _ = _generate(pipe, list(CALIBRATION_PROMPTS), list(range(len(CALIBRATION_PROMPTS))), spec.steps,
                               spec.guidance_scale, spec.height, spec.width, "cpu", spec.call_kwargs)
        images.append(out.float())
        del pipe
    path = build_tiny_safety_checker(str(Path(root) / "nsfw-check-standin"), images=images or None)
    print(f"  NSFW check {safety.model} -> tiny random stand-in {Path(path).name} (flags meaninglessly)")
    return dataclasses.replace(safety, model=path, revision=None)


def load_nsfw_check(safety: SafetySettings | None, standin: bool) -> list[dict]:
    """The provenance record of the run's NSFW check, loaded once on the driver ([] without one)."""
    if safety is None or not safety.checks:
        return []
    from operators.image_nsfw_check import load_safety_checker

    checker, _, rec = load_safety_checker(safety.model, safety.revision, device="cpu", dtype="float32")
    del checker
    gc.collect()
    return [{"role": "NSFW check (every model's images)", "model": safety.model, "standin": standin,
             "detail": {**rec, "policy": safety.policy, "exclude_flagged": safety.exclude}}]


def generation_rows(images: pa.Table, requested: int, phases: dict, head_rows=None, heads: Sequence[Stage] = ()
                    ) -> list[dict]:
    """Run-summary rows per generator: generation (requested -> ok, dropped per status), then the
    rows ``head_rows(phase, branch, generated_ok_table, ok, share)`` adds for the heads; without
    ``head_rows``, one row per head of ``heads``: the generated images it measured (its first
    output column not null), the others dropped as its ``unmeasured`` reason ("not_measured")."""
    import pyarrow.compute as pc

    from pipelines.engine.progress import outcome_counts
    from pipelines.engine.summary import stage_row
    from schemas.images import GENERATION_STATUS, MODEL, GenerationStatus

    rows = []
    for model, phase in phases.items():
        mine = images.filter(pc.equal(images.column(MODEL), model))
        branch = f"generated: {Path(model.rstrip('/')).name}"
        status = outcome_counts(mine, GENERATION_STATUS)
        ok = status.get(GenerationStatus.OK, 0)
        share = phase.processed / phase.total if phase.total else 0.0
        rows.append(stage_row(phase, branch, "generate", requested, ok,
                              {k: v for k, v in status.items() if k != GenerationStatus.OK}, round(requested * share)))
        gen_ok = mine.filter(pc.fill_null(pc.equal(mine.column(GENERATION_STATUS), GenerationStatus.OK), False))
        if head_rows is not None:
            rows += head_rows(phase, branch, gen_ok, ok, share)
            continue
        for head in heads:
            column = head.op.output_fields[0].name
            measured = int(pc.sum(pc.is_valid(gen_ok.column(column))).as_py() or 0) if gen_ok.num_rows else 0
            rows.append(stage_row(phase, branch, head.name, ok, measured,
                                  {getattr(head.op, "unmeasured", "not_measured"): ok - measured}, round(ok * share)))
    return rows


__all__ = ["GeneratorSpec", "GenerationSettings", "SafetySettings", "GenerationPlan", "Generated", "generation_settings",
           "parse_generator", "build_standin_generators", "load_generators", "generate", "generation_rows"]

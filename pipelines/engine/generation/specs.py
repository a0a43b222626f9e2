"""Generator specs: one text-to-image model with its own settings, and the study block that lists them.

A *generator spec* is one text-to-image model with its own settings (steps, guidance, size,
dtype, negative prompt, scheduler, revision, extra pipeline arguments). A study's YAML gives the
paper's values as the defaults of every generator; each model may override them, in the file
(``generation.models: [{model: ID, steps: 4, ...}]``) or on the command line
(``--generator ID:steps=4,guidance_scale=0``). The specs are what is fingerprinted and recorded.

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
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from operators.support import families
from pipelines.engine.generation.safety import SAFETY_POLICIES, SafetySettings, safety_settings

# the spec's own keys (with the spelling a user may type for some); anything else is an extra
# pipeline argument, checked against the loaded pipeline's signature on the driver
SPEC_KEYS = ("revision", "dtype", "steps", "guidance_scale", "height", "width", "negative_prompt", "scheduler",
             "safety_checker", "family", "cuda_dtype", "variant", "cpu_offload")
KEY_ALIASES = {"guidance": "guidance_scale", "num_inference_steps": "steps", "cfg": "guidance_scale"}
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
    # diffusers' enable_model_cpu_offload when the generator actors get a GPU (None: not set, off; True where the
    # model card's example offloads): where the weights wait, not what is computed, so not fingerprinted
    cpu_offload: bool | None = field(default=None, compare=False)
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
        if d["cpu_offload"] is None:
            d.pop("cpu_offload")
        return d

    def job(self) -> dict:
        """The spec as a run's fingerprint sees it: its record without CPU offload, which moves weights,
        not numbers (a run resumed with it on or off reuses its images)."""
        return {k: v for k, v in self.record().items() if k != "cpu_offload"}

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
        return {"generators": [g.job() for g in self.generators],
                "seed": int(self.seed),
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
    if key == "cpu_offload" and value is not None:
        if isinstance(value, bool):
            return value
        low = str(value).strip().lower()
        if low in ("true", "yes", "on", "1"):
            return True
        if low in ("false", "no", "off", "0"):
            return False
        raise ValueError(f"{where}: cpu_offload={value!r} is not true or false")
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
            "height": d["height"], "width": d["width"], "cuda_dtype": d["cuda_dtype"], "variant": d["variant"],
            "cpu_offload": d["cpu_offload"]}
    extra = {} if d["max_sequence_length"] is None else {"max_sequence_length": int(d["max_sequence_length"])}
    return {"spec": spec, "extra": extra, "defaults_from": f"{d['defaults_from']} (family {d['family']}: {d['family_from']})"}



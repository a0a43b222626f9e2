"""Model settings and model checks every study shares: ``ModelSpec`` (a model other than a
generator: CLIP, BLIP-2, a detector, a backbone, an FID extractor), CLIP settings with their
command-line overrides, the tiny random CLIP stand-in, and loading a model once on the driver
before any data is read (an unloadable model fails the run then, naming it). Generators:
pipelines/engine/generation/specs.py (``GeneratorSpec``)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from operators.base import collect_let_go, weak_parts
from operators.support.clip import load_clip
from operators.support.models import ModelLoadError
from pipelines.standins.clip import build_tiny_open_clip

SPEC_FIELDS = ("model", "revision", "dtype", "device")


@dataclass(frozen=True)
class ModelSpec:
    """One model of a study besides its generators: hub id or path, revision, dtype, device
    placement, and the loader's own settings (``options``: a pretrained tag, prompts, thresholds,
    a batch size). Immutable: a stand-in run gets another spec (``standin_at``), never an edited one.

    ``record()`` is what a run fingerprints and records: the flat block as the study's YAML writes
    it (``{model, revision, <options>}``, ``dtype`` / ``device`` only when set). Options read like a
    mapping (``spec["threshold"]``, ``spec.get("pretrained")``), as do the four fields."""

    model: str
    revision: str | None = None
    dtype: str | None = None
    device: str | None = None               # None: the run's device (its GPU plan)
    options: Mapping[str, Any] = field(default_factory=dict)
    standin: bool = False

    def __post_init__(self):
        if not isinstance(self.model, str) or not self.model.strip():
            raise ValueError(f"a model needs an id or a path, got {self.model!r}")
        clash = sorted(set(self.options) & set(SPEC_FIELDS))
        if clash:
            raise ValueError(f"model {self.model}: {clash} are spec fields, not options")

    @classmethod
    def from_block(cls, block: Mapping | "ModelSpec", **changes) -> "ModelSpec":
        """A spec from a study file's block (``{model: ..., revision: ..., threshold: ...}``), with
        ``changes`` (fields or options) applied; a block without ``model`` is an error naming it."""
        flat = dict(block.record() if isinstance(block, ModelSpec) else block) | changes
        if not flat.get("model"):
            raise ValueError(f"a model block needs `model:` (got keys {sorted(flat)})")
        core = {k: flat.pop(k) for k in SPEC_FIELDS if k in flat}
        return cls(**core, options=flat)

    def get(self, key: str, default=None):
        if key in SPEC_FIELDS:
            v = getattr(self, key)
            return default if v is None else v
        return self.options.get(key, default)

    def __getitem__(self, key: str):
        if key in SPEC_FIELDS:
            return getattr(self, key)
        return self.options[key]

    def __contains__(self, key: str) -> bool:
        return key in SPEC_FIELDS or key in self.options

    def with_options(self, **options) -> "ModelSpec":
        """The same model with ``options`` changed (fields by name too: ``model=``, ``revision=``)."""
        core = {k: options.pop(k) for k in SPEC_FIELDS if k in options}
        return dataclasses.replace(self, **core, options={**self.options, **options})

    def standin_at(self, path: str, **options) -> "ModelSpec":
        """This spec pointed at a stand-in directory: no hub revision, marked as a stand-in."""
        return dataclasses.replace(self.with_options(**options), model=str(path), revision=None, standin=True)

    def record(self) -> dict:
        out = {"model": self.model, "revision": self.revision}
        if self.dtype is not None:
            out["dtype"] = self.dtype
        if self.device is not None:
            out["device"] = self.device
        return out | dict(self.options)

    def load_kwargs(self, *names: str) -> dict:
        """``model`` and ``revision`` plus the named options (missing ones as None)."""
        return {"model": self.model, "revision": self.revision, **{n: self.options.get(n) for n in names}}

STANDIN_GENERATORS = ("stable-diffusion-v1-4-standin", "stable-diffusion-v1-5-standin")


def build_standin_clip(root: str) -> str:
    """A tiny random open_clip CLIP (seed 0) under ``root``, its gender prompts calibrated so that a
    demo counts images (``pipelines.standins.clip.calibrate_gender_prompts``): its directory."""
    return build_tiny_open_clip(str(Path(root) / "clip-vit-standin"), seed=0, calibrate=True)


HUB_PROBE_TIMEOUT_S = 3.0


def hub_endpoint() -> str:
    """The Hugging Face hub the model loaders talk to (``HF_ENDPOINT``, default huggingface.co)."""
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def hub_reachable(timeout: float = HUB_PROBE_TIMEOUT_S) -> tuple[bool, str]:
    """One HEAD request to the hub: (True, "") when it answers with any HTTP status, else (False, why)."""
    try:
        urllib.request.urlopen(urllib.request.Request(hub_endpoint(), method="HEAD"), timeout=timeout).close()
        return True, ""
    except urllib.error.HTTPError:   # the hub answered (a status is an answer)
        return True, ""
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return False, str(getattr(exc, "reason", exc))


@contextlib.contextmanager
def hub_offline_if_unreachable(timeout: float = HUB_PROBE_TIMEOUT_S):
    """Inside the block (a run that loads real models), the hub is in offline mode if one request
    to it before the models load gets no answer.

    Without an answer (no route, DNS failure, a firewall that drops packets), the model loaders
    would spend their own timeouts and retries on every file of every model (over a minute for a
    model id that is not in the cache) before failing. In offline mode (``HF_HUB_OFFLINE=1``, read
    by huggingface_hub, transformers and diffusers at each call) models in the local cache load at
    once and any other fails at once with its loader's message; one line says why. A run that set
    HF_HUB_OFFLINE itself is left as it is; the previous state is restored at the end."""
    import huggingface_hub.constants as hub  # deferred: huggingface_hub

    if hub.HF_HUB_OFFLINE:
        yield
        return
    ok, why = hub_reachable(timeout)
    if ok:
        yield
        return
    before = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    hub.HF_HUB_OFFLINE = True
    print(f"the Hugging Face hub at {hub_endpoint()} cannot be reached ({why}): models load from the local cache "
          f"only (HF_HUB_OFFLINE=1); one missing there fails at once")
    try:
        yield
    finally:
        hub.HF_HUB_OFFLINE = False
        if before is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = before


@contextlib.contextmanager
def native_stderr_silenced(enabled: bool = True):
    """Silence what native libraries write straight to file descriptor 2 while a model loads on the
    driver (MediaPipe's TensorFlow Lite and absl lines: "Created TensorFlow Lite XNNPACK delegate",
    "All log messages before absl::InitializeLog()", a feedback-manager warning), which read like
    errors and are none. Python exceptions still propagate and are reported; --verbose keeps it all."""
    if not enabled:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            try:
                yield
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)
    finally:
        os.close(saved)


@contextlib.contextmanager
def standin_hint(standin: bool):
    """A model that cannot load, outside a stand-in run, also says how to run without it."""
    try:
        yield
    except ModelLoadError as exc:
        if standin:
            raise
        raise ModelLoadError(f"{exc}\n(For an offline smoke run of the pipeline without these models, "
                             f"--standin-models uses tiny random-weight stand-ins.)") from exc


def clip_record(clip: ModelSpec, standin: bool, role: str) -> dict:
    """Load CLIP on the CPU once (and let it go): its provenance record (hub commit, weight
    sha256s, its activation)."""
    bundle = load_clip(clip["model"], clip.get("pretrained"), device="cpu", revision=clip.get("revision"))
    record = {"role": role, "model": clip["model"], "standin": standin, "detail": bundle.record}
    parts = weak_parts(bundle)
    del bundle
    collect_let_go(parts)
    return record


def clip_revision(clip: Mapping, args) -> dict:
    """``clip`` with --clip-revision applied; a revision belongs to the weights it was set for, so
    --clip-model or --clip-pretrained without one drops the study file's."""
    clip = dict(clip)
    if getattr(args, "clip_model", None) or getattr(args, "clip_pretrained", None) is not None:
        clip["revision"] = None
    if getattr(args, "clip_revision", None) is not None:
        clip["revision"] = args.clip_revision
    clip.setdefault("revision", None)
    return clip


def clip_settings(clip: Mapping, args) -> ModelSpec:
    """A study's CLIP with --clip-model / --clip-pretrained / --clip-revision applied (a directory
    or local-dir: / hf-hub: model needs no pretrained tag)."""
    clip = dict(clip)
    if getattr(args, "clip_model", None):
        clip["model"] = args.clip_model
        if args.clip_pretrained is None and (args.clip_model.startswith(("local-dir:", "hf-hub:"))
                                             or Path(args.clip_model).is_dir()):
            clip["pretrained"] = None
    if getattr(args, "clip_pretrained", None) is not None:
        clip["pretrained"] = args.clip_pretrained
    return ModelSpec.from_block(clip_revision(clip, args))


def standin_clip(clip: ModelSpec, root: str) -> ModelSpec:
    """``clip`` pointed at the tiny random CLIP under ``root`` (no pretrained tag)."""
    return clip.standin_at(build_standin_clip(root), pretrained=None)


def quiet_model_libraries(diffusers: bool = True) -> None:
    """No download/loading progress bars or advice from the model libraries (--verbose keeps them).
    ``diffusers``: also diffusers' (a run with generators); a run without (the caption side) does
    not import it, about 4 s of the driver's start."""
    import transformers  # deferred: transformers

    libs = [transformers]
    if diffusers or "diffusers" in sys.modules:
        import diffusers as diffusers_lib  # deferred: diffusers

        libs.append(diffusers_lib)
    for lib in libs:
        lib.utils.logging.set_verbosity_error()
        lib.utils.logging.disable_progress_bar()


def print_models(records: list[dict]) -> None:
    """One line per loaded model: its role, real or STAND-IN, and its id."""
    width = max([26] + [len(r["role"]) for r in records])
    for r in records:
        kind = r.get("standin_kind") or "random weights"
        tag = f"STAND-IN ({kind}, meaningless outputs)" if r["standin"] else "real"
        print(f"model {r['role']:<{width}} {tag:<46} {r['model']}")

"""The run's one safety policy: its settings, the NSFW check's counts per model, and its stand-in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import pyarrow as pa
import pyarrow.compute as pc

from operators.base import Stage
from operators.image_nsfw_check import NsfwCheck
from schemas.images import GENERATION_STATUS, NSFW, GenerationStatus

# one safety policy per run, the same for every model (operators.image_nsfw_check):
# check-all: no model's own checker; the run's NSFW check runs on every model's images alike
# model-default: each model's own checker as it ships (SD 1.x blanks what it flags; SDXL, SD 3,
#   FLUX and PixArt ship none): paper 002's protocol read literally
# off: no checker and no check
SAFETY_POLICIES = ("check-all", "model-default", "off")

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
        return {"nsfw_check": Stage(NsfwCheck, {"model": self.model, "revision": self.revision}),
                "exclude_nsfw": bool(self.exclude)}



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



def safety_counts(images: pa.Table) -> dict:
    """One model's images under the run's safety policy: generated, checked (NSFW not null),
    flagged, left out by the run's NSFW check (nsfw_excluded), blanked by the model's own checker."""
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
    safety = run.safety
    if safety is None:
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

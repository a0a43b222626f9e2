"""The generation plan: what an image study asks the engine to generate, and what of it the run's
fingerprint sees."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import pyarrow as pa

from operators.base import Stage
from pipelines.engine.run.fingerprint import qualified_name


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
    ``finish`` turns a drained batch into stored rows (default: conformed to ``schema``).
    ``operator`` is the generator stage's operator (``operators.image_generation.ImageGenerator``,
    or the triplet generator), ``sink`` the image sink of ``save_images`` (None: images not saved):
    the engine imports no operator of its own. ``images_file``: the table of generated rows the
    engine writes into the run directory (None: the study writes its own), with a CSV beside it
    when ``images_csv``."""

    requests: pa.Table
    schema: pa.Schema
    operator: type
    sink: type | None = None
    heads: Sequence[Stage] = ()
    after: Sequence[Stage] = ()
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
    images_file: str | None = None
    images_csv: bool = False


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
        return qualified_name(v)
    return v


def stage_job(stage: Stage) -> dict:
    """A stage as its run's fingerprint sees it: operator and arguments (nested stages too)."""
    return {"op": _plain(stage.op), "kwargs": _plain(dict(stage.kwargs))}


def plan_job(plan: GenerationPlan) -> dict:
    """What a plan's rows depend on besides the generators: its heads, the stages after the
    generator and the generator operator's own arguments (part of the run's fingerprint, so a new
    head or a head's changed setting is another run, never rows without its columns)."""
    return {"operator": _plain(plan.operator),
            "operator_kwargs": _plain(dict(plan.operator_kwargs)),
            "heads": [stage_job(s) for s in plan.heads], "after": [stage_job(s) for s in plan.after]}


@dataclass
class Generated:
    """The rows of every generator (in request order per generator), their phases and budgets."""

    images: pa.Table | None
    phases: dict
    budgets: list



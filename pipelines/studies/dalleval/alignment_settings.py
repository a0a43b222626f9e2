"""The alignment study's settings (paper 000, App. D): preset, --config file and flags, built once with the captions they ask for."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable

import pyarrow as pa

from pipelines.engine.cli import config as study_config
from pipelines.engine.generation import GenerationSettings, generation_settings
from pipelines.engine.run.models import ModelSpec, clip_settings
from schemas import alignment as A
from schemas.subsets import PROMPT


PRESET = "dalleval_alignment.yaml"




# ------------------------------------------------------------------------------------ settings
@dataclass(frozen=True)
class AlignmentSettings:
    """The effective alignment / quality study (preset < --config file < flags), built once; the
    inputs read from it (``requests``, ``caption_counts``, ``caption_groups``) are filled in by
    ``AlignmentStudy.settings``, and a stand-in run's models by ``use_standins`` (a new object)."""

    # left out of the run id: R-precision and CLIPScore are computed from the checkpointed
    # embeddings every time; the caption counts and groups are read from the captions, whose
    # requests are in it; the report's options only shape the page
    not_in_run_id = ("r_precision", "clip_score", "caption_counts", "caption_groups", "report")

    label: str
    captions: dict                     # input, column, id_column, group_column, sample, seed
    reference: dict                    # images / statistics, pairing, columns, max_images (App. D.2)
    generation: GenerationSettings
    clip: ModelSpec                    # R-precision and CLIPScore (options: pretrained, batch_size)
    r_precision: dict                  # negatives, r, seed, reading, repeats
    clip_score: dict                   # w
    fid: ModelSpec                     # model: the extractor ("torchvision", "inception", "pkg.mod:fn");
                                       # options: weights (a local copy or None), batch_size
    report: dict                       # examples
    execution: dict
    requests: pa.Table | None = None
    caption_counts: dict | None = None  # read, null_or_blank, [one_per_group], kept
    caption_groups: dict | None = None  # image id -> the drawn caption (pairing "captions" finds the images by it)
    # a stand-in run's FID extractor: a function building the torch module (the recorded name is fid.model)
    fid_factory: Callable | None = None


def fid_settings(block: dict, args) -> ModelSpec:
    """The FID extractor with --fid-extractor / --fid-weights applied, as a spec whose model is
    the extractor's name."""
    fid = dict(block)
    for key, attr in (("extractor", "fid_extractor"), ("weights", "fid_weights")):
        if getattr(args, attr, None) is not None:
            fid[key] = getattr(args, attr)
    extractor = fid.pop("extractor", None)
    return ModelSpec.from_block(fid, model=extractor)


def fid_block(fid: ModelSpec) -> dict:
    """The FID extractor as the study file writes it ({extractor, weights, batch_size}): what
    metrics.json and the report record."""
    return {"extractor": fid.model, **fid.options}


def settings(args) -> AlignmentSettings:
    cfg = study_config.load_config(getattr(args, "config", None), preset=PRESET)
    cap = dict(cfg["captions"])
    for key, attr in (("input", "captions"), ("column", "caption_column"), ("id_column", "caption_id_column"),
                      ("group_column", "caption_group_column"), ("sample", "max_captions")):
        if getattr(args, attr, None) is not None:
            cap[key] = getattr(args, attr)
    ref = dict(cfg["reference"])
    if getattr(args, "reference", None) is not None:
        ref["images"] = args.reference
    for key, attr in (("max_images", "max_reference_images"), ("pairing", "reference_pairing"),
                      ("statistics", "reference_statistics"), ("caption_column", "reference_caption_column")):
        if getattr(args, attr, None) is not None:
            ref[key] = getattr(args, attr)
    ref.setdefault("pairing", A.DEFAULT_REFERENCE_PAIRING)
    if ref["pairing"] not in A.REFERENCE_PAIRINGS:
        raise ValueError(f"reference.pairing must be one of {', '.join(map(repr, A.REFERENCE_PAIRINGS))}, not "
                         f"{ref['pairing']!r}")
    fid = fid_settings(cfg["fid"], args)
    rp = dict(cfg["r_precision"])
    if getattr(args, "negatives", None) is not None:
        rp["negatives"] = args.negatives
    if getattr(args, "r_precision_reading", None) is not None:
        rp["reading"] = args.r_precision_reading
    rp.setdefault("reading", "project")
    rp.setdefault("repeats", 5)
    if rp["reading"] not in ("project", "released"):
        raise ValueError(f"r_precision.reading must be 'project' or 'released', not {rp['reading']!r}")
    if int(rp["negatives"]) < 1 or int(rp["r"]) < 1:
        raise ValueError(f"r_precision: negatives ({rp['negatives']}) and r ({rp['r']}) must be >= 1")
    ex = study_config.execution_settings(cfg["execution"], args)
    return AlignmentSettings(label=str(cfg.get("name") or "dalleval-alignment"), captions=cap, reference=ref,
                             generation=generation_settings(cfg["generation"], args),
                             clip=clip_settings(cfg["clip"], args), r_precision=rp,
                             clip_score=dict(cfg["clip_score"]), fid=fid, report=dict(cfg.get("report") or {}),
                             execution=ex)


def captions_digest(requests: pa.Table) -> str:
    """sha256 of the drawn (caption id, caption) pairs: the run's identity follows the captions'
    content, not only the input's path (a changed file at the same path is another run)."""
    h = hashlib.sha256()
    for cid, text in zip(requests.column(A.CAPTION_ID).to_pylist(), requests.column(PROMPT).to_pylist()):
        h.update(f"{cid}\x1f{text}\x1e".encode())
    return h.hexdigest()

"""`exposed.py run`: Stable Diffusion Exposed (papers 003/004), triplets and representational
disparities (sections 3 and 4), as one Ray job.

captions (any caption set) and the Profession set  -> triplets (Table S1 filter, person/people
swapped; female/male before the profession)                                   [driver, vectorised]
  -> units: each triplet x its seeds (5 for GCC and Profession, 1 otherwise), one recorded seed
     shared by the unit's three prompts
  -> generation (any diffusers model): the unit's three images in one call on one device, and
     there, while they are on it: prompt embeddings t and final latents z_0 (prompt and denoising
     spaces), SSIM / Diff. Pix., ResNet-50, CLIP ViT-B/32, DINO ViT-S/16, split-product DINO ViT-B/8
                                                                   [Ray Data, GPU actors]
  -> per-image table (three rows per unit, one status each), Table 3 / S3 means with the units
     behind each, the RQ1 answer per cell, metrics.json, report.html.

Images are checkpointed per unit (its three rows together) as they arrive, so an interrupted run
resumes where it stopped; everything the images depend on (the triplets themselves, seeds,
generation and disparity models) names the run.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs  # noqa: F401 -- pa.fs

from operators.base import Stage
from operators.image_backbone_disparity import BackboneDisparity
from operators.image_clip_embedding import ClipImageEmbedder
from operators.image_split_product import SplitProductDisparity
from operators.image_prompt_dependency import PromptDependency
from operators.image_ssim_disparity import SsimDisparity
from operators.image_triplet_generation import TripletGenerator
from operators.support.seeds import image_seeds
from pipelines.engine import arguments, generation, io, lifecycle
from pipelines.engine import headline as HL
from pipelines.engine import config as study_config
from pipelines.engine.figures import FigureDir
from pipelines.engine.checkpoint import model_dir
from pipelines.engine.generation import GenerationPlan, GenerationSettings, generation_budget, generation_settings
from pipelines.engine.lifecycle import Outcome, Run, StudyBase, run_study
from pipelines.engine.models import ModelSpec, clip_settings, standin_clip
from pipelines.engine.progress import outcome_counts
from pipelines.engine.summary import stage_row
from pipelines.studies.exposed import headline_metrics as HM
from pipelines.studies.exposed import metrics as M
from pipelines.studies.exposed import objects as O
from pipelines.studies.exposed import report as exposed_report
from pipelines.studies.exposed import report_objects as objects_report
from pipelines.studies.exposed import triplets as T
from schemas import exposed as S
from schemas.images import GENERATION_STATUS, MODEL, SEED, GenerationStatus

PRESET = "exposed.yaml"
REPLACED = ("captions", "seeds_per_triplet")
FILES = {
    "triplets": "triplets",                  # one row per triplet (parquet + csv)
    "counts": "triplet_counts.csv",          # what the filter kept and rejected, per reason and word
    "images": "images",                      # per image: unit, variant, prompt, seed, status, pair values
    "disparities": "disparities.csv",        # per (model, source, pair, space): mean, std, units
    "table3": "table3_disparities.csv",      # Table 3 / S3 shape
    "direction": "rq1_direction.csv",        # per (model, source, space): closer to masculine or feminine
    "metrics": "metrics.json",
    "report": "report.html",
    # sections 5-7 (with objects.enabled)
    "objects": "objects",                            # per detected object (label, score, box, mask, group) + hidden nouns
    "object_counts": "object_counts.csv",            # C(o, P) (Eq. 3) with |P|
    "object_chi2": "object_chi2.csv",                # section 5.1: chi-square on the triplet and each pair
    "cooccurrence_similarity": "table4_cooccurrence_similarity.csv",   # Table 4: s_O per pair (Eq. 4)
    "bias_scores": "bias_scores.csv",                # Figure 2: BS(o) (Eq. 5), minimum count applied
    "group_counts": "group_counts.csv",              # C_g(o, P) per dependency group
    "top_objects": "figure4_top_objects.csv",        # Figure 4: 10 most frequent objects per group, no individuals
    "group_chi2": "tables_s4_s6_group_chi2.csv",     # Tables S4-S6
    "group_images": "table_s8_group_images.csv",     # Table S8: % of images holding each group
    "group_objects": "table_s9_group_objects.csv",   # Table S9: distinct objects per group, nouns
    "group_intersections": "table_s10_group_intersections.csv",   # Table S10
    "group_bias_scores": "group_bias_scores.csv",    # Figure 5: BS(o) on the implicit groups
    "images_dir": "images",
}
CONFIG_DIR = Path(study_config.__file__).resolve().parents[2] / "configs"

# the disparity heads: configuration key -> (operator, spaces it measures)
HEADS = {"ssim": (SsimDisparity, (S.Space.SSIM, S.Space.DIFF_PIX)),
         "resnet": (BackboneDisparity, (S.Space.RESNET,)),
         "clip": (ClipImageEmbedder, (S.Space.CLIP,)),
         "dino": (BackboneDisparity, (S.Space.DINO,)),
         "split_product": (SplitProductDisparity, (S.Space.SPLIT_PRODUCT,))}


# ------------------------------------------------------------------------------------ settings
def _caption_spec(spec: str, column: str | None = None) -> dict:
    """--captions [SOURCE=]PATH[:COLUMN] (the source's name defaults to the file's, the column to
    --caption-column)."""
    source, eq, rest = spec.partition("=")
    if not eq:
        source, rest = "", spec
    if (eq and not source.strip()) or not rest.strip():
        raise ValueError(f"--captions {spec!r}: expected [SOURCE=]PATH[:COLUMN] (e.g. coco=/data/coco.parquet:caption)")
    path, column = rest, column or None    # None: recognised from the file's columns (T.caption_column)
    head, colon, tail = rest.rpartition(":")
    if colon and head and "/" not in tail and not Path(rest).exists():
        path, column = head, tail
    if not source.strip():
        source = T.default_source(path)
    return {"source": source.strip().lower(), "path": path, "column": column}


def _input_path(path: str) -> str:
    """A caption path as given, or (the embedded default) relative to configs/."""
    if "://" in path or Path(path).exists():
        return path
    bundled = CONFIG_DIR / path
    return str(bundled) if bundled.exists() else path


def _source_counts(specs: list[str], what: str) -> dict:
    out = {}
    for spec in specs or []:
        source, eq, n = spec.partition("=")
        if not eq or not n.strip().isdigit() or int(n) < 1:
            raise ValueError(f"{what} {spec!r}: expected SOURCE=N with N >= 1")
        out[source.strip().lower()] = int(n)
    return out


@dataclass(frozen=True)
class DisparitySettings:
    """Section 4 and App. A: the spaces measured and the image-space models behind them."""

    spaces: tuple[str, ...]            # prompt and denoising (measured by the generator) always among them
    ssim: Mapping[str, Any]            # SsimDisparity's settings ({win_size})
    resnet: ModelSpec                  # ResNet-50
    clip: ModelSpec                    # CLIP ViT-B/32 (open_clip; option ``pretrained``)
    dino: ModelSpec                    # DINO ViT-S/16
    split_product: ModelSpec           # DINO ViT-B/8 (option ``chunks``)
    batch_size: int | None             # images per forward pass of each head (None: 32)

    def record(self) -> dict:
        """The ``disparity`` block as the study file writes it (each model as its flat block)."""
        return {"spaces": list(self.spaces), "ssim": dict(self.ssim), "resnet": self.resnet.record(),
                "clip": self.clip.record(), "dino": self.dino.record(), "split_product": self.split_product.record(),
                "batch_size": self.batch_size}

    def job(self) -> dict:
        """What the per-image disparities depend on (the record without the batch size)."""
        return {k: v for k, v in self.record().items() if k != "batch_size"}


@dataclass(frozen=True)
class ObjectSettings:
    """Sections 5-7 and App. A: objects in the generated images and prompt-image dependency groups.
    Values as the study file gives them (the statistics convert them where they are used)."""

    enabled: bool
    detector: ModelSpec                # GroundingDINO or OWLv2 (the file's ``detector``, ``detector_revision``)
    segmenter: ModelSpec               # SAM (``segmenter``, ``segmenter_revision``)
    box_threshold: float
    text_threshold: float              # GroundingDINO only
    nms_iou: float                     # class-agnostic
    tags: str                          # the tag list's file, as given
    spacy_model: str                   # the noun set's tagger
    share_unit_nouns: bool             # one noun set per unit (the three prompts share their nouns)
    theta: float                       # attention maps binarised at θ
    attention_layers: str              # daam | all
    sigma: float                       # coverage threshold of "guided"
    sigma_human: float                 # the same when both the object and the word refer to humans
    min_count: Mapping[str, int]       # source -> bias-score minimum count
    default_min_count: int             # any other source
    top_objects: int                   # objects shown toward each side in the bias-score figures
    leave_out_individuals: str         # LEAVE_OUT_INDIVIDUALS
    min_group_objects: int             # no group test on a group with fewer objects
    vocabulary: tuple[str, ...] = ()   # the tag list read (empty when disabled)

    def record(self) -> dict:
        """The ``objects`` block as the study file writes it (flat detector / segmenter keys), the
        vocabulary left out."""
        flat = {"enabled": self.enabled, "detector": self.detector.model, "detector_revision": self.detector.revision,
                "segmenter": self.segmenter.model, "segmenter_revision": self.segmenter.revision}
        rest = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name not in flat and f.name not in ("detector", "segmenter", "vocabulary")}
        return flat | rest


@dataclass(frozen=True)
class ExposedSettings:
    """The effective Exposed study (preset < --config file < flags), built once; ``triplets``,
    ``counts`` and ``units`` are the inputs read from it (``ExposedStudy.settings``)."""

    label: str
    captions: list[dict]               # caption sets: {source, path, column}
    professions: dict                  # the Profession set: enabled, templates, sentences, per_topic
    seeds_per_triplet: dict            # source -> seeds per triplet
    default_seeds_per_triplet: int     # any other source
    max_triplets: int | None           # per source, after filtering (None: all)
    generation: GenerationSettings
    disparity: DisparitySettings
    objects: ObjectSettings
    report: dict                       # examples shown per model and source
    execution: dict
    triplets: pa.Table | None = None   # one row per triplet (every source)
    counts: pa.Table | None = None     # what the triplet filter kept and rejected
    units: pa.Table | None = None      # one row per (triplet, seed): the generation requests


def settings(args) -> ExposedSettings:
    """The effective study: configs/exposed.yaml, the --config file, then command-line overrides."""
    cfg = study_config.load_config(getattr(args, "config", None), preset=PRESET, replace=REPLACED)
    captions = [dict(c) for c in (cfg.get("captions") or [])]
    if getattr(args, "captions", None):
        captions = [_caption_spec(s, getattr(args, "caption_column", None)) for s in args.captions]
    if getattr(args, "no_captions", False):
        captions = []
    for c in captions:
        if not c.get("source") or not c.get("path"):
            raise ValueError(f"captions: every entry needs source and path, got {c}")
        c["source"] = str(c["source"]).lower()
        c["path"] = _input_path(str(c["path"]))
        if not c.get("column"):
            c["column"], choice = T.caption_column(c["path"], None, getattr(args, "dataset_name", None))
            if choice is not None:
                print(f"  {c['source']}: {choice.line()}")
    prof = dict(cfg["professions"])
    if getattr(args, "no_professions", False):
        prof["enabled"] = False
    if getattr(args, "per_topic", None) is not None:
        prof["per_topic"] = args.per_topic
    if getattr(args, "profession_sentences", None):
        prof["sentences"] = args.profession_sentences
    if not captions and not prof["enabled"]:
        raise ValueError("nothing to generate: no caption sources and the Profession set is off")
    seeds = {str(k).lower(): int(v) for k, v in (cfg.get("seeds_per_triplet") or {}).items()}
    seeds.update(_source_counts(getattr(args, "seeds_per_triplet", None), "--seeds-per-triplet"))
    default_seeds = int(cfg.get("default_seeds_per_triplet") or 1)
    max_triplets = getattr(args, "max_triplets", None)
    max_triplets = cfg.get("max_triplets") if max_triplets is None else max_triplets
    gen = generation_settings(cfg["generation"], args)
    disp = disparity_settings(cfg["disparity"], args)
    objects = object_settings(cfg.get("objects") or {}, args)
    check_families(gen.generators)
    ex = study_config.execution_settings(cfg["execution"], args)
    return ExposedSettings(label=str(cfg.get("name") or "exposed"), captions=captions, professions=prof,
                           seeds_per_triplet=seeds, default_seeds_per_triplet=default_seeds, max_triplets=max_triplets,
                           generation=gen, disparity=disp, objects=objects, report=dict(cfg.get("report") or {}),
                           execution=ex)


def check_families(generators) -> None:
    """Refuse, before any work, a generator whose family cannot give what the study measures:
    PixArt pipelines hand no latents or prompt embeddings to a step callback (no prompt or
    denoising space). Sections 5-7 read word heat maps from a UNet's cross-attention (DAAM) or from
    the joint attention of SD 3 / FLUX's MMDiT blocks (``operators.support.joint_attention``); an
    unknown family's pipeline is checked when it loads (``capture_for`` names what to run instead)."""
    no_callback = [g.model for g in generators if g.family in ("pixart-alpha", "pixart-sigma")]
    if no_callback:
        raise ValueError(f"{', '.join(no_callback)}: PixArt pipelines pass no latents or prompt embeddings to "
                         f"callback_on_step_end, so the prompt and denoising spaces cannot be measured; leave them out "
                         f"of this study (the other studies run them)")


def disparity_settings(cfg: Mapping, args) -> DisparitySettings:
    """The ``disparity`` section with --spaces and the model flags applied."""
    spaces = list(args.spaces) if getattr(args, "spaces", None) else list(cfg["spaces"])
    unknown = sorted(set(spaces) - set(S.Space.ALL))
    if unknown:
        raise ValueError(f"disparity.spaces: unknown {unknown}; known: {list(S.Space.ALL)}")
    for key in reversed(S.Space.GENERATOR):
        if key not in spaces:
            spaces = [key, *spaces]   # measured by the generator itself, always
    models = {}
    for key, flag in (("resnet", "resnet_model"), ("dino", "dino_model"), ("split_product", "split_product_model")):
        # a model given on the command line drops the study file's revision (it belongs to that file's model)
        changes = {"model": getattr(args, flag), "revision": None} if getattr(args, flag, None) else {}
        models[key] = _model_block(cfg[key], f"disparity.{key}", **changes)
    return DisparitySettings(spaces=tuple(spaces), ssim=dict(cfg["ssim"]), clip=clip_settings(cfg["clip"], args),
                             batch_size=cfg.get("batch_size"), **models)


def _model_block(block, where: str, **changes) -> ModelSpec:
    if not isinstance(block, Mapping):
        raise ValueError(f"{where}: expected a mapping with model (and revision), got {block!r}")
    try:
        return ModelSpec.from_block(block, **changes)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def object_settings(cfg: Mapping, args) -> ObjectSettings:
    """The ``objects`` section (sections 5-7) with the command line's overrides; the tag list read."""
    from operators.image_grounded_segmentation import read_tags

    o = dict(cfg)
    o["enabled"] = bool(o.get("enabled", True)) and not getattr(args, "no_objects", False)
    specs = {}
    for key in ("detector", "segmenter"):
        model, revision = o.pop(key, None), o.pop(f"{key}_revision", None)
        if getattr(args, key, None):
            model, revision = getattr(args, key), None
        specs[key] = _model_block({"model": model, "revision": revision}, f"objects.{key}")
    if getattr(args, "tags", None):
        o["tags"] = args.tags
    o["min_count"] = {str(k).lower(): int(v) for k, v in (o.get("min_count") or {}).items()}
    o["min_count"].update(_source_counts(getattr(args, "min_count", None), "--min-count"))
    for key in ("theta", "sigma", "sigma_human", "box_threshold", "text_threshold", "nms_iou"):
        if not 0.0 <= float(o[key]) <= 1.0:
            raise ValueError(f"objects.{key} must be in [0, 1], got {o[key]}")
    if getattr(args, "attention_layers", None):
        o["attention_layers"] = args.attention_layers
    o["attention_layers"] = str(o.get("attention_layers", "daam"))
    if o["attention_layers"] not in ("daam", "all"):
        raise ValueError(f"objects.attention_layers must be daam or all, got {o['attention_layers']!r}")
    if getattr(args, "leave_out_individuals", None):
        o["leave_out_individuals"] = args.leave_out_individuals
    o["leave_out_individuals"] = str(o.get("leave_out_individuals", "group_tests"))
    if o["leave_out_individuals"] not in LEAVE_OUT_INDIVIDUALS:
        raise ValueError(f"objects.leave_out_individuals must be one of {LEAVE_OUT_INDIVIDUALS}, "
                         f"got {o['leave_out_individuals']!r}")
    o["vocabulary"] = tuple(read_tags(_input_path(str(o["tags"])))) if o["enabled"] else ()
    unknown = sorted(set(o) - {f.name for f in dataclasses.fields(ObjectSettings)})
    if unknown:
        raise ValueError(f"objects: unknown keys {unknown}")
    return ObjectSettings(**o, **specs)


# Where the individuals (person, people, woman, man, girl, boy, ...: footnote 8's list) are left out
# of the statistics. Always of Figure 4 and the bias-score plots (footnote 8).
#   group_tests (default): also of the group tests of Tables S4-S6, where the prompt decides them by
#       construction (a hidden "woman" can only be hidden in a feminine prompt's image); they stay in
#       s_O (Eq. 4), the RQ2 tests on C(o, P) and the bias scores: the tag list asks every image for
#       person, man, woman, girl, boy, so a man detected in a neutral image is a measurement;
#   all_tests: also of s_O and the RQ2 tests (this project's earlier reading);
#   none: in every test and s_O.
LEAVE_OUT_INDIVIDUALS = ("group_tests", "all_tests", "none")


def min_counts(objects: ObjectSettings, sources) -> dict:
    """The bias-score minimum count of each source (its own, else ``default_min_count``)."""
    return {s: int(objects.min_count.get(s, objects.default_min_count)) for s in sources}


def build_triplets(st: ExposedSettings) -> tuple[pa.Table, pa.Table]:
    """Every configured source's triplets (at most ``max_triplets`` each) and the filter's counts."""
    parts, counts = [], []
    for c in st.captions:
        t, k = T.caption_triplets(c["path"], c["source"], column=c["column"])
        parts.append(t)
        counts.append(k)
    prof = st.professions
    if prof["enabled"]:
        if prof.get("sentences"):
            t, k = T.sentence_triplets(_input_path(str(prof["sentences"])))
        else:
            t, k = T.profession_triplets(templates=prof.get("templates"), per_topic=prof.get("per_topic"))
        parts.append(t)
        counts.append(k)
    triplets = pa.concat_tables(parts) if parts else S.TRIPLETS.empty_table()
    if st.max_triplets is not None:
        keep = []
        for source in dict.fromkeys(triplets.column(S.TRIPLET_SOURCE).to_pylist()):
            idx = np.flatnonzero(np.asarray(pc.equal(triplets.column(S.TRIPLET_SOURCE), source)))
            keep.extend(idx[:max(0, int(st.max_triplets))].tolist())
        triplets = triplets.take(pa.array(sorted(keep), pa.int64()))
    return triplets, (pa.concat_tables(counts) if counts else S.TRIPLET_COUNTS.empty_table())


def unit_requests(triplets: pa.Table, seeds_per: dict, default_seeds: int, base_seed: int) -> pa.Table:
    """One row per (triplet, seed index): the unit's three prompts and its seed, a hash of (base
    seed, neutral prompt, seed index) so it never depends on the model, batch or worker."""
    n_seeds = np.array([seeds_per.get(s, default_seeds) for s in triplets.column(S.TRIPLET_SOURCE).to_pylist()],
                       np.int64)
    rows = np.repeat(np.arange(triplets.num_rows), n_seeds)
    index = np.concatenate([np.arange(k) for k in n_seeds]) if len(n_seeds) else np.zeros(0, np.int64)
    units = triplets.take(pa.array(rows, pa.int64()))
    neutral = units.column(S.NEUTRAL).to_pylist()
    ids = [f"{t}-s{k}" for t, k in zip(units.column(S.TRIPLET_ID).to_pylist(), index)]
    return pa.table({S.UNIT_ID: pa.array(ids, pa.string()), S.TRIPLET_ID: units.column(S.TRIPLET_ID),
                     S.TRIPLET_SOURCE: units.column(S.TRIPLET_SOURCE),
                     S.SEED_INDEX: pa.array(index, pa.int32()), S.NEUTRAL: units.column(S.NEUTRAL),
                     S.FEMININE: units.column(S.FEMININE), S.MASCULINE: units.column(S.MASCULINE),
                     SEED: pa.array(image_seeds(base_seed, neutral, index), pa.int64()),
                     # the Profession set's profession (null for captions): the noun sets of sections 5-6 use it
                     S.PROFESSION: units.column(S.PROFESSION)})


def triplets_digest(triplets: pa.Table) -> str:
    """sha256 of the triplets' ids and prompts: the run's name changes when any prompt does."""
    h = hashlib.sha256()
    for col in (S.TRIPLET_ID, S.NEUTRAL, S.FEMININE, S.MASCULINE):
        for v in triplets.column(col).to_pylist():
            h.update(str(v).encode("utf-8", "surrogatepass") + b"\x1f")
    return h.hexdigest()


def head_stages(disparity: DisparitySettings) -> list[Stage]:
    """The disparity heads the configured spaces need, as Stages built on the generator's device."""
    d, spaces = disparity, set(disparity.spaces)
    batch = int(d.batch_size or 32)
    out = []
    if spaces & {S.Space.SSIM, S.Space.DIFF_PIX}:
        out.append(Stage(SsimDisparity, {"win_size": int(d.ssim.get("win_size", 7))}))
    if S.Space.RESNET in spaces:
        out.append(Stage(BackboneDisparity, {"space": S.Space.RESNET, "model": d.resnet.model,
                                             "revision": d.resnet.revision, "batch_size": batch}))
    if S.Space.CLIP in spaces:
        c = d.clip
        out.append(Stage(ClipImageEmbedder, {"model": c.model, "pretrained": c.get("pretrained"),
                                             "revision": c.revision, "batch_size": batch}))
    if S.Space.DINO in spaces:
        out.append(Stage(BackboneDisparity, {"space": S.Space.DINO, "model": d.dino.model,
                                             "revision": d.dino.revision, "batch_size": batch}))
    if S.Space.SPLIT_PRODUCT in spaces:
        sp = d.split_product
        out.append(Stage(SplitProductDisparity, {"model": sp.model, "revision": sp.revision,
                                                 "batch_size": batch,
                                                 **({"chunks": int(sp["chunks"])} if sp.get("chunks") else {})}))
    return out


def dependency_stage(objects: ObjectSettings) -> Stage | None:
    """Sections 5-6 on the generator's device (None when ``objects.enabled`` is off)."""
    o = objects
    if not o.enabled:
        return None
    return Stage(PromptDependency, {
        "detector": o.detector.model, "segmenter": o.segmenter.model, "detector_revision": o.detector.revision,
        "segmenter_revision": o.segmenter.revision, "box_threshold": float(o.box_threshold),
        "text_threshold": float(o.text_threshold), "nms_iou": float(o.nms_iou),
        "vocabulary": list(o.vocabulary), "spacy_model": o.spacy_model, "theta": float(o.theta),
        "sigma": float(o.sigma), "sigma_human": float(o.sigma_human),
        "attention_layers": o.attention_layers, "share_nouns": bool(o.share_unit_nouns)})


def object_job(objects: ObjectSettings) -> dict | None:
    """What the per-image object columns depend on (not the statistics' settings)."""
    if not objects.enabled:
        return None
    record = objects.record()
    job = {k: record.get(k) for k in ("detector", "detector_revision", "segmenter", "segmenter_revision",
                                      "box_threshold", "text_threshold", "nms_iou", "spacy_model", "theta", "sigma",
                                      "sigma_human", "attention_layers", "share_unit_nouns")}
    job["vocabulary_sha256"] = hashlib.sha256("\n".join(objects.vocabulary).encode()).hexdigest()
    return job


def image_job(st: ExposedSettings, args) -> dict:
    """What the per-image results depend on: its fingerprint names the run."""
    return {"study": "paper004-exposed", "triplets_sha256": triplets_digest(st.triplets),
            "seeds_per_triplet": st.seeds_per_triplet, "default_seeds_per_triplet": st.default_seeds_per_triplet,
            "generation": st.generation.job(),
            "plan": generation.plan_job(generation_plan(st, st.units, True)), "disparity": st.disparity.job(),
            "objects": object_job(st.objects), "standin_models": bool(args.standin_models)}


# ------------------------------------------------------------------------------------ models
def load_models(st: ExposedSettings, standin: bool) -> list[dict]:
    """Every model loaded once on the driver (CPU) before any work: an unloadable one fails the run
    now, naming it. The heads are built as the generator builds them (the engine loads the
    generators, checked by ``ExposedStudy.check_generator``)."""
    records = []
    for stage in head_stages(st.disparity):
        head = stage.build(device="cpu")
        records.append({"role": f"disparity ({', '.join(head.spaces)})", "model": stage.kwargs.get("model", "-"),
                        "standin": standin and stage.op is not SsimDisparity, "detail": getattr(head, "record", None)})
        del head
    dep = dependency_stage(st.objects)
    if dep is not None:
        analysis = dep.build(device="cpu")
        records.append({"role": "objects (detector + SAM, noun set)", "model": f"{dep.kwargs['detector']} + "
                        f"{dep.kwargs['segmenter']}", "standin": standin, "detail": analysis.record})
        del analysis
    return records


def standins(st: ExposedSettings, root: str) -> ExposedSettings:
    """Tiny random image models under ``root`` (the engine builds the generators'): the settings of
    a run on them (``st`` itself is left as it is)."""
    from pipelines.standins.vision import build_tiny_dino, build_tiny_resnet

    d = st.disparity
    disparity = dataclasses.replace(
        d, clip=standin_clip(d.clip, root),
        resnet=d.resnet.standin_at(build_tiny_resnet(str(Path(root) / "resnet-standin"), seed=0)),
        dino=d.dino.standin_at(build_tiny_dino(str(Path(root) / "dino-s16-standin"), seed=0, patch_size=16)),
        split_product=d.split_product.standin_at(build_tiny_dino(str(Path(root) / "dino-b8-standin"), seed=1,
                                                                 patch_size=8)))
    objects = st.objects
    if objects.enabled:
        from pipelines.standins.grounding import build_tiny_grounding_dino, build_tiny_sam

        objects = dataclasses.replace(
            objects,
            detector=objects.detector.standin_at(build_tiny_grounding_dino(Path(root) / "grounding-dino-standin")),
            segmenter=objects.segmenter.standin_at(build_tiny_sam(Path(root) / "sam-standin")),
            # random detectors spread their labels over the whole vocabulary: a short tag list
            # keeps the tiny run's counts above the bias-score minimum, so every table has rows
            vocabulary=STANDIN_TAGS)
    return dataclasses.replace(st, disparity=disparity, objects=objects)


STANDIN_TAGS = ("hat", "dress", "suit", "tie", "tree", "grass", "car", "table", "dog", "cake")


# ------------------------------------------------------------------------------------ the study
class ExposedStudy(StudyBase):
    """Papers 003/004, sections 3-4, as a study of the engine's lifecycle."""

    name = "paper004-exposed"

    def settings(self, args) -> ExposedSettings:
        st = settings(args)
        triplets, counts = build_triplets(st)
        if not triplets.num_rows:
            raise ValueError("no triplets: no caption of the configured sources qualifies (see the counts with "
                             "`exposed.py triplets`) and the Profession set is off")
        units = unit_requests(triplets, st.seeds_per_triplet, st.default_seeds_per_triplet, st.generation.seed)
        return dataclasses.replace(st, triplets=triplets, counts=counts, units=units)

    def job(self, args, st: ExposedSettings) -> dict:
        return image_job(st, args)

    def announce(self, args, st: ExposedSettings) -> None:
        by_source = {s: n for s, n in zip(*np.unique(st.triplets.column(S.TRIPLET_SOURCE).to_pylist(),
                                                      return_counts=True))}
        units = st.units.num_rows
        print(f"Stable Diffusion Exposed: {st.triplets.num_rows:,} triplets "
              f"({', '.join(f'{s} {int(n):,}' for s, n in by_source.items())}), {units:,} units = {3 * units:,} "
              f"images per generator; spaces: {', '.join(st.disparity.spaces)}")

    # As SD v2.0 and v2.1 share OpenCLIP-H, stand-ins 2 and 3 share one text encoder (so their
    # prompt-space columns agree, as the paper's do)
    standin_shared_text_encoder = (1, 2)

    def check_generator(self, pipe, spec) -> None:
        from operators.image_triplet_generation import check_capture

        check_capture(pipe, spec.model)

    def use_standins(self, args, st: ExposedSettings, root: str) -> ExposedSettings:
        return standins(st, root)

    def load_models(self, args, st: ExposedSettings, gpu) -> list[dict]:
        return load_models(st, args.standin_models)

    def execute(self, run: Run) -> Outcome:
        args, st, rd = run.args, run.st, run.rd
        units, per_actor = st.units, run.gpu.per_actor
        models = run.generator_models
        io.write_table_and_csv(st.triplets, rd.fs, f"{rd.path}/{FILES['triplets']}")
        io.write_text(st.counts.to_pandas().to_csv(index=False), rd.fs, f"{rd.path}/{FILES['counts']}")
        generated = generation.generate(run, generation_plan(st, units, bool(args.save_images)))
        images, phases, budgets = generated.images, generated.phases, generated.budgets
        spaces = tuple(s for s in S.Space.ALL if s in st.disparity.spaces)
        objects = object_tables(st.objects, images) if st.objects.enabled else None
        head = headline_numbers(run, images, spaces, objects)
        ends = HM.intervals(head, models)
        disparities = M.with_intervals(M.disparity_table(images, spaces), HM.disparity_intervals(ends))
        table3, direction = M.table3(disparities), M.direction_table(disparities, HM.gap_intervals(ends))
        io.write_table_and_csv(images, rd.fs, f"{rd.path}/{FILES['images']}", csv_without=PARQUET_ONLY)
        io.write_text(disparities.to_pandas().to_csv(index=False), rd.fs, f"{rd.path}/{FILES['disparities']}")
        io.write_text(table3.to_csv(index=False), rd.fs, f"{rd.path}/{FILES['table3']}")
        io.write_text(direction.to_csv(index=False), rd.fs, f"{rd.path}/{FILES['direction']}")
        if objects is not None:
            objects["cooccurrence_similarity"] = HM.with_s_o_intervals(objects["cooccurrence_similarity"], ends)
            io.write_table_and_csv(objects["objects"], rd.fs, f"{rd.path}/{FILES['objects']}", csv_without=PARQUET_ONLY)
            for key in OBJECT_FILES:
                io.write_text(objects[key].to_csv(index=False), rd.fs, f"{rd.path}/{FILES[key]}")
        summary_rows = run_summary_rows(st, images, units.num_rows, phases)
        save_images = bool(args.save_images)
        metrics = {
            "config": {"images": image_job(st, args), "captions": st.captions, "professions": st.professions,
                       "max_triplets": st.max_triplets, "execution": st.execution, "gpus_per_actor": per_actor,
                       "gpu_plan": run.gpu.as_dict(), "generators_loaded": models,
                       "disparity_loaded": st.disparity.record(), "save_images": save_images},
            "models": run.models,
            "headline": head,
            "triplets": {"total": st.triplets.num_rows, "units": units.num_rows,
                         "by_source": outcome_counts(st.triplets, S.TRIPLET_SOURCE),
                         "filter": st.counts.to_pylist()},
            "images": {"requested_per_generator": 3 * units.num_rows, "rows": images.num_rows,
                       "generation_status": outcome_counts(images, GENERATION_STATUS)},
            "results": {"disparities": M.summary(disparities),
                        **({"objects": object_summary(objects)} if objects is not None else {})},
            "objects": st.objects.record() | {"vocabulary_size": len(st.objects.vocabulary)},
            "error_budgets": [b.as_dict() for b in budgets],
        }
        return Outcome(metrics, summary_rows, {"images": images, "disparities": disparities, "table3": table3,
                                               "direction": direction, "save_images": save_images,
                                               "objects": objects, "headline": head})

    def report(self, run: Run, outcome: Outcome) -> None:
        st, rd, d = run.st, run.rd, outcome.data
        meta = {"run_id": rd.run_id, "output": rd.display(), "standin": bool(run.args.standin_models),
                "models": run.generator_models, "triplets": st.triplets.num_rows, "units": st.units.num_rows,
                "spaces": list(st.disparity.spaces),
                "images_dir": f"{rd.uri}/{FILES['images_dir']}" if d["save_images"] else None}
        extra = None
        if d["objects"] is not None:
            def load_image(model: str, image_id: str):
                path = f"{rd.path}/{FILES['images_dir']}/{model_dir(model)}/{image_id}.png"
                if not d["save_images"] or rd.fs.get_file_info(path).type == pa.fs.FileType.NotFound:
                    return None
                from PIL import Image

                with rd.fs.open_input_file(path) as f:
                    return np.asarray(Image.open(f).convert("RGB"))

            def objects_section(sink):
                return objects_report.render_html(d["objects"], d["images"].to_pandas(), sink,
                                                  top=int(st.objects.top_objects),
                                                  examples=int(st.report.get("object_examples", 1)),
                                                  load_image=load_image)

            extra = objects_section
        html = exposed_report.render_html(meta, d, st.counts, run.models, figures=FigureDir(rd.fs, rd.path),
                                          examples=int(st.report.get("examples", 3)), extra=extra)
        io.write_text(html, rd.fs, f"{rd.path}/{FILES['report']}")
        print(exposed_report.format_results(d["table3"], d["direction"]))
        if d["objects"] is not None:
            print(objects_report.format_results(d["objects"]))
        # the lead numbers with their intervals; a stand-in run's notice ends the printed results
        print(exposed_report.format_headline(d["headline"], standin=bool(run.args.standin_models)))
        written = [FILES["report"], FILES["metrics"], HL.HEADLINE_UNITS_FILE, f"{FILES['triplets']}.parquet/.csv",
                   FILES["counts"],
                   f"{FILES['images']}.parquet/.csv", FILES["disparities"], FILES["table3"], FILES["direction"]]
        if d["objects"] is not None:
            written += [f"{FILES['objects']}.parquet/.csv", *(FILES[k] for k in OBJECT_FILES)]
        print(f"\nwrote {rd.display()}/: {', '.join(written)}" + (f", {FILES['images_dir']}/" if d["save_images"] else ""))


def headline_numbers(run: Run, images: pa.Table, spaces: tuple, objects: dict | None) -> dict:
    """metrics.json's ``headline`` (``headline_metrics``): per generator, Table 3's disparities, the
    RQ1 gaps and s_O, each with its interval over triplets; writes headline_units.parquet."""
    cols = [MODEL, S.UNIT_ID, S.TRIPLET_ID, S.TRIPLET_SOURCE, S.VARIANT, S.UNIT_STATUS, GENERATION_STATUS]
    subjects = HM.subjects(images.select(cols).to_pandas(), M.pair_values(images, spaces),
                           None if objects is None else objects["unit_cosines"], run.models, run.generator_models)
    standin = bool(run.args.standin_models)
    root = lifecycle.standin_root(run.rd) if standin else None
    return HL.write(run.rd, ExposedStudy.name, subjects, headline_protocol(run.st, root),
                    arguments.interval_settings(run.args), standin)


def headline_protocol(st: ExposedSettings, standin_root: str | None = None) -> dict:
    """What two runs must share for their headline numbers to be compared: the triplets (ids and
    prompts), seeds per triplet and the base seed, the safety policy that decides which units are
    measured, the spaces with their models, the object analysis (with the individuals rule s_O
    follows) and the resampled unit. Not the generators (the subjects) nor execution settings.
    Stand-in models' paths are written relative to ``standin_root`` (each run builds its own)."""
    objects = object_job(st.objects)
    protocol = {"study": ExposedStudy.name, "triplets_sha256": triplets_digest(st.triplets),
                "triplets": st.triplets.num_rows, "seeds_per_triplet": dict(st.seeds_per_triplet),
                "default_seeds_per_triplet": st.default_seeds_per_triplet, "base_seed": int(st.generation.seed),
                "safety": st.generation.safety.job(), "disparity": st.disparity.job(),
                "objects": None if objects is None else objects | {
                    "leave_out_individuals": st.objects.leave_out_individuals},
                "resampled_unit": f"{HM.UNIT} (a source of one triplet: its (triplet, seed) units)"}
    return _portable(protocol, standin_root)


def _portable(value, root: str | None):
    """``value`` with the directory ``root`` in any string written as "<stand-ins>" (a CLIP stand-in
    is "local-dir:<root>/...")."""
    if root is None:
        return value
    if isinstance(value, dict):
        return {k: _portable(v, root) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_portable(v, root) for v in value]
    return value.replace(root, "<stand-ins>") if isinstance(value, str) else value


def run(args) -> dict:
    """`exposed.py run`."""
    return run_study(ExposedStudy(), args)


# ------------------------------------------------------------------------------------ generation
def generation_plan(st: ExposedSettings, units: pa.Table, save_images: bool) -> GenerationPlan:
    """Sections 3-4: each unit's three images in one call, the disparity heads (and with objects the
    dependency analysis) on the generator's device, the images saved as <image id>.png."""
    return GenerationPlan(units, S.EXPOSED_IMAGES, heads=head_stages(st.disparity), operator=TripletGenerator,
                          operator_kwargs={"dependency": dependency_stage(st.objects)}, key=S.IMAGE_ID,
                          request_key=S.UNIT_ID, per_request=3, save_images=save_images,
                          images_dir=FILES["images_dir"],
                          budgets_of=lambda model: error_budgets(st.execution, st.objects.enabled, model),
                          what="generating and measuring")


# ------------------------------------------------------------------------------------ sections 5-7
# masks and heat-map previews are in the parquet files only (a CSV cell cannot hold them faithfully)
PARQUET_ONLY = (S.OBJECT_MASKS, S.ATTENTION_MASKS, S.ATTENTION_MAPS, S.OBJECT_MASK)
OBJECT_FILES = ("object_counts", "object_chi2", "cooccurrence_similarity", "bias_scores", "group_counts",
                "top_objects", "group_chi2", "group_images", "group_objects", "group_intersections", "group_bias_scores")


def error_budgets(execution: Mapping, objects: bool, model: str) -> list:
    """Generation failures, and (with ``objects``) failed analyses, each against --max-error-rate."""
    from pipelines.engine.progress import ErrorBudget

    ex = execution
    out = [generation_budget(ex, model)]
    if objects:
        out.append(ErrorBudget(f"object detection ({model})", {S.DETECTION_STATUS: (S.DetectionStatus.ERROR,)},
                               float(ex["max_error_rate"]), int(ex["error_budget_min_rows"])))
    return out


def object_tables(o: ObjectSettings, images: pa.Table) -> dict:
    """Sections 5-7 from the per-image rows: the object table and every statistic of Tables 4,
    S4-S6, S8-S10 and Figures 2/5 (see FILES)."""
    objects = O.object_rows(images)
    objs, imgs = objects.to_pandas(), images.select(
        [c for c in images.column_names if c not in PARQUET_ONLY]).to_pandas()
    found = O.detected(objs)
    counts = O.cooccurrence(found)
    sizes = O.prompt_set_sizes(imgs)
    # individuals (person, woman, man, ...): see LEAVE_OUT_INDIVIDUALS
    mode = o.leave_out_individuals
    no_people = objs[~objs[S.OBJECT].isin(S.INDIVIDUALS)]
    object_rows = no_people if mode == "all_tests" else objs
    group_rows = objs if mode == "none" else no_people
    object_found = O.detected(object_rows)
    object_counts = O.cooccurrence(object_found)
    floors = min_counts(o, sorted(set(imgs[S.TRIPLET_SOURCE])))
    cosines = O.unit_cosines(object_found, imgs)
    bias = O.bias_scores(counts, sizes, floors)
    bias["individual"] = bias[S.OBJECT].isin(S.INDIVIDUALS)
    group_bias = O.group_bias_scores(objs, sizes, floors)
    group_bias["individual"] = group_bias[S.OBJECT].isin(S.INDIVIDUALS)
    vocab = O.group_vocabularies(objs, imgs)
    group_counts = O.group_counts(objs)
    return {"objects": objects, "object_counts": counts.merge(sizes, on=[MODEL, S.TRIPLET_SOURCE, S.VARIANT],
                                                              how="left"),
            "object_chi2": O.chi_square_tests(object_counts),
            "cooccurrence_similarity": O.cooccurrence_similarity(object_found, imgs, cosines), "unit_cosines": cosines,
            "bias_scores": bias, "group_counts": group_counts,
            "top_objects": O.top_objects_per_group(group_counts, int(o.top_objects)),
            "group_chi2": O.group_chi_square_tests(group_rows, int(o.min_group_objects)),
            "group_images": O.images_with_group(objs, imgs), "group_objects": O.group_object_counts(vocab),
            "group_intersections": O.group_intersections(vocab), "group_bias_scores": group_bias,
            "min_count": floors}


def object_summary(t: dict) -> dict:
    """metrics.json: Table 4 (s_O), the chi-square p-values, and the size of each table."""
    return {"cooccurrence_similarity": t["cooccurrence_similarity"].to_dict("records"),
            "object_chi2": t["object_chi2"].to_dict("records"),
            "group_chi2": t["group_chi2"].to_dict("records"),
            "group_images": t["group_images"].to_dict("records"),
            "objects": t["objects"].num_rows, "bias_scores": len(t["bias_scores"]), "min_count": t["min_count"]}


# ------------------------------------------------------------------------------------ accounting
def run_summary_rows(st: ExposedSettings, images: pa.Table, units: int, phases: dict) -> list[dict]:
    """Per caption source: captions read, triplets kept and rejected per reason, the ones over
    --max-triplets, units (x seeds); per generator: images and complete units."""
    rows = []
    counts = st.counts.to_pandas()
    per_outcome = counts[counts[S.HUMAN_WORD].isna()]
    chosen = outcome_counts(st.triplets, S.TRIPLET_SOURCE)
    unit_sources = st.units.column(S.TRIPLET_SOURCE)
    for source, g in per_outcome.groupby(S.TRIPLET_SOURCE, sort=False):
        by = dict(zip(g[S.TRIPLET_STATUS], g[S.COUNT].astype(int)))
        kept = by.pop(S.TripletOutcome.KEPT, 0)
        read = kept + sum(by.values())
        branch = f"triplets: {source}"
        rows.append(stage_row(None, branch, "triplet filter", read, kept, by, read))
        # --max-triplets keeps the first N of a source; each kept triplet becomes one unit per seed
        n = chosen.get(source, 0)
        rows.append(stage_row(None, branch, "max triplets", kept, n,
                              {"over_max_triplets": kept - n} if kept > n else {}, kept))
        made = int(pc.sum(pc.equal(unit_sources, source)).as_py() or 0)
        rows.append(stage_row(None, branch, "units (x seeds)", n, made, {}, n))
    for model, phase in phases.items():
        rows += generation.generation_rows(images, 3 * units, {model: phase})   # images: three per unit
        mine = images.filter(pc.equal(images.column(MODEL), model))
        branch = f"generated: {Path(model.rstrip('/')).name}"
        ok = outcome_counts(mine, GENERATION_STATUS).get(GenerationStatus.OK, 0)
        share = phase.processed / phase.total if phase.total else 0.0
        unit_status = outcome_counts(mine.filter(pc.equal(mine.column(S.VARIANT), S.Variant.NEUTRAL)), S.UNIT_STATUS)
        complete = unit_status.get(GenerationStatus.OK, 0)
        rows.append(stage_row(phase, branch, "disparities (units)", units, complete,
                              {k: v for k, v in unit_status.items() if k != GenerationStatus.OK}, round(units * share)))
        if st.objects.enabled:
            detection = outcome_counts(mine.filter(pc.equal(mine.column(GENERATION_STATUS), GenerationStatus.OK)),
                                       S.DETECTION_STATUS)
            done = detection.get(S.DetectionStatus.OK, 0)
            rows.append(stage_row(phase, branch, "objects + groups", ok, done,
                                  {f"detection_{k}": v for k, v in detection.items() if k != S.DetectionStatus.OK},
                                  round(ok * share)))
    return rows

"""The Exposed study's settings (papers 003/004): preset, --config file and flags, the triplets and units they ask for."""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from operators.image_backbone_disparity import BackboneDisparity
from operators.image_clip_embedding import ClipImageEmbedder
from operators.image_split_product import SplitProductDisparity
from operators.image_ssim_disparity import SsimDisparity
from operators.support.families import FAMILIES, WORD_MAPS
from operators.support.seeds import image_seeds
from pipelines.engine.cli import config as study_config
from pipelines.engine.generation import GenerationSettings, generation_settings
from pipelines.engine.run.models import ModelSpec, clip_settings
from pipelines.studies.exposed import triplets as T
from schemas import exposed as S
from schemas.images import SEED
from operators.support.grounding import read_tags


PRESET = "exposed.yaml"


REPLACED = ("captions", "seeds_per_triplet")


CONFIG_DIR = Path(study_config.__file__).resolve().parents[3] / "configs"


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

    # left out of the run id: the statistics' settings, applied to the checkpointed objects every
    # time the tables are computed
    not_in_run_id = ("top_objects", "min_count", "default_min_count", "leave_out_individuals", "min_group_objects")

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

    # left out of the run id: the caption filter's counts are derived from the captions, whose
    # triplets are in it; the report's options only shape the page
    not_in_run_id = ("counts", "report")

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
    unknown family's pipeline is checked when it loads (``capture_for`` names what to run instead);
    a known family without word maps here (``families.WORD_MAPS``) is refused now."""
    no_callback = [g.model for g in generators if g.family in ("pixart-alpha", "pixart-sigma")]
    if no_callback:
        raise ValueError(f"{', '.join(no_callback)}: PixArt pipelines pass no latents or prompt embeddings to "
                         f"callback_on_step_end, so the prompt and denoising spaces cannot be measured; leave them out "
                         f"of this study (the other studies run them)")
    no_maps = [f"{g.model} ({g.family})" for g in generators
               if g.family in FAMILIES and g.family not in WORD_MAPS and not g.family.startswith("pixart")]
    if no_maps:
        raise ValueError(f"{', '.join(no_maps)}: word heat maps from this family's attention are not implemented yet "
                         f"(they are for {', '.join(WORD_MAPS)}), and sections 5-7 need them; leave these models out "
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

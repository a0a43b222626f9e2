"""What the Exposed study generates and measures on the generator's device (sections 3-4): the heads, the dependency analysis, the plan and its fingerprint, the models loaded on the driver and their stand-ins."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Mapping

import pyarrow as pa

from operators.base import Stage
from operators.image_backbone_disparity import BackboneDisparity
from operators.image_clip_embedding import ClipImageEmbedder
from operators.image_split_product import SplitProductDisparity
from operators.image_prompt_dependency import PromptDependency
from operators.image_ssim_disparity import SsimDisparity
from operators.image_sink import ImageSink
from operators.image_triplet_generation import TripletGenerator
from pipelines.engine.generation import GenerationPlan, generation_budget
from pipelines.engine.run.models import standin_clip
from schemas import exposed as S
from pipelines.studies.exposed.settings import DisparitySettings, ExposedSettings, ObjectSettings
from pipelines.standins.vision import build_tiny_dino, build_tiny_resnet
from pipelines.standins.grounding import build_tiny_grounding_dino, build_tiny_sam
from pipelines.engine.stream.progress import ErrorBudget


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

    d = st.disparity
    disparity = dataclasses.replace(
        d, clip=standin_clip(d.clip, root),
        resnet=d.resnet.standin_at(build_tiny_resnet(str(Path(root) / "resnet-standin"), seed=0)),
        dino=d.dino.standin_at(build_tiny_dino(str(Path(root) / "dino-s16-standin"), seed=0, patch_size=16)),
        split_product=d.split_product.standin_at(build_tiny_dino(str(Path(root) / "dino-b8-standin"), seed=1,
                                                                 patch_size=8)))
    objects = st.objects
    if objects.enabled:

        objects = dataclasses.replace(
            objects,
            detector=objects.detector.standin_at(build_tiny_grounding_dino(Path(root) / "grounding-dino-standin")),
            segmenter=objects.segmenter.standin_at(build_tiny_sam(Path(root) / "sam-standin")),
            # random detectors spread their labels over the whole vocabulary: a short tag list
            # keeps the tiny run's counts above the bias-score minimum, so every table has rows
            vocabulary=STANDIN_TAGS)
    return dataclasses.replace(st, disparity=disparity, objects=objects)


STANDIN_TAGS = ("hat", "dress", "suit", "tie", "tree", "grass", "car", "table", "dog", "cake")


# ------------------------------------------------------------------------------------ generation
def generation_plan(st: ExposedSettings, units: pa.Table, save_images: bool) -> GenerationPlan:
    """Sections 3-4: each unit's three images in one call, the disparity heads (and with objects the
    dependency analysis) on the generator's device, the images saved as <image id>.png."""
    return GenerationPlan(units, S.EXPOSED_IMAGES, TripletGenerator, ImageSink, heads=head_stages(st.disparity),
                          operator_kwargs={"dependency": dependency_stage(st.objects)}, key=S.IMAGE_ID,
                          request_key=S.UNIT_ID, per_request=3, save_images=save_images,
                          images_dir=FILES["images_dir"],
                          budgets_of=lambda model: error_budgets(st.execution, st.objects.enabled, model),
                          what="generating and measuring")


def error_budgets(execution: Mapping, objects: bool, model: str) -> list:
    """Generation failures, and (with ``objects``) failed analyses, each against --max-error-rate."""
    ex = execution
    out = [generation_budget(ex, model)]
    if objects:
        out.append(ErrorBudget(f"object detection ({model})", {S.DETECTION_STATUS: (S.DetectionStatus.ERROR,)},
                               float(ex["max_error_rate"]), int(ex["error_budget_min_rows"])))
    return out

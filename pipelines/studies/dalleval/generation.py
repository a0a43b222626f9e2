"""What the DALL-Eval parts share besides the engine: the generator stage with its heads on the
generator's device, the image sink, loading the generators once on the driver, and the run
summary's generation rows. The social-bias part (study.py), the skills part (skills_study.py)
and the alignment part (alignment_study.py) build their stage lists from these."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from operators.base import Stage, conform
from operators.image_generation import ImageGenerator
from operators.image_sink import ImageSink
from pipelines.engine import checkpoint, stages
from pipelines.engine import models as engine_models
from pipelines.engine.checkpoint import model_dir
from pipelines.engine.progress import outcome_counts
from pipelines.engine.summary import stage_row
from schemas.images import IMAGE_ID
from schemas.images import GENERATION_STATUS, MODEL, GenerationStatus


def generator_stage(st: dict, model: str, heads: list, batch: int) -> Stage:
    """``model``'s ImageGenerator with ``heads`` on its device, pinned to the revision the driver loaded."""
    gen = st["generation"]
    return Stage(ImageGenerator, {"model": model, "revision": gen["revisions"].get(model),
                                  "steps": int(gen["steps"]), "guidance_scale": float(gen["guidance_scale"]),
                                  "height": gen["height"], "width": gen["width"],
                                  "safety_checker": gen["safety_checker"], "scheduler": gen.get("scheduler"),
                                  "micro_batch": batch, "device": st.get("device", "auto"), "heads": heads,
                                  **st.get("generation_speed", {})})


def sink_stages(args, images_dir: str, model: str) -> list[Stage]:
    """The image sink (images/<model dir>/<image id>.png), unless --no-save-images."""
    if getattr(args, "no_save_images", False):
        return []
    return [Stage(ImageSink, {"uri": f"{images_dir}/{model_dir(model)}", "keys": [], "name_column": IMAGE_ID})]


RESOURCE_FLAGS = {"gen_actors": [(ImageGenerator.stage_name, "actors")]}


def head_pipeline(st: dict, model: str, args, per_actor: float, images_dir: str, heads: list) -> list[Stage]:
    """The stage list of a part whose measures all run as heads on the generator's device: the
    generator (``per_actor`` GPUs, --gen-batch-size images a call, --gen-actors actors) and the sink."""
    batch = max(1, args.gen_batch_size)
    pipeline = [generator_stage(st, model, heads, batch), *sink_stages(args, images_dir, model)]
    return stages.configure(pipeline, stages.overrides(st["execution"], args, RESOURCE_FLAGS, {
        ImageGenerator.stage_name: {"num_gpus": per_actor, "batch_size": batch}}))


def generate(ray, rd, requests: pa.Table, model: str, pipeline: list[Stage], schema: pa.Schema, args, budgets,
             echo, finish=None):
    """Every requested image of ``model`` through ``pipeline``, checkpointed by image id (rows
    ``finish``ed, default: conformed to ``schema``); returns (rows in request order, the Phase)."""
    return checkpoint.generate(ray, rd, requests, model, pipeline, schema, IMAGE_ID, max(1, args.gen_batch_size),
                               budgets, echo, finish=finish or (lambda t: conform(t, schema)))


def load_generators(st: dict, models: list[str], standin: bool) -> list[dict]:
    """Load every generator once on the CPU (and let it go): their provenance records."""
    gen = st["generation"]
    return engine_models.load_generators(models, gen["safety_checker"], standin, gen.get("scheduler"),
                                         gen["revisions"])


def generation_rows(images: pa.Table, requested: int, phases: dict, head_rows) -> list[dict]:
    """Run-summary rows per generator: generation (requested -> ok, dropped per status), then the
    rows ``head_rows(phase, branch, generated_ok_table, ok, share)`` adds for the heads."""
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
        rows += head_rows(phase, branch, gen_ok, ok, share)
    return rows

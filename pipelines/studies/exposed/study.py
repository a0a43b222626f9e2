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
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs  # noqa: F401 -- pa.fs

from operators.image_triplet_generation import check_capture
from pipelines.engine import generation
from pipelines.engine.storage import io
from pipelines.engine.stats import headline as HL
from pipelines.engine.report.figures import FigureDir
from pipelines.engine.storage.checkpoint import model_dir
from pipelines.engine.generation import Generated, GenerationPlan
from pipelines.engine.run.lifecycle import ImageStudy, Outcome, Run, run_study, standin_root
from pipelines.engine.stream.progress import outcome_counts
from pipelines.engine.stats.summary import stage_row
from pipelines.studies.exposed import headline_metrics as HM
from pipelines.studies.exposed import metrics as M
from pipelines.studies.exposed import objects as O
from pipelines.studies.exposed import report as exposed_report
from pipelines.studies.exposed import report_objects as objects_report
from schemas import exposed as S
from schemas.images import GENERATION_STATUS, MODEL, GenerationStatus
from pipelines.studies.exposed.settings import ObjectSettings, ExposedSettings, settings, min_counts, build_triplets, unit_requests, triplets_digest
from pipelines.studies.exposed.plan import FILES, object_job, load_models, standins, generation_plan


# ------------------------------------------------------------------------------------ the study
class ExposedStudy(ImageStudy):
    """Papers 003/004, sections 3-4, as a study of the engine's lifecycle."""

    name = "paper004-exposed"

    plan_of = staticmethod(generation_plan)

    def settings(self, args) -> ExposedSettings:
        st = settings(args)
        triplets, counts = build_triplets(st)
        if not triplets.num_rows:
            raise ValueError("no triplets: no caption of the configured sources qualifies (see the counts with "
                             "`exposed.py triplets`) and the Profession set is off")
        units = unit_requests(triplets, st.seeds_per_triplet, st.default_seeds_per_triplet, st.generation.seed)
        return dataclasses.replace(st, triplets=triplets, counts=counts, units=units)


    def announce(self, opts, st: ExposedSettings) -> None:
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
        check_capture(pipe, spec.model)

    def use_standins(self, opts, st: ExposedSettings, root: str) -> ExposedSettings:
        return standins(st, root)

    def load_models(self, opts, st: ExposedSettings, gpu) -> list[dict]:
        return load_models(st, opts.standin_models)

    def prepare(self, run: Run) -> GenerationPlan:
        st, rd = run.st, run.rd
        io.write_table_and_csv(st.triplets, rd.fs, f"{rd.path}/{FILES['triplets']}")
        io.write_text(st.counts.to_pandas().to_csv(index=False), rd.fs, f"{rd.path}/{FILES['counts']}")
        return generation_plan(st, st.units, run.options.save_images)

    def analyse(self, run: Run, generated: Generated) -> Outcome:
        st, rd = run.st, run.rd
        units, models = st.units, run.generator_models
        images, phases = generated.images, generated.phases
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
        save_images = run.options.save_images
        metrics = {
            "config": {"images": run.rd.job, "captions": st.captions, "professions": st.professions,
                       "max_triplets": st.max_triplets, "execution": st.execution, **run.generation_config(),
                       "disparity_loaded": st.disparity.record()},
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
        }
        return Outcome(metrics, summary_rows, {"images": images, "disparities": disparities, "table3": table3,
                                               "direction": direction, "save_images": save_images,
                                               "objects": objects, "headline": head})

    def report(self, run: Run, outcome: Outcome) -> None:
        st, rd, d = run.st, run.rd, outcome.data
        meta = {"run_id": rd.run_id, "output": rd.display(), "standin": run.options.standin_models,
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
        unpooled = exposed_report.without_pooled(d["images"].to_pandas())
        if unpooled:
            print(exposed_report.pooled_note(unpooled, exposed_report.Pg.model_labels(unpooled)))
        if d["objects"] is not None:
            print(objects_report.format_results(d["objects"]))
        # the lead numbers with their intervals; a stand-in run's notice ends the printed results
        print(exposed_report.format_headline(d["headline"], standin=run.options.standin_models))
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
    standin = run.options.standin_models
    root = standin_root(run.rd) if standin else None
    return HL.write(run.rd, ExposedStudy.name, subjects, headline_protocol(run.st, root), run.options.intervals, standin)


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


# ------------------------------------------------------------------------------------ sections 5-7
# masks and heat-map previews are in the parquet files only (a CSV cell cannot hold them faithfully)
PARQUET_ONLY = (S.OBJECT_MASKS, S.ATTENTION_MASKS, S.ATTENTION_MAPS, S.OBJECT_MASK)
OBJECT_FILES = ("object_counts", "object_chi2", "cooccurrence_similarity", "bias_scores", "group_counts",
                "top_objects", "group_chi2", "group_images", "group_objects", "group_intersections", "group_bias_scores")


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

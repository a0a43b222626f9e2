"""`dalleval.py skills`: PaintSkills visual-reasoning evaluation (paper 000, sections 3, 4.1, 5.2;
App. B) as one Ray job.

skill prompts (object / count / spatial, the test-split sizes), one image each with a recorded seed
  -> generation (any diffusers model), and on the generator's device, while the image is there:
     object detection (DETR-R101-DC5 trained on COCO, zero-shot; every detection above the
     recording floor is stored)                                              [Ray Data, GPU actors]
  -> the verdicts of section 4.1 at the threshold (0.7) from the stored detections, per-skill
     accuracy (Table 2 shape), per split (Fig. 5a: count per N, spatial per relation; object per
     class) and per task (Fig. 5b), images.parquet, metrics.json, report.html with examples.

Images and their detections are checkpointed by (model, image id) as they arrive, so an
interrupted run resumes where it stopped. The threshold is not part of the run's identity: the
same run id with another --threshold rescores the stored detections without generating anything.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from operators.base import Stage
from operators.image_generation import ImageGenerator
from operators.image_object_detection import ObjectDetector, load_object_detector
from operators.image_sink import ImageSink
from pipelines.engine.storage import io
from pipelines.engine.stats import headline as HL
from pipelines.engine.cli import config as study_config
from pipelines.engine.report.figures import FigureDir
from pipelines.engine.generation import Generated, GenerationPlan, GenerationSettings, generation_rows, generation_settings
from pipelines.engine.report.page import STANDIN_CONSOLE
from pipelines.engine.run.lifecycle import ImageStudy, Outcome, Run, run_study
from pipelines.engine.run.models import ModelSpec
from pipelines.engine.stats.summary import stage_row
from pipelines.standins.detection import build_tiny_detr
from pipelines.studies.dalleval import headlines as H
from pipelines.studies.dalleval import report_skills
from pipelines.studies.dalleval import skills as K
from schemas import paintskills as P
from schemas.subsets import PROMPT

PRESET = "dalleval_skills.yaml"
REPLACED = ("template_sets",)
FILES = {
    "images": "images",                       # per image: prompt, keywords, seed, status, detections, verdicts
    "accuracies": "skill_accuracies.csv",     # model,skill,accuracy,n: the input of `dalleval.py summarize --skills`
    "table2": "table2_skills.csv",            # Table 2 shape
    "splits": "figure5a_splits.csv",          # per count / relation (and per object)
    "tasks": "figure5b_tasks.csv",            # per task
    "metrics": "metrics.json",
    "report": "report.html",
    "images_dir": "images",
}


# ------------------------------------------------------------------------------------ settings
@dataclass(frozen=True)
class SkillsSettings:
    """The effective PaintSkills study (preset < --config file < flags), built once; ``requests``
    is the input made from it (the skill prompts, each with its image's seed)."""

    # left out of the run id: the scoring threshold and rules judge the checkpointed detections
    # every time the tables are computed; the report's options only shape the page
    not_in_run_id = ("detector.threshold", "detector.object_rule", "detector.count_rule", "report")

    label: str
    prompts: dict                      # sizes per skill, objects, counts, relations, the template set and its templates
    generation: GenerationSettings
    detector: ModelSpec                # options: threshold, record_threshold, object_rule, count_rule, batch_size
    report: dict                       # examples_per_skill
    execution: dict
    requests: pa.Table | None = None


def detector_settings(block: dict, args) -> ModelSpec:
    """The skill detector with --detector / --detector-revision / --threshold / --object-rule /
    --count-rule applied and checked (another model drops the study file's revision)."""
    det = dict(block)
    if getattr(args, "detector", None):
        det["model"], det["revision"] = args.detector, None
    if getattr(args, "detector_revision", None) is not None:
        det["revision"] = args.detector_revision
    if getattr(args, "threshold", None) is not None:
        det["threshold"] = args.threshold
    for key, allowed in (("object_rule", K.OBJECT_RULES), ("count_rule", K.COUNT_RULES)):
        if getattr(args, key, None) is not None:
            det[key] = getattr(args, key)
        if det.get(key, "paper") not in allowed:
            raise ValueError(f"detector.{key}: {det.get(key)!r} is not one of {allowed}")
        det[key] = det.get(key, "paper")
    det["threshold"], det["record_threshold"] = float(det["threshold"]), float(det["record_threshold"])
    if not 0 <= det["record_threshold"] <= det["threshold"] < 1:
        raise ValueError(f"detector: need 0 <= record_threshold ({det['record_threshold']}) <= threshold "
                         f"({det['threshold']}) < 1 (detections below the recording floor are not stored)")
    return ModelSpec.from_block(det)


def settings(args) -> SkillsSettings:
    """The effective study: configs/dalleval_skills.yaml, the --config file, then the flags."""
    cfg = study_config.load_config(getattr(args, "config", None), preset=PRESET, replace=REPLACED)
    pr = dict(cfg["prompts"])
    sizes = {s: int(pr["sizes"].get(s, K.TEST_SPLIT[s])) for s in P.Skill.ALL}
    if getattr(args, "prompts_per_skill", None) is not None:
        sizes = {s: max(0, int(args.prompts_per_skill)) for s in P.Skill.ALL}
    if getattr(args, "skills", None):
        wanted = [s.strip().lower() for s in args.skills.split(",") if s.strip()]
        bad = sorted(set(wanted) - set(P.Skill.ALL))
        if bad:
            raise ValueError(f"--skills: {bad} are not skills ({', '.join(P.Skill.ALL)})")
        sizes = {s: (n if s in wanted else 0) for s, n in sizes.items()}
    if not any(sizes.values()):
        raise ValueError("no skill prompt to generate (every size is 0)")
    name = getattr(args, "templates", None) or pr.get("templates") or "table1"
    sets = cfg.get("template_sets") or {}
    if name not in sets:
        raise ValueError(f"templates: {name!r} is not one of the template sets {sorted(sets)}")
    templates = K.check_templates(sets[name])
    det = detector_settings(cfg["detector"], args)
    gen = generation_settings(cfg["generation"], args)
    ex = study_config.execution_settings(cfg["execution"], args)
    prompts = {"sizes": sizes, "objects": list(pr["objects"]), "counts": [int(c) for c in pr["counts"]],
               "relations": list(pr["relations"]), "same_class_pairs": bool(pr.get("same_class_pairs", True)),
               "template_set": name, "templates": templates, "plurals": dict(pr.get("plurals") or {}),
               "relation_words": dict(pr.get("relation_words") or {})}
    return SkillsSettings(label=str(cfg.get("name") or "dalleval-skills"), prompts=prompts, generation=gen,
                          detector=det, report=dict(cfg.get("report") or {}), execution=ex)


def requests_of(st: SkillsSettings) -> pa.Table:
    pr = st.prompts
    return K.skill_prompts(pr["sizes"], pr["objects"], pr["counts"], pr["relations"], pr["templates"],
                           pr["same_class_pairs"], st.generation.seed, pr["plurals"], pr["relation_words"])


# ------------------------------------------------------------------------------------ generation
def generation_plan(st: SkillsSettings, requests: pa.Table, save_images: bool) -> GenerationPlan:
    """Each skill prompt's image, its detections on the generator's device, the image saved."""
    det = st.detector
    head = Stage(ObjectDetector, {"model": det.model, "revision": det.revision,
                                  "record_threshold": det["record_threshold"], "batch_size": int(det["batch_size"]),
                                  "dtype": det.dtype})
    return GenerationPlan(requests, P.SKILL_IMAGES, ImageGenerator, ImageSink, heads=[head], key=P.IMAGE_ID,
                          save_images=save_images,
                          images_dir=FILES["images_dir"], what="generating and detecting")


# ------------------------------------------------------------------------------------ the study
class SkillsStudy(ImageStudy):
    """PaintSkills (paper 000, section 4.1) as a study of the engine's lifecycle."""

    name = "paper000-dalleval-skills"

    plan_of = staticmethod(generation_plan)

    def settings(self, args) -> SkillsSettings:
        st = settings(args)
        return dataclasses.replace(st, requests=requests_of(st))


    def announce(self, opts, st: SkillsSettings) -> None:
        sizes = st.prompts["sizes"]
        print(f"DALL-Eval PaintSkills: {sizes[P.Skill.OBJECT]:,} object + {sizes[P.Skill.COUNT]:,} count + "
              f"{sizes[P.Skill.SPATIAL]:,} spatial prompts ({st.prompts['template_set']} templates), one image "
              f"each per generator; detector {'a tiny stand-in' if opts.standin_models else st.detector.model} "
              f"at threshold {st.detector['threshold']:g}")

    def use_standins(self, opts, st: SkillsSettings, root: str) -> SkillsSettings:
        return dataclasses.replace(st, detector=st.detector.standin_at(
            build_tiny_detr(str(Path(root) / "detr-standin"), seed=0, favour=st.prompts["objects"])))

    def load_models(self, opts, st: SkillsSettings, gpu) -> list[dict]:
        det = st.detector
        bundle = load_object_detector(det.model, det.revision, device="cpu", dtype="float32")
        records = [{"role": "skill detector (zero-shot)", "model": det.model, "standin": opts.standin_models,
                    "detail": bundle.record}]
        del bundle
        return records


    def analyse(self, run: Run, generated: Generated) -> Outcome:
        st, rd = run.st, run.rd
        requests = st.requests
        images, phases = generated.images, generated.phases
        threshold = st.detector["threshold"]
        judged = K.judge(images, threshold, st.detector["object_rule"], st.detector["count_rule"])
        results = analyse(judged)
        headline = headline_section(run, judged)
        results = with_intervals(results, H.by_model(headline))
        out_fs, out = rd.fs, rd.path
        io.write_table_and_csv(judged, out_fs, f"{out}/{FILES['images']}")
        for key in ("accuracies", "table2", "splits", "tasks"):
            io.write_text(results[key].to_csv(index=False), out_fs, f"{out}/{FILES[key]}")
        save_images = run.options.save_images
        metrics = {
            "config": {"images": run.rd.job, "threshold": threshold,
                       "object_rule": st.detector["object_rule"], "count_rule": st.detector["count_rule"],
                       "execution": st.execution, **run.generation_config(), "detector_loaded": st.detector},
            "images": {"requested_per_generator": requests.num_rows, "rows": images.num_rows,
                       "judged": K.judged_counts(judged)},
            "results": {k: results[k].to_dict("records") for k in ("accuracies", "table2", "splits", "tasks")},
            "zero_shot_note": ZERO_SHOT,
            "headline": headline,
        }
        rows = generation_rows(judged, requests.num_rows, phases, detection_rows)
        return Outcome(metrics, rows, {"images": judged, "results": results, "save_images": save_images,
                                       "headline": headline})

    def report(self, run: Run, outcome: Outcome) -> None:
        st, rd, d = run.st, run.rd, outcome.data
        meta = {"run_id": rd.run_id, "output": rd.display(), "models": run.generator_models,
                "standin": run.options.standin_models, "detector": st.detector.record(),
                "templates": st.prompts["template_set"], "sizes": st.prompts["sizes"],
                "images_dir": FILES["images_dir"] if d["save_images"] else None,
                "examples": int(st.report.get("examples_per_skill", 6)), "headline": d["headline"]}
        html = report_skills.render_html(meta, d["images"], d["results"], run.models,
                                         figures=FigureDir(rd.fs, rd.path))
        io.write_text(html, rd.fs, f"{rd.path}/{FILES['report']}")
        print(K.format_table2(d["results"]["table2"]))
        print(ZERO_SHOT)
        if run.options.standin_models:
            print(STANDIN_CONSOLE)
        print(f"\nwrote {rd.display()}/: {FILES['report']}, {FILES['metrics']}, {FILES['images']}.parquet/.csv, "
              f"{FILES['accuracies']}, {FILES['table2']}, {FILES['splits']}, {FILES['tasks']}"
              + (f", {FILES['images_dir']}/" if d["save_images"] else ""))


ZERO_SHOT = ("Note: the detector is used zero-shot (COCO weights); the paper's DETR was fine-tuned on PaintSkills "
             "simulator images and its generators on PaintSkills too, so these accuracies are not the paper's "
             "Table 2 numbers.")


def run(args) -> dict:
    """`dalleval.py skills`."""
    return run_study(SkillsStudy(), args)


# ------------------------------------------------------------------------------------ measures
def analyse(judged: pa.Table) -> dict:
    accuracies = K.skill_accuracies(judged)
    return {"accuracies": accuracies, "table2": K.table2(accuracies), "splits": K.split_accuracies(judged),
            "tasks": K.task_accuracies(judged)}


def headline_section(run: Run, judged: pa.Table) -> dict:
    """metrics.json's ``headline`` (and headline_units.parquet): per generator, each skill's accuracy
    and their average (Table 2) over the judged prompts, each with its interval."""
    units = H.skill_units(judged)
    metrics = H.skill_metrics(units)
    requested = run.st.requests.num_rows
    judged_n = {m: int((units["model"] == m).sum()) for m in metrics}
    excluded = {m: {"not generated or not judged": requested - n} for m, n in judged_n.items()}
    subjects = H.subjects(metrics, run.models, judged_n, excluded)
    return HL.write(run.rd, H.SKILLS_STUDY, subjects, protocol(run.st), run.options.intervals,
                    run.options.standin_models)


def protocol(st: SkillsSettings) -> dict:
    """What two skills runs must share to be compared: the prompts, seeds, safety policy, detector
    and scoring rules (not the generators)."""
    gen, req = st.generation, st.requests
    prompts = [[i, p] for i, p in zip(req.column(P.PROMPT_ID).to_pylist(), req.column(PROMPT).to_pylist())]
    return {"paper": "000", "part": "PaintSkills (sections 3, 4.1)", "prompts": HL.protocol_digest(prompts),
            "sizes": dict(st.prompts["sizes"]), "template_set": st.prompts["template_set"], "images_per_prompt": 1,
            "seed": int(gen.seed), "safety": gen.safety.job(), "detector": H.model_protocol(st.detector)}


def with_intervals(results: dict, lookup: dict) -> dict:
    """``results`` with each headline accuracy's interval beside it (skill_accuracies.csv, Table 2)."""
    acc = results["accuracies"]
    bounds = [H.interval_of(lookup, m, H.accuracy_key(s)) for m, s in zip(acc["model"], acc["skill"])]
    return {**results, "accuracies": H.insert_interval(acc, "accuracy", bounds),
            "table2": H.table2_with_intervals(results["table2"], lookup)}


def detection_rows(phase, branch: str, gen_ok: pa.Table, ok: int, share: float) -> list[dict]:
    """Per skill: generated images in, judged images kept (every generated image is judged; a
    detector failure fails the batch, it is not dropped silently)."""
    rows = []
    for skill, c in K.judged_counts(gen_ok).items():
        if c["images"]:
            rows.append(stage_row(phase, branch, f"detect: {skill}", c["images"], c["judged"],
                                  {"not_judged": c["images"] - c["judged"]}, round(c["images"] * share)))
    return rows

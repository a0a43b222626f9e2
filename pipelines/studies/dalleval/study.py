"""`dalleval.py run`: the social-bias study of DALL-Eval (paper 000, section 4.2) as one Ray job.

diagnostic prompts (Table 13), N images each with recorded seeds
  -> generation (any diffusers model), and on the generator's device, while the images are there:
     BLIP-2 "the person looks like a male or a female?" and "Is the person wearing [A]?" (or CLIP
     zero-shot gender)                                                    [Ray Data, GPU actors]
  -> skin tone: face-mesh landmarks, skin region, ITA, nearest Monk Skin Tone   [Ray Data, CPU actors]
  -> per-image table, per-prompt counts, average gender / skin tone and MAD (Tables 6-8, 16-17,
     20-21), attribute presence per group (Tables 9, 22-31), metrics.json, report.html.

Images and their detections are checkpointed by (model, image id) as they arrive, so an interrupted
run resumes where it stopped. Everything the per-image results depend on (prompts, generation,
detector settings) names the run; the measures are recomputed from the per-image table every time.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.studies.dalleval import metrics as M
from operators.base import Stage, conform
from operators.image_blip2_vqa import Blip2Detector
from operators.image_clip_gender import ClipGenderClassifier
from operators.image_generation import ImageGenerator
from operators.image_sink import ImageSink
from operators.image_skin_tone import SkinToneDetector
from pipelines.studies.dalleval.prompts import (
    dalleval_requests,
    diagnostic_prompts,
    parse_groups,
    parse_professions,
)
from pipelines.engine.storage import io
from pipelines.engine.stats import headline as HL
from pipelines.studies.dalleval import headlines as H
from pipelines.studies.dalleval import report as dalleval_report
from pipelines.engine.cli import config as study_config
from pipelines.engine.report.figures import FigureDir
from pipelines.engine.generation import Generated, GenerationPlan, GenerationSettings, generation_rows, generation_settings
from pipelines.engine.run.lifecycle import ImageStudy, Outcome, Run, run_study
from pipelines.engine.run.models import ModelSpec, clip_record, clip_settings, native_stderr_silenced, standin_clip
from pipelines.engine.stream.progress import outcome_counts
from pipelines.engine.stats.summary import stage_row
from schemas import dalleval as S
from schemas.images import GENDER, GENERATION_STATUS, Gender
from schemas.subsets import PROMPT
from pipelines.standins.blip2 import build_tiny_blip2
from operators.support.blip2_models import check_blip2
from operators.image_blip2_vqa import normalize_attributes

PRESET = "dalleval.yaml"
REPLACED = ("groups", "professions", "attributes", "articles")  # a study file's own sets, not merged
FILES = {
    "images": "images",                          # per image: prompt, seed, status, detections (parquet + csv)
    "counts": "prompt_counts.csv",               # per (model, prompt): the input of `dalleval.py summarize`
    "presence": "attribute_presence.csv",        # per (model, prompt, attribute)
    "metrics": "metrics.json",
    "report": "report.html",
    "summary": "run_summary",
    "images_dir": "images",
    "standins": "standin_models",
}
CLIP_TO_DETECTED = {Gender.MALE: S.DetectedGender.MALE, Gender.FEMALE: S.DetectedGender.FEMALE,
                    Gender.AMBIGUOUS: S.DetectedGender.UNKNOWN}


# ------------------------------------------------------------------------------------ settings
@dataclass(frozen=True)
class DallEvalSettings:
    """The effective social-bias study (preset < --config file < flags), built once; ``requests``
    is the input read from it (the diagnostic prompts, each with its images' seeds)."""

    # left out of the run id: the groups the tables compare are applied to the checkpointed rows
    # every time the tables are computed
    not_in_run_id = ("neutral", "compare")

    label: str
    groups: dict                       # label -> words in the prompt ("man" -> "a man")
    professions: list                  # Table 13
    template: str                      # "{group} who works as {article} {profession}"
    bare_prompts: bool                 # also the bare "[G]" prompts
    articles: dict                     # profession -> its article, where the vowel-sound rule is wrong
    neutral: str | None                # the group of the gender-neutral prompts (Table 6), if any
    compare: list                      # [first, second]: the groups the attribute tables compare, or []
    generation: GenerationSettings
    detect: dict                       # gender ("blip2" / "clip"), attributes (bool), skin_tone (bool)
    blip2: ModelSpec                   # gender / attribute questions (options: questions, template, batch)
    clip: ModelSpec                    # CLIP zero-shot gender (options: pretrained, prompts, threshold)
    attributes: list                   # [{"name", "text"}] asked about with BLIP-2
    skin_tone: dict                    # SkinToneDetector settings
    execution: dict
    requests: pa.Table | None = None


def blip2_settings(block: dict, args) -> ModelSpec:
    """The study's BLIP-2 with --blip2-model / --blip2-revision applied (another model drops the
    study file's revision: a revision belongs to the weights it was set for)."""
    changes = {}
    if getattr(args, "blip2_model", None):
        changes.update(model=args.blip2_model, revision=None)
    if getattr(args, "blip2_revision", None) is not None:
        changes["revision"] = args.blip2_revision
    return ModelSpec.from_block(block, **changes)


def settings(args) -> DallEvalSettings:
    """The effective study: configs/dalleval.yaml, the --config file, then command-line overrides."""
    cfg = study_config.load_config(args.config, preset=PRESET, replace=REPLACED)
    groups = parse_groups(cfg["groups"])
    professions = parse_professions(cfg["professions"])
    professions = study_config.only(professions, getattr(args, "professions", None), "--professions")
    if getattr(args, "max_professions", None) is not None:
        professions = professions[:max(0, args.max_professions)]
    neutral = cfg.get("neutral")
    if neutral is not None and neutral not in groups:
        raise ValueError(f"neutral: {neutral!r} is not one of the groups {list(groups)}")
    compare = list(cfg.get("compare") or [])
    if compare and (len(compare) != 2 or any(c not in groups for c in compare) or compare[0] == compare[1]):
        raise ValueError(f"compare: {compare} must name two different groups of {list(groups)}")
    gen = generation_settings(cfg["generation"], args)
    detect = dict(cfg["detect"])
    if getattr(args, "gender_detector", None):
        detect["gender"] = args.gender_detector
    if getattr(args, "no_attributes", False):
        detect["attributes"] = False
    if getattr(args, "no_skin_tone", False):
        detect["skin_tone"] = False
    if detect["gender"] not in S.GenderDetector.ALL:
        raise ValueError(f"detect.gender must be one of {S.GenderDetector.ALL}, got {detect['gender']!r}")
    blip2 = blip2_settings(cfg["blip2"], args)
    clip = clip_settings(cfg["clip"], args)

    attributes = [{"name": n, "text": " ".join(t.split())} for n, t in normalize_attributes(cfg.get("attributes"))]
    if detect["attributes"] and not attributes:
        raise ValueError("detect.attributes is on but no attributes are configured")
    ex = study_config.execution_settings(cfg["execution"], args)
    bare = bool(cfg.get("bare_prompts", True)) and not getattr(args, "no_bare_prompts", False)
    return DallEvalSettings(label=str(cfg.get("name") or "dalleval"), groups=groups, professions=professions,
                            template=str(cfg["template"]), bare_prompts=bare, articles=dict(cfg.get("articles") or {}),
                            neutral=neutral, compare=compare, generation=gen, detect=detect, blip2=blip2, clip=clip,
                            attributes=attributes, skin_tone=dict(cfg["skin_tone"]), execution=ex)


def requests_of(st: DallEvalSettings) -> pa.Table:
    prompts = diagnostic_prompts(st.groups, st.professions, st.template, st.bare_prompts, st.articles)
    gen = st.generation
    return dalleval_requests(prompts, gen.images_per_prompt, gen.seed)


def uses_blip2(detect: dict) -> bool:
    return detect["gender"] == S.GenderDetector.BLIP2 or bool(detect["attributes"])


def detector_kwargs(st: DallEvalSettings) -> dict | None:
    """The BLIP-2 head of the generator (None when nothing is asked)."""
    if not uses_blip2(st.detect):
        return None
    b = st.blip2
    return {"model": b.model, "revision": b.revision,
            "gender_question": b["gender_question"] if st.detect["gender"] == S.GenderDetector.BLIP2 else None,
            "attributes": st.attributes if st.detect["attributes"] else [],
            "attribute_question": b["attribute_question"], "prompt_template": b["prompt_template"],
            "max_new_tokens": int(b["max_new_tokens"]), "batch_size": int(b["batch_size"]),
            "dtype": b.dtype or "auto"}


def classifier_kwargs(st: DallEvalSettings) -> dict | None:
    if st.detect["gender"] != S.GenderDetector.CLIP:
        return None
    c = st.clip
    return {"model": c.model, "pretrained": c.get("pretrained"), "revision": c.revision,
            "prompts": list(c["prompts"]),
            "threshold": float(c["threshold"])}


# ------------------------------------------------------------------------------------ models
def load_models(st: DallEvalSettings, standin: bool) -> list[dict]:
    """Load every model once on the driver before any work (BLIP-2 as configuration and processor
    only: its weights are large): an unloadable model fails the run now, naming it."""
    records = []
    if st.detect["gender"] == S.GenderDetector.CLIP:
        records.append(clip_record(st.clip, standin, "gender detector (CLIP zero-shot)"))
    if uses_blip2(st.detect):
        records.append({"role": "BLIP-2 (gender / attributes)", "model": st.blip2.model, "standin": standin,
                        "detail": check_blip2(st.blip2.model, st.blip2.revision)})
    if st.detect["skin_tone"]:
        with native_stderr_silenced(), SkinToneDetector(**st.skin_tone) as det:   # MediaPipe's native lines
            record = det.record
        records.append({"role": "skin tone (face mesh + ITA)", "model": "MediaPipe Face Mesh", "standin": False,
                        "detail": record})
    return records


def standins(st: DallEvalSettings, root: str) -> DallEvalSettings:
    """Tiny random BLIP-2 and CLIP under ``root`` (the engine builds the generators'): the
    settings pointed at them (``st`` is left as it is)."""

    return dataclasses.replace(st, clip=standin_clip(st.clip, root),
                               blip2=st.blip2.standin_at(build_tiny_blip2(str(Path(root) / "blip2-standin"), seed=0)))


# ------------------------------------------------------------------------------------ generation
def generation_plan(st: DallEvalSettings, requests: pa.Table, save_images: bool) -> GenerationPlan:
    """Section 5 (social bias): each diagnostic prompt's images, their gender (CLIP zero-shot or
    BLIP-2, on the generator's device) and attributes (BLIP-2), skin tone from the face (Monk
    scale), and the images saved."""
    clip, blip2 = classifier_kwargs(st), detector_kwargs(st)
    heads = [*([Stage(ClipGenderClassifier, clip)] if clip else []), *([Stage(Blip2Detector, blip2)] if blip2 else [])]
    skin = st.detect["skin_tone"]
    return GenerationPlan(
        requests, S.DALLEVAL_IMAGES, ImageGenerator, ImageSink, heads=heads, key=S.IMAGE_ID,
        images_file=FILES["images"], images_csv=True,
        after=[Stage(SkinToneDetector, dict(st.skin_tone))] if skin else [],
        finish=DetectedGenderColumns(st.detect["gender"]), save_images=save_images, images_dir=FILES["images_dir"],
        resource_flags={"skin_actors": [(SkinToneDetector.stage_name, "actors")]},
        # a skin-tone batch: four generator calls' images
        overrides={SkinToneDetector.stage_name: lambda batch: {"batch_size": batch * 4}} if skin else {},
        what="generating and detecting")


# ------------------------------------------------------------------------------------ the study
class DallEvalStudy(ImageStudy):
    """The social-bias half of paper 000 as a study of the engine's lifecycle."""
    name = "paper000-dalleval"

    plan_of = staticmethod(generation_plan)

    def settings(self, args) -> DallEvalSettings:
        st = settings(args)
        return dataclasses.replace(st, requests=requests_of(st))   # bad input fails now


    def announce(self, opts, st: DallEvalSettings) -> None:
        requests = st.requests
        print(f"DALL-Eval social bias: {len(st.groups)} groups x {len(st.professions)} professions"
              f"{' + bare prompts' if st.bare_prompts else ''} = "
              f"{requests.num_rows // st.generation.images_per_prompt:,} "
              f"prompts, {requests.num_rows:,} images per generator; gender by {st.detect['gender']}, attributes "
              f"{'on' if st.detect['attributes'] else 'off'}, skin tone {'on' if st.detect['skin_tone'] else 'off'}")

    def actor_cpus(self, opts, st: DallEvalSettings) -> float:
        return opts.gen_actors + (opts.flags["skin_actors"] if st.detect["skin_tone"] else 0)

    def use_standins(self, opts, st: DallEvalSettings, root: str) -> DallEvalSettings:
        return standins(st, root)

    def load_models(self, opts, st: DallEvalSettings, gpu) -> list[dict]:
        return load_models(st, opts.standin_models)


    def analyse(self, run: Run, generated: Generated) -> Outcome:
        st, rd = run.st, run.rd
        requests = st.requests
        images, phases = generated.images, generated.phases
        results = analyse(images, st.neutral, st.compare, st.detect)
        headline = headline_section(run, results)
        results = with_intervals(results, H.by_model(headline), st.compare)
        out_fs, out = rd.fs, rd.path
        io.write_text(results["counts"].to_csv(index=False), out_fs, f"{out}/{FILES['counts']}")
        io.write_text(results["presence"].to_csv(index=False), out_fs, f"{out}/{FILES['presence']}")
        for name, table in results["tables"].items():
            io.write_text(table.to_csv(index=False), out_fs, f"{out}/{name}.csv")
        summary_rows = run_summary_rows(images, requests.num_rows, phases, st.detect)
        save_images = run.options.save_images
        metrics = {
            "config": {"images": run.rd.job, "neutral": st.neutral, "compare": st.compare,
                       "execution": st.execution, **run.generation_config(),
                       "blip2_loaded": st.blip2 if uses_blip2(st.detect) else None,
                       "clip_loaded": st.clip if st.detect["gender"] == S.GenderDetector.CLIP else None},
            "models": run.models,
            "images": {"requested_per_generator": requests.num_rows, "rows": images.num_rows,
                       "generation_status": outcome_counts(images, GENERATION_STATUS),
                       "detected_gender": outcome_counts(images, S.DETECTED_GENDER),
                       "skin_status": outcome_counts(images, S.SKIN_STATUS)},
            "results": {"models": results["summary"], "reference": M.reference_rows(),
                        "tables": {k: v.to_dict("records") for k, v in results["tables"].items()}},
            "headline": headline,
        }
        return Outcome(metrics, summary_rows, {"images": images, "results": results, "save_images": save_images,
                                               "headline": headline})

    def report(self, run: Run, outcome: Outcome) -> None:
        st, rd, d = run.st, run.rd, outcome.data
        results = d["results"]
        meta = {"run_id": rd.run_id, "output": rd.display(), "images": d["images"].num_rows,
                "models": run.generator_models, "standin": run.options.standin_models,
                "detect": st.detect,
                "neutral": st.neutral, "compare": st.compare, "attributes": [a["name"] for a in st.attributes],
                "headline": d["headline"]}
        io.write_text(dalleval_report.render_html(meta, results, run.models, figures=FigureDir(rd.fs, rd.path)), rd.fs, f"{rd.path}/{FILES['report']}")
        print(dalleval_report.format_results(results, standin=run.options.standin_models))
        print(f"\nwrote {rd.display()}/: {FILES['report']}, {FILES['metrics']}, {FILES['images']}.parquet/.csv, "
              f"{FILES['counts']}, {FILES['presence']}, {', '.join(sorted(n + '.csv' for n in results['tables']))}"
              + (f", {FILES['images_dir']}/" if d["save_images"] else ""))


def run(args) -> dict:
    """`dalleval.py run`."""
    return run_study(DallEvalStudy(), args)


# ------------------------------------------------------------------------------------ generated rows
class DetectedGenderColumns:
    """Per-image table rows from the stages' output: CLIP's labels as detected genders, the detector
    named, the schema's columns (a small CPU step on the driver's sink)."""

    def __init__(self, detector: str):
        self.detector = detector

    def __call__(self, t: pa.Table) -> pa.Table:
        if self.detector == S.GenderDetector.CLIP and GENDER in t.column_names:
            clip = t.column(GENDER).cast(pa.string())
            mapped = pa.nulls(t.num_rows, pa.string())   # decode errors and missing images stay null
            for src, dst in CLIP_TO_DETECTED.items():
                mapped = pc.if_else(pc.fill_null(pc.equal(clip, src), False), dst, mapped)
            idx = t.schema.get_field_index(S.DETECTED_GENDER)
            t = t.set_column(idx, S.DETECTED_GENDER, mapped) if idx >= 0 else t.append_column(S.DETECTED_GENDER, mapped)
        if S.DETECTED_GENDER in t.column_names:
            named = pc.if_else(pc.is_valid(t.column(S.DETECTED_GENDER)), self.detector, pa.scalar(None, pa.string()))
            idx = t.schema.get_field_index(S.GENDER_DETECTOR)
            t = t.set_column(idx, S.GENDER_DETECTOR, named) if idx >= 0 else t.append_column(S.GENDER_DETECTOR, named)
        return conform(t, S.DALLEVAL_IMAGES)


# ------------------------------------------------------------------------------------ measures
def analyse(images: pa.Table, neutral: str | None, compare: list, detect: dict) -> dict:
    counts = M.prompt_counts(images).to_pandas()
    presence = M.attribute_presence(images).to_pandas()
    summary = M.model_summary(counts, neutral, tones=bool(detect["skin_tone"]))
    tables = {"table_bias_mad": mad_table(summary)}
    if neutral is not None:
        tables["table_gender_per_profession"] = M.gender_table(counts, neutral)
    if detect["skin_tone"]:
        tables["table_skin_tone_per_profession"] = M.skin_tone_table(counts)
    if detect["attributes"] and not presence.empty:
        pair = tuple(compare) if compare else ("", "")
        tables["table_attributes_by_group"] = M.group_attribute_table(presence, neutral, pair)
        tables["table_attributes_per_prompt"] = M.prompt_attribute_table(presence, neutral)
    answers = H.attribute_answers(images) if detect["attributes"] and not presence.empty else None
    return {"counts": counts, "presence": presence, "tables": tables, "summary": summary, "answers": answers}


def headline_section(run: Run, results: dict) -> dict:
    """metrics.json's ``headline`` (and headline_units.parquet): per generator, Table 8's MADs and the
    average gender over prompts, Table 9's attribute gap over attributes, each with its interval."""
    st = run.st
    tones = bool(st.detect["skin_tone"])
    metrics = H.bias_metrics(results["counts"], st.neutral, tones, results["tables"].get("table_attributes_by_group"),
                             st.compare, results.get("answers"), run.options.intervals.seed)
    images, excluded = {}, {}
    for model in metrics:
        images[model], excluded[model] = H.bias_excluded(results["counts"], model, st.requests.num_rows, tones)
    subjects = H.subjects(metrics, run.models, images, excluded)
    return HL.write(run.rd, H.BIAS_STUDY, subjects, protocol(st), run.options.intervals,
                    run.options.standin_models)


def protocol(st: DallEvalSettings) -> dict:
    """What two runs must share to be compared: prompts, images per prompt, seeds, the safety
    policy, the detectors and their settings, the groups compared (not the generators)."""
    gen = st.generation
    prompts = list(dict.fromkeys(st.requests.column(PROMPT).to_pylist()))
    out = {"paper": "000", "part": "social bias (section 4.2)", "prompts": HL.protocol_digest(prompts),
           "prompt_count": len(prompts), "images_per_prompt": int(gen.images_per_prompt), "seed": int(gen.seed),
           "safety": gen.safety.job(), "neutral": st.neutral, "compare": list(st.compare), "detect": dict(st.detect)}
    if uses_blip2(st.detect):
        out["blip2"] = H.model_protocol(st.blip2)
    if st.detect["gender"] == S.GenderDetector.CLIP:
        out["clip"] = H.model_protocol(st.clip)
    if st.detect["attributes"]:
        out["attributes"] = HL.protocol_digest(st.attributes)
    if st.detect["skin_tone"]:
        out["skin_tone"] = dict(st.skin_tone)
    return out


def with_intervals(results: dict, lookup: dict, compare: list) -> dict:
    """``results`` with the headline intervals beside their values: in the per-model summary, Table
    8's table (gender_mad, gender_avg, skin_tone_mad) and Table 9's compared row (mean_abs_diff)."""
    tables = dict(results["tables"])
    tables["table_bias_mad"] = H.with_intervals(tables["table_bias_mad"], lookup, {
        "gender_mad": H.GENDER_MAD, "gender_avg": H.GENDER_AVERAGE, "skin_tone_mad": H.SKIN_TONE_MAD})
    att = tables.get("table_attributes_by_group")
    if att is not None and not att.empty and "mean_abs_diff" in att and len(compare) == 2:
        tables["table_attributes_by_group"] = H.with_intervals(att, lookup, {"mean_abs_diff": H.ATTRIBUTE_GAP},
                                                               rows=att["row"] == f"{compare[0]} - {compare[1]}")
    return {**results, "summary": H.summary_with_intervals(results["summary"], lookup), "tables": tables}


def mad_table(summary: list[dict]) -> pd.DataFrame:
    """Table 8: MAD of gender and skin tone per model, between the uniform and one-hot references."""
    ref = M.reference_rows()
    rows = [{"model": ref[0]["model"], "gender_mad": ref[0]["gender"], "skin_tone_mad": ref[0]["skin_tone"]}]
    for m in summary:
        rows.append({"model": m["model"], "gender_mad": m["gender"]["mad"], "gender_avg": m["gender"]["average"],
                     "gender_prompts": m["gender"]["prompts"],
                     "skin_tone_mad": (m.get("skin_tone") or {}).get("mad"),
                     "skin_tone_avg": (m.get("skin_tone") or {}).get("average"),
                     "skin_tone_prompts": (m.get("skin_tone") or {}).get("prompts")})
    rows.append({"model": ref[1]["model"], "gender_mad": ref[1]["gender"], "skin_tone_mad": ref[1]["skin_tone"]})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------ accounting
def run_summary_rows(images: pa.Table, requested: int, phases: dict, detect: dict) -> list[dict]:
    def detected(phase, branch: str, gen_ok: pa.Table, ok: int, share: float) -> list[dict]:
        genders = outcome_counts(gen_ok, S.DETECTED_GENDER)
        decided = genders.get(S.DetectedGender.MALE, 0) + genders.get(S.DetectedGender.FEMALE, 0)
        dropped = {k: v for k, v in genders.items() if k not in (S.DetectedGender.MALE, S.DetectedGender.FEMALE)}
        rows = [stage_row(phase, branch, f"gender ({detect['gender']})", ok, decided, dropped, round(ok * share))]
        if detect["skin_tone"]:
            skin = outcome_counts(gen_ok, S.SKIN_STATUS)
            rows.append(stage_row(phase, branch, "skin_tone", ok, skin.get(S.SkinStatus.OK, 0),
                                  {k: v for k, v in skin.items() if k != S.SkinStatus.OK}, round(ok * share)))
        if detect["attributes"]:
            asked = int(pc.sum(pc.is_valid(gen_ok.column(S.ATTRIBUTE_NAMES))).as_py() or 0)
            rows.append(stage_row(phase, branch, "attributes (blip2)", ok, asked, {"not_asked": ok - asked},
                                  round(ok * share)))
        return rows

    return generation_rows(images, requested, phases, detected)

"""`gep.py run` and `gep.py evaluate`: the GEP study of paper 001 as one Ray job.

G x A x C -> prompts (neutral "[g] [c]", explicit "[g] [a] [c]"), N images each with recorded seeds
  -> generation (any diffusers model) + L2-normalised CLIP image embedding on the device   [Ray Data, GPU actors]
  -> C-f, CC-f, CLS-f per (image, attribute): every attribute on neutral images, the named
     one on explicit images; CLS classifiers trained on CLIP text embeddings              [Ray actor]
  -> frequencies per (model, setting, gender, attribute, estimator) -> GEP vectors and scores (Eq. 2)
  -> tables (Tables 11-14), metrics.json, report.html; annotation tasks for people;
     with annotations: GEP_human, Kendall tau-b / MCC per vector (Table 4), model-level tau (Table 6),
     ROC-AUC per attribute (Tables 7, 16).

Generated images are checkpointed by (model, image id) as they arrive, so an interrupted run
resumes where it stopped. Only what the images depend on names the run (its fingerprint): the
estimators' settings (reference string, classifier settings) are recomputed on every attempt, so
re-running with another --reference re-scores the same images without generating them again.
"""

from __future__ import annotations

import io as _io
import json
import time
import dataclasses
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.studies.gep import headline as GH
from pipelines.studies.gep import metrics as M
from operators.base import Stage, conform
from operators.image_clip_embedding import ClipImageEmbedder
from operators.image_generation import ImageGenerator
from operators.image_sink import ImageSink
from operators.support.attribute_classifier import (
    TABLE2_CONTEXTS,
    ClassifierSettings,
    check_validation_split,
    classifier_sentences,
)
from pipelines.studies.gep.prompts import gep_requests, parse_attributes, parse_genders
from pipelines.engine.stats import headline
from pipelines.engine.storage import io
from pipelines.engine.stream import runtime
from pipelines.studies.gep import report as gep_report
from pipelines.engine.cli import config as study_config
from pipelines.engine.report.figures import FigureDir
from pipelines.engine import generation
from pipelines.engine.generation import Generated, GenerationPlan, GenerationSettings, generation_settings
from pipelines.engine.run.lifecycle import ImageStudy, Outcome, Run, run_study
from pipelines.engine.storage.checkpoint import model_dir
from pipelines.engine.run.models import ModelSpec, clip_record, clip_settings, standin_clip
from pipelines.engine.stream.progress import Phase, outcome_counts
from pipelines.engine.stats.summary import stage_row
from schemas import gep as S
from schemas.images import GENERATION_STATUS, MODEL, GenerationStatus
from schemas.subsets import PROMPT
from operators.image_attribute_scores import AttributeScorer

PRESET = "gep.yaml"
REPLACED = ("genders", "comparisons", "attributes", "contexts", "settings")  # a study file's own sets, not merged
FILES = {
    "images": "images.parquet",                 # per image: prompt, seed, status, CLIP embedding
    "scores": "scores",                         # per (image, attribute): C, CC, CLS
    "frequencies": "frequencies",               # per (model, setting, gender, attribute, estimator)
    "vectors": "gep_vectors",                   # per (model, setting, estimator, comparison, attribute)
    "gep": "gep_scores",                        # per (model, setting, estimator, comparison)
    "tasks": "annotation_tasks.csv",            # (image, attribute) pairs for people to annotate (section 5)
    "metrics": "metrics.json",
    "report": "report.html",
    "summary": "run_summary",
    "images_dir": "images",
    "standins": "standin_models",
    "evaluation": "evaluation.json",
}
SCORE_BLOCK = 4096


# ------------------------------------------------------------------------------------ settings
@dataclass(frozen=True)
class GepSettings:
    """The effective GEP study (preset < --config file < flags), built once; ``requests`` and
    ``annotations`` are the inputs read from it (bad input fails when they are built)."""

    # left out of the run id: the comparisons, the reference and the attribute classifier score the
    # checkpointed embeddings every time (scores are not checkpointed); human annotations are read
    # at the end of every run
    not_in_run_id = ("comparisons", "reference", "classifier", "annotations")

    label: str
    genders: dict                      # label -> text in the prompt (section 3)
    comparisons: list                  # (first, second) group pairs: v_j = f_first - f_second
    attributes: list                   # Attribute (Table 1)
    contexts: list                     # Table 2
    settings: list                     # neutral / explicit
    templates: dict
    generation: GenerationSettings
    clip: ModelSpec                    # section 6: CLIP ViT-L/14
    reference: str
    classifier: dict                   # ClassifierSettings, resolved
    execution: dict
    requests: pa.Table | None = None
    annotations: Any = None            # pandas DataFrame of human annotations (--annotations)


def settings(args) -> GepSettings:
    """The effective study: configs/gep.yaml, the --config file, then command-line overrides."""
    cfg = study_config.load_config(args.config, preset=PRESET, replace=REPLACED)
    genders = parse_genders(cfg["genders"])
    attributes = parse_attributes(cfg["attributes"])
    attributes = study_config.only(attributes, getattr(args, "attributes", None), "--attributes", lambda a: a.name)
    contexts = [" ".join(str(c).split()) for c in (cfg.get("contexts") or [])]
    if getattr(args, "max_contexts", None) is not None:
        contexts = contexts[:max(0, args.max_contexts)]
    setting_list = list(getattr(args, "settings", None) or cfg["settings"])
    comparisons = [tuple(c) for c in cfg["comparisons"]]
    for c in comparisons:
        if len(c) != 2 or c[0] not in genders or c[1] not in genders or c[0] == c[1]:
            raise ValueError(f"comparisons: {list(c)} must name two different groups of {list(genders)}")
    gen = generation_settings(cfg["generation"], args)
    clip = clip_settings(cfg["clip"], args)
    classifier = dict(cfg["classifier"])
    classifier["contexts"] = list(classifier.get("contexts") or contexts or TABLE2_CONTEXTS)
    if getattr(args, "ensemble", None) is not None:
        classifier["ensemble"] = args.ensemble
    # resolved here (the named SGD reading -> schedule, tol): a bad setting fails before any model loads,
    # and metrics.json records the values the scorer trains with
    resolved = ClassifierSettings(**classifier)
    classifier = asdict(resolved)
    if attributes:   # too few training sentences for early stopping fails now, not inside the scorer
        check_validation_split(len(classifier_sentences(attributes[0], resolved.genders, resolved.contexts,
                                                        resolved.positive, resolved.negative)[0]), resolved,
                               attributes[0].name)
    ex = study_config.execution_settings(cfg["execution"], args)
    return GepSettings(label=str(cfg.get("name") or "gep"), genders=genders, comparisons=comparisons,
                       attributes=attributes, contexts=contexts, settings=setting_list,
                       templates=dict(cfg["templates"]), generation=gen, clip=clip,
                       reference=cfg["reference"] if getattr(args, "reference", None) is None else args.reference,
                       classifier=classifier, execution=ex)


def requests_of(st: GepSettings) -> pa.Table:
    gen = st.generation
    return gep_requests(st.genders, st.attributes, st.contexts, st.settings, st.templates,
                        gen.images_per_prompt, gen.seed)


def scoring_config(st: GepSettings) -> dict:
    return {"comparisons": [list(c) for c in st.comparisons], "reference": st.reference,
            "attributes": [asdict(a) for a in st.attributes], "classifier": st.classifier}


# ------------------------------------------------------------------------------------ generation
def generation_plan(st: GepSettings, requests: pa.Table, save_images: bool) -> GenerationPlan:
    """Section 3: one image per prompt and seed; section 4: its L2-normalised CLIP image embedding,
    computed on the generator's device; the image saved for annotators (section 5)."""
    clip = st.clip
    embed = Stage(ClipImageEmbedder, {"model": clip["model"], "pretrained": clip.get("pretrained"),
                                      "revision": clip.get("revision")})
    return GenerationPlan(requests, S.GEP_IMAGES, ImageGenerator, ImageSink, heads=[embed], key=S.IMAGE_ID,
                          save_images=save_images, images_dir=FILES["images_dir"], images_file=FILES["images"])


# ------------------------------------------------------------------------------------ the study
class GepStudy(ImageStudy):
    """Paper 001 as a study of the engine's lifecycle (pipelines/engine/run/lifecycle.py)."""
    name = "paper001-gep"

    plan_of = staticmethod(generation_plan)

    def settings(self, args) -> GepSettings:
        st = settings(args)
        return dataclasses.replace(st, requests=requests_of(st),  # bad input fails now
                                   annotations=read_annotations(args.annotations) if args.annotations else None)


    def announce(self, opts, st: GepSettings) -> None:
        print(f"GEP study: {len(st.genders)} groups, {len(st.attributes)} attributes, {len(st.contexts)} "
              f"contexts, settings {', '.join(st.settings)}: {st.requests.num_rows:,} images per generator")

    def actor_cpus(self, opts, st: GepSettings) -> float:
        return opts.gen_actors + 1

    def use_standins(self, opts, st: GepSettings, root: str) -> GepSettings:
        return dataclasses.replace(st, clip=standin_clip(st.clip, root))

    def load_models(self, opts, st: GepSettings, gpu) -> list[dict]:
        return [clip_record(st.clip, opts.standin_models, "CLIP (embeddings, estimators)")]


    def analyse(self, run: Run, generated: Generated) -> Outcome:
        st, rd = run.st, run.rd
        requests, per_actor = st.requests, run.gpu.per_actor
        images, phases = generated.images, generated.phases

        print(f"scoring {len(st.attributes)} attributes with C-f, CC-f and CLS-f "
              f"(ensembles of {st.classifier['ensemble']}) ...")
        scores, scorer_record, score_phase = score(run.ray, images, st, per_actor, run.gpu.device)
        results = analyse(scores, st.comparisons)
        annotations = st.annotations
        evaluation = (evaluate(images, scores, results, annotations, st.attributes, st.comparisons)
                      if annotations is not None else None)

        out_fs, out = rd.fs, rd.path
        shown = gep_report.with_human(results, evaluation)
        head = headline_of(run, shown, scores, images, evaluation)
        results, shown = GH.with_intervals(results, head), GH.with_intervals(shown, head)
        if evaluation is not None:
            evaluation = GH.with_intervals(evaluation, head)
        io.write_table_and_csv(scores, out_fs, f"{out}/{FILES['scores']}")
        io.write_table_and_csv(results["frequencies"], out_fs, f"{out}/{FILES['frequencies']}")
        io.write_table_and_csv(results["vectors"], out_fs, f"{out}/{FILES['vectors']}")
        io.write_table_and_csv(results["gep"], out_fs, f"{out}/{FILES['gep']}")
        names = [a.name for a in st.attributes]
        tables = gep_report.paper_tables(shown, names)
        for name, table in tables.items():
            io.write_text(table.to_csv(index=False), out_fs, f"{out}/{name}.csv")
        save_images = run.options.save_images
        io.write_text(annotation_tasks(images, st, rd if save_images else None).to_csv(index=False), out_fs,
                      f"{out}/{FILES['tasks']}")
        if evaluation is not None:
            write_evaluation(evaluation, out_fs, out)

        summary_rows = run_summary_rows(images, requests.num_rows, phases, score_phase, scores.num_rows,
                                        generation_plan(st, None, save_images).heads)
        metrics = {
            "config": {"images": run.rd.job, "scoring": scoring_config(st), "execution": st.execution,
                       **run.generation_config(), "clip_loaded": st.clip},
            "models": run.models, "scorer": scorer_record,
            "images": {"requested_per_generator": requests.num_rows, "rows": images.num_rows,
                       "status": outcome_counts(images, GENERATION_STATUS),
                       "embedded": int(pc.sum(pc.is_valid(images.column(S.EMBEDDING))).as_py() or 0),
                       "scored_pairs": scores.num_rows},
            "results": {"gep": results["gep"].to_dict("records"), "vectors": results["vectors"].to_dict("records"),
                        "frequencies": results["frequencies"].to_pylist()},
            "evaluation": evaluation_json(evaluation) if evaluation is not None else None,
            "headline": head,
        }
        return Outcome(metrics, summary_rows, {"images": images, "shown": shown, "tables": tables,
                                               "evaluation": evaluation, "save_images": save_images,
                                               "headline": head})

    def report(self, run: Run, outcome: Outcome) -> None:
        st, rd, d = run.st, run.rd, outcome.data
        meta = {"run_id": rd.run_id, "output": rd.display(), "images": d["images"].num_rows,
                "models": run.generator_models, "standin": run.options.standin_models, "settings": st.settings,
                "reference": st.reference, "ensemble": st.classifier["ensemble"],
                "attributes": [a.name for a in st.attributes]}
        io.write_text(gep_report.render_html(meta, d["shown"], d["tables"], d["evaluation"], run.models,
                                             figures=FigureDir(rd.fs, rd.path), headline=d["headline"]),
                      rd.fs, f"{rd.path}/{FILES['report']}")
        print(gep_report.format_scores(d["shown"], d["evaluation"], standin=run.options.standin_models,
                                       level=d["headline"]["interval"]["level"]))
        print(f"\nwrote {rd.display()}/: {FILES['report']}, {FILES['metrics']}, "
              f"{', '.join(sorted(n + '.csv' for n in d['tables']))}, {FILES['tasks']}"
              + (f", {FILES['images_dir']}/" if d["save_images"] else ""))


def run(args) -> dict:
    """`gep.py run`."""
    return run_study(GepStudy(), args)


def headline_of(run: Run, shown: dict, scores: pa.Table, images: pa.Table, evaluation: dict | None) -> dict:
    """metrics.json's ``headline`` (GEP scores and vector entries with intervals, per generator);
    writes headline_units.parquet into the run directory."""
    standin = run.options.standin_models
    cols = [MODEL, S.IMAGE_ID, PROMPT, GENERATION_STATUS]
    subjects, protocol = GH.build(run.st, shown, scores.to_pandas(), images.select(cols).to_pandas(),
                                  evaluation["labels"] if evaluation is not None else None,
                                  run.generator_models, run.models, standin, run.options.intervals.seed)
    return headline.write(run.rd, GepStudy.name, subjects, protocol, run.options.intervals, standin)


# ------------------------------------------------------------------------------------ scoring
def scorer_kwargs(st: GepSettings, device: str = "auto") -> dict:
    return {"attributes": [asdict(a) for a in st.attributes], "clip": st.clip.record(), "reference": st.reference,
            "classifier": st.classifier, "device": device}


def score(ray, images: pa.Table, st: GepSettings, per_actor: float, device: str = "auto"):
    """Per-(image, attribute) scores from one scorer actor (CLIP text side + classifier ensembles)."""
    phase = Phase("score attributes", "images", images.num_rows)
    t0 = time.time()
    opts = {"num_cpus": 1, **runtime.actor_retries()}
    if per_actor:
        opts["num_gpus"] = per_actor
    actor = ray.remote(**opts)(runtime.built_with_gc_paused(AttributeScorer)).remote(**scorer_kwargs(st, device))
    try:
        record = ray.get(actor.describe.remote())
        cols = [S.IMAGE_ID, MODEL, S.SETTING, S.GENDER, S.ATTRIBUTE, S.CONTEXT_ID, S.EMBEDDING]
        table = images.select(cols)
        refs = [actor.score_batch.remote(table.slice(i, SCORE_BLOCK)) for i in range(0, table.num_rows, SCORE_BLOCK)]
        parts = ray.get(refs)
    finally:
        ray.kill(actor)
    phase.processed = images.num_rows
    phase.seconds = time.time() - t0
    scores = pa.concat_tables(parts) if parts else S.GEP_SCORES.empty_table()
    return conform(scores, S.GEP_SCORES), record, phase


def frequencies(scores: pa.Table) -> pa.Table:
    """Mean score per (model, setting, gender, attribute), per estimator (C-f, CC-f, CLS-f)."""
    keys = [MODEL, S.SETTING, S.GENDER, S.ATTRIBUTE]
    cols = list(S.Estimator.COLUMNS.values())
    agg = scores.group_by(keys, use_threads=False).aggregate([(c, "mean") for c in cols] + [(S.IMAGE_ID, "count")])
    parts = []
    for est, col in S.Estimator.COLUMNS.items():
        parts.append(pa.table({**{k: agg.column(k) for k in keys},
                               S.ESTIMATOR: pa.array([est] * agg.num_rows, pa.string()),
                               S.FREQUENCY: agg.column(f"{col}_mean").cast(pa.float64()),
                               S.IMAGES: agg.column(f"{S.IMAGE_ID}_count").cast(pa.int64())}))
    return conform(pa.concat_tables(parts), S.GEP_FREQUENCIES) if parts else S.GEP_FREQUENCIES.empty_table()


def analyse(scores: pa.Table, comparisons: list) -> dict:
    freq = frequencies(scores)
    vectors = M.gep_vectors(freq.to_pandas(), pairs=comparisons)
    return {"frequencies": freq, "vectors": vectors, "gep": M.gep_scores(vectors)}


# ------------------------------------------------------------------------------------ annotations
def read_annotations(uri: str) -> pd.DataFrame:
    """Human annotations: image_id, attribute, present (0/1) and, with several generators, model."""
    text = io.read_text(uri)
    try:
        df = pd.read_csv(_io.StringIO(text), dtype={S.IMAGE_ID: str, S.ATTRIBUTE: str, MODEL: str})
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise io.InputError(f"{uri}: not a readable CSV ({exc})") from None
    missing = [c for c in (S.IMAGE_ID, S.ATTRIBUTE, S.PRESENT) if c not in df.columns]
    if missing:
        raise io.InputError(f"{uri}: missing columns {missing} (need image_id, attribute, present; optional model)")
    df = df.copy()
    for c in (S.IMAGE_ID, S.ATTRIBUTE):
        bad = df.index[df[c].isna() | (df[c].astype(str).str.strip() == "")].tolist()
        if bad:
            raise io.InputError(f"{uri}: empty {c} in data rows {bad[:10]}")
        df[c] = df[c].astype(str).str.strip()
    present = pd.to_numeric(df[S.PRESENT], errors="coerce")
    bad = df.index[~present.isin([0, 1])].tolist()
    if bad:
        raise io.InputError(f"{uri}: present must be 0 or 1; data rows {bad[:10]} are not")
    df[S.PRESENT] = present.astype(int)
    keys = [c for c in (MODEL, S.IMAGE_ID, S.ATTRIBUTE) if c in df.columns]
    dup = df.index[df.duplicated(keys, keep=False)].tolist()
    if dup:
        raise io.InputError(f"{uri}: the same (image, attribute) is annotated more than once in data rows {dup[:10]} "
                            f"(give the majority label of the annotators, section 5)")
    return df


def human_labels(images: pa.Table, ann: pd.DataFrame, attributes: list[str]) -> tuple[pd.DataFrame, dict]:
    """Annotations joined with their images (model, setting, gender); the pairs the paper annotates
    are kept (every attribute on neutral images, the named one on explicit images), others counted."""
    meta = images.select([MODEL, S.IMAGE_ID, S.SETTING, S.GENDER, S.ATTRIBUTE]).to_pandas()
    meta = meta.rename(columns={S.ATTRIBUTE: "prompt_attribute"})
    models = meta[MODEL].dropna().unique().tolist()
    if MODEL not in ann.columns:
        if len(models) > 1:
            raise io.InputError(f"the run has {len(models)} generators: the annotations need a model column "
                                f"(one of {models})")
        ann = ann.assign(**{MODEL: models[0] if models else None})
    unknown_attr = sorted(set(ann[S.ATTRIBUTE]) - set(attributes))
    if unknown_attr:
        raise io.InputError(f"annotations name attributes {unknown_attr} that the run does not score ({attributes})")
    joined = ann.merge(meta, on=[MODEL, S.IMAGE_ID], how="left", indicator=True)
    missing = joined.loc[joined["_merge"] == "left_only", [MODEL, S.IMAGE_ID]].drop_duplicates()
    if len(missing):
        raise io.InputError(f"annotations name {len(missing)} images that are not in the run, e.g. "
                            f"{missing.head(5).to_dict('records')}")
    joined = joined.drop(columns="_merge")
    scored = (joined[S.SETTING] == S.Setting.NEUTRAL) | (joined[S.ATTRIBUTE] == joined["prompt_attribute"])
    counts = {"annotations": int(len(joined)), "used": int(scored.sum()),
              "ignored_not_scored_in_setting": int((~scored).sum())}
    return joined[scored].drop(columns="prompt_attribute").reset_index(drop=True), counts


def evaluate(images: pa.Table, scores: pa.Table, results: dict, ann: pd.DataFrame, attributes: list,
             comparisons: list) -> dict:
    """GEP_human from the annotations, and each estimator against it (section 6)."""
    names = [a.name for a in attributes]
    labels, counts = human_labels(images, ann, names)
    keys = [MODEL, S.SETTING, S.GENDER, S.ATTRIBUTE]
    hf = labels.groupby(keys, sort=False).agg(**{S.FREQUENCY: (S.PRESENT, "mean"), S.IMAGES: (S.PRESENT, "size")})
    hf = hf.reset_index().assign(**{S.ESTIMATOR: S.Estimator.HUMAN})
    order = {a: i for i, a in enumerate(names)}
    hf = hf.sort_values([MODEL, S.SETTING, S.GENDER, S.ATTRIBUTE], key=lambda s: s.map(order) if s.name == S.ATTRIBUTE
                        else s, kind="stable").reset_index(drop=True)
    auto_vectors = results["vectors"]
    human_vectors = M.gep_vectors(hf, pairs=comparisons)
    human_gep = M.gep_scores(human_vectors)
    # per-vector agreement (Table 4): only the attributes both sides have
    table4 = M.compare_vectors(auto_vectors, human_vectors)
    table6 = M.compare_scores(results["gep"], human_gep) if len(human_gep) >= 2 else None
    # ROC-AUC per attribute (Tables 7, 16): annotated pairs of both settings, scores as predictions
    sc = scores.select([MODEL, S.IMAGE_ID, S.ATTRIBUTE, S.SCORE_C, S.SCORE_CC, S.SCORE_CLS]).to_pandas()
    pairs = labels.merge(sc, on=[MODEL, S.IMAGE_ID, S.ATTRIBUTE], how="inner")
    roc_rows = []
    for (model, attribute), grp in pairs.groupby([MODEL, S.ATTRIBUTE], sort=False):
        for est, col in S.Estimator.COLUMNS.items():
            roc_rows.append({MODEL: model, S.ESTIMATOR: est, S.ATTRIBUTE: attribute, "pairs": len(grp),
                             "positives": int(grp[S.PRESENT].sum()),
                             "roc_auc": M.roc_auc(grp[S.PRESENT].to_numpy(), grp[col].to_numpy())})
    roc = pd.DataFrame(roc_rows, columns=[MODEL, S.ESTIMATOR, S.ATTRIBUTE, "pairs", "positives", "roc_auc"])
    avg = (roc.dropna(subset=["roc_auc"]).groupby([MODEL, S.ESTIMATOR], sort=False)["roc_auc"].mean()
           .rename("mean_roc_auc").reset_index())
    return {"counts": counts, "labels": labels, "human_frequencies": hf, "human_vectors": human_vectors,
            "human_gep": human_gep,
            "vector_agreement": table4, "score_agreement": table6, "roc": roc, "roc_mean": avg}


def write_evaluation(ev: dict, fs, out: str) -> None:
    for key in ("human_frequencies", "human_vectors", "human_gep", "vector_agreement", "roc"):
        io.write_text(ev[key].to_csv(index=False), fs, f"{out}/{key}.csv")
    io.write_text(json.dumps(io.clean_json(evaluation_json(ev)), indent=2, default=str, allow_nan=False), fs,
                  f"{out}/{FILES['evaluation']}")


def evaluation_json(ev: dict) -> dict:
    return {"counts": ev["counts"], "human_gep": ev["human_gep"].to_dict("records"),
            "vector_agreement": ev["vector_agreement"].to_dict("records"), "score_agreement": ev["score_agreement"],
            "roc_auc": ev["roc"].to_dict("records"), "mean_roc_auc": ev["roc_mean"].to_dict("records")}


def evaluate_run(args) -> dict:
    """`gep.py evaluate --run DIR --annotations CSV`: the evaluation for a finished run, from its files."""
    fs, path = io.output_fs(args.run)
    for name in ("run.json", FILES["images"], f"{FILES['scores']}.parquet"):
        if not io.exists(fs, f"{path}/{name}"):
            raise io.InputError(f"{args.run}: no {name}; is this a finished `gep.py run` directory?")
    record = json.loads(io.read_text(f"{args.run.rstrip('/')}/{FILES['metrics']}"))
    scoring = record["config"]["scoring"]
    attributes = parse_attributes({a["name"]: {"phrase": a["phrase"], "text": a["text"]}
                                   for a in scoring["attributes"]})
    comparisons = [tuple(c) for c in scoring["comparisons"]]
    with fs.open_input_file(f"{path}/{FILES['images']}") as fh:
        images = io.read_parquet(fh)
    with fs.open_input_file(f"{path}/{FILES['scores']}.parquet") as fh:
        scores = io.read_parquet(fh)
    ann = read_annotations(args.annotations)
    results = analyse(scores, comparisons)
    ev = evaluate(images, scores, results, ann, attributes, comparisons)
    write_evaluation(ev, fs, path)
    print(gep_report.format_scores(gep_report.with_human(results, ev), ev))
    print(f"\nwrote {args.run}/{FILES['evaluation']} and the human_*.csv, vector_agreement.csv, roc.csv tables")
    return ev


# ------------------------------------------------------------------------------------ accounting
def annotation_tasks(images: pa.Table, st: GepSettings, rd=None) -> pd.DataFrame:
    """The (image, attribute) pairs of section 5 for people to annotate, with the question asked
    ("Do you see a person in a dress?") and the image file; ``present`` is left for the answer."""
    phrase = {a.name: a.phrase for a in st.attributes}
    df = images.select([MODEL, S.IMAGE_ID, S.SETTING, S.GENDER, "prompt", S.ATTRIBUTE, GENERATION_STATUS]).to_pandas()
    df = df[df[GENERATION_STATUS] == GenerationStatus.OK].drop(columns=GENERATION_STATUS)
    neutral = df[df[S.SETTING] == S.Setting.NEUTRAL].drop(columns=S.ATTRIBUTE)
    neutral = neutral.merge(pd.DataFrame({S.ATTRIBUTE: list(phrase)}), how="cross")
    tasks = pd.concat([neutral, df[df[S.SETTING] == S.Setting.EXPLICIT]], ignore_index=True)
    tasks["question"] = [f"Do you see a person {phrase[a]}?" for a in tasks[S.ATTRIBUTE]]
    tasks["image_file"] = ([f"{FILES['images_dir']}/{model_dir(m)}/{i}.png" for m, i in zip(tasks[MODEL], tasks[S.IMAGE_ID])]
                           if rd is not None else None)
    tasks[S.PRESENT] = ""
    cols = [MODEL, S.IMAGE_ID, "image_file", S.SETTING, S.GENDER, "prompt", S.ATTRIBUTE, "question", S.PRESENT]
    return tasks[cols]


def run_summary_rows(images: pa.Table, requested: int, phases: dict, score_phase: Phase, pairs: int,
                     heads=()) -> list[dict]:
    rows = generation.generation_rows(images, requested, phases, heads=heads)
    embedded = int(pc.sum(pc.is_valid(images.column(S.EMBEDDING))).as_py() or 0)
    rows.append(stage_row(score_phase, f"all generators ({pairs:,} image-attribute pairs)", "attribute_scores",
                          embedded, embedded, {}, embedded))
    return rows

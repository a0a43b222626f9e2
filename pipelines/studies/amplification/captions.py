"""The caption side of paper 002 (`amplification.py captions`, and the first phase of `run`).

LAION captions -> validate -> occupation match -> gender words -> person names -> one row per
(caption, occupation) -> SBERT similarity to the occupation's prompts, streamed in resumable
shards of input files; then the training subsets (naive, no indicators, NN, NN + no indicators;
sections 4 and 5) by a partial top-k reduction, and the per-occupation summaries.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import numpy as np
import pyarrow.compute as pc

from operators.base import Stage, conform
from operators.text_caption_normaliser import CONTROL_CHARACTERS, INVISIBLE_CHARACTERS, CaptionNormaliser
from operators.text_caption_validator import CaptionValidator, holds_text
from operators.text_gender_words import GenderWordIndicators
from operators.text_name_gender import NER_RUN, NER_SKIPPED, STAGE_NAMES, NameGenderIndicators, load_spacy
from operators.text_occupation_explode import OccupationExploder
from operators.text_occupation_matcher import OccupationMatcher
from operators.support.sbert_openvino import version as openvino_version
from operators.text_prompt_similarity import (SBERT_ENCODED, SBERT_FOLDED, TORCH_BACKENDS, PromptSimilarity, lean_loader,
                                              load_sentence_transformer, sbert_backend, sbert_loader, sbert_provenance)
from pipelines.engine import config as study_config
from pipelines.engine import io, rundir, runtime, scan, stages
from pipelines.engine import shards as engine_shards
from pipelines.engine.lifecycle import Outcome, Run, run_study
from pipelines.engine.models import ModelSpec
from pipelines.engine.progress import ErrorBudget, ErrorBudgetExceeded, Phase, drain
from pipelines.engine.summary import (
    CountMismatch,
    check_chain,
    format_summary,
    outcomes_by_stage,
    stage_counts,
    summarize,
    summary_rows_captions,
)
from pipelines.studies.amplification import caption_report as report
from pipelines.studies.amplification import jobs, refine
from pipelines.studies.amplification.prompts import prompt_table
from pipelines.studies.amplification.selection import SelectionConfig, partial_top_k, pool as selection_pool, walk
from schemas import captions as C
from schemas.occupations import OCCUPATION_FORMS
from schemas.subsets import DUPLICATE_ROW, DUPLICATE_URL, MATCHED_CAPTIONS, SELECTION_INPUT, TRAINING_SUBSETS

# the installed project, also when `ray submit` runs a copy of this script outside the repository
REPO = Path(study_config.__file__).resolve().parents[2]
SAMPLE_INPUT = REPO / "data" / "synthetic" / "laion_synthetic_sample.parquet"

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

    occupations: list                  # Occupation (Table 1's occupations, or the job's)
    occupation_forms: str              # plural / singular / both (section 3)
    prompts: list                      # Table 1 prompt templates
    gender_indicators: dict            # App. A.5's word lists, names (spaCy), NER prefilter
    selection: dict                    # section 4: sample_size, nn_k, seed, no_indicator_mode, walks
    sbert: ModelSpec                   # section 5.2's SBERT (option: precision)
    execution: dict
    config: dict                       # the whole effective configuration file (recorded)
    label: str
    input: tuple | None = None         # (CaptionInput, columns, text column)

    @property
    def models(self) -> dict:
        """The ``models`` block as the study file writes it (fingerprinted and recorded)."""
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


def caption_job(args, st: CaptionSettings, inp, columns: dict) -> dict:
    """Everything the caption side's results depend on (its fingerprint names the run)."""
    return {
        "study": "paper002-amplification", "command": args.command,
        # what identifies each file's data, not only its name and rows: a file rewritten in place
        # gets a run of its own (or, under the same --run-id, a refusal), never the old results
        "input": {"files": [inp.display(f) for f in inp.files], "rows": inp.num_rows,
                  "data": inp.data_identity()}, "columns": columns,
        "occupations": [jobs.occupation_spec(o) for o in st.occupations],
        "occupation_forms": st.occupation_forms, "prompts": st.prompts,
        "gender_indicators": st.gender_indicators | {"names_enabled": not args.no_names},
        "selection": st.selection, "models": st.models,
    }


# annotated captions up to this many are selected in the driver process (select_subsets_local),
# more through Ray Data (select_subsets); execution.local_selection_rows (configs/paper002.yaml) sets it
LOCAL_SELECTION_ROWS = 1_000_000

CAPTION_TALLIES = "caption_tallies"
TALLY_SCHEMA = engine_shards.TALLY_SCHEMA
CAPTION_FAILURES = (C.DROP_NULL, C.DROP_EMPTY, C.DROP_NON_TEXT)


def caption_shards(run: rundir.RunDir, inp, files_per_shard: int) -> list[list[str]]:
    """The input files in shards of ``files_per_shard``, fixed when the run starts (recorded)."""
    n = max(1, int(files_per_shard))
    return run.plan("caption_shards", [inp.files[i:i + n] for i in range(0, len(inp.files), n)])


def scan_shards(ray, run: rundir.RunDir, inp, columns: dict, annotated_schema: pa.Schema, schema: pa.Schema,
                st: CaptionSettings, args) -> tuple[Phase, ErrorBudget, pa.Table]:
    """The caption scan, one shard of input files at a time. A finished shard is marked done and
    skipped on resume; an unfinished one is cleared and scanned again.

    Crash safety: sink tasks write their parts atomically and report them; the driver commits a
    shard (keeps the parts it received, deletes what retried or killed attempts left, writes the
    shard's tallies under a fixed name) and only then writes the done marker, which lists the parts:
    a crash at any point leaves a shard that is either done and exact, or redone on resume (the
    protocol is the engine's: pipelines/engine/shards.py)."""
    ex = st.execution
    shards = caption_shards(run, inp, ex["files_per_shard"])
    if sorted(f for sh in shards for f in sh) != sorted(inp.files):
        raise io.InputError(f"the input files differ from those this run started with ({run.display('run.json')})")
    rows_of = dict(zip(inp.files, inp.row_counts))
    phase = Phase("caption scan", "captions", inp.num_rows)
    budget = ErrorBudget(C.STAGE_CAPTIONS, {}, float(ex["max_error_rate"]), int(ex["error_budget_min_rows"]))
    attempt: list[pa.Table] = []
    stats: list[str] = []  # Ray Data's per-operator statistics of each shard scanned in this attempt
    for i, files in enumerate(shards):
        name = f"captions/shard-{i:05d}"
        shard_rows = sum(rows_of[f] for f in files)
        if run.done(name):
            phase.reused += shard_rows
            done = run.read_part(CAPTION_TALLIES, f"shard-{i:05d}", TALLY_SCHEMA)
            if done is not None:   # the budget counts every attempt's rows, as the stage counts do
                _TallyBudget(budget).add(done)
            continue
        print(f"caption shard {i + 1}/{len(shards)}: {len(files)} file(s), {shard_rows:,} rows ...")
        data_dir = f"{run.file(FILES['annotated'])}/shard-{i:05d}"
        run.clear(data_dir)
        ds = caption_stream(ray, inp.subset(files), columns, schema, st, args)
        ds = runtime.map_batches(ds, engine_shards.write_part_task, runtime.task_retries(), batch_format="pyarrow",
                                 num_cpus=1,
                                 fn_args=(run.fs, data_dir, annotated_schema))
        parts: list[pa.Table] = []
        sink_budget = _TallyBudget(budget)
        before = phase.seconds
        try:
            drain(ds, parts.append, phase, budgets=[sink_budget], flush_rows=1, echo=_echo(args), count=_captions_read)
        except Exception as exc:  # a file with corrupt data pages: name it and the cause, not a crashed worker
            bad = io.unreadable_input(exc, inp.subset(files), _read_columns(columns))
            if bad is None:
                raise
            raise bad from None
        if phase.ray_stats:
            stats.append(f"===== caption shard {i + 1}/{len(shards)}: {len(files)} file(s), {shard_rows:,} rows, "
                         f"{phase.seconds - before:.1f} s =====\n{phase.ray_stats}")
        shard_tallies = pa.concat_tables(parts) if parts else TALLY_SCHEMA.empty_table()
        attempt.append(engine_shards.commit_shard(
            run, name, data_dir, shard_tallies, {"files": [inp.display(f) for f in files], "rows": shard_rows},
            CAPTION_TALLIES, key=f"shard-{i:05d}"))
    if stats:  # where the scan's time went, per operator (informative; rewritten by every attempt that scans)
        io.write_text("\n\n".join(stats) + "\n", run.fs, run.file(FILES["ray_stats"]))
    return phase, budget, pa.concat_tables(attempt) if attempt else TALLY_SCHEMA.empty_table()


class _TallyBudget:
    """The caption validator's error budget, fed from tally rows (the stream carries counts): a
    ``progress.Budget``."""

    def __init__(self, budget: ErrorBudget):
        self.budget = budget

    def add(self, tallies: pa.Table) -> None:
        """Count a block of tally rows: a block holds one row per (stage, outcome) per scan
        fragment, so the counts of one outcome are summed over its rows."""
        counts = outcomes_by_stage(stage_counts(tallies)).get(C.STAGE_CAPTIONS, {})
        self.budget.count(sum(counts.values()), {o: n for o, n in counts.items() if o in CAPTION_FAILURES})

    def check(self, final: bool = False) -> None:
        self.budget.check(final)


def _captions_read(tallies: pa.Table) -> int:
    """Input captions a block of tally rows accounts for (the validator sees every row once)."""
    mask = pc.equal(tallies.column(C.TALLY_STAGE), C.STAGE_CAPTIONS)
    return int(pc.sum(tallies.column(C.TALLY_COUNT).filter(mask)).as_py() or 0)


def shard_names(run: rundir.RunDir, shards: int) -> list[tuple[str, str]]:
    """[(done marker, data directory)] of each caption shard."""
    return [(f"captions/shard-{i:05d}", f"{run.file(FILES['annotated'])}/shard-{i:05d}") for i in range(shards)]


def committed_parts(run: rundir.RunDir, shards: int) -> list[str]:
    """The annotated-caption part files of every done shard, as their done markers list them."""
    return engine_shards.committed_parts(run, shard_names(run, shards))


def _echo(args):
    return runtime.progress_echo(bool(args.no_progress))


def _phase_record(phase: Phase) -> dict:
    return {"name": phase.name, "unit": phase.unit, "total": phase.total, "reused": phase.reused,
            "processed": phase.processed, "seconds": round(phase.seconds, 3),
            "rate_per_s": None if phase.rate is None else round(phase.rate, 3)}


def _read_columns(columns: dict) -> list[str]:
    return [c for c in (columns["text_column"], columns["url_column"], *columns["kept_columns"]) if c]


def caption_stages(st: CaptionSettings, args, columns: dict) -> list[Stage]:
    """Paper 002's caption side as a stage list, in the order of its method section."""
    gi, sbert = st.gender_indicators, st.sbert
    words = {k: gi[k] for k in ("male_words", "female_words", "male_pronouns", "female_pronouns")}
    return [
        # rows with a usable caption; null, empty and non-text captions are counted drops (section 3.2)
        Stage(CaptionValidator, {"text_column": columns["text_column"], "url_column": columns["url_column"]}),
        # control characters as spaces, invisible marks removed, so every later stage reads one text
        # (project choice, docs/method.md)
        Stage(CaptionNormaliser, {}),
        # captions naming an occupation of Table 4, whole words, regular plurals (sections 2.3, 3.2)
        # ("singular": the terms exactly as listed, --occupation-forms)
        Stage(OccupationMatcher, {"occupations": st.occupations, "forms": st.occupation_forms}),
        # explicit gender indicators: gendered words and pronouns (section 5.1, App. A.5)
        Stage(GenderWordIndicators, words),
        # person names whose first name gender-guesser knows (App. A.5); --no-names leaves them out
        *([] if args.no_names else [Stage(NameGenderIndicators, {
            "spacy_model": gi["spacy_model"], "count_mostly": gi["count_mostly_names"],
            "prefilter": bool(gi.get("ner_prefilter", True)),
            "skip_words": [t for o in st.occupations for t in o.forms()]})]),
        # one row per (caption, occupation), with a stable caption id and a seeded sampling key
        Stage(OccupationExploder, {"seed": st.selection["seed"]}),
        # SBERT cosine between each caption and its occupation's Table 1 prompts (section 5.2)
        Stage(PromptSimilarity, {"model": sbert.model, "revision": sbert.revision,
                                 "prompts": prompt_table(st.occupations, st.prompts), "device": args.device,
                                 "precision": sbert.get("precision", "auto"), "backend": sbert.get("backend", "auto"),
                                 "fold_duplicates": sbert_fold(st, args), "screen_occupations": screen_occupations(st)}),
    ]


# command-line flags that change a caption stage's resources (declared on the operators)
RESOURCE_FLAGS = {
    "scan_batch_size": [(CaptionValidator.stage_name, "batch_size"), (OccupationMatcher.stage_name, "batch_size")],
    "ner_actors": [(NameGenderIndicators.stage_name, "actors")],
    "embed_actors": [(PromptSimilarity.stage_name, "actors")],
    "embed_gpus": [(PromptSimilarity.stage_name, "num_gpus")],
}


def sbert_fold(st: CaptionSettings, args) -> str:
    """``--sbert-fold``, else ``execution.sbert_fold_duplicates`` (PromptSimilarity's ``fold_duplicates``)."""
    return getattr(args, "sbert_fold", None) or st.execution.get("sbert_fold_duplicates") or "tokens"


# project choice (issue 34): automatic SBERT pools get at most one actor per this many input rows
ROWS_PER_EMBED_ACTOR = 10_000


def embed_actors(args, st: CaptionSettings, ray=None) -> int | tuple[int, int]:
    """SBERT's actor pool: ``--embed-actors`` when given, else the configuration's
    ``execution.stages.prompt_similarity.actors``, else automatic (project choice, issue 34): with
    ``--embed-gpus`` one actor; on CPUs one actor per core of a local instance (each actor runs one
    torch thread; the encoder is the stream's slowest stage, and the scan and NER hand it their last
    rows early: docs/benchmarks.md), and on a cluster a pool that grows from 1 to the cluster's CPUs
    while captions queue. Either way one CPU of the instance is left to the scan and sink tasks
    besides the NER actors (a pool asking for more would never start), and there is at most one
    actor per ``ROWS_PER_EMBED_ACTOR`` input rows: an actor costs about 5 CPU-s to start, more than
    a small input's SBERT work gives it. ``ray`` None: before Ray starts (what sizes a local
    instance)."""
    if getattr(args, "embed_actors", None) is not None:
        return stages.pool_size(args.embed_actors)
    configured = ((st.execution or {}).get("stages") or {}).get(PromptSimilarity.stage_name, {}).get("actors")
    if configured is not None:
        return stages.pool_size(configured)
    if args.embed_gpus:
        return 1
    rows = st.input[0].num_rows if st.input is not None else None
    useful = max(1, -(-int(rows) // ROWS_PER_EMBED_ACTOR)) if rows is not None else None
    if ray is None:
        return min(runtime.local_cores(), useful or runtime.local_cores())
    free = int(ray.cluster_resources().get("CPU", 1)) - (0 if args.no_names else args.ner_actors) - 1
    free = max(1, min(free, useful or free))
    if runtime.is_local_instance():
        return min(runtime.local_cores(), free)
    return 1, free


def caption_stream(ray, inp, columns: dict, schema: pa.Schema, st: CaptionSettings, args):
    """The caption scan as one Ray Data stream: the stage list, with this run's resources. Its
    leading stateless stages (validate, occupation match, gender words) run inside the parquet
    read tasks (``scan.scan_parquet``): only the captions they keep leave a task."""
    pipeline = stages.configure(caption_stages(st, args, columns),
                                stages.overrides(st.execution, args, RESOURCE_FLAGS))
    n = scan.fusable(pipeline)
    cpus = int(ray.cluster_resources().get("CPU", 1))
    ds = scan.scan_parquet(ray, inp, _read_columns(columns), pipeline[:n], schema, fragment_rows(st, inp.num_rows, cpus))
    return stages.run(ds, pipeline[n:], schema)


def fragment_rows(st: CaptionSettings, rows: int, cpus: int) -> int:
    """Rows per scan task: ``execution.scan_fragment_rows``, or fewer for an input smaller than two
    such fragments per CPU, so that a small input (the bundled sample: one file) is still read by
    several tasks, and its matches reach NER and the SBERT actors in several blocks, not one block
    that a single SBERT actor works through while the others wait (project choice, issue 34). A
    fragment is whole row groups, so a file of one row group stays one task."""
    configured = int(st.execution.get("scan_fragment_rows") or scan.DEFAULT_FRAGMENT_ROWS)
    return max(1, min(configured, -(-int(rows) // (2 * max(1, int(cpus))))))


def selection_config(st: CaptionSettings) -> SelectionConfig:
    sel = st.selection
    if not float(sel.get("max_walk_factor", 20)) >= 1:
        raise ValueError(f"selection.max_walk_factor must be >= 1, not {sel.get('max_walk_factor')!r}")
    return SelectionConfig(sel["sample_size"], sel["nn_k"], len(st.prompts), sel["no_indicator_mode"],
                           training_sample=sel.get("training_sample", "captions"),
                           nn_sample=sel.get("nn_sample", "captions"), pool_factor=float(sel.get("pool_factor", 1)),
                           duplicates=sel.get("duplicates", "fold"))


def select_subsets(ray, data, annotated_rows: int, selection: SelectionConfig, prompts: dict, n_occupations: int):
    """The selection pool (``selection.pool``: every subset's first k rows, k from ``selection``,
    before the no-indicator split) by partial top-k per batch, merged per occupation; and
    per-occupation stats.

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
        .map_groups(selection_pool, fn_args=(selection, prompts), batch_format="pyarrow")
    )
    subsets = conform(pa.concat_tables(ray.get(subsets.to_arrow_refs())), TRAINING_SUBSETS)
    subsets = subsets.sort_by([(c, "ascending") for c in ("occupation", "subset", "prompt_id", "rank")])
    return subsets, occupation_stats(ray, data)


def select_subsets_local(table: pa.Table, selection: SelectionConfig, prompts: dict) -> tuple[pa.Table, pa.Table]:
    """``select_subsets`` in this process, for annotated captions that fit in memory: the same
    functions (partial top-k per 65,536 rows, then ``pool``; per-batch counts summed), so the
    same subsets and counts, without the start-up of two distributed Ray Data jobs and a shuffle
    (tens of seconds, whatever the size)."""
    if table.num_rows == 0:
        return TRAINING_SUBSETS.empty_table(), report.combine_occupation_stats([])
    step = 65536
    partials = pa.concat_tables([partial_top_k(table.slice(i, step), selection) for i in range(0, table.num_rows, step)])
    subsets = conform(selection_pool(partials, selection, prompts), TRAINING_SUBSETS)
    subsets = subsets.sort_by([(c, "ascending") for c in ("occupation", "subset", "prompt_id", "rank")])
    stats = report.combine_occupation_stats([report.partial_occupation_stats(
        table.select([C.OCCUPATION, C.CAPTION_GENDER]).slice(i, step)) for i in range(0, table.num_rows, step)])
    return subsets, stats


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


def validate_input(args, st: CaptionSettings | None = None):
    inp = io.resolve_parquet_inputs(args.captions, getattr(args, "input_identity", "footer"))
    choice = io.choose_input_columns(inp, args.caption_column, args.url_column,
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
    extras = [io.resolve_column(inp, c, "keep") for c in args.keep_columns]
    join = None
    if getattr(args, "shard_key", None):   # kept through the scan and the selection as join_key
        join = io.resolve_column(inp, args.shard_key, "join key", flag="--shard-key")
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


def load_caption_models(args, st: CaptionSettings) -> list[dict]:
    """Load spaCy and SBERT on the driver before any data is read; their provenance records."""
    records = []
    if not args.no_names:
        nlp = load_spacy(st.gender_indicators["spacy_model"])
        records.append({"role": "caption side (spacy)", "key": "spacy", "model": st.gender_indicators["spacy_model"],
                        "standin": False, "detail": {"model": st.gender_indicators["spacy_model"],
                                                     "name": nlp.meta.get("name"), "version": nlp.meta.get("version"),
                                                     "pipes": nlp.pipe_names}})
    sbert, revision = st.sbert.model, st.sbert.revision
    # openvino missing where a backend needs it: fails now
    backend = sbert_backend(st.sbert.get("backend", "auto"), on_gpu=False, screens=bool(screen_occupations(st)))
    # loaded here the way the actors will load it (on GPUs through sentence-transformers)
    model = load_sentence_transformer(sbert, revision, "cpu", lean=lean_loader(backend) and not sbert_on_gpus(args))
    records.append({"role": "caption side (sbert)", "key": "sbert", "model": sbert, "standin": False,
                    "detail": sbert_provenance(sbert, revision)   # the hub commit and sha256 of what loaded
                    | {"backend": backend, "loader": sbert_loader(model),
                       "openvino": openvino_version() if backend not in TORCH_BACKENDS or screen_occupations(st)
                       else None}
                    | ({"screened": screen_note(st)} if screen_occupations(st) else {})})
    return records


def caption_records(records: list[dict]) -> dict:
    """metrics.json's "models" of the caption side: {"spacy": ..., "sbert": ...}."""
    return {r["key"]: r["detail"] for r in records if r.get("key")}


def caption_side(run: Run, st: CaptionSettings, own_run: bool) -> tuple[dict, tuple]:
    """The caption side in an open run: scan (resumable shards), training subsets, summaries.
    Returns its metrics and what ``print_caption_side`` shows; ``own_run``: the `captions`
    subcommand (adds the run summary rows)."""
    args, rd, ray = run.args, run.rd, run.ray
    args.embed_actors = embed_actors(args, st, ray)   # recorded as resolved
    inp, columns, extra_fields = st.input
    selection = selection_config(st)
    annotated_schema = C.annotated_schema(extra_fields)
    phase, budget, attempt = scan_shards(ray, rd, inp, columns, annotated_schema, C.stream_schema(extra_fields),
                                         st, args)
    tallies = rd.read_parts(CAPTION_TALLIES, TALLY_SCHEMA)
    pool, stats, annotated_rows = select_pool(run, st, selection.pool())
    folded = duplicate_counts(run, st, pool, selection)
    subsets = walk(pool, selection)[0]   # the first k captions; `run` walks the pool to k counted images
    io.write_table(subsets, rd.fs, rd.file(FILES["subsets"]))
    if selection.walks:
        io.write_table(pool, rd.fs, rd.file(FILES["pool"]))
    sim = report.similarity_summary(stats, subsets, st.occupations)
    io.write_table_and_csv(sim, rd.fs, rd.file(FILES["similarity"]))

    counts = stage_counts(tallies)
    io.write_table_and_csv(counts, rd.fs, rd.file(FILES["counts"]))
    order = [s.name for s in caption_stages(st, args, columns)]  # the summary follows the stage list
    summary = summarize(counts, order)
    if summary[C.STAGE_CAPTIONS]["rows_in"] != inp.num_rows:
        raise CountMismatch(f"read {summary[C.STAGE_CAPTIONS]['rows_in']} rows, the files hold {inp.num_rows}")
    check_chain(summary, final_rows=annotated_rows, expansions=(C.STAGE_EXPLODE,))
    summary[STAGE_DUPLICATES] = folded   # after the chain: the selection's folded rows, per reason
    unmatched_occupations(sim)   # a warning naming them; none matching at all: an error (exit 2)

    sizes, head = report.subset_sizes(subsets), report.headline(sim)
    names = ner_counts(counts, st, args)
    encoded = sbert_counts(counts, st, args)
    metrics = {
        "stage": "captions",
        "attempt_summary": summarize(stage_counts(attempt), order),
        "input": {"paths": list(args.captions), "files": [inp.display(f) for f in inp.files], "rows": inp.num_rows,
                  **columns, "page_checksums": inp.checksum_record()},
        "output": rd.display(),
        "config": {
            "occupations": [o.__dict__ | {"forms": list(o.forms(st.occupation_forms == "plural"))}
                            for o in st.occupations],
            "occupation_forms": st.occupation_forms,
            "prompts": st.prompts,
            "gender_indicators": st.gender_indicators | {"names_enabled": not args.no_names},
            "selection": selection.as_dict() | {"seed": st.selection["seed"]},
            "models": st.models,
            "config_file": args.config or str(study_config.default_config_path()),
            "occupations_file": args.occupations_file,
            "execution": st.execution,
            "resources": {"scan_batch_size": args.scan_batch_size, "ner_actors": args.ner_actors,
                          "embed_actors": args.embed_actors, "embed_gpus": args.embed_gpus, "device": args.device},
            "stages": stages.describe(stages.configure(caption_stages(st, args, columns),
                                                       stages.overrides(st.execution, args, RESOURCE_FLAGS))),
        },
        "models": caption_records(run.models),
        "counts": summary,
        "caption_phase": _phase_record(phase),
        "error_budgets": [budget.as_dict()],
        "annotated_rows": annotated_rows,
        "names_ner": names,
        "sbert_encoded": encoded,
        # captions whose control or invisible characters were made spaces or removed (normalise_captions)
        "captions_normalised": {k: outcomes_by_stage(counts).get(C.STAGE_NORMALISE, {}).get(k, 0)
                                for k in (CONTROL_CHARACTERS, INVISIBLE_CHARACTERS)},
        # --sbert-backend screened: how the subsets were made exact (refine.exact_pool); the annotated
        # captions keep the bf16 screen's cosines
        "sbert_screen": run.records.get("sbert_screen"),
        # backend "auto": the occupations screened and the estimate behind it (refine.screen_plan)
        "sbert_screen_plan": st.sbert.get("screen_plan"),
        "subset_rows": sizes,
        "caption_headline": head,   # (the caption side's means; "headline" is the interval contract)
        "_stats": stats,   # the per-occupation stats, for `run` to summarise its walked subsets (popped there)
    }
    if own_run:
        metrics.pop("_stats")
        metrics["run_summary"] = summary_rows_captions(summary, phase, summarize(stage_counts(attempt), order))
    return metrics, (format_summary(summary), annotated_rows, subsets, sizes, head, names)


def unmatched_occupations(sim: pa.Table) -> list[str]:
    """The occupations no caption of the input names (a warning naming them); none matching at all
    is an error (a misspelt job, the wrong caption column, or a sample without them)."""
    counts = zip(sim.column(C.OCCUPATION).to_pylist(), sim.column(MATCHED_CAPTIONS).to_pylist())
    unmatched = [o for o, n in counts if not n]
    if not unmatched:
        return unmatched
    names = ", ".join(unmatched[:12]) + (f" and {len(unmatched) - 12} more" if len(unmatched) > 12 else "")
    if len(unmatched) == sim.num_rows:
        raise io.InputError(f"no caption of the input names any of the {sim.num_rows} occupation(s) ({names}): "
                            f"check their spelling, --occupation-forms, and the caption column (--caption-column)")
    print(f"warning: {len(unmatched)} of {sim.num_rows} occupation(s) match no caption of the input, so their "
          f"tables stay empty: {names} (check their spelling and --occupation-forms)")
    return unmatched


STAGE_DUPLICATES = "select_subsets"


def _url_rows(batch: pa.Table, keys: pa.Array) -> pa.Table:
    """The (occupation, url, caption_id) of the annotated rows whose occupation and URL are in
    ``keys`` (occupation and URL joined by U+001F)."""
    hit = pc.fill_null(pc.is_in(_occupation_url(batch), keys), False)
    return batch.filter(hit).select([C.OCCUPATION, C.URL, C.CAPTION_ID])


def duplicate_counts(run: Run, st: CaptionSettings, pool: pa.Table, selection: SelectionConfig) -> dict:
    """What folding repeated rows left out (``selection.DUPLICATES``), as a run-summary stage: of
    the annotated rows of an occupation whose URL is a selected row's, the rows beyond that one
    with the same caption (``duplicate_row``: same URL and caption, the same caption_id) and with
    another caption (``duplicate_url``). Exact: one pass over the annotated captions, keeping only
    the selected URLs' rows (a few per selected row). With ``keep`` nothing is folded."""
    keys = selected_keys(pool)
    if selection.duplicates != "fold" or not len(keys):
        return {"rows_in": len(keys), "rows_out": len(keys), "dropped": {DUPLICATE_ROW: 0, DUPLICATE_URL: 0}}
    rd = run.rd
    parts = committed_parts(rd, len(caption_shards(rd, st.input[0], st.execution["files_per_shard"])))
    schema = pa.schema([C.annotated_schema(st.input[2]).field(c) for c in (C.OCCUPATION, C.URL, C.CAPTION_ID)])
    return fold_counts([_url_rows(io.read_parquet_files(rd.fs, [p], schema), keys) for p in parts], schema)


def selected_keys(pool: pa.Table) -> pa.Array:
    """The distinct (occupation, URL) of a pool's rows with a URL, joined by U+001F."""
    return pc.unique(_occupation_url(pool.filter(pc.is_valid(pool.column(C.URL)))))


def _occupation_url(table: pa.Table) -> pa.ChunkedArray:
    """Each row's occupation and URL joined by U+001F (null where the URL is)."""
    return pc.binary_join_element_wise(table.column(C.OCCUPATION), table.column(C.URL), "\x1f")


def fold_counts(tables: list[pa.Table], schema: pa.Schema) -> dict:
    """The run-summary stage of ``duplicate_counts`` from the selected URLs' annotated rows."""
    rows = pa.concat_tables([schema.empty_table()] + [t.select(schema.names) for t in tables])
    out = {"rows_in": 0, "rows_out": 0, "dropped": {DUPLICATE_ROW: 0, DUPLICATE_URL: 0}}
    per = rows.group_by([C.OCCUPATION, C.URL], use_threads=False).aggregate(
        [(C.CAPTION_ID, "count"), (C.CAPTION_ID, "count_distinct")])
    n, distinct = (np.asarray(per.column(f"{C.CAPTION_ID}_{a}").to_numpy(), np.int64) for a in ("count", "count_distinct"))
    out["dropped"] = {DUPLICATE_ROW: int((n - distinct).sum()), DUPLICATE_URL: int((distinct - 1).sum())}
    out["rows_in"], out["rows_out"] = int(n.sum()), per.num_rows
    return out


def select_pool(run: Run, st: CaptionSettings, pool_cfg: SelectionConfig) -> tuple[pa.Table, pa.Table, int]:
    """The selection pool of the annotated captions the scan committed (``selection.pool``, k from
    ``pool_cfg``), the per-occupation stats and the annotated rows. The image side calls it again
    with a larger pool when a walk runs out of candidates."""
    rd, inp = run.rd, st.input[0]
    annotated_schema = C.annotated_schema(st.input[2])
    prompts = prompt_table(st.occupations, st.prompts)
    parts = committed_parts(rd, len(caption_shards(rd, inp, st.execution["files_per_shard"])))
    annotated_rows = io.count_parquet_rows(rd.fs, parts)
    if annotated_rows == 0:  # no caption named an occupation: still leave a readable (empty) table
        parts = [f"{rd.file(FILES['annotated'])}/part-0.parquet"]
        io.write_table(annotated_schema.empty_table(), rd.fs, parts[0])
    join = st.input[1].get("join_key")
    local = annotated_rows <= int(st.execution.get("local_selection_rows", LOCAL_SELECTION_ROWS))
    if local:
        # what matched fits in memory (20,000 rows per 4 M LAION-like captions): select here
        table = with_join_key(io.read_parquet_files(rd.fs, parts, annotated_schema), join)
        pool, stats = select_subsets_local(table, pool_cfg, prompts)

        def candidates_of(limits):
            return refine.candidate_rows(table, limits, pool_cfg)
    else:
        data = run.ray.data.read_parquet(parts, filesystem=rd.fs, schema=annotated_schema)
        if join:
            data = data.map_batches(with_join_key, fn_args=(join,), batch_format="pyarrow", batch_size=None)
        pool, stats = select_subsets(run.ray, data, annotated_rows, pool_cfg, prompts, len(st.occupations))

        def candidates_of(limits):   # a map over the annotated captions; only the candidates reach the driver
            found = data.map_batches(refine.candidate_rows, fn_args=(limits, pool_cfg), batch_format="pyarrow",
                                     batch_size=65536)
            return pa.concat_tables([SELECTION_INPUT.empty_table()] + run.ray.get(found.to_arrow_refs()))
    if screened(st, run.args) and annotated_rows:
        # what the driver selects in memory it encodes itself; a selection through Ray Data (LAION
        # scale: ~250,000 candidates) encodes them on SBERT actors
        exact = exact_stage(st, run.args)
        encode = (refine.exact_similarities(PromptSimilarity(**(dict(exact.kwargs) | {"device": "cpu"}))) if local
                  else exact_on_actors(run, exact))
        pool, record = refine.exact_pool(
            pool, pool_cfg, lambda rows: select_subsets_local(rows, pool_cfg, prompts)[0], candidates_of,
            encode, st.sbert.get("screen_margin"),
            screened_occupations=screen_occupations(st) if st.sbert.get("backend", "auto") == "auto" else None,
            memo=run.memo.setdefault("sbert_exact", {}))   # a walk's reselection encodes only new rows
        run.records["sbert_screen"] = record | {"annotated_rows": annotated_rows, "pool_rows": pool.num_rows,
                                                "share_re_encoded": round(record["re_encoded"] / annotated_rows, 6)}
    return pool, stats, annotated_rows


def sbert_on_gpus(args) -> bool:
    """Whether the stream's SBERT actors run on GPUs (``--embed-gpus``, or every model on cuda)."""
    return bool(getattr(args, "embed_gpus", 0)) or getattr(args, "device", None) == "cuda"


def screened(st: CaptionSettings, args) -> bool:
    """Whether the stream screened in bf16 (``--sbert-backend screened`` on CPU actors, or "auto"
    with occupations to screen), so that the selection takes its candidates again with exact
    cosines (``refine``)."""
    backend = st.sbert.get("backend", "auto")
    return not sbert_on_gpus(args) and (backend == "screened" or (backend == "auto" and bool(screen_occupations(st))))


def screen_occupations(st: CaptionSettings) -> list[str]:
    """The occupations backend "auto" screens in bf16 (``planned``; none before it ran, on GPUs
    and with any other backend)."""
    return list((st.sbert.get("screen_plan") or {}).get("screened") or [])


def screen_note(st: CaptionSettings) -> str:
    """What backend "auto" screened, as the report's model table and the console say it."""
    return (f"{len(screen_occupations(st))} of {len(st.occupations)} occupations screened in bf16, their subsets "
            f"made exact with torch fp32 (annotated_captions keep the screen's cosines for them)")


def planned(args, st: CaptionSettings) -> CaptionSettings:
    """``st`` (with its input) with the plan of backend "auto" in its SBERT options: which
    occupations to screen in bf16 (``refine.screen_plan``). On GPUs, and with any other backend,
    ``st`` unchanged."""
    if st.sbert.get("backend", "auto") != "auto" or sbert_on_gpus(args) or st.input is None:
        return st
    inp, columns, _ = st.input
    # the run's own validation and occupation match, as the scan runs them
    match = [s for s in caption_stages(st, args, columns) if s.op in (CaptionValidator, OccupationMatcher)]
    read = [c for c in (columns["text_column"], columns["url_column"]) if c]
    plan = refine.screen_plan(inp, read, match, [o.name for o in st.occupations], selection_config(st).pool(),
                              factor=st.sbert.get("screen_factor", refine.SCREEN_FACTOR),
                              min_rows=st.sbert.get("screen_min_rows", refine.SCREEN_MIN_ROWS))
    st = dataclasses.replace(st, sbert=dataclasses.replace(st.sbert, options={**st.sbert.options, "screen_plan": plan}))
    if plan["screened"]:
        where = {"all": "of", "spread": "spread over"}.get(plan["sampled_from"], "at the start of")
        print(f"  SBERT (auto): {screen_note(st)}; chosen from {plan['sampled_rows']:,} rows {where} the input: "
              f"at least {plan['factor']:g}x the {plan['pool_rows_per_occupation']:,} rows their pools can hold")
    return st


def exact_stage(st: CaptionSettings, args) -> Stage:
    """The stream's SBERT stage (its settings and resources, ``--embed-actors`` included) built with
    torch fp32: what encodes the screen's candidates again."""
    stage = stages.configure(caption_stages(st, args, st.input[1]),
                             stages.overrides(st.execution, args, RESOURCE_FLAGS))[-1]
    return dataclasses.replace(stage, kwargs=dict(stage.kwargs) | {"backend": "torch", "precision": "fp32"})


def exact_on_actors(run: Run, stage: Stage):
    """``encode`` for ``refine.exact_pool`` on an actor pool of ``stage`` (``exact_stage``): the rows
    with exact ``prompt_similarity`` (in any order; ``exact_pool`` matches them by row)."""
    def encode(rows: pa.Table) -> pa.Table:
        ds = runtime.from_table(run.ray, rows, stage.declared().batch_size)
        out = runtime.map_stage(ds, PromptSimilarity, dict(stage.kwargs), stage.declared())
        return pa.concat_tables([rows.slice(0, 0)] + [t.select(rows.column_names).cast(rows.schema)
                                                      for t in run.ray.get(out.to_arrow_refs())])
    return encode


def with_join_key(table: pa.Table, column: str | None) -> pa.Table:
    """``table`` with ``join_key``: the kept ``--shard-key`` column as text (int ids as their digits,
    as img2dataset's metadata holds them once cast); unchanged without one."""
    if not column:
        return table
    return table.append_column(C.JOIN_KEY, table.column(column).cast(pa.string()))


def sbert_counts(counts: pa.Table, st: CaptionSettings, args) -> dict:
    """How many (caption, occupation) rows SBERT embedded and how many reused the embedding of
    another row of their batch: the same input row, or the same token ids (``sbert_fold``), from
    the similarity stage's tallies."""
    c = outcomes_by_stage(counts).get(PromptSimilarity.stage_name, {})
    rows, encoded = c.get(C.OUTCOME_ROWS_IN, 0), c.get(SBERT_ENCODED, 0)
    return {"fold_duplicates": sbert_fold(st, args), "rows": rows, "encoded": encoded,
            "folded": c.get(SBERT_FOLDED, 0), "share_encoded": round(encoded / rows, 6) if rows else None}


def ner_counts(counts: pa.Table, st: CaptionSettings, args) -> dict | None:
    """How many matched captions spaCy ran on (all of them without the prefilter), from the
    person-name stage's tallies; None with --no-names."""
    if args.no_names:
        return None
    c = outcomes_by_stage(counts).get(STAGE_NAMES, {})
    captions, ran = c.get(C.OUTCOME_ROWS_IN, 0), c.get(NER_RUN, 0)
    return {"prefilter": bool(st.gender_indicators.get("ner_prefilter", True)), "captions": captions,
            "ner_run": ran, "ner_skipped": c.get(NER_SKIPPED, 0),
            "share_ner_run": round(ran / captions, 6) if captions else None}


def print_caption_side(rd, shown: tuple, brief: bool = False) -> None:
    summary_text, annotated_rows, subsets, sizes, head, names = shown
    report.print_caption_report(summary_text, rd.display(), annotated_rows, subsets, sizes, head, FILES, brief)
    if names and names["captions"]:
        how = ("only where a word is a first name gender-guesser knows; person_names is null elsewhere"
               if names["prefilter"] else "on every caption (--ner-all)")
        print(f"person names: spaCy NER ran on {names['ner_run']:,} of {names['captions']:,} matched captions "
              f"({100 * names['share_ner_run']:.1f}%), {how}")


class CaptionStudy:
    """`amplification.py captions`: the caption side alone, as a study of the engine's lifecycle."""

    name = "paper002-amplification"

    def settings(self, args) -> CaptionSettings:
        st = settings(args)
        # a missing or unreadable input fails now, before any model loads
        return planned(args, dataclasses.replace(st, input=validate_input(args, st)))

    def label(self, st: CaptionSettings) -> str:
        return st.label

    def job(self, args, st: CaptionSettings) -> dict:
        inp, columns, _ = st.input
        return caption_job(args, st, inp, columns)

    def announce(self, args, st: CaptionSettings) -> None:
        pass

    def gpu_models(self, args, st: CaptionSettings) -> bool:
        return False

    def actor_cpus(self, args, st: CaptionSettings) -> float:
        return runtime.pool_max(embed_actors(args, st)) + (0 if args.no_names else args.ner_actors)

    def use_standins(self, args, st: CaptionSettings, root: str) -> None:  # no stand-ins: spaCy and SBERT are real
        raise ValueError("the caption side has no stand-in models")

    def load_models(self, args, st: CaptionSettings, gpu) -> list[dict]:
        return load_caption_models(args, st)

    def execute(self, run: Run) -> Outcome:
        metrics, shown = caption_side(run, run.st, own_run=True)
        return Outcome(metrics, metrics.pop("run_summary"), {"shown": shown})

    def report(self, run: Run, outcome: Outcome) -> None:
        print_caption_side(run.rd, outcome.data["shown"])


def run_captions(args) -> dict:
    """`amplification.py captions`."""
    return run_study(CaptionStudy(), args)

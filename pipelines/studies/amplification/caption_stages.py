"""The caption side as a stage list (paper 002's method section, in order) and its resources: the
stages, the SBERT actor pool, the Ray Data stream that runs them over a scan of the input, the
plan of SBERT backend "auto", and the exact SBERT stage that encodes a screen's candidates again.
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

import pyarrow as pa

from operators.base import Stage
from operators.text_caption_normaliser import CaptionNormaliser
from operators.text_caption_validator import CaptionValidator
from operators.text_gender_words import GenderWordIndicators
from operators.text_name_gender import NameGenderIndicators
from operators.text_occupation_explode import OccupationExploder
from operators.text_occupation_matcher import OccupationMatcher
from operators.text_prompt_similarity import PromptSimilarity
from pipelines.engine.cli.options import RunOptions
from pipelines.engine.run.lifecycle import Run
from pipelines.engine.stream import runtime, scan, stages
from pipelines.studies.amplification import refine
from pipelines.studies.amplification.caption_settings import (CaptionSettings, read_columns, sbert_fold, sbert_on_gpus,
                                                             screen_note, screen_occupations, selection_config)
from pipelines.studies.amplification.prompts import prompt_table


def caption_stages(st: CaptionSettings, opts: RunOptions, columns: dict) -> list[Stage]:
    """Paper 002's caption side as a stage list, in the order of its method section (``opts``: the
    run's device and SBERT's folding of repeated rows)."""
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
        *([] if not st.names_enabled else [Stage(NameGenderIndicators, {
            "spacy_model": gi["spacy_model"], "count_mostly": gi["count_mostly_names"],
            "prefilter": bool(gi.get("ner_prefilter", True)),
            "skip_words": [t for o in st.occupations for t in o.forms()]})]),
        # one row per (caption, occupation), with a stable caption id and a seeded sampling key
        Stage(OccupationExploder, {"seed": st.selection["seed"]}),
        # SBERT cosine between each caption and its occupation's Table 1 prompts (section 5.2)
        Stage(PromptSimilarity, {"model": sbert.model, "revision": sbert.revision,
                                 "prompts": prompt_table(st.occupations, st.prompts), "device": opts.device,
                                 "precision": sbert.get("precision", "auto"), "backend": sbert.get("backend", "auto"),
                                 "fold_duplicates": sbert_fold(st, opts), "screen_occupations": screen_occupations(st)}),
    ]


# command-line flags that change a caption stage's resources (declared on the operators)
RESOURCE_FLAGS = {
    "scan_batch_size": [(CaptionValidator.stage_name, "batch_size"), (OccupationMatcher.stage_name, "batch_size")],
    "ner_actors": [(NameGenderIndicators.stage_name, "actors")],
    "embed_actors": [(PromptSimilarity.stage_name, "actors")],
    "embed_gpus": [(PromptSimilarity.stage_name, "num_gpus")],
}


def configured_stages(st: CaptionSettings, opts: RunOptions, columns: dict) -> list[Stage]:
    """The stage list with this run's resources: the configuration's ``execution.stages``, then
    the flags of ``RESOURCE_FLAGS``."""
    return stages.configure(caption_stages(st, opts, columns),
                            stages.overrides(st.execution, opts.flags, RESOURCE_FLAGS))


def with_embed_actors(opts: RunOptions, actors) -> RunOptions:
    """``opts`` with SBERT's actor pool resolved (``embed_actors``): what the scan's stages get and
    metrics.json records."""
    return dataclasses.replace(opts, flags=MappingProxyType({**opts.flags, "embed_actors": actors}))


# project choice: automatic SBERT pools get at most one actor per this many input rows
ROWS_PER_EMBED_ACTOR = 10_000


def embed_actors(opts: RunOptions, st: CaptionSettings, ray=None) -> int | tuple[int, int]:
    """SBERT's actor pool: ``--embed-actors`` when given, else the configuration's
    ``execution.stages.prompt_similarity.actors``, else automatic (project choice): with
    ``--embed-gpus`` one actor; on CPUs one actor per core of a local instance (each actor runs one
    torch thread; the encoder is the stream's slowest stage, and the scan and NER hand it their last
    rows early: docs/benchmarks.md), and on a cluster a pool that grows from 1 to the cluster's CPUs
    while captions queue. Either way one CPU of the instance is left to the scan and sink tasks
    besides the NER actors (a pool asking for more would never start), and there is at most one
    actor per ``ROWS_PER_EMBED_ACTOR`` input rows: an actor costs about 5 CPU-s to start, more than
    a small input's SBERT work gives it. ``ray`` None: before Ray starts (what sizes a local
    instance)."""
    if opts.flags.get("embed_actors") is not None:
        return stages.pool_size(opts.flags["embed_actors"])
    configured = ((st.execution or {}).get("stages") or {}).get(PromptSimilarity.stage_name, {}).get("actors")
    if configured is not None:
        return stages.pool_size(configured)
    if opts.flags.get("embed_gpus"):
        return 1
    rows = st.input[0].num_rows if st.input is not None else None
    useful = max(1, -(-int(rows) // ROWS_PER_EMBED_ACTOR)) if rows is not None else None
    if ray is None:
        return min(runtime.local_cores(), useful or runtime.local_cores())
    free = int(ray.cluster_resources().get("CPU", 1)) - (opts.flags["ner_actors"] if st.names_enabled else 0) - 1
    free = max(1, min(free, useful or free))
    if runtime.is_local_instance():
        return min(runtime.local_cores(), free)
    return 1, free


def caption_stream(ray, inp, columns: dict, schema: pa.Schema, st: CaptionSettings, opts: RunOptions):
    """The caption scan as one Ray Data stream: the stage list, with this run's resources. Its
    leading stateless stages (validate, occupation match, gender words) run inside the parquet
    read tasks (``scan.scan_parquet``): only the captions they keep leave a task."""
    pipeline = configured_stages(st, opts, columns)
    n = scan.fusable(pipeline)
    cpus = int(ray.cluster_resources().get("CPU", 1))
    ds = scan.scan_parquet(ray, inp, read_columns(columns), pipeline[:n], schema, fragment_rows(st, inp.num_rows, cpus))
    return stages.run(ds, pipeline[n:], schema)


def fragment_rows(st: CaptionSettings, rows: int, cpus: int) -> int:
    """Rows per scan task: ``execution.scan_fragment_rows``, or fewer for an input smaller than two
    such fragments per CPU, so that a small input (the bundled sample: one file) is still read by
    several tasks, and its matches reach NER and the SBERT actors in several blocks, not one block
    that a single SBERT actor works through while the others wait (project choice). A
    fragment is whole row groups, so a file of one row group stays one task."""
    configured = int(st.execution.get("scan_fragment_rows") or scan.DEFAULT_FRAGMENT_ROWS)
    return max(1, min(configured, -(-int(rows) // (2 * max(1, int(cpus))))))


def planned(opts: RunOptions, st: CaptionSettings) -> CaptionSettings:
    """``st`` (with its input) with the plan of backend "auto" in its SBERT options: which
    occupations to screen in bf16 (``refine.screen_plan``). On GPUs, and with any other backend,
    ``st`` unchanged."""
    if st.sbert.get("backend", "auto") != "auto" or sbert_on_gpus(opts) or st.input is None:
        return st
    inp, columns, _ = st.input
    # the run's own validation and occupation match, as the scan runs them
    match = [s for s in caption_stages(st, opts, columns) if s.op in (CaptionValidator, OccupationMatcher)]
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


def exact_stage(st: CaptionSettings, opts: RunOptions) -> Stage:
    """The stream's SBERT stage (its settings and resources, ``--embed-actors`` included) built with
    torch fp32: what encodes the screen's candidates again."""
    stage = configured_stages(st, opts, st.input[1])[-1]
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

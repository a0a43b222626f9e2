"""The image side of paper 002 as Ray Data streams: training images (fetch -> face -> CLIP) and
generated images (generate + CLIP on the GPU tensor -> face), and the per-image table.

Image stages never drop rows; each writes a status column, and the payload columns are dropped
as soon as the last stage that needs pixels has run, so only statuses and scores leave the
stream. Rows out of every stream equal rows in, which the run checks.
"""

from __future__ import annotations

from typing import Any

import re
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from operators.base import Resources, Stage, conform
from operators.image_clip_gender import ClipGenderClassifier
from operators.image_face_filter import FaceFilter
from operators.image_generation import ImageGenerator
from operators.image_fetch import ImageFetcher
from operators.image_shard_reader import ShardImageReader
from operators.image_sink import ImageSink
from operators.support.seeds import image_seeds
from pipelines.engine.stream import stages
from pipelines.engine.storage.checkpoint import first_per_key
from pipelines.engine.generation import GenerationPlan
from pipelines.engine.run.models import ModelSpec
from pipelines.engine.stream import runtime
from pipelines.engine.stream.progress import Phase, drain
from pipelines.studies.amplification import training_shards
from schemas import images as I
from schemas.captions import CAPTION, CAPTION_GENDER, CAPTION_ID, JOIN_KEY, OCCUPATION, URL
from schemas.datasets import SHARD, SHARD_FORMAT, SHARD_KEY, SHARD_ORDER, SHARD_URL
from schemas.subsets import PROMPT, PROMPT_ID, SUBSET, Subset

PAYLOAD = I.PAYLOAD
TRAINING_URLS = "training (distinct URLs)"


@dataclass(frozen=True)
class ImageSettings:
    """Everything the image side needs: operator kwargs and resources (a run's own values, such as
    its device or the sample's local server, go into a copy: ``dataclasses.replace``)."""

    not_in_run_id = (
        "url_rewrite",        # a mirror of the same images (recorded in metrics.json): a run resumes against a new one
        "fetch_block_rows",   # URLs per fetch task: how the fetch is batched
        "face_actors",        # the face filter's actor pool: how the stage executes
        "clip_actors",        # CLIP's actor pool: how the stage executes
        "clip_gpus",          # GPUs per CLIP actor: the run's GPU plan
        "save_images",        # where a run saves copies of the images (--save-images): the rows are the same
    )

    fetch: dict
    face: dict
    clip: ModelSpec                    # CLIP (ClipGenderClassifier: its record is the operator's kwargs)
    generators: list                   # GeneratorSpec: each model with its own settings
    images_per_prompt: int
    caption_images: int
    seed: int
    url_rewrite: list[tuple[str, str]] = field(default_factory=list)
    fetch_block_rows: int = 256
    face_actors: int = 1
    clip_actors: int = 1
    clip_gpus: float = 0.0
    save_images: str | None = None     # URI: save fetched and generated images there (parquet)
    execution: dict = field(default_factory=dict)  # the study's execution settings (execution.stages)
    safety: Any = None                 # the run's safety policy (generation.SafetySettings)
    shards: Any = None                 # --training-images: the img2dataset output (training_shards.ShardSource)
    fetch_missing: bool = False        # --fetch-missing: fetch live what the shards lack
    local_image_server: bool = True    # the bundled sample's images served locally (--no-local-image-server: not)


# ------------------------------------------------------------------------------------ training
def unique_urls(subsets: pa.Table, rewrite: list[tuple[str, str]]) -> pa.Table:
    """One row per distinct URL of the training subsets (each fetched and classified once),
    with the URL actually fetched (after ``rewrite`` prefix mappings, e.g. to a local mirror)."""
    urls = pc.unique(subsets.column(URL).drop_null())
    fetch = urls
    for src, dst in rewrite:
        fetch = pc.replace_substring_regex(fetch, "^" + re.escape(src), dst.replace("\\", "\\\\"))
    return pa.table({URL: urls, FETCH_URL: fetch})


FETCH_URL = "_fetch_url"  # transient: the URL the fetcher requests (after --url-rewrite)


TRAINING_CHECKPOINT = "training_images"
TRAINING_ROWS = "training rows: "   # the run summary's branch of one training subset (+ its name)


def training_stages(st: ImageSettings, from_shards: bool = False) -> list[Stage]:
    """The training images of every subset (section 3.2, App. A.2; section 2.2, App. A.4): fetched
    live, or (``from_shards``) read from img2dataset's shards (``training_shards``)."""
    source = Stage(ShardImageReader, {}, Resources(num_cpus=1, batch_size=st.fetch_block_rows)) if from_shards else \
        Stage(_FetchRewritten, {"kwargs": st.fetch}, Resources(num_cpus=1, batch_size=st.fetch_block_rows))
    return configure(st, [
        # img2dataset's fetch and resize (or the bytes img2dataset stored), one status per URL
        source,
        *([Stage(ImageSink, {"uri": f"{st.save_images}/training", "keys": [URL]})] if st.save_images else []),
        # exactly one face (MediaPipe BlazeFace)
        Stage(FaceFilter, st.face),
        # CLIP zero-shot gender on the images with one face, counted at p >= threshold
        Stage(ClipGenderClassifier, st.clip.record() | {"only_face_ok": True}),
    ])


# one generated image per (prompt, seed), generated in this order (its batches: pixels do not
# depend on the order, but a fixed one keeps a stand-in run's floats bit-equal from run to run)
GENERATION_KEY = (PROMPT, I.SEED)
GENERATION_ORDER = ((I.SOURCE, "ascending"), (OCCUPATION, "ascending"), (PROMPT, "ascending"),
                    (I.IMAGE_INDEX, "ascending"))
RESULT_ORDER = [(I.SOURCE, "ascending"), (OCCUPATION, "ascending"), (PROMPT_ID, "ascending"), (PROMPT, "ascending"),
                (CAPTION_ID, "ascending"), (I.IMAGE_INDEX, "ascending")]


def generation_plan(st: ImageSettings, requests: pa.Table | None, budgets_of=None) -> GenerationPlan:
    """Generated images (section 3.1, section 6, App. A.3), for the engine to generate with each
    generator spec: one per prompt and recorded seed, CLIP gender on the device tensor, then the
    face filter. A caption naming two occupations is in both occupations' section 6 requests with
    one seed: it is generated once and its row given to each (``share_key``)."""
    sink = [Stage(ImageSink, {"uri": f"{st.save_images}/generated", "keys": [
        I.MODEL, I.SOURCE, OCCUPATION, PROMPT_ID, PROMPT, I.IMAGE_INDEX, I.SEED, CAPTION_ID]})] if st.save_images else []
    return GenerationPlan(requests, generated_schema(), ImageGenerator, heads=[Stage(ClipGenderClassifier, st.clip.record())],
                          after=[*sink, Stage(FaceFilter, st.face)], key=PROMPT, share_key=GENERATION_KEY,
                          order=GENERATION_ORDER, save_images=False, budgets_of=budgets_of,
                          resource_flags={"face_actors": [(FaceFilter.stage_name, "actors")]})


def configure(st: ImageSettings, pipeline: list[Stage]) -> list[Stage]:
    """The image stages' resources for this run: the configuration's execution.stages, then the
    --face-actors / --clip-actors / --gen-actors / --gen-batch-size flags and the GPU plan."""
    return stages.configure(pipeline, stages.overrides(st.execution, values={
        FaceFilter.stage_name: {"actors": st.face_actors},
        ClipGenderClassifier.stage_name: {"actors": st.clip_actors, "num_gpus": st.clip_gpus},
    }))


def training_images(ray, subsets: pa.Table, st: ImageSettings, run=None, budgets=(), echo=print):
    """Fetch, face-filter and classify every distinct training URL: one row per URL; and the Phase.

    With ``run`` (a RunDir) results are checkpointed as they arrive, and URLs whose results a
    previous attempt checkpointed are not fetched again.
    """
    urls = unique_urls(subsets, st.url_rewrite)
    out_schema = TRAINING_RESULT_SCHEMA
    done = checkpointed_results(run, urls) if run else out_schema.empty_table()
    todo = urls.filter(pc.invert(pc.is_in(urls.column(URL), done.column(URL))))
    phase = Phase("training images", "URLs", urls.num_rows, reused=done.num_rows)
    for b in budgets:
        b.add(done)
    new_parts: list[pa.Table] = []
    sink = (lambda t: run.write_part(TRAINING_CHECKPOINT, conform(t, out_schema))) if run else new_parts.append
    if todo.num_rows and st.shards is not None:
        todo = _from_shards(ray, todo, subsets, st, sink, phase, budgets, echo)
    if todo.num_rows:
        ds = runtime.from_table(ray, todo, st.fetch_block_rows)
        ds = stages.run(ds, training_stages(st))
        ds = ds.drop_columns(PAYLOAD + [FETCH_URL])
        drain(ds, sink, phase, budgets=budgets, flush_rows=st.fetch_block_rows, echo=echo)
    elif budgets:
        for b in budgets:
            b.check(final=True)
    if run:
        results = checkpointed_results(run, urls)
    else:
        results = pa.concat_tables([done] + [conform(t, out_schema) for t in new_parts])
    got = results.column(URL)
    if results.num_rows != urls.num_rows or pc.count_distinct(got).as_py() != urls.num_rows \
            or pc.any(pc.invert(pc.is_in(urls.column(URL), got))).as_py():
        raise RuntimeError(f"training images: {urls.num_rows} distinct URLs went in, {results.num_rows} rows "
                           f"({pc.count_distinct(got).as_py()} distinct URLs) came back")
    return results.sort_by(URL), phase


def checkpointed_results(run, urls: pa.Table) -> pa.Table:
    """The checkpointed result of every URL of ``urls`` that an attempt finished: one row per URL,
    the first written (a block that a retried task wrote twice counts once)."""
    done = first_per_key(run.read_parts(TRAINING_CHECKPOINT, TRAINING_RESULT_SCHEMA), URL)
    return done.filter(pc.is_in(done.column(URL), urls.column(URL)))


def _from_shards(ray, todo: pa.Table, subsets: pa.Table, st: ImageSettings, sink, phase, budgets, echo) -> pa.Table:
    """The ``todo`` URLs' images from the shards (index, then read, face filter and CLIP), results
    to ``sink``; returns the URLs left to fetch live (with --fetch-missing those the shards lack,
    else none: they are written as not_in_shards / shard_failed). Joined by URL, or with
    --shard-key by the ``subsets`` rows' join_key."""
    urls = todo.column(URL)
    found = training_shards.index(ray, st.shards, training_shards.wanted_pairs(subsets, urls, st.shards.key))
    stored = found.filter(pc.equal(found.column(I.FETCH_STATUS), I.FetchStatus.OK))
    failed = found.filter(pc.not_equal(found.column(I.FETCH_STATUS), I.FetchStatus.OK))
    failed = failed.append_column(I.IMAGE_ORIGIN, pa.array([I.ImageOrigin.SHARDS] * failed.num_rows, pa.string()))
    lacking = pa.concat_tables([conform(failed, TRAINING_RESULT_SCHEMA),
                                conform(training_shards.absent_rows(urls, found, st.shards.key),
                                        TRAINING_RESULT_SCHEMA)])
    joined = f", joined by {st.shards.key!r}" if st.shards.key else ""
    print(f"  training images from {st.shards.format} shards ({len(st.shards.shards)}{joined}): {stored.num_rows:,} of "
         f"{todo.num_rows:,} URLs stored, {lacking.num_rows:,} not "
         + ("(fetched live: --fetch-missing)" if st.fetch_missing else "(not_in_shards / shard_failed; --fetch-missing "
                                                                        "fetches them live)"))
    if stored.num_rows:
        ds = runtime.from_table(ray, stored.sort_by([(SHARD_ORDER, "ascending"), (SHARD_KEY, "ascending")]),
                                st.fetch_block_rows)
        ds = stages.run(ds, training_stages(st, from_shards=True))
        ds = ds.drop_columns(PAYLOAD + [SHARD, SHARD_FORMAT, SHARD_ORDER, SHARD_KEY, SHARD_URL, JOIN_KEY])
        failed_reads: list[pa.Table] = []

        def keep(t: pa.Table) -> None:   # and the samples the shards could not deliver, for the note below
            failed_reads.append(t.filter(pc.equal(t.column(I.FETCH_STATUS), I.FetchStatus.SHARD_FAILED))
                                .select([I.FETCH_STATUS, I.FETCH_ERROR]))
            sink(t)

        drain(ds, keep, phase, budgets=budgets, flush_rows=st.fetch_block_rows, echo=echo)
        note = training_shards.corrupt_note(training_shards.corrupt_shards(pa.concat_tables(failed_reads))) \
            if failed_reads else None
        if note:   # a damaged shard is named (metrics.json records every one: images.training_shards)
            print(note)
    if st.fetch_missing:
        return todo.filter(pc.is_in(urls, lacking.column(URL)))
    if lacking.num_rows:
        sink(lacking)
        phase.processed += lacking.num_rows
    return todo.slice(0, 0)


TRAINING_RESULT_SCHEMA = pa.schema([pa.field(URL, pa.string())] + [f for f in I.FETCH_COLUMNS if f.name not in PAYLOAD]
                                   + [I.IMAGE_RESULTS.field(I.IMAGE_ORIGIN)]
                                   + list(I.FACE_COLUMNS) + list(I.GENDER_COLUMNS) + list(I.EMBEDDING_COLUMNS))


class _FetchRewritten:
    """The fetcher applied to the rewritten URL column, results keyed by the dataset's URL."""

    def __init__(self, kwargs: dict):
        self.fetcher = ImageFetcher(**kwargs)

    def __call__(self, batch: pa.Table) -> pa.Table:
        original = batch.column(URL)
        out = self.fetcher(batch.set_column(batch.schema.get_field_index(URL), URL, batch.column(FETCH_URL)))
        out = out.append_column(I.IMAGE_ORIGIN, pa.array([I.ImageOrigin.FETCHED] * out.num_rows, pa.string()))
        return out.set_column(out.schema.get_field_index(URL), URL, original)


def training_rows(subsets: pa.Table, url_results: pa.Table) -> pa.Table:
    """Per-image rows of the training side: one per (occupation, subset, prompt, caption)."""
    keep = [OCCUPATION, SUBSET, PROMPT_ID, PROMPT, CAPTION_ID, CAPTION, CAPTION_GENDER, URL]
    # the per-image table has no embeddings (Arrow's join cannot carry list columns either)
    results = url_results.drop_columns([c for c in (I.CLIP_EMBEDDING,) if c in url_results.column_names])
    rows = subsets.select(keep).join(results, keys=URL, join_type="left outer", use_threads=False)
    n = rows.num_rows
    no_url = pc.is_null(rows.column(URL))
    if n != subsets.num_rows or pc.any(pc.and_(pc.invert(no_url), pc.is_null(rows.column(I.FETCH_STATUS)))).as_py():
        raise RuntimeError(f"training rows: {subsets.num_rows} subset rows, {n} after joining the URL results, "
                           f"or a URL without a result")
    for col, value in ((I.FETCH_STATUS, I.FetchStatus.INVALID_URL), (I.FETCH_ERROR, "no URL in the dataset row")):
        rows = rows.set_column(rows.schema.get_field_index(col), col,
                               pc.if_else(no_url, pa.scalar(value, pa.string()), rows.column(col)))
    rows = rows.append_column(I.SOURCE, pa.array([I.Source.TRAINING] * n, pa.string()))
    counted = _all_ok(rows, I.FETCH_STATUS)
    rows = rows.append_column(I.COUNTED, pa.array(counted))
    order = [(OCCUPATION, "ascending"), (SUBSET, "ascending"), (PROMPT_ID, "ascending"), (CAPTION_ID, "ascending")]
    return conform(rows, I.IMAGE_RESULTS).sort_by(order)


def _all_ok(rows: pa.Table, first_status: str) -> np.ndarray:
    ok = lambda col, v: np.asarray(pc.fill_null(pc.equal(rows.column(col), v), False))  # noqa: E731
    gender = rows.column(I.GENDER)
    decided = np.asarray(pc.fill_null(pc.is_in(gender, pa.array(list(I.Gender.DECIDED))), False))
    return ok(first_status, "ok") & ok(I.FACE_STATUS, I.FaceStatus.OK) & decided


# ---------------------------------------------------------------------------------- generation
def generation_requests(prompts: dict[str, list[str]], training: pa.Table, st: ImageSettings,
                        caption_prompts: bool) -> pa.Table:
    """One row per image to generate (per model): Table 1 prompts x occupations x N, and
    (section 6) M images per caption of the naive subset whose training image counts, so that
    the prompts are exactly the captions behind T (P_o = S_o); each image has its own seed.

    ``training`` is the training side of the per-image table (``training_rows``).
    """
    occ, pid, text, idx = [], [], [], []
    for o, plist in prompts.items():
        for j, p in enumerate(plist):
            occ += [o] * st.images_per_prompt
            pid += [j + 1] * st.images_per_prompt
            text += [p] * st.images_per_prompt
            idx += list(range(st.images_per_prompt))
    prompt_rows = pa.table({
        I.SOURCE: pa.array([I.Source.GENERATED] * len(occ), pa.string()),
        OCCUPATION: pa.array(occ, pa.string()), PROMPT_ID: pa.array(pid, pa.int32()),
        PROMPT: pa.array(text, pa.string()), I.IMAGE_INDEX: pa.array(idx, pa.int32()),
    })
    parts = [prompt_rows]
    if caption_prompts and st.caption_images > 0:
        naive = training.filter(pc.and_(pc.equal(training.column(SUBSET), Subset.NAIVE), training.column(I.COUNTED)))
        m = st.caption_images
        take = np.repeat(np.arange(naive.num_rows), m)
        cap = naive.take(pa.array(take, pa.int64()))
        parts.append(pa.table({
            I.SOURCE: pa.array([I.Source.CAPTION_PROMPT] * cap.num_rows, pa.string()),
            OCCUPATION: cap.column(OCCUPATION), SUBSET: cap.column(SUBSET),
            PROMPT: cap.column(CAPTION), I.IMAGE_INDEX: pa.array(np.tile(np.arange(m), naive.num_rows), pa.int32()),
            CAPTION_ID: cap.column(CAPTION_ID), CAPTION: cap.column(CAPTION),
            CAPTION_GENDER: cap.column(CAPTION_GENDER), URL: cap.column(URL),
        }))
    req = pa.concat_tables([conform(p, REQUEST_SCHEMA) for p in parts])
    # the seed key is the prompt text; for captions also the caption id, so that two training
    # examples with the same caption text still get independent images
    keys = [p if cid is None else f"caption:{cid}\x1f{p}"
            for p, cid in zip(req.column(PROMPT).to_pylist(), req.column(CAPTION_ID).to_pylist())]
    seeds = image_seeds(st.seed, keys, req.column(I.IMAGE_INDEX).to_pylist())
    return req.set_column(req.schema.get_field_index(I.SEED), I.SEED, pa.array(seeds, pa.int64()))


REQUEST_SCHEMA = pa.schema([I.IMAGE_RESULTS.field(n) for n in (
    I.SOURCE, OCCUPATION, SUBSET, PROMPT_ID, PROMPT, I.IMAGE_INDEX, I.SEED, CAPTION_ID, CAPTION, CAPTION_GENDER, URL)])


def generated_schema() -> pa.Schema:
    return pa.schema(list(REQUEST_SCHEMA) + [f for f in I.GENERATION_COLUMNS if f.name not in PAYLOAD]
                     + list(I.GENDER_COLUMNS) + list(I.EMBEDDING_COLUMNS) + list(I.FACE_COLUMNS))


def generated_rows(gen: pa.Table) -> pa.Table:
    counted = _all_ok(gen, I.GENERATION_STATUS)
    return conform(gen.append_column(I.COUNTED, pa.array(counted)), I.IMAGE_RESULTS)


# ------------------------------------------------------------------------------ row accounting
def image_stage_counts(url_results: pa.Table, generated: pa.Table, training: pa.Table | None = None,
                       labels: dict[str, str] | None = None) -> list[dict]:
    """Rows in and outcome counts per image stage, as a cascade: a stage's input is the rows the
    previous stage passed. Every stage's outcomes add up to its input (checked)."""
    rows = []

    def cascade(branch: str, table: pa.Table, steps: list[tuple[str, str, tuple, str]]):
        mask = np.ones(table.num_rows, bool)
        for stage, col, outcomes, ok in steps:
            col_vals = np.array(table.column(col).to_pylist(), dtype=object)
            vals = col_vals[mask]
            counts = {o: int((vals == o).sum()) for o in outcomes}
            rows_in = int(mask.sum())
            if sum(counts.values()) != rows_in:
                unknown = sorted({str(v) for v in vals} - set(outcomes))
                raise RuntimeError(f"{branch}/{stage}: outcomes add up to {sum(counts.values())} of {rows_in} rows "
                                   f"(unexpected values {unknown})")
            for o, c in counts.items():
                rows.append({"branch": branch, "stage": stage, "rows_in": rows_in, "outcome": o, "count": c})
            mask = mask & (col_vals == ok) if ok != "decided" else mask
    gender_outcomes = I.Gender.ALL
    training_steps = [
        ("fetch", I.FETCH_STATUS, I.FetchStatus.ALL, "ok"),
        ("face_filter", I.FACE_STATUS, I.FaceStatus.ALL, "ok"),
        ("clip_gender", I.GENDER, gender_outcomes, "decided"),
    ]
    cascade(TRAINING_URLS, url_results, training_steps)
    if training is not None:  # the same per subset row (a URL in several subsets counts in each)
        for subset in sorted(set(training.column(SUBSET).to_pylist())):
            cascade(f"{TRAINING_ROWS}{subset}", training.filter(pc.equal(training.column(SUBSET), subset)),
                    training_steps)
    for source in (I.Source.GENERATED, I.Source.CAPTION_PROMPT, I.Source.PARAPHRASE_PROMPT):
        for model in sorted(set(generated.column(I.MODEL).to_pylist()) - {None}) if generated.num_rows else []:
            sel = generated.filter(pc.and_(pc.equal(generated.column(I.SOURCE), source),
                                           pc.equal(generated.column(I.MODEL), model)))
            if sel.num_rows:
                cascade(f"{source}: {(labels or {}).get(model, model)}", sel, [
                    ("generate", I.GENERATION_STATUS, tuple(I.GenerationStatus.ALL), "ok"),
                    ("face_filter", I.FACE_STATUS, I.FaceStatus.ALL, "ok"),
                    ("clip_gender", I.GENDER, gender_outcomes, "decided"),
                ])
    return rows

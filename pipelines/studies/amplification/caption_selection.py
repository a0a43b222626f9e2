"""The training subsets of paper 002 (naive, no indicators, NN, NN + no indicators; sections 4 and
5) from the annotated captions the scan committed: the selection pool by a partial top-k
reduction (in this process or through Ray Data), made exact where SBERT screened in bf16, the
per-occupation caption counts, and what folding repeated rows left out.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from operators.base import conform
from operators.text_prompt_similarity import PromptSimilarity
from pipelines.engine.run.lifecycle import Run
from pipelines.engine.storage import io
from pipelines.engine.stream import scan
from pipelines.studies.amplification import caption_report as report
from pipelines.studies.amplification import refine
from pipelines.studies.amplification.caption_scan import caption_shards, committed_parts
from pipelines.studies.amplification.caption_settings import FILES, CaptionSettings, screen_occupations, screened
from pipelines.studies.amplification.caption_stages import exact_on_actors, exact_stage
from pipelines.studies.amplification.prompts import prompt_table
from pipelines.studies.amplification.selection import SelectionConfig, partial_top_k, pool as selection_pool
from schemas import captions as C
from schemas.subsets import DUPLICATE_ROW, DUPLICATE_URL, SELECTION_INPUT, TRAINING_SUBSETS

# annotated captions up to this many are selected in the driver process (select_subsets_local),
# more through Ray Data (select_subsets); execution.local_selection_rows (configs/paper002.yaml) sets it
LOCAL_SELECTION_ROWS = 1_000_000


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
        data = scan.parquet_dataset(run.ray, rd.fs, parts, schema=annotated_schema)
        if join:
            data = data.map_batches(with_join_key, fn_args=(join,), batch_format="pyarrow", batch_size=None)
        pool, stats = select_subsets(run.ray, data, annotated_rows, pool_cfg, prompts, len(st.occupations))

        def candidates_of(limits):   # a map over the annotated captions; only the candidates reach the driver
            found = data.map_batches(refine.candidate_rows, fn_args=(limits, pool_cfg), batch_format="pyarrow",
                                     batch_size=65536)
            return pa.concat_tables([SELECTION_INPUT.empty_table()] + run.ray.get(found.to_arrow_refs()))
    if screened(st, run.options) and annotated_rows:
        # what the driver selects in memory it encodes itself; a selection through Ray Data (LAION
        # scale: ~250,000 candidates) encodes them on SBERT actors
        exact = exact_stage(st, run.options)
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


def with_join_key(table: pa.Table, column: str | None) -> pa.Table:
    """``table`` with ``join_key``: the kept ``--shard-key`` column as text (int ids as their digits,
    as img2dataset's metadata holds them once cast); unchanged without one."""
    if not column:
        return table
    return table.append_column(C.JOIN_KEY, table.column(column).cast(pa.string()))


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


STAGE_DUPLICATES = "select_subsets"


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


def _url_rows(batch: pa.Table, keys: pa.Array) -> pa.Table:
    """The (occupation, url, caption_id) of the annotated rows whose occupation and URL are in
    ``keys`` (occupation and URL joined by U+001F)."""
    hit = pc.fill_null(pc.is_in(_occupation_url(batch), keys), False)
    return batch.filter(hit).select([C.OCCUPATION, C.URL, C.CAPTION_ID])


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

"""Exact training subsets from a bf16 screen (``models.sbert_backend: screened``).

The stream encodes every caption with SBERT in bf16 (OpenVINO on CPUs with AVX512-BF16 / AMX, about
3x torch fp32), which moves a cosine by up to ``margin`` (measured: at most 2.65e-3 on the bundled
sample's 64,728 (caption, prompt) pairs and 2.43e-3 on the real captions of the NER check). The
selection then needs exact cosines only where they can change a subset:

* every group of the pool (``selection.pool``) is "the k best rows" in an order: the similarity
  groups by descending cosine, the random ones by ``sample_key``. Let ``t`` be the screen order key
  of a full group's k-th row. There are k distinct URLs whose screen key is <= t, so the exact k-th
  key is <= t + margin, and a row whose exact key is <= that has a screen key <= t + 2 margin.
  So the exact pool lies inside the **candidates**: the rows with a screen key <= t + 2 margin in
  some full group (<= t in a random group, whose key is not a cosine), and every row of a group
  with fewer than k distinct URLs.
* the candidates are encoded again with torch fp32 and the pool is selected from them with the
  exact cosines, by the same functions as any pool: the same members, ranks and similarities as a
  run that encoded everything with torch.

``margin`` is an empirical bound, so every round checks it on every row it re-encodes: when a row's
screen cosine is further than ``margin`` from its exact one, the margin becomes twice the largest
difference seen and the candidates are taken again (their exact cosines are kept between rounds).

What it saves grows with the captions per occupation: a pool holds about k x (1 + prompts) rows per
occupation, so at LAION scale (thousands to millions of matches per occupation) almost nothing is
encoded twice, while in a small input where every row is in every group (the bundled sample, the
synthetic 4 M set) every row is, and the screen is pure cost. The annotated captions on disk keep
the screen cosines (metrics.json ``sbert_screen`` says so).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from operators.base import conform, with_column
from pipelines.engine.stream.scan import FragmentScan
from pipelines.studies.amplification.selection import SelectionConfig, candidates, order_key, similarity_matrix
from schemas.captions import CAPTION_ID, OCCUPATION, OCCUPATIONS, PROMPT_SIMILARITY, SAMPLE_KEY
from schemas.subsets import ORDER_KEY, PROMPT_ID, SELECTION_INPUT, SIMILARITY, SOURCE_ROW, SUBSET, Subset

# project choice: the screen's bound on |bf16 cosine - fp32 cosine|, about twice the
# largest difference measured on real and bundled captions (2.65e-3); checked on every re-encoded row
DEFAULT_MARGIN = 0.005
MAX_ROUNDS = 4
# project choice: the default backend "auto" screens an occupation when the input is
# estimated to hold at least this many times the rows its pool can take (an upper bound: the pools
# measured hold about half of it), so that at most about a quarter of its rows are encoded twice
# (the screen costs ~0.39 of torch, docs/benchmarks.md); below it the occupation is torch's
SCREEN_FACTOR = 2
# project choice: ... and only when the occupations to screen are estimated to hold at
# least this many captions together: each SBERT actor then loads the library and converts the model
# for OpenVINO (~9 CPU-s), which a smaller screen does not pay back
SCREEN_MIN_ROWS = 50_000
# project choice: "auto" estimates each occupation's captions from at most this many rows
# of the input (the same validation and occupation match as the scan), read in SAMPLE_SPOTS runs
# spread evenly over the input's rows, so that an input sorted by caption is sampled across its
# order rather than at its start
SAMPLE_ROWS = 262_144
SAMPLE_SPOTS = 8
LIMITS = pa.schema([pa.field(OCCUPATION, pa.string()), pa.field(SUBSET, pa.string()),
                    pa.field(PROMPT_ID, pa.int32()), pa.field("limit", pa.float64())])


def pool_rows(cfg: SelectionConfig) -> int:
    """The most rows one occupation's pool can hold: k per random subset, k per prompt per NN subset."""
    return sum(cfg.k(s) * (cfg.n_prompts if s in Subset.PER_PROMPT else 1) for s in Subset.ALL)


def sample_spots(inp, rows: int, spots: int = SAMPLE_SPOTS) -> list[tuple[str, list[int] | None, int]]:
    """Where ``sample_occupations`` reads: (file, row groups, most rows) in input order. An input of
    at most ``rows`` rows, or of fewer than 8 row groups (or without its footers' row groups), is
    read from its start; a larger one at ``spots`` places (at most a quarter of its row groups)
    evenly spread over its rows, ``rows / spots`` rows from the start of the row group holding each
    (places in one row group are read there once, their rows added up)."""
    groups = [(f, g, n) for f, sizes in enumerate(inp.row_groups or []) for g, n in enumerate(sizes) if n]
    # a place reads its row group's caption and URL column chunks whole (parquet's unit of I/O): at
    # most a quarter of the input's row groups, so that an input of few large row groups is not
    # read once more before the stream
    spots = min(spots, len(groups) // 4)
    if inp.num_rows <= rows or spots <= 1:
        return [(path, None, rows) for path in inp.files]
    quota = -(-rows // spots)
    ends = np.cumsum([n for _, _, n in groups])
    out: dict[tuple[int, int], int] = {}
    for j in range(spots):
        f, g, _ = groups[int(np.searchsorted(ends, (j + 0.5) * inp.num_rows / spots, side="right"))]
        out[(f, g)] = out.get((f, g), 0) + quota
    # from the row group on to the file's end: a row group smaller than its share does not cut it short
    return [(inp.files[f], list(range(g, len(inp.row_groups[f]))), n) for (f, g), n in sorted(out.items())]


def sample_occupations(inp, columns: list[str], stages: list, rows: int, spots: int = SAMPLE_SPOTS
                       ) -> tuple[dict, int, str | None]:
    """What the scan's own stages (``stages``: the run's caption validation and occupation match,
    through ``scan.FragmentScan``, as its read tasks run them) find in at most ``rows`` rows of the
    input, read where ``sample_spots`` says: captions per occupation, the rows read, and why reading
    stopped early (None: it did not). A file that cannot be read ends the sample there: the
    estimate is only advisory, and the scan then reports the file as it does any."""
    places = sample_spots(inp, rows, spots)
    scan = FragmentScan(inp.filesystem, columns, stages, None, min([65_536, *(n for _, _, n in places)]))
    found, read, stopped = {}, 0, None
    for path, groups, most in places:
        if read >= rows:
            break
        here = 0
        try:
            for table in scan.read(path, groups):
                table = table.slice(0, min(most - here, rows - read))
                read, here = read + table.num_rows, here + table.num_rows
                kept = scan.run_stages(table, {})
                if kept.num_rows:
                    for v in pc.value_counts(pc.list_flatten(kept.column(OCCUPATIONS))).to_pylist():
                        found[v["values"]] = found.get(v["values"], 0) + int(v["counts"])
                if here >= most or read >= rows:
                    break
        except (OSError, pa.ArrowException) as exc:
            stopped = f"{inp.display(path)}: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
            break
    return found, read, stopped


def screen_plan(inp, columns: list[str], stages: list, occupations: list[str], cfg: SelectionConfig,
                sample_rows: int = SAMPLE_ROWS, factor: float = SCREEN_FACTOR, min_rows: int = SCREEN_MIN_ROWS,
                spots: int = SAMPLE_SPOTS) -> dict:
    """Which ``occupations`` (names) backend "auto" screens in bf16: those whose captions, estimated
    from ``sample_rows`` rows of the input spread over it (``sample_occupations``: read, validated
    and matched by the scan's ``stages``) and scaled to its rows, are at least ``factor`` x the rows
    their pool can hold (``pool_rows``), provided they hold at least ``min_rows`` captions together
    (else none). The rest are encoded with torch. Either way the subsets are torch's; only the
    time differs. ``spots``: the places the sample is read at (``sample_spots``; 1: the start)."""
    found, sampled, stopped = (sample_occupations(inp, columns, stages, sample_rows, spots) if inp.num_rows
                               else ({}, 0, None))
    scale = inp.num_rows / sampled if sampled else 0.0
    estimated = {n: int(round(found.get(n, 0) * scale)) for n in occupations}
    per_pool = pool_rows(cfg)
    screened = [n for n in occupations if per_pool and estimated[n] >= factor * per_pool]
    if sum(estimated[n] for n in screened) < min_rows:
        screened = []
    # read whole, at places spread over it (row groups named), or from its start
    where = "all" if inp.num_rows <= sample_rows else \
        "spread" if sample_spots(inp, sample_rows, spots)[0][1] is not None else "start"
    return {"sampled_rows": sampled, "sampled_from": where, "input_rows": int(inp.num_rows),
            "pool_rows_per_occupation": per_pool,
            "factor": float(factor), "min_rows": int(min_rows), "estimated_captions": estimated, "screened": screened,
            **({"sample_stopped": stopped} if stopped else {})}


class ScreenBoundExceeded(RuntimeError):
    """The screen's cosines differ from the exact ones by more than the margin after every round."""


def limits(screen_pool: pa.Table, cfg: SelectionConfig, margin: float) -> pa.Table:
    """Per group of a pool selected on screen cosines (``selection.pool``'s TRAINING_SUBSETS rows
    before the walk): the largest screen order key a candidate may have. A group holding fewer than
    its k rows (fewer distinct URLs than k in the whole input) takes every row: +inf."""
    if screen_pool.num_rows == 0:
        return LIMITS.empty_table()
    pid = pc.fill_null(screen_pool.column(PROMPT_ID), 0).cast(pa.int32())
    keys = pa.table({OCCUPATION: screen_pool.column(OCCUPATION), SUBSET: screen_pool.column(SUBSET), PROMPT_ID: pid})
    similar = pc.is_in(keys.column(SUBSET), value_set=pa.array(Subset.PER_PROMPT)).to_numpy(zero_copy_only=False)
    order = order_key(similar, screen_pool.column(SIMILARITY).to_numpy(zero_copy_only=False),
                      screen_pool.column(SAMPLE_KEY).to_numpy(zero_copy_only=False))
    keys = keys.append_column("key", pa.array(order, pa.float64()))
    per = keys.group_by([OCCUPATION, SUBSET, PROMPT_ID], use_threads=False).aggregate([("key", "max"), ("key", "count")])
    subset = per.column(SUBSET).to_pylist()
    full = per.column("key_count").to_numpy() >= np.array([cfg.k(s) for s in subset], np.int64)
    widen = np.array([2 * margin if s in Subset.PER_PROMPT else 0.0 for s in subset])
    limit = np.where(full, per.column("key_max").to_numpy() + widen, np.inf)
    return pa.table({OCCUPATION: per.column(OCCUPATION), SUBSET: per.column(SUBSET),
                     PROMPT_ID: per.column(PROMPT_ID), "limit": pa.array(limit, pa.float64())}, schema=LIMITS)


def candidate_rows(batch: pa.Table, group_limits: pa.Table, cfg: SelectionConfig) -> pa.Table:
    """The rows of a batch of annotated captions (SELECTION_INPUT columns) whose screen order key is
    within its group's limit in some group: every row the exact pool could hold. Applies to any
    split of the input (a row's fate depends on the row and the limits only)."""
    batch = conform(batch, SELECTION_INPUT)
    if batch.num_rows == 0 or group_limits.num_rows == 0:
        return batch.slice(0, 0)
    cand = candidates(batch, cfg).select([OCCUPATION, SUBSET, PROMPT_ID, ORDER_KEY, SOURCE_ROW])
    joined = cand.join(group_limits, keys=[OCCUPATION, SUBSET, PROMPT_ID], join_type="inner", use_threads=False)
    inside = joined.filter(pc.less_equal(joined.column(ORDER_KEY), joined.column("limit")))
    rows = np.unique(inside.column(SOURCE_ROW).to_numpy())
    return batch.take(pa.array(rows, pa.int64()))


def _row_keys(table: pa.Table) -> pa.ChunkedArray:
    """(caption_id, occupation) as one string per row: what identifies an annotated row."""
    return pc.binary_join_element_wise(table.column(CAPTION_ID).cast(pa.string()), table.column(OCCUPATION), "\x1f")


def exact_pool(screen_pool: pa.Table, cfg: SelectionConfig, select: Callable[[pa.Table], pa.Table],
               candidates_of: Callable[[pa.Table], pa.Table], encode: Callable[[pa.Table], pa.Table],
               margin: float = DEFAULT_MARGIN, screened_occupations=None, memo: dict | None = None
               ) -> tuple[pa.Table, dict]:
    """The pool an all-fp32 run selects (to torch's own float noise), from ``screen_pool`` (selected
    on the screen cosines), provided every row's screen cosines are within ``margin`` of the exact
    ones: the re-encoded rows check it, the others cannot (the bound is a measured one).

    ``candidates_of(limits)``: the annotated rows within ``limits`` (``candidate_rows`` over the
    whole input, in this process or on workers); ``encode(rows)``: the rows with exact
    ``prompt_similarity``; ``select(rows)``: the pool of some rows (``selection.pool`` after the
    partial top-k). ``screened_occupations``: the occupations the stream screened ("auto"); the rows
    of the others already hold torch's cosines and are taken as they are (None: every row was
    screened). ``memo`` (a dict, empty at first) carries the exact rows and the largest screen error
    from one call to the next over the same annotated rows (a walk's reselection with a larger
    pool): a row encoded once is never encoded again, and the margin starts at least as wide as
    the errors seen. Returns the pool and what the refinement did (``re_encoded`` counted over
    every call with the memo), for metrics.json."""
    if not margin > 0:
        raise ValueError(f"the screen margin must be > 0, not {margin!r}")
    memo = {} if memo is None else memo
    exact = memo.get("exact", SELECTION_INPUT.empty_table())
    record = {"margin": float(margin), "rounds": 0, "candidates": 0, "re_encoded": memo.get("re_encoded", 0),
              "max_screen_error": memo.get("max_screen_error", 0.0), "refinements": memo.get("refinements", 0) + 1}
    for rnd in range(1, MAX_ROUNDS + 1):
        rows = conform(candidates_of(limits(screen_pool, cfg, margin)), SELECTION_INPUT)
        known = _row_keys(exact).combine_chunks()
        new = rows.filter(pc.invert(pc.is_in(_row_keys(rows), value_set=known)))
        if new.num_rows and screened_occupations is not None:   # torch's already: kept as they are
            mine = pc.is_in(new.column(OCCUPATION), value_set=pa.array(list(screened_occupations), pa.string()))
            exact = pa.concat_tables([exact, new.filter(pc.invert(mine))])
            new = new.filter(mine)
        if new.num_rows:
            new = _by_row(new)
            fresh = _by_row(conform(encode(new), SELECTION_INPUT))   # an encoder may return any order
            if not _row_keys(fresh).equals(_row_keys(new)):
                raise RuntimeError(f"the exact encoder returned other rows ({fresh.num_rows}) than it was given "
                                   f"({new.num_rows})")
            screen = similarity_matrix(new.column(PROMPT_SIMILARITY), cfg.n_prompts).astype(np.float64)
            err = float(np.abs(similarity_matrix(fresh.column(PROMPT_SIMILARITY), cfg.n_prompts) - screen).max())
            record["max_screen_error"] = max(record["max_screen_error"], err)
            record["re_encoded"] += new.num_rows
            exact = pa.concat_tables([exact, fresh])
        record.update(rounds=rnd, candidates=rows.num_rows, margin=float(margin))
        memo.update(exact=exact, re_encoded=record["re_encoded"], max_screen_error=record["max_screen_error"],
                    refinements=record["refinements"])
        if record["max_screen_error"] <= margin:
            # this margin's candidates, each with the exact cosines of its (caption_id, occupation):
            # exact repeats of a row share that key and their text, so one encode serves them all
            at = pc.index_in(_row_keys(rows), value_set=_row_keys(exact).combine_chunks())
            return select(with_column(rows, PROMPT_SIMILARITY, exact.column(PROMPT_SIMILARITY).take(at))), record
        margin = 2 * record["max_screen_error"]
    raise ScreenBoundExceeded(
        f"SBERT's bf16 screen moved a cosine by {record['max_screen_error']:.2e}, more than the margin after "
        f"{MAX_ROUNDS} rounds: run with --sbert-backend torch")


def _by_row(table: pa.Table) -> pa.Table:
    return table.sort_by([(CAPTION_ID, "ascending"), (OCCUPATION, "ascending")])


def exact_similarities(similarity) -> Callable[[pa.Table], pa.Table]:
    """``encode`` for ``exact_pool`` through a PromptSimilarity operator built with torch fp32:
    the rows with their ``prompt_similarity`` recomputed, in chunks of the operator's batch size."""
    step = int(similarity.resources.batch_size)

    def encode(rows: pa.Table) -> pa.Table:
        parts = [similarity(rows.slice(i, step)).column(PROMPT_SIMILARITY) for i in range(0, rows.num_rows, step)]
        values = pa.chunked_array([c for p in parts for c in p.chunks], rows.schema.field(PROMPT_SIMILARITY).type)
        return with_column(rows, PROMPT_SIMILARITY, values)

    return encode

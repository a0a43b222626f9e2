"""The caption scan of paper 002: the input files in resumable shards, each streamed through the
caption stages and committed with its tallies (the engine's shard protocol), and the caption
validator's error budget fed from those tallies.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from pipelines.engine.cli.options import RunOptions
from pipelines.engine.run import rundir
from pipelines.engine.stats.summary import outcomes_by_stage, stage_counts
from pipelines.engine.storage import io
from pipelines.engine.storage.inputs import unreadable_input
from pipelines.engine.stream import runtime
from pipelines.engine.stream import shards as engine_shards
from pipelines.engine.stream.progress import ErrorBudget, Phase, drain
from pipelines.studies.amplification.caption_settings import FILES, CaptionSettings, read_columns
from pipelines.studies.amplification.caption_stages import caption_stream
from schemas import captions as C

CAPTION_TALLIES = "caption_tallies"
TALLY_SCHEMA = engine_shards.TALLY_SCHEMA
CAPTION_FAILURES = (C.DROP_NULL, C.DROP_EMPTY, C.DROP_NON_TEXT)


def caption_shards(run: rundir.RunDir, inp, files_per_shard: int) -> list[list[str]]:
    """The input files in shards of ``files_per_shard``, fixed when the run starts (recorded)."""
    n = max(1, int(files_per_shard))
    return run.plan("caption_shards", [inp.files[i:i + n] for i in range(0, len(inp.files), n)])


def scan_shards(ray, run: rundir.RunDir, inp, columns: dict, annotated_schema: pa.Schema, schema: pa.Schema,
                st: CaptionSettings, opts: RunOptions) -> tuple[Phase, ErrorBudget, pa.Table]:
    """The caption scan, one shard of input files at a time. A finished shard is marked done and
    skipped on resume; an unfinished one is cleared and scanned again.

    Crash safety: sink tasks write their parts atomically and report them; the driver commits a
    shard (keeps the parts it received, deletes what retried or killed attempts left, writes the
    shard's tallies under a fixed name) and only then writes the done marker, which lists the parts:
    a crash at any point leaves a shard that is either done and exact, or redone on resume (the
    protocol is the engine's: pipelines/engine/stream/shards.py)."""
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
        ds = caption_stream(ray, inp.subset(files), columns, schema, st, opts)
        ds = runtime.map_batches(ds, engine_shards.write_part_task, runtime.task_retries(), batch_format="pyarrow",
                                 num_cpus=1,
                                 fn_args=(run.fs, data_dir, annotated_schema))
        parts: list[pa.Table] = []
        sink_budget = _TallyBudget(budget)
        before = phase.seconds
        try:
            drain(ds, parts.append, phase, budgets=[sink_budget], flush_rows=1,
                  echo=runtime.progress_echo(opts.no_progress), count=_captions_read)
        except Exception as exc:  # a file with corrupt data pages: name it and the cause, not a crashed worker
            bad = unreadable_input(exc, inp.subset(files), read_columns(columns))
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

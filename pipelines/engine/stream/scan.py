"""A parquet scan fused with the stateless stages that follow it.

A stream that reads LAION metadata and then filters it (validate, occupation match, gender
words) keeps about 1% of what it reads. Read as a Ray Data ``read_parquet`` followed by
``map_batches``, every row read is first put into the object store as a block (about 95 MB per
million captions with their URLs), then fetched again by the stage that drops 99% of it, and a
file becomes one block, so a stage only starts once its whole file is read. Here the leading
stateless CPU stages of the stage list run *inside* the read tasks instead: each task reads one
fragment (a run of a file's row groups), passes it through the stages batch by batch, and emits
only the rows they keep plus one tally row per (stage, outcome). Nothing but the matched rows
ever reaches the object store, the tasks are as many as the fragments (so every core reads from
the first second on), and the model stages downstream start as soon as the first fragment is done.

The stages are the same operator classes with the same batch size (the first stage's
``batch_size``, ``--scan-batch-size``), so their results and their tallies are identical to the
unfused stream's; only the execution changes. Stages with an actor pool or a GPU (spaCy, SBERT)
stay separate Ray Data stages after the scan.
"""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pyarrow.parquet as pq

from operators.base import Resources, Stage, conform, run_counted, tally_rows
from pipelines.engine.storage import io
from pipelines.engine.stream import runtime

DEFAULT_FRAGMENT_ROWS = 1 << 20  # rows per scan task: ~1 s of work per core, many tasks per file at LAION's size


def fusable(stages: list[Stage]) -> int:
    """How many leading stages can run inside the read tasks: stateless (no actor pool) CPU
    stages. The first stage with an actor pool or a GPU ends the prefix."""
    n = 0
    for s in stages:
        res = s.declared()
        if res.actors or res.num_gpus:
            break
        n += 1
    return n


def fragments(inp, fragment_rows: int = DEFAULT_FRAGMENT_ROWS) -> list[dict]:
    """The scan's units of work: per file, runs of consecutive row groups of at least
    ``fragment_rows`` rows (a file's last run may be smaller; a row group is never split).
    Each is {"path", "row_groups": [indices], "rows"}; together they cover every row once."""
    out = []
    groups = inp.row_groups or [None] * len(inp.files)
    for path, sizes, rows in zip(inp.files, groups, inp.row_counts or [0] * len(inp.files)):
        if sizes is None:  # no footer detail: the whole file is one fragment
            out.append({"path": path, "row_groups": None, "rows": int(rows)})
            continue
        run, run_rows = [], 0
        for i, n in enumerate(sizes):
            run.append(i)
            run_rows += n
            if run_rows >= fragment_rows:
                out.append({"path": path, "row_groups": run, "rows": run_rows})
                run, run_rows = [], 0
        if run or not sizes:  # the tail of the file (or a file with no row groups: its schema only)
            out.append({"path": path, "row_groups": run, "rows": run_rows})
    return out


class FragmentScan:
    """Read fragments of parquet files and run ``stages`` over them in batches of ``batch_rows``
    rows; returns the kept rows and one tally row per (stage, outcome).

    The stages run as ``operators.base.StreamStage`` runs them in a stream, with the same counts
    (a filtering stage: "kept" and one outcome per drop reason, zero counts included; any other
    stage: rows in and out, plus its own ``tally``; a stage that receives no rows counts nothing),
    but without carrying tally rows through the batch: the kept rows go from stage to stage as
    they are and are conformed to the stream schema once per fragment, the counts are summed in
    a dict. A plain class: tests and benchmarks call it without Ray."""

    def __init__(self, filesystem, columns: list[str], stages: list[Stage], schema: pa.Schema, batch_rows: int):
        self.filesystem = filesystem
        self.columns = list(columns)
        self.ops = [s.build() for s in stages]
        self.schema = schema
        self.batch_rows = max(1, int(batch_rows))

    def read(self, path: str, row_groups: list[int] | None):
        """The fragment's ``columns`` as tables of at most ``batch_rows`` rows."""
        try:
            with self.filesystem.open_input_file(path) as fh:
                pf = pq.ParquetFile(fh, page_checksum_verification=True)   # where the file has checksums
                groups = list(range(pf.num_row_groups)) if row_groups is None else list(row_groups)
                if not groups:  # no rows: still one (empty) batch, so the stages see the file's schema
                    yield pf.schema_arrow.empty_table().select(self.columns)
                    return
                # one core per task (the task's CPU reservation); parallelism comes from more tasks
                for rb in pf.iter_batches(batch_size=self.batch_rows, row_groups=groups, columns=self.columns,
                                          use_threads=False):
                    yield pa.Table.from_batches([rb])
        except (OSError, pa.ArrowException) as err:
            # Ray passes a task's exception on as text: name the file in it (inputs.unreadable_input
            # then reads that file again on the driver to report the cause)
            err.add_note(f"while reading parquet file {path}")
            raise

    def run_stages(self, table: pa.Table, counts: dict) -> pa.Table:
        """The rows of ``table`` the stages keep; their outcomes added to ``counts``."""
        for op in self.ops:
            if not table.num_rows:
                break
            table, found = run_counted(op, table)
            if found is not None:
                mine = counts.setdefault(op.stage_name, {})
                for outcome, n in found.items():
                    mine[outcome] = mine.get(outcome, 0) + int(n)
        return table

    def scan(self, path: str, row_groups: list[int] | None) -> pa.Table:
        kept, counts = [], {}
        for table in self.read(path, row_groups):
            table = self.run_stages(table, counts)
            if table.num_rows:
                kept.append(conform(table, self.schema))
        tallies = [tally_rows(stage, c, self.schema) for stage, c in counts.items()]
        return pa.concat_tables(kept + tallies) if kept or tallies else self.schema.empty_table()

    def __call__(self, batch: pa.Table) -> pa.Table:
        """A batch of fragment descriptors (``fragments``' rows) -> the stages' output for all."""
        return pa.concat_tables([self.scan(f["path"], f["row_groups"]) for f in batch.to_pylist()])


def scan_parquet(ray, inp, columns: list[str], stages: list[Stage], schema: pa.Schema,
                 fragment_rows: int = DEFAULT_FRAGMENT_ROWS):
    """A Ray dataset of what ``stages`` keep of ``inp``'s ``columns``, plus their tally rows: one
    task per fragment (``fragments``), each reading its row groups and running the stages in
    process. ``stages`` must be fusable (see ``fusable``); they run with the first stage's CPUs
    and batch size."""
    if fusable(stages) != len(stages):
        raise ValueError("only stateless CPU stages (no actor pool, no GPU) run inside the scan")
    res = stages[0].declared() if stages else Resources()
    frags = fragments(inp, fragment_rows)
    items = [{"path": f["path"], "row_groups": f["row_groups"]} for f in frags]
    ds = ray.data.from_items(items, override_num_blocks=max(1, len(items)))
    scan = FragmentScan(inp.filesystem, columns, stages, schema, res.batch_size)
    return runtime.map_batches(ds, _scan_task, runtime.task_retries(), batch_format="pyarrow", batch_size=1,
                               num_cpus=res.num_cpus, fn_args=(scan,))


def parquet_dataset(ray, filesystem, paths: list[str], schema: pa.Schema | None = None,
                    columns: list[str] | None = None):
    """A Ray dataset of the rows of parquet files (their ``columns``, read as ``schema`` where
    given): one read task per file, on the task workers every stream uses. Ray Data's own
    ``read_parquet`` first reads the files' footers on a pool of 32 actors per execution (one
    process each, whatever the number of files); a dataset read again (a selection consumed three
    times) starts them again each time."""
    items = [{"path": str(p)} for p in paths]
    ds = ray.data.from_items(items, override_num_blocks=max(1, len(items)))
    return runtime.map_batches(ds, _file_task, runtime.task_retries(), batch_format="pyarrow", batch_size=1,
                               fn_args=(filesystem, schema, columns))


def _file_task(batch: pa.Table, filesystem, schema: pa.Schema | None, columns: list[str] | None) -> pa.Table:
    tables = [io.read_parquet_file(filesystem, path, columns=columns, schema=schema, use_threads=False)
              for path in batch.column("path").to_pylist()]
    runtime.settle_task_worker()
    return pa.concat_tables(tables)


def _scan_task(batch: pa.Table, scan: FragmentScan) -> pa.Table:
    out = scan(batch)
    runtime.settle_task_worker()
    return out


def describe(stages: list[Stage], fragment_rows: int) -> dict:
    """What metrics.json records about the fused scan."""
    return {"fused_stages": [s.name for s in stages], "fragment_rows": int(fragment_rows),
            "batch_rows": dataclasses.asdict(stages[0].declared())["batch_size"] if stages else None}

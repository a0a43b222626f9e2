"""Resume by shard: the commit protocol of a stream whose sink tasks write part files.

A long scan runs one shard of its input at a time. Its sink tasks write their rows as part files
(atomically, under fresh names) and pass on only their tally rows, plus one row per part naming
it (``write_part_task``). When the shard's stream is drained, the driver commits it
(``commit_shard``): it keeps exactly the parts it received, deletes whatever attempts Ray retried
or killed left in the shard's directory, writes the shard's tallies under a fixed key, and only
then writes the done marker, which lists the parts. A crash at any point leaves a shard that is
either done and exact, or redone on resume (its directory cleared first). Readers take the parts
the markers list (``committed_parts``), never a directory listing. As datatrove keeps completion
markers in its executor, this lives in the engine beside ``rundir`` and ``checkpoint``.
"""

from __future__ import annotations

import posixpath
import uuid

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from operators.base import conform, split_tallies
from pipelines.engine.storage import io
from schemas.captions import STAGE_WRITTEN_PARTS, TALLY_COUNT, TALLY_FIELDS, TALLY_OUTCOME, TALLY_STAGE

TALLY_SCHEMA = pa.schema(TALLY_FIELDS)


def write_part_task(batch: pa.Table, fs, data_dir: str, schema: pa.Schema) -> pa.Table:
    """The sink of a sharded stream (a Ray Data map task): write this batch's data rows as a part
    file of ``data_dir`` (atomically, conformed to ``schema``); return only its tally rows, with
    one more row naming the part (outcome: the file name, count: its rows)."""
    data, tallies = split_tallies(batch)
    out = tallies.select([TALLY_STAGE, TALLY_OUTCOME, TALLY_COUNT]).cast(TALLY_SCHEMA)
    if data.num_rows:
        part = f"part-{uuid.uuid4().hex}.parquet"
        io.write_table(conform(data, schema), fs, f"{data_dir}/{part}")
        out = pa.concat_tables([out, pa.table([[STAGE_WRITTEN_PARTS], [part], [data.num_rows]], schema=TALLY_SCHEMA)])
    return out


def commit_parts(fs, data_dir: str, written: pa.Table) -> list[dict]:
    """Keep exactly the parts the driver received (``written``: their tally rows) in ``data_dir``
    and delete everything else: parts of attempts Ray retried (a worker that died after writing, a
    block re-run by lineage reconstruction) and temporary files of killed writes. Returns the
    manifest, [{"name", "rows"}], sorted by name."""
    manifest = [{"name": n, "rows": int(r)} for n, r in zip(written.column(TALLY_OUTCOME).to_pylist(),
                                                             written.column(TALLY_COUNT).to_pylist())]
    keep = {m["name"] for m in manifest}
    infos = fs.get_file_info(pafs.FileSelector(data_dir, allow_not_found=True, recursive=True))
    files = {posixpath.basename(f.path): f.path for f in infos if f.type == pafs.FileType.File}
    missing = sorted(keep - set(files))
    if missing or len(keep) != len(manifest):
        raise RuntimeError(f"parts reported written but not in {data_dir}: {missing[:5]}")
    for base, path in files.items():
        if base not in keep:
            fs.delete_file(path)
    return sorted(manifest, key=lambda m: m["name"])


def commit_shard(run, name: str, data_dir: str, tallies: pa.Table, info: dict, tally_checkpoint: str,
                 key: str) -> pa.Table:
    """Commit a drained shard (see the module docstring): its parts, its tallies (checkpoint
    ``tally_checkpoint``, part ``key``: a redone shard replaces its own), then the done marker
    ``name`` with ``info`` and the parts' manifest. Returns the tallies without the part rows."""
    written = pc.equal(tallies.column(TALLY_STAGE), STAGE_WRITTEN_PARTS)
    manifest = commit_parts(run.fs, data_dir, tallies.filter(written))
    tallies = tallies.filter(pc.invert(written))
    run.write_part(tally_checkpoint, tallies, key=key)
    run.mark_done(name, {**info, "parts": manifest})
    return tallies


def committed_parts(run, shards: list[tuple[str, str]]) -> list[str]:
    """The part files of every done shard of ``shards`` ([(marker name, data directory)]), as their
    done markers list them (a file in a shard directory that no marker lists is never read)."""
    paths = []
    for name, data_dir in shards:
        done = run.done(name) or {}
        if "parts" in done:
            paths += [f"{data_dir}/{p['name']}" for p in done["parts"]]
        else:  # marked done by a version that kept no list: what its directory holds
            infos = run.fs.get_file_info(pafs.FileSelector(data_dir, allow_not_found=True))
            paths += sorted(f.path for f in infos if f.type == pafs.FileType.File and f.path.endswith(".parquet")
                            and not posixpath.basename(f.path).startswith((".", "_")))
    return paths

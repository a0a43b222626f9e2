"""The engine's shard commit protocol (pipelines/engine/stream/shards.py), without Ray: the sink task's
parts, the driver's commit, and what readers see."""

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from operators.base import tally_rows
from pipelines.engine.run import rundir
from pipelines.engine.stream import shards
from schemas.captions import STAGE_WRITTEN_PARTS, TALLY_COUNT, TALLY_OUTCOME, TALLY_STAGE

SCHEMA = pa.schema([pa.field("x", pa.int64()), pa.field(TALLY_STAGE, pa.string()),
                    pa.field(TALLY_OUTCOME, pa.string()), pa.field(TALLY_COUNT, pa.int64())])


def batch(values, kept):
    data = pa.table({"x": pa.array(values, pa.int64())})
    from operators.base import conform

    return pa.concat_tables([conform(data, SCHEMA), tally_rows("stage", {"kept": kept}, SCHEMA)])


def test_a_shard_commits_exactly_the_parts_the_driver_received(tmp_path):
    run = rundir.RunDir(str(tmp_path), "r").open("fp", {"job": 1})
    fs, data_dir = pafs.LocalFileSystem(), str(tmp_path / "r" / "data" / "shard-00000")
    out_schema = pa.schema([pa.field("x", pa.int64())])
    received = [shards.write_part_task(batch([1, 2], 2), fs, data_dir, out_schema),
                shards.write_part_task(batch([3], 1), fs, data_dir, out_schema)]
    lost = shards.write_part_task(batch([9, 9, 9], 3), fs, data_dir, out_schema)   # a retried attempt's part
    assert lost.filter(pa.compute.equal(lost[TALLY_STAGE], STAGE_WRITTEN_PARTS)).num_rows == 1
    tallies = shards.commit_shard(run, "scan/shard-00000", data_dir, pa.concat_tables(received), {"rows": 3},
                                  "tallies", key="shard-00000")
    assert STAGE_WRITTEN_PARTS not in tallies.column(TALLY_STAGE).to_pylist()
    marker = run.done("scan/shard-00000")
    assert marker["rows"] == 3 and sorted(p["rows"] for p in marker["parts"]) == [1, 2]
    parts = shards.committed_parts(run, [("scan/shard-00000", data_dir), ("scan/shard-00001", data_dir + "1")])
    assert sorted(pq.read_table(p)["x"].to_pylist()[0] for p in parts) == [1, 3]
    assert len(list((tmp_path / "r" / "data" / "shard-00000").iterdir())) == 2   # the lost part is gone
    assert run.read_parts("tallies", shards.TALLY_SCHEMA).num_rows == tallies.num_rows


def test_a_part_reported_but_missing_fails_the_commit(tmp_path):
    fs = pafs.LocalFileSystem()
    written = pa.table({TALLY_STAGE: [STAGE_WRITTEN_PARTS], TALLY_OUTCOME: ["part-x.parquet"], TALLY_COUNT: [1]})
    with pytest.raises(RuntimeError, match="not in"):
        shards.commit_parts(fs, str(tmp_path), written.cast(shards.TALLY_SCHEMA))

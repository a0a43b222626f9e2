"""The shared per-image checkpoint of the studies (pipelines/engine/storage/checkpoint.py): first-written row
per image wins, other models and no-longer-requested images are ignored, request order restored,
list-typed columns survive."""

import pyarrow as pa
import pytest

from pipelines.engine.storage import checkpoint
from pipelines.engine.run.rundir import RunDir

SCHEMA = pa.schema([("image_id", pa.string()), ("model", pa.string()), ("value", pa.int64()),
                    ("answers", pa.list_(pa.string()))])


def part(ids, model, values):
    return pa.table({"image_id": ids, "model": [model] * len(ids), "value": values,
                     "answers": [[f"a{v}", "b"] for v in values]}, schema=SCHEMA)


def test_checkpointed_rows_resume_and_order(tmp_path):
    rd = RunDir(str(tmp_path), "r")
    rd.open("fp", {"x": 1})
    rd.write_part("gen", part(["i1", "i2"], "m", [1, 2]))
    rd.write_part("gen", part(["i2", "i3"], "m", [20, 3]))      # a retried block wrote i2 again
    rd.write_part("gen", part(["i1", "i4"], "other", [7, 8]))   # another model's images
    requests = pa.table({"image_id": ["i4", "i3", "i2", "i1", "i5"]})
    done = checkpoint.checkpointed(rd, "gen", "m", requests, SCHEMA, "image_id")
    assert sorted(done.column("image_id").to_pylist()) == ["i1", "i2", "i3"]
    assert dict(zip(done.column("image_id").to_pylist(), done.column("value").to_pylist()))["i2"] == 2  # first written
    todo = checkpoint.still_to_do(requests, done, "image_id")
    assert todo.column("image_id").to_pylist() == ["i4", "i5"]
    assert checkpoint.still_to_do(requests, done.slice(0, 0), "image_id").num_rows == 5
    # only what is still requested counts
    fewer = pa.table({"image_id": ["i3", "i1"]})
    kept = checkpoint.checkpointed(rd, "gen", "m", fewer, SCHEMA, "image_id")
    ordered = checkpoint.in_request_order(kept, fewer, "image_id", "m")
    assert ordered.column("image_id").to_pylist() == ["i3", "i1"]
    assert ordered.column("answers").to_pylist() == [["a3", "b"], ["a1", "b"]]
    with pytest.raises(RuntimeError, match="5 images requested, 3 came back"):
        checkpoint.in_request_order(done, requests, "image_id", "m")


UNIT_SCHEMA = pa.schema([("image_id", pa.string()), ("unit_id", pa.string()), ("model", pa.string()),
                         ("value", pa.int64())])


def unit_part(rows, model="m"):
    return pa.table({"image_id": [f"{u}-{v}" for u, v in rows], "unit_id": [u for u, _ in rows],
                     "model": [model] * len(rows), "value": list(range(len(rows)))}, schema=UNIT_SCHEMA)


def test_multi_row_requests_count_only_when_complete(tmp_path):
    """A triplet unit is one request of three rows: a part cut short by a crash (two of its three
    rows written) leaves the unit to do again; complete units come back three rows each, in
    request order."""
    rd = RunDir(str(tmp_path), "r")
    rd.open("fp", {"x": 1})
    rd.write_part("gen", unit_part([("u1", "a"), ("u1", "b"), ("u1", "c"), ("u2", "a"), ("u2", "b")]))
    rd.write_part("gen", unit_part([("u3", "a"), ("u3", "b"), ("u3", "c"), ("u1", "a")]))  # u1/a again: first wins
    requests = pa.table({"unit_id": ["u3", "u2", "u1", "u4"]})
    done = checkpoint.checkpointed(rd, "gen", "m", requests, UNIT_SCHEMA, "image_id", "unit_id", 3)
    assert sorted(set(done.column("unit_id").to_pylist())) == ["u1", "u3"]
    assert done.num_rows == 6
    assert checkpoint.still_to_do(requests, done, "unit_id").column("unit_id").to_pylist() == ["u2", "u4"]
    fewer = pa.table({"unit_id": ["u3", "u1"]})
    ordered = checkpoint.in_request_order(done, fewer, "image_id", "m", "unit_id", 3)
    assert ordered.column("image_id").to_pylist() == ["u3-a", "u3-b", "u3-c", "u1-a", "u1-b", "u1-c"]
    with pytest.raises(RuntimeError, match="12 images requested, 6 came back"):
        checkpoint.in_request_order(done, requests, "image_id", "m", "unit_id", 3)

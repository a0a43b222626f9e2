"""Per-image checkpoints of a study: what a model already produced, for resuming.

Results are written as parts (``RunDir.write_part``) while they stream in; on a new attempt the
parts are read back, a row per image id kept (the first written: a retried block may have written
one twice), and only images still requested count. No pyarrow join is used, so list-typed columns
(CLIP embeddings, BLIP-2 answers) come through.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from schemas.images import MODEL


def checkpointed(rd, name: str, model: str, requests: pa.Table, schema: pa.Schema, key: str) -> pa.Table:
    """``model``'s checkpointed rows under ``name`` that are still requested, one per ``key``."""
    done = rd.read_parts(name, schema)
    done = done.filter(pc.equal(done.column(MODEL), model))
    if done.num_rows:
        idx = pa.array(np.arange(done.num_rows), pa.int64())
        first = done.append_column("_i", idx).group_by([key], use_threads=False).aggregate([("_i", "min")])
        done = done.take(first.column("_i_min"))
    return done.filter(pc.is_in(done.column(key), requests.column(key)))


def still_to_do(requests: pa.Table, done: pa.Table, key: str) -> pa.Table:
    """The requests whose ``key`` is not in ``done``."""
    if not done.num_rows:
        return requests
    return requests.filter(pc.invert(pc.is_in(requests.column(key), done.column(key))))


def in_request_order(rows: pa.Table, requests: pa.Table, key: str, what: str) -> pa.Table:
    """``rows`` (one per requested ``key``) in the order of ``requests``; every request must be there."""
    if rows.num_rows != requests.num_rows:
        raise RuntimeError(f"{what}: {requests.num_rows} images requested, {rows.num_rows} came back")
    return rows.take(pc.index_in(requests.column(key), rows.column(key)))

"""Per-image checkpoints of a study: what a model already produced, for resuming.

Results are written as parts (``RunDir.write_part``) while they stream in; on a new attempt the
parts are read back, a row per image id kept (the first written: a retried block may have written
one twice), and only images still requested count. No pyarrow join is used, so list-typed columns
(CLIP embeddings, BLIP-2 answers) come through.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.engine.run import rundir
from schemas.images import MODEL

Key = str | Sequence[str]   # the column, or columns, naming one image


def key_columns(key: Key) -> list[str]:
    return [key] if isinstance(key, str) else list(key)


def key_values(table: pa.Table, key: Key) -> pa.Array | pa.ChunkedArray:
    """One value per row naming its ``key``: the column itself, or the columns joined as text."""
    cols = key_columns(key)
    if len(cols) == 1:
        return table.column(cols[0])
    return pc.binary_join_element_wise(*[pc.cast(table.column(c), pa.string()) for c in cols], "\x1f")


def first_per_key(table: pa.Table, key: Key) -> pa.Table:
    """The first row per ``key``, in the table's order (through a row index: list columns come along)."""
    if table.num_rows == 0:
        return table
    idx = table.select(key_columns(key)).append_column("_i", pa.array(np.arange(table.num_rows), pa.int64()))
    first = idx.group_by(key_columns(key), use_threads=False).aggregate([("_i", "min")]).column("_i_min").to_numpy()
    return table.take(pa.array(np.sort(first), pa.int64()))


def per_request_rows(rows: pa.Table, requests: pa.Table, key: Key) -> pa.Table:
    """One row per request from ``rows`` (one per ``key``, shared by the requests with that key):
    each request gets the row of its key with the request's own columns (several requests may
    share one generated image, e.g. a caption in two occupations' section 6 requests)."""
    if requests.num_rows == 0:
        return rows.slice(0, 0)
    position = pc.index_in(key_values(requests, key), key_values(rows, key))
    if position.null_count:
        raise RuntimeError(f"{position.null_count} requests have no row")
    out = rows.take(position)
    for name in requests.column_names:
        if name in out.column_names:
            out = out.set_column(out.schema.get_field_index(name), name,
                                 requests.column(name).cast(out.schema.field(name).type))
    return out


def checkpointed(rd, name: str, model: str, requests: pa.Table, schema: pa.Schema, key: Key,
                 request_key: str | None = None, per_request: int = 1) -> pa.Table:
    """``model``'s checkpointed rows under ``name`` that are still requested, one per ``key``
    (a column or several).

    A request may produce several rows (``per_request``, e.g. the three images of a triplet unit),
    each with its own ``key`` and the request's ``request_key``: a request counts as done only
    when all its rows are there (a part cut short by a crash leaves it to do again)."""
    rkey = request_key or key
    done = rd.read_parts(name, schema)
    done = first_per_key(done.filter(pc.equal(done.column(MODEL), model)), key)
    done = done.filter(pc.is_in(key_values(done, rkey), key_values(requests, rkey)))
    if per_request > 1 and done.num_rows:
        counts = done.group_by([rkey], use_threads=False).aggregate([(key, "count")])
        complete = counts.filter(pc.equal(counts.column(f"{key}_count"), per_request)).column(rkey)
        done = done.filter(pc.is_in(done.column(rkey), complete))
    return done


def still_to_do(requests: pa.Table, done: pa.Table, key: Key) -> pa.Table:
    """The requests whose ``key`` is not in ``done``."""
    if not done.num_rows:
        return requests
    return requests.filter(pc.invert(pc.is_in(key_values(requests, key), key_values(done, key))))


def in_request_order(rows: pa.Table, requests: pa.Table, key: Key, what: str, request_key: str | None = None,
                     per_request: int = 1) -> pa.Table:
    """``rows`` (``per_request`` per request, told apart by ``key``) in the order of ``requests``
    (and of ``key`` within one); every request must be there."""
    if rows.num_rows != requests.num_rows * per_request:
        raise RuntimeError(f"{what}: {requests.num_rows * per_request} images requested, {rows.num_rows} came back")
    if request_key is None:
        return rows.take(pc.index_in(key_values(requests, key), key_values(rows, key)))
    position = pc.index_in(rows.column(request_key), requests.column(request_key))
    order = pc.sort_indices(pa.table({"r": position, "k": rows.column(key)}), [("r", "ascending"), ("k", "ascending")])
    return rows.take(order)


def generation_checkpoint(model: str) -> str:
    """The checkpoint name of ``model``'s generated images."""
    return f"generated/{hashlib.sha256(model.encode()).hexdigest()[:12]}"


def model_dir(model: str) -> str:
    """A readable, collision-free directory name for ``model``'s saved images."""
    return f"{rundir.slug(Path(model.rstrip('/')).name, 30)}-{hashlib.sha256(model.encode()).hexdigest()[:6]}"

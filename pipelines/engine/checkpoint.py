"""Per-image checkpoints of a study: what a model already produced, for resuming.

Results are written as parts (``RunDir.write_part``) while they stream in; on a new attempt the
parts are read back, a row per image id kept (the first written: a retried block may have written
one twice), and only images still requested count. No pyarrow join is used, so list-typed columns
(CLIP embeddings, BLIP-2 answers) come through.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from schemas.images import MODEL, PAYLOAD


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


def generation_checkpoint(model: str) -> str:
    """The checkpoint name of ``model``'s generated images."""
    return f"generated/{hashlib.sha256(model.encode()).hexdigest()[:12]}"


def model_dir(model: str) -> str:
    """A readable, collision-free directory name for ``model``'s saved images."""
    from pipelines.engine import rundir

    return f"{rundir.slug(Path(model.rstrip('/')).name, 30)}-{hashlib.sha256(model.encode()).hexdigest()[:6]}"


def generate(ray, rd, requests: pa.Table, model: str, pipeline: list, schema: pa.Schema, key: str, batch: int,
             budgets, echo, finish: Callable[[pa.Table], pa.Table] | None = None):
    """Run the generation ``pipeline`` (a stage list) over every request of ``model`` not yet
    checkpointed, checkpointing rows (``finish``ed, default: conformed to ``schema``) as they
    arrive; returns (one row per request in request order, the Phase)."""
    from pipelines.engine import runtime, stages
    from pipelines.engine.progress import Phase, drain

    from operators.base import conform

    name = generation_checkpoint(model)
    done = checkpointed(rd, name, model, requests, schema, key)
    todo = still_to_do(requests, done, key)
    phase = Phase(f"generate {Path(model.rstrip('/')).name}", "images", requests.num_rows, reused=done.num_rows)
    for b in budgets:
        b.add(done)
    if todo.num_rows:
        finish = finish or (lambda t: conform(t, schema))
        ds = runtime.from_table(ray, todo.sort_by([(key, "ascending")]), batch * 4)
        ds = stages.run(ds, pipeline).drop_columns(PAYLOAD)
        drain(ds, lambda t: rd.write_part(name, finish(t)), phase, budgets=budgets, flush_rows=max(batch * 4, 32),
              echo=echo)
    elif budgets:
        for b in budgets:
            b.check(final=True)
    images = checkpointed(rd, name, model, requests, schema, key)
    return conform(in_request_order(images, requests, key, model), schema), phase

"""One stage serving every generator of a run: each row goes to the operator of its model.

A run that compares several generators runs them in one Ray Data execution: the requests of all
generators form one stream, each row carrying the generator it asks for (MODEL), and a stage
whose operators differ per generator (the generator itself, the image sink with its per-model
folder) becomes one ``ByModel`` stage. Its actors build the operator of a model when its first
row arrives and keep at most ``keep`` of them built (default one: a generator on a GPU holds
gigabytes, and the requests reach the actors ordered by model, so each actor switches a few
times per run, not per batch). Stages that are the same for every generator (a skin-tone or
face stage after the generator) stay one ordinary stage.

What it saves: every actor stage of every execution starts a Python process that imports its
libraries (torch, diffusers, open_clip: about 5 CPU-seconds on a small machine), once per
execution, whatever the number of images; one execution per run pays that once instead of once
per generator (docs/testing.md has the measurements).

What the generators of a ``ByModel`` stage take alike is built once per actor: a head, the NSFW
check or Exposed's objects and word maps (an argument that is a ``Stage`` or a list of them, the
same for every model) is built the first time a generator needs it and then handed to each
generator built after it, on the same device. A switch between generators loads the next
generator, not CLIP, BLIP-2 or GroundingDINO and SAM again (on a GPU each is seconds to a minute
of loading, and BLIP-2 alone is 15 GB).
"""

from __future__ import annotations

import dataclasses
import gc
import sys
from collections import OrderedDict
from typing import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from operators.base import Stage, weak_parts
from schemas.images import MODEL


class ByModel:
    """Apply, to each row, the operator of ``stages[row's MODEL]`` (built on first use, at most
    ``keep`` built at once). Rows come back in their order; an operator that returns several rows
    per row (a triplet unit's images) gives them back model by model."""

    def __init__(self, stages: Mapping[str, Stage], keep: int = 1):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.stages, self.shared = share_parts(dict(stages))   # the parts every model takes alike
        self.keep = int(keep)
        self.built: OrderedDict[str, object] = OrderedDict()

    def operator(self, model: str):
        """The built operator of ``model`` (the least recently used one let go when over ``keep``)."""
        if model not in self.stages:
            raise KeyError(f"no stage for model {model!r} (this stage serves {sorted(self.stages)})")
        if model in self.built:
            self.built.move_to_end(model)
            return self.built[model]
        while len(self.built) >= self.keep:
            _, old = self.built.popitem(last=False)
            kept = {id(part) for shared in self.shared for part in shared.built.values()}
            parts = [ref for ref in weak_parts(old) if id(ref()) not in kept]   # the shared parts stay
            del old
            release_device_memory(freeze=not self.built, let_go=parts)
        self.built[model] = self.stages[model].build()
        # built under the paused collector: one full collection now instead of the three passes
        # over the build's objects that turning it back on starts (nothing frozen: it may be let go)
        gc.collect()
        return self.built[model]

    def __call__(self, batch: pa.Table) -> pa.Table:
        models = batch.column(MODEL)
        names = pc.unique(models).to_pylist()
        if len(names) == 1:
            return self.operator(names[0])(batch)
        parts, rows = [], []
        for name in names:
            idx = np.flatnonzero(np.asarray(of_model(batch, name)))
            parts.append(self.operator(name)(batch.take(pa.array(idx, pa.int64()))))
            rows.append(idx)
        out = pa.concat_tables(parts, promote_options="default")
        if out.num_rows != batch.num_rows:   # rows per request (a triplet unit's three images): model by model
            return out
        order = np.argsort(np.concatenate(rows), kind="stable")
        return out.take(pa.array(order, pa.int64()))


@dataclasses.dataclass(frozen=True)
class SharedStage(Stage):
    """A part every generator of a ``ByModel`` stage takes alike (a head, the NSFW check): one
    instance in every generator's arguments, whose ``build`` gives the part it built for the same
    defaults (the generator's device), building it the first time."""

    built: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def build(self, **defaults):
        key = tuple(sorted(defaults.items()))
        if key not in self.built:
            self.built[key] = super().build(**defaults)
        return self.built[key]


def share_parts(stages: dict[str, Stage]) -> tuple[dict[str, Stage], list[SharedStage]]:
    """``stages`` with every argument that is a ``Stage`` (or a list or tuple of them) and the same
    for every model replaced by one ``SharedStage`` (list) in all of them; and those shared stages."""
    if len(stages) < 2:
        return stages, []
    first = next(iter(stages.values()))
    made: list[SharedStage] = []

    def is_part(value) -> bool:
        return isinstance(value, Stage) or (isinstance(value, (list, tuple)) and bool(value)
                                            and all(isinstance(v, Stage) for v in value))

    def shared(value):
        if isinstance(value, Stage):
            made.append(SharedStage(value.op, value.kwargs, value.resources))
            return made[-1]
        return type(value)(shared(v) for v in value)

    parts = {k: shared(v) for k, v in first.kwargs.items()
             if is_part(v) and all(k in s.kwargs and s.kwargs[k] == v for s in stages.values())}
    if not parts:
        return stages, []
    return {m: dataclasses.replace(s, kwargs={**s.kwargs, **parts}) for m, s in stages.items()}, made


def of_model(table: pa.Table, model: str):
    """Which rows of ``table`` belong to generator ``model`` (its MODEL column; a null is none's)."""
    return pc.fill_null(pc.equal(table.column(MODEL), model), False)


def release_device_memory(freeze: bool = False, let_go: Sequence = ()) -> None:
    """Collect a let-go model and return its GPU memory to the device (where torch is in use).
    ``freeze``: no model is left built, so what survives the collection is the process's own (its
    libraries, the actor's state): it is frozen (``gc.freeze``), and the next let-go model's
    collection walks only what was allocated since, not every imported library again (about 0.8 s
    per switch in a generator actor). Never with a model still built, nor while any part of the
    let-go one (``let_go``: ``weak_parts`` taken before it was dropped) is still alive, held by
    something else: frozen, it could never be collected once that lets it go."""
    gc.collect()
    if freeze and not any(ref() is not None for ref in let_go):
        gc.freeze()
    torch = sys.modules.get("torch")   # never imported here: only a process that already uses it
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def merge(pipelines: Mapping[str, list[Stage]]) -> list[Stage]:
    """One stage list for the generators of ``pipelines`` ({model: its stage list}, all of the same
    length and stage names): a stage equal for every model stays as it is; one that differs (its
    arguments) becomes a ``ByModel`` stage with the resources they share."""
    lists = list(pipelines.values())
    out = []
    for i, first in enumerate(lists[0]):
        column = [p[i] for p in lists]
        if any(s.name != first.name for s in column):
            raise ValueError(f"the generators' stage lists differ at {i}: {[s.name for s in column]}")
        if all(s == first for s in column):
            out.append(first)
            continue
        resources = {repr(s.declared()) for s in column}   # Resources holds a dict: compared as text
        if len(resources) > 1:
            raise ValueError(f"stage {first.name}: the generators ask for different resources {sorted(resources)}")
        out.append(Stage(ByModel, {"stages": dict(zip(pipelines, column))}, resources=first.declared()))
    return out


def resource_groups(pipelines: Mapping[str, list[Stage]]) -> list[list[str]]:
    """The models whose stage lists ask for the same resources at every stage (so one execution can
    serve them), in order: on a cluster, a model too large for ``gpu_worker``'s card asks for
    ``gpu_worker_large``'s resource and runs in an execution of its own."""
    groups: dict[tuple, list[str]] = {}
    for model, stages in pipelines.items():
        groups.setdefault(tuple((s.name, repr(s.declared())) for s in stages), []).append(model)
    return list(groups.values())

"""What every stage shares: the contracts of operators, declared resources, schema conformance,
and row accounting.

A stage is a plain class: ``__init__`` loads what it needs once per worker, ``__call__`` takes a
``pyarrow.Table`` batch and returns one. Nothing here imports Ray, so tests call stages directly.

The contracts the engine relies on are declared below as Protocols (a type checker and
``isinstance`` see them; tests/operators/test_contracts.py checks every operator against the one
it claims):

- ``Operator``: a stage of a Ray Data stream (``stage_name``, ``resources``, ``__call__``); its
  rows in and out are counted under ``stage_name``, plus what ``tally(out)`` adds (``Tallying``).
- ``FilterOperator``: an operator whose ``status_column`` holds one of ``outcomes`` per row;
  "kept" rows go on, the others become counted drops (``run_counted``).
- ``DeviceHead``: runs inside the generator's actor on the generated image tensor, while it is on
  the device (``classify_tensor``), adding the columns of ``output_fields``; ``takes_prompts``
  heads also get the prompts.
- ``DisparityHead``: runs inside the triplet generator on a unit's three images and returns one
  similarity per pair and space it measures (``spaces``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import typing
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from schemas.captions import (
    OUTCOME_KEPT,
    OUTCOME_ROWS_IN,
    OUTCOME_ROWS_OUT,
    TALLY_COUNT,
    TALLY_OUTCOME,
    TALLY_STAGE,
)


@dataclass(frozen=True)
class Resources:
    """What a pipeline needs to know to turn a stage into a ``map_batches`` call."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    batch_size: int = 4096
    # None: stateless stage, run as Ray tasks. An int: a pool of that many actors, each loading
    # the stage's model once. (min, max): a pool Ray Data grows from min to max actors as inputs queue.
    actors: int | tuple[int, int] | None = None
    # Custom Ray resources each task/actor also asks for ({name: amount}), e.g. {"large_gpu": 1}
    # for a generator too large for the ordinary GPU node (pipelines/engine/run/gpus.py). None: none.
    resources: dict | None = None


@runtime_checkable
class Operator(Protocol):
    """A stage of a stream: one batch in, one batch out; rows counted under ``stage_name``."""

    stage_name: ClassVar[str]
    resources: ClassVar[Resources]

    def __call__(self, batch: pa.Table) -> pa.Table: ...


@runtime_checkable
class FilterOperator(Operator, Protocol):
    """An operator that decides per row: ``status_column`` holds one of ``outcomes`` (one of them
    "kept"); the others are drops, counted per reason."""

    status_column: ClassVar[str]
    outcomes: ClassVar[tuple[str, ...]]


@runtime_checkable
class Tallying(Protocol):
    """An operator with informational counts of its own (not drops), e.g. "NER skipped"."""

    def tally(self, out: pa.Table) -> Mapping[str, int]: ...


@runtime_checkable
class DeviceHead(Protocol):
    """A measure on the generated image tensor, on the generator's device: ``classify_tensor(images)``
    (``images`` (B, 3, H, W) floats in [0, 1]; with ``takes_prompts`` also ``prompts=[...]``) returns
    {column: B values} for the columns of ``output_fields``."""

    stage_name: ClassVar[str]
    output_fields: ClassVar[Sequence[pa.Field]]

    def classify_tensor(self, images: Any, **kwargs) -> Mapping[str, Sequence]: ...


@runtime_checkable
class DisparityHead(Protocol):
    """A measure on a triplet unit's three images: ``triplet_similarities(images)`` (U, 3, 3, H, W)
    returns {space: (U, 3) pair similarities} for each of its ``spaces``."""

    spaces: Sequence[str]

    def triplet_similarities(self, images: Any) -> Mapping[str, Any]: ...


def declares(cls: type, contract: type) -> list[str]:
    """The members of ``contract`` (a Protocol above) that ``cls`` lacks: [] when it declares them
    all (checked on the class, without building it)."""
    def has(name: str) -> bool:   # every class is callable: a method must be defined by the class
        if name.startswith("__"):
            return any(name in vars(k) for k in cls.__mro__ if k is not object)
        return hasattr(cls, name) or any(name in getattr(k, "__annotations__", {}) for k in cls.__mro__)

    names = getattr(contract, "__protocol_attrs__", None) or typing._get_protocol_attrs(contract)
    return sorted(n for n in names if not has(n))


@dataclass(frozen=True)
class Stage:
    """One line of a pipeline: an operator class, its keyword arguments, and the resources it runs
    with (None: what the operator declares in its ``resources``). A pipeline is a list of these,
    run by ``pipelines.engine.stream.stages.run``; a head that runs inside another stage on its device
    (CLIP on the generator's images) is a Stage given to that stage as an argument."""

    op: type
    kwargs: Mapping = dataclasses.field(default_factory=dict)
    resources: Resources | None = None

    @property
    def name(self) -> str:
        return getattr(self.op, "stage_name", self.op.__name__)

    def declared(self) -> Resources:
        return self.resources or getattr(self.op, "resources", None) or Resources()

    def build(self, **defaults):
        """The operator, with ``defaults`` for arguments the stage does not set (e.g. the device)."""
        return build_operator(self.op, {**defaults, **dict(self.kwargs)})


def build_operator(factory: Callable[..., Any], kwargs: Mapping) -> Any:
    """``factory(**kwargs)`` built under ``gc_paused``: how every operator is built (a Stage, a
    stream stage, a task's operator)."""
    with gc_paused():
        return factory(**kwargs)


@contextlib.contextmanager
def gc_paused(collect_after: bool = False):
    """Python's cyclic garbage collector off while an operator is built. Building one imports its
    libraries and loads its model: millions of long-lived objects, over which the collector would
    run several full passes during the build. Paused, they all stay in the youngest generation, and
    once the collector is back on it walks them three times (young, middle, then a full
    collection): the pause alone only moves that cost (docs/benchmarks.md). What keeps its objects
    ends the pause with one pass: ``settle_heap`` (an actor), or ``collect_after``, one full
    collection when the block has finished (the driver's model loads and stand-ins). Reference
    counting frees memory as usual meanwhile; cyclic garbage waits for the next collection."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
    if collect_after:
        gc.collect()


def settle_heap() -> None:
    """For a process that has just built what it keeps for the rest of its life (an actor and its
    operator): one full collection, then what survives is frozen (``gc.freeze``). Built under
    ``gc_paused``, the libraries and the model (millions of objects) all sit in the youngest
    generation, and turning the collector back on would walk them three times over the next
    moments (young, middle, then a full collection); settled, they are walked once and never again,
    and later collections see only what the batches allocate. Not for a process that lets what it
    built go (a task's operator, ``ByModel``'s models): a frozen object in a reference cycle is
    never collected."""
    gc.collect()
    gc.freeze()


def weak_parts(model: Any) -> list:
    """Weak references to ``model``, its parts (a diffusers pipeline's ``components``, else the
    values of its attributes, and a pipeline such a part holds) and every submodule of the torch
    modules among them, taken before the caller lets it go: what ``collect_let_go`` checks. Parts
    that take no weak reference (strings, numbers, None, containers) are left out."""
    import weakref

    def parts_of(obj) -> list:
        comps = getattr(obj, "components", None)
        if isinstance(comps, Mapping):
            return list(comps.values())
        return [] if _is_module(obj) or not hasattr(obj, "__dict__") else list(vars(obj).values())

    found = [model]
    for part in parts_of(model):
        found.append(part)
        if isinstance(getattr(part, "components", None), Mapping):   # an operator holding a pipeline
            found += list(part.components.values())
    found += [sub for obj in found if _is_module(obj) for sub in obj.modules()]
    refs, seen = [], set()
    for obj in found:
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        try:
            refs.append(weakref.ref(obj))
        except TypeError:
            continue
    return refs


def _is_module(obj) -> bool:
    """A torch ``nn.Module`` (told by its interface: nothing here imports torch)."""
    return hasattr(obj, "_modules") and callable(getattr(obj, "modules", None))


def collect_let_go(refs: Sequence) -> None:
    """Free a model the caller has just let go (``weak_parts`` taken before its last reference was
    dropped), its reference cycles included, before the next one loads. While the collector is
    paused (``gc_paused``) nothing has been collected since the pause began, so what the model
    allocated is in the youngest generation: collecting that one frees it without walking the
    long-lived heap (in a process that imported torch, diffusers and transformers, a full
    collection takes about 0.4 s). Whatever is still alive after that (allocated before the pause,
    or kept by an older object) gets the full collection."""
    gc.collect(0)
    if any(ref() is not None for ref in refs):
        gc.collect()


def with_column(table: pa.Table, name: str, values) -> pa.Table:
    """``table`` with column ``name`` set to ``values`` (replaced in place, or appended)."""
    i = table.schema.get_field_index(name)
    return table.set_column(i, name, values) if i >= 0 else table.append_column(name, values)


def status_array(codes: np.ndarray, outcomes: tuple[str, ...]) -> pa.DictionaryArray:
    """A status column from integer (or boolean) codes indexing ``outcomes``; dictionary-encoded,
    so building it costs nothing per row."""
    return pa.DictionaryArray.from_arrays(pa.array(np.asarray(codes, np.int8)), pa.array(list(outcomes), pa.string()))


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Return ``table`` with exactly ``schema``'s columns, in order; absent columns are nulls."""
    n = table.num_rows
    columns = []
    for field in schema:
        if field.name in table.column_names:
            col = table.column(field.name)
            if not col.type.equals(field.type):
                col = col.cast(field.type)
            columns.append(col)
        else:
            columns.append(pa.nulls(n, field.type))
    return pa.Table.from_arrays(columns, schema=schema)


def tally_rows(stage: str, counts: Mapping[str, int], schema: pa.Schema) -> pa.Table:
    """One row per (stage, outcome) with its count and nulls elsewhere, conformed to ``schema``.

    Outcomes with a zero count are still emitted, so every outcome appears in the summary.
    """
    outcomes = list(counts)
    table = pa.table(
        {
            TALLY_STAGE: pa.array([stage] * len(outcomes), pa.string()),
            TALLY_OUTCOME: pa.array(outcomes, pa.string()),
            TALLY_COUNT: pa.array([int(counts[o]) for o in outcomes], pa.int64()),
        }
    )
    return conform(table, schema)


def split_tallies(batch: pa.Table) -> tuple[pa.Table, pa.Table]:
    """Split a stream batch into (data rows, tally rows)."""
    if TALLY_STAGE not in batch.column_names:
        return batch, batch.slice(0, 0)
    is_tally = pc.is_valid(batch.column(TALLY_STAGE))
    return batch.filter(pc.invert(is_tally)), batch.filter(is_tally)


def filter_with_tally(
    batch: pa.Table,
    stage: str,
    outcome: pa.Array,
    schema: pa.Schema,
    outcomes: tuple[str, ...],
) -> pa.Table:
    """Keep rows whose ``outcome`` is "kept"; replace the others by tally rows counting each reason.

    ``outcomes`` lists every possible outcome so that zero counts are reported too. The counts of
    one call always add up to ``batch.num_rows``.
    """
    counts = outcome_tally(stage, outcome, outcomes)
    kept = batch.filter(pc.equal(outcome, OUTCOME_KEPT))
    return pa.concat_tables([conform(kept, schema), tally_rows(stage, counts, schema)])


def outcome_tally(stage: str, status: pa.Array | pa.ChunkedArray, outcomes: Sequence[str]) -> dict[str, int]:
    """{outcome: rows} of a filter's ``status`` column, every outcome listed (zero counts too); an
    outcome the filter did not declare is an error."""
    counts = dict.fromkeys((OUTCOME_KEPT,) + tuple(o for o in outcomes if o != OUTCOME_KEPT), 0)
    if len(status):
        vc = pc.value_counts(status)
        for value, count in zip(vc.field("values").to_pylist(), vc.field("counts").to_pylist()):
            if value not in counts:
                raise ValueError(f"stage {stage!r} produced unknown outcome {value!r}")
            counts[value] = count
    return counts


def run_counted(op: Callable[[pa.Table], pa.Table], table: pa.Table) -> tuple[pa.Table, dict[str, int] | None]:
    """Run ``op`` on ``table``: (the rows it passes on, its counts) -- the one row accounting of
    every stream (``StreamStage``) and of the fused scan (``pipelines.engine.stream.scan``).

    A ``FilterOperator`` passes on its "kept" rows and counts every outcome; any other named
    operator counts rows in and out, plus what its ``tally(out)`` adds; an unnamed one is not
    counted (None)."""
    stage, status = getattr(op, "stage_name", None), getattr(op, "status_column", None)
    out = op(table)
    if status is not None:
        column = out.column(status)
        return out.filter(pc.equal(column, OUTCOME_KEPT)), outcome_tally(stage, column, op.outcomes)
    if stage is None:
        return out, None
    counts = {OUTCOME_ROWS_IN: table.num_rows, OUTCOME_ROWS_OUT: out.num_rows}
    if hasattr(op, "tally"):
        counts |= op.tally(out)
    return out, counts


class StreamStage:
    """Run a stage on a stream that also carries tally rows, and count what it does.

    Tally rows skip the operator and are passed on unchanged. A filtering operator (one with a
    ``status_column``) keeps its "kept" rows and turns the others into tally rows per reason;
    any other named operator tallies the rows it received and passed on (and what its ``tally(out)``
    adds, if it has one: counts such as "NER skipped", which the summary does not read as drops). The result is conformed
    to the stream schema, so every block of the stream has one schema.
    """

    def __init__(self, factory: Callable[..., Callable[[pa.Table], pa.Table]], kwargs: dict, schema: pa.Schema):
        self.op = build_operator(factory, kwargs)
        self.schema = schema

    def __call__(self, batch: pa.Table) -> pa.Table:
        data, tallies = split_tallies(batch)
        parts = []
        if data.num_rows:
            out, counts = run_counted(self.op, data)
            parts.append(conform(out, self.schema))
            if counts is not None:
                parts.append(tally_rows(self.op.stage_name, counts, self.schema))
        parts.append(conform(tallies, self.schema))
        return pa.concat_tables(parts)

"""Every generator of a run in one Ray Data execution: rows routed to their model's operator, in
their order; per-model checkpoints, budgets and phases; a generator asking for other resources in
an execution of its own."""

from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest

from operators.base import Resources, Stage
from pipelines.engine.cli.options import RunOptions
from pipelines.engine.generation import GeneratorSpec, execute, routing
from pipelines.engine.generation.plan import GenerationPlan
from pipelines.engine.run import rundir
from schemas.images import GENERATION_STATUS, MODEL, PAYLOAD, SEED, GenerationStatus

BUILT = []   # (model, id of the operator) as each ByModel builds one, in this process


class Marker:
    """A stand-in generator: writes its model and a value derived from (model, seed)."""

    stage_name = "generate"
    resources = Resources(num_cpus=1, batch_size=4, actors=1)

    def __init__(self, model: str, fail_seeds=(), **_):
        self.model, self.fail_seeds = model, set(fail_seeds)
        BUILT.append(model)

    def __call__(self, batch: pa.Table) -> pa.Table:
        seeds = batch.column(SEED).to_pylist()
        status = [GenerationStatus.ERROR if s in self.fail_seeds else GenerationStatus.OK for s in seeds]
        out = batch.drop_columns([c for c in (MODEL, GENERATION_STATUS, "value") if c in batch.column_names])
        out = out.append_column(MODEL, pa.array([self.model] * batch.num_rows, pa.string())) \
            .append_column(GENERATION_STATUS, pa.array(status, pa.string())) \
            .append_column("value", pa.array([f"{self.model}:{s}" for s in seeds], pa.string()))
        for name in PAYLOAD:   # the image columns: the engine drops them before the driver
            out = out.append_column(name, pa.nulls(batch.num_rows, pa.binary()))
        return out


SCHEMA = pa.schema([("image_id", pa.string()), (SEED, pa.int64()), (MODEL, pa.string()),
                    (GENERATION_STATUS, pa.string()), ("value", pa.string())])


def test_by_model_routes_each_row_and_keeps_their_order():
    BUILT.clear()
    stages = {m: Stage(Marker, {"model": m}) for m in ("a", "b", "c")}
    op = routing.ByModel(stages, keep=1)
    batch = pa.table({MODEL: ["b", "a", "b", "c", "a"], SEED: [0, 1, 2, 3, 4]})
    out = op(batch)
    assert out.column(MODEL).to_pylist() == ["b", "a", "b", "c", "a"]          # the rows' own order
    assert out.column("value").to_pylist() == ["b:0", "a:1", "b:2", "c:3", "a:4"]
    assert len(op.built) == 1 and BUILT == ["b", "a", "c"]                     # at most one kept
    op(pa.table({MODEL: ["c"], SEED: [9]}))
    assert BUILT == ["b", "a", "c"]                                           # the one kept is reused
    two = routing.ByModel(stages, keep=2)
    two(batch)
    assert list(two.built) == ["a", "c"]                                      # the least recently used let go
    with pytest.raises(KeyError, match="no stage for model 'z'"):
        op(pa.table({MODEL: ["z"], SEED: [1]}))


class Triple(Marker):
    """Three rows per request (as the triplet generator gives a unit's images)."""

    def __call__(self, batch: pa.Table) -> pa.Table:
        out = super().__call__(batch)
        return pa.concat_tables([out, out, out])


def test_a_batch_of_several_models_with_several_rows_per_request_keeps_every_row():
    op = routing.ByModel({m: Stage(Triple, {"model": m}) for m in ("a", "b")})
    out = op(pa.table({MODEL: ["b", "a", "b"], SEED: [0, 1, 2]}))
    assert out.num_rows == 9
    assert sorted(out.column("value").to_pylist()) == sorted(["b:0", "b:2", "a:1"] * 3)


def test_stages_differing_per_model_merge_into_one_and_other_resources_split():
    after = Stage(Marker, {"model": "shared"})
    pipelines = {"a": [Stage(Marker, {"model": "a"}), after], "b": [Stage(Marker, {"model": "b"}), after]}
    gen, same = routing.merge(pipelines)
    assert gen.op is routing.ByModel and set(gen.kwargs["stages"]) == {"a", "b"} and same is after
    assert gen.declared() == Marker.resources
    large = Stage(Marker, {"model": "c"}, resources=Resources(num_cpus=1, batch_size=4, actors=1,
                                                                 resources={"large_gpu": 1.0}))
    assert routing.resource_groups({**pipelines, "c": [large, after]}) == [["a", "b"], ["c"]]
    with pytest.raises(ValueError, match="different resources"):
        routing.merge({**pipelines, "c": [large, after]})


def test_every_generator_runs_in_one_execution_and_resumes(ray_local, tmp_path, monkeypatch):
    executions = []
    real_drain = execute.drain
    monkeypatch.setattr(execute, "drain", lambda ds, *a, **k: executions.append(1) or real_drain(ds, *a, **k))
    models = ["m1", "m2", "m3"]
    requests = pa.table({"image_id": [f"i{k}" for k in range(10)], SEED: list(range(10))})
    rd = rundir.RunDir(str(tmp_path), "r").open("fp", {"job": "r"})
    run = SimpleNamespace(options=RunOptions(gen_batch_size=2), safety=None, gpu=None, rd=rd, ray=ray_local,
                          st=SimpleNamespace(execution={"max_error_rate": 0.5, "error_budget_min_rows": 1}),
                          generators=[GeneratorSpec(m) for m in models], echo=lambda *a, **k: None)
    plan = GenerationPlan(requests, SCHEMA, Marker, operator_kwargs={"fail_seeds": [3]})
    monkeypatch.setattr(GeneratorSpec, "operator_kwargs", lambda self: {"model": self.model})
    out = execute.generate(run, plan)
    assert len(executions) == 1                         # three generators, one Ray Data execution
    for m in models:
        mine = out.images.filter(pa.compute.equal(out.images.column(MODEL), m))
        assert mine.column("image_id").to_pylist() == requests.column("image_id").to_pylist()
        assert mine.column("value").to_pylist() == [f"{m}:{s}" for s in range(10)]
        assert (out.phases[m].total, out.phases[m].processed, out.phases[m].reused) == (10, 10, 0)
    # each generator's failures against its own budget: one error in ten rows each
    assert [b.as_dict()["failed"] for b in out.budgets] == [{GenerationStatus.ERROR: 1}] * 3
    assert [b.seen for b in out.budgets] == [10, 10, 10]
    again = execute.generate(run, plan)                  # resumed: everything from the checkpoints
    assert len(executions) == 1 and [again.phases[m].reused for m in models] == [10, 10, 10]
    assert again.images.equals(out.images)
    assert np.all(np.asarray(again.images.column("value").to_pylist()) == np.asarray(out.images.column("value").to_pylist()))


class Cyclic(Marker):
    """A generator whose model sits in a reference cycle (as modules with hooks do)."""

    def __init__(self, model: str, **kw):
        super().__init__(model, **kw)
        self.me = self


def test_a_let_go_model_is_collected_and_only_an_empty_actor_is_frozen():
    """A model let go is freed before the next is built; when none is left built, what survives is
    frozen so that later collections skip it; a model still built is never frozen."""
    import gc
    import weakref

    stages = {m: Stage(Cyclic, {"model": m}) for m in ("a", "b", "c")}
    one = routing.ByModel(stages, keep=1)
    one(pa.table({MODEL: ["a"], SEED: [0]}))
    first = weakref.ref(one.built["a"])
    frozen = gc.get_freeze_count()
    one(pa.table({MODEL: ["b"], SEED: [1]}))
    assert first() is None and list(one.built) == ["b"]
    assert gc.get_freeze_count() > frozen
    second = weakref.ref(one.built["b"])
    one(pa.table({MODEL: ["c"], SEED: [2]}))
    assert second() is None                 # built after the freeze: collected as usual

    two = routing.ByModel(stages, keep=2)
    two(pa.table({MODEL: ["a", "b"], SEED: [0, 1]}))
    kept = weakref.ref(two.built["b"])
    frozen = gc.get_freeze_count()
    two(pa.table({MODEL: ["c"], SEED: [2]}))
    assert list(two.built) == ["b", "c"] and gc.get_freeze_count() <= frozen   # "b" still built
    del two
    gc.collect()
    assert kept() is None                   # so it is collected once let go

    held = routing.ByModel(stages, keep=1)
    held(pa.table({MODEL: ["a"], SEED: [0]}))
    elsewhere = held.built["a"]             # something else still holds the model let go
    ref = weakref.ref(elsewhere)
    frozen = gc.get_freeze_count()
    held(pa.table({MODEL: ["b"], SEED: [1]}))
    assert gc.get_freeze_count() <= frozen  # not frozen with it
    del elsewhere
    gc.collect()
    assert ref() is None
    gc.unfreeze()       # the test process's heap as the module left it (conftest freezes per module)


class Head:
    """A stand-in head (CLIP, BLIP-2, the NSFW check): counts its builds, in this process."""

    builds: list = []

    def __init__(self, name: str = "clip", device: str = "cpu"):
        self.name, self.device = name, device
        Head.builds.append((name, device))


class WithHeads(Marker):
    """A stand-in generator that builds its heads on its device, as the real generators do."""

    def __init__(self, model: str, heads=(), nsfw_check=None, device: str = "cpu", **kw):
        super().__init__(model, **kw)
        self.heads = [h.build(device=device) if isinstance(h, Stage) else h for h in heads]
        self.nsfw_check = nsfw_check.build(device=device) if isinstance(nsfw_check, Stage) else nsfw_check


def test_the_heads_every_generator_takes_alike_are_built_once_and_outlive_each_switch():
    """A switch between generators builds the next generator, not its heads again: the heads and
    NSFW check every model's stage names alike are built once per device and handed to each
    generator; a part only some models take, or one that differs, is built for each as before."""
    import gc
    import weakref

    Head.builds.clear()
    heads = [Stage(Head, {"name": "clip"}), Stage(Head, {"name": "blip2"})]
    nsfw = Stage(Head, {"name": "nsfw"})
    stages = {m: Stage(WithHeads, {"model": m, "heads": heads, "nsfw_check": nsfw}) for m in ("a", "b", "c")}
    one = routing.ByModel(stages, keep=1)
    one(pa.table({MODEL: ["a"], SEED: [0]}))
    clip = weakref.ref(one.built["a"].heads[0])
    first = weakref.ref(one.built["a"])
    frozen = gc.get_freeze_count()
    one(pa.table({MODEL: ["b", "c", "a"], SEED: [1, 2, 3]}))
    assert Head.builds == [("clip", "cpu"), ("blip2", "cpu"), ("nsfw", "cpu")]    # once, for three generators
    assert first() is None and clip() is one.built["a"].heads[0]                 # the generator went; its heads stay
    assert gc.get_freeze_count() > frozen          # the shared heads do not hold the let-go model's freeze back
    # a generator on another device gets the heads built there
    devices = {"a": "cpu", "b": "cuda:0", "c": "cpu"}
    split = routing.ByModel({m: Stage(WithHeads, {**s.kwargs, "device": devices[m]}) for m, s in stages.items()})
    for i, m in enumerate(["a", "b", "c"]):
        split(pa.table({MODEL: [m], SEED: [i]}))
        assert {h.device for h in split.built[m].heads} == {devices[m]}
    assert Head.builds[3:] == [("clip", "cpu"), ("blip2", "cpu"), ("nsfw", "cpu"),
                               ("clip", "cuda:0"), ("blip2", "cuda:0"), ("nsfw", "cuda:0")]
    # a head only one model takes, or taken with other arguments, is that model's own
    Head.builds.clear()
    own = {"a": Stage(WithHeads, {"model": "a", "heads": heads}),
           "b": Stage(WithHeads, {"model": "b", "heads": [Stage(Head, {"name": "clip-l"})]}),
           "c": Stage(WithHeads, {"model": "c"})}
    mixed = routing.ByModel(own, keep=1)
    for i, m in enumerate(["a", "b", "c", "a"]):     # a batch each: "a" is built again after "c"
        mixed(pa.table({MODEL: [m], SEED: [i]}))
    assert Head.builds == [("clip", "cpu"), ("blip2", "cpu"), ("clip-l", "cpu"), ("clip", "cpu"), ("blip2", "cpu")]
    gc.unfreeze()

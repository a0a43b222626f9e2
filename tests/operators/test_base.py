import pyarrow as pa
import pytest

from operators.base import (
    StreamStage,
    conform,
    filter_with_tally,
    split_tallies,
    tally_rows,
)
from schemas.captions import TALLY_COUNT, TALLY_OUTCOME, TALLY_STAGE, stream_schema

SCHEMA = stream_schema()


def test_filter_with_tally_counts_add_up():
    t = pa.table({"caption": ["a", "b", "c", "d"]})
    out = filter_with_tally(t, "s", pa.array(["kept", "x", "kept", "x"]), SCHEMA, ("kept", "x", "y"))
    data, tallies = split_tallies(out)
    assert data.column("caption").to_pylist() == ["a", "c"]
    counts = dict(zip(tallies[TALLY_OUTCOME].to_pylist(), tallies[TALLY_COUNT].to_pylist()))
    assert counts == {"kept": 2, "x": 2, "y": 0}
    with pytest.raises(ValueError, match="unknown outcome"):
        filter_with_tally(t, "s", pa.array(["kept", "z", "kept", "x"]), SCHEMA, ("kept", "x"))


class Upper:
    stage_name = "upper"

    def __init__(self, suffix):
        self.suffix = suffix

    def __call__(self, batch):
        import pyarrow.compute as pc

        return batch.set_column(batch.schema.get_field_index("caption"), "caption",
                                pc.binary_join_element_wise(pc.utf8_upper(batch["caption"]), self.suffix, ""))


def test_stream_stage_passes_tallies_around_the_operator():
    data = conform(pa.table({"caption": ["a", "b"]}), SCHEMA)
    batch = pa.concat_tables([data, tally_rows("earlier", {"kept": 2, "dropped": 5}, SCHEMA)])
    out = StreamStage(Upper, {"suffix": "!"}, SCHEMA)(batch)
    d, t = split_tallies(out)
    assert d.column("caption").to_pylist() == ["A!", "B!"]
    assert out.schema.equals(SCHEMA)
    got = {(s, o): n for s, o, n in zip(t[TALLY_STAGE].to_pylist(), t[TALLY_OUTCOME].to_pylist(), t[TALLY_COUNT].to_pylist())}
    assert got == {("earlier", "kept"): 2, ("earlier", "dropped"): 5, ("upper", "rows_in"): 2, ("upper", "rows_out"): 2}


def test_conform_fills_and_orders():
    t = conform(pa.table({"url": ["u"], "unknown": [1]}), SCHEMA)
    assert t.schema.equals(SCHEMA) and t["url"].to_pylist() == ["u"] and t["caption"].to_pylist() == [None]


class _Probe:
    """Records whether Python's cyclic collector was on while it was built."""

    stage_name = "probe"

    def __init__(self, x=0, fail=False):
        import gc

        self.collector_on, self.x = gc.isenabled(), x
        if fail:
            raise RuntimeError("cannot load")

    def __call__(self, batch):
        return batch


def test_operators_are_built_with_the_collector_paused_and_it_comes_back_on():
    """Every way an operator is built (a Stage, a stream stage, an actor of ``map_stage``: the class
    Ray Data constructs, under the operator's own name) pauses the collector while it loads and turns
    it back on after, also when the build fails; a collector a caller had turned off stays off."""
    import gc

    from ray import cloudpickle

    from operators.base import Stage
    from pipelines.engine.stream.runtime import built_with_gc_paused

    actor_class = cloudpickle.loads(cloudpickle.dumps(built_with_gc_paused(_Probe)))   # as an actor gets it
    assert actor_class.__name__ == "_Probe" and issubclass(actor_class, _Probe)
    assert gc.isenabled()
    built = [Stage(_Probe, {"x": 3}).build(), StreamStage(_Probe, {"x": 3}, SCHEMA).op, actor_class(x=3)]
    assert [(b.collector_on, b.x) for b in built] == [(False, 3)] * 3 and gc.isenabled()
    for build in (lambda: Stage(_Probe, {"fail": True}).build(), lambda: actor_class(fail=True)):
        with pytest.raises(RuntimeError, match="cannot load"):
            build()
        assert gc.isenabled()
    gc.disable()
    try:
        assert Stage(_Probe).build().collector_on is False and not gc.isenabled()
    finally:
        gc.enable()


class _Part:
    """A model part in a reference cycle (as modules with hooks are): freed only by the collector."""

    def __init__(self):
        self.me = self


class _Pipeline:
    def __init__(self):
        self.components = {"unet": _Part(), "tokenizer": "not weak-referenceable", "vae": None}
        self.components["unet"].owner = self


@pytest.fixture
def explicit_collections_only():
    """No automatic collection while a test counts collections (only those the code makes), and
    this process's heap unfrozen after it (conftest.py freezes it again per module)."""
    import gc

    before = gc.get_threshold()
    gc.set_threshold(10**9, 10**9, 10**9)
    yield
    gc.set_threshold(*before)
    gc.unfreeze()


def _collections(fn):
    """The generations the cyclic collector ran over, in this thread, while ``fn()`` ran."""
    import gc
    import threading

    seen, me = [], threading.get_ident()

    def note(phase, info):
        if phase == "start" and threading.get_ident() == me:
            seen.append(info["generation"])

    gc.callbacks.append(note)
    try:
        fn()
    finally:
        gc.callbacks.remove(note)
    return seen


def test_a_model_let_go_under_the_paused_collector_is_freed_by_a_young_collection_only(explicit_collections_only):
    """What a model allocated while the collector is paused is all in the youngest generation: it
    is freed, cycles included, without a full collection (which walks every imported library)."""
    from operators.base import collect_let_go, gc_paused, weak_parts

    with gc_paused():
        pipe = _Pipeline()
        refs = weak_parts(pipe)
        assert len(refs) == 2        # the pipeline and its unet; the string and None take no reference
        del pipe
        assert any(r() is not None for r in refs)     # the cycles keep it: reference counting alone leaves it
        assert _collections(lambda: collect_let_go(refs)) == [0]
        assert all(r() is None for r in refs)


def test_a_model_that_survived_a_collection_gets_the_full_one(explicit_collections_only):
    import gc

    from operators.base import collect_let_go, gc_paused, weak_parts

    with gc_paused():
        bundle = _Part()
        bundle.model = _Part()
        refs = weak_parts(bundle)
        gc.collect()                  # promoted to the oldest generation while still in use
        del bundle
        assert _collections(lambda: collect_let_go(refs)) == [0, 2]
        assert all(r() is None for r in refs)


def test_an_actor_settles_its_heap_once_built_and_by_model_collects_after_each_model(monkeypatch,
                                                                                      explicit_collections_only):
    """An actor keeps what it built for its whole life: once built, one collection and the survivors
    frozen, so no later collection walks its libraries and model again. Both kinds of actor stage
    (``stage`` with tally rows, ``map_stage``) get that class; tasks, which let their operator go
    after each batch, do not. ``ByModel`` collects once after each model it builds and freezes
    nothing then (the model may be let go)."""
    import gc

    from operators.base import Resources, Stage
    from pipelines.engine.generation import routing
    from pipelines.engine.stream import runtime

    actor_class = runtime.built_with_gc_paused(_Probe)
    before = gc.get_freeze_count()
    young = [[] for _ in range(2000)]           # what a build leaves in the youngest generation
    full = lambda fn: _collections(fn).count(2)   # noqa: E731  (full collections while fn runs)
    assert full(lambda: actor_class(x=1)) == 1
    assert gc.isenabled() and gc.get_freeze_count() >= before + len(young)

    seen = []
    monkeypatch.setattr(runtime, "map_batches", lambda ds, fn, retries, **kw: seen.append(fn))
    actors, task = Resources(actors=1), Resources()
    runtime.stage(None, _Probe, {}, SCHEMA, actors)
    runtime.map_stage(None, _Probe, {}, actors)
    runtime.stage(None, _Probe, {}, SCHEMA, task)
    runtime.map_stage(None, _Probe, {}, task)
    assert [fn.__name__ for fn in seen] == ["StreamStage", "_Probe", "_run_in_task", "_apply_in_task"]
    assert full(lambda: seen[0](_Probe, {"x": 2}, SCHEMA)) == full(lambda: seen[1](x=2)) == 1

    by_model = routing.ByModel({"a": Stage(_Probe, {"x": 1})})
    frozen = gc.get_freeze_count()
    assert full(lambda: by_model.operator("a")) == 1
    assert gc.get_freeze_count() <= frozen        # nothing frozen (frozen objects may still die meanwhile)
    assert full(lambda: by_model.operator("a")) == 0     # built once


def test_a_task_worker_settles_its_heap_after_its_first_task_only(monkeypatch, explicit_collections_only):
    """A task builds its operator, applies it and lets it go; the worker process settles its heap
    once, after its first task (its libraries imported by then), and never again."""
    from pipelines.engine.stream import runtime

    monkeypatch.setattr(runtime, "_worker_settled", [False])
    batch = pa.table({"caption": ["a"]})
    full = lambda fn: _collections(fn).count(2)   # noqa: E731
    assert full(lambda: runtime._apply_in_task(batch, _Probe, {"x": 1})) == 1
    assert full(lambda: runtime._apply_in_task(batch, _Probe, {"x": 2})) == 0
    monkeypatch.setattr(runtime, "_worker_settled", [False])
    out = {}
    assert full(lambda: out.setdefault("t", runtime._run_in_task(batch, _Probe, {}, SCHEMA))) == 1
    assert split_tallies(out["t"])[0].column("caption").to_pylist() == ["a"]


def test_a_paused_block_can_end_with_one_full_collection(explicit_collections_only):
    """``collect_after``: the run's model loads on the driver end with one full collection (not the
    three passes turning the collector back on starts); the default ends with none, and a block
    that fails raises without collecting."""
    import gc

    from operators.base import gc_paused

    def block(**kw):
        with gc_paused(**kw):
            assert not gc.isenabled()

    def failing():
        with pytest.raises(RuntimeError, match="cannot load"):
            with gc_paused(collect_after=True):
                raise RuntimeError("cannot load")

    full = lambda fn: _collections(fn).count(2)   # noqa: E731
    assert full(lambda: block(collect_after=True)) == 1 and gc.isenabled()
    assert full(block) == 0
    assert full(failing) == 0 and gc.isenabled()


def test_the_driver_loads_a_run_s_models_with_the_collector_paused_then_collects_once(explicit_collections_only):
    import gc

    from types import SimpleNamespace

    from pipelines.engine.run import lifecycle

    class Study:
        check_generator = None

        def load_models(self, opts, st, gp):
            assert not gc.isenabled()
            return [{"role": "captions"}]

    full = lambda fn: _collections(fn).count(2)   # noqa: E731
    got, opts = {}, SimpleNamespace(standin_models=True)
    assert full(lambda: got.setdefault("records", lifecycle._load_models(Study(), opts, None, None, [], None))) == 1
    assert got["records"] == [{"role": "captions"}] and gc.isenabled()


def test_weak_parts_reach_every_submodule_of_a_pipeline_an_operator_holds():
    """A cycle anywhere in a let-go model's modules keeps ``collect_let_go`` from trusting the
    young collection alone: the references reach the operator, its pipeline's components and
    every submodule of them."""
    import torch

    from operators.base import weak_parts

    class Pipe:
        def __init__(self):
            self.unet = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.ReLU()))
            self.components = {"unet": self.unet, "tokenizer": "text", "scheduler": None}

    class Operator:
        def __init__(self):
            self.pipe, self.heads = Pipe(), [object()]

    op = Operator()
    alive = {id(r()) for r in weak_parts(op)}
    assert {id(op), id(op.pipe), *(id(m) for m in op.pipe.unet.modules())} <= alive
    assert len(alive) == 2 + 4                 # the operator, its pipeline, the four modules; no lists or text

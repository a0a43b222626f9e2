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

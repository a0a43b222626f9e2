"""Every operator declares the contract the engine relies on (operators/base.py), checked on the
class: a stream stage, a filter with its outcomes, a head on the generator's device, a disparity
head. A new operator that forgets a member fails here, not inside a worker."""

import importlib
import inspect
from pathlib import Path

import pytest

from operators import base
from operators.base import DeviceHead, DisparityHead, FilterOperator, Operator, Tallying, declares
from schemas.captions import OUTCOME_KEPT

MODULES = sorted(p.stem for p in (Path(base.__file__).parent).glob("*.py") if p.stem not in ("__init__", "base"))


def operators():
    """(module, class) of every class a module defines with a stage_name: its operator(s)."""
    out = []
    for name in MODULES:
        module = importlib.import_module(f"operators.{name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and "stage_name" in vars(cls):
                out.append((name, cls))
    return out


OPERATORS = operators()


def test_every_operator_module_has_an_operator():
    assert {m for m, _ in OPERATORS} == set(MODULES)


@pytest.mark.parametrize("module,cls", OPERATORS, ids=[c.__name__ for _, c in OPERATORS])
def test_the_operator_declares_its_contracts(module, cls):
    kinds = []
    if any("__call__" in vars(k) for k in cls.__mro__ if k is not object):   # a stage of a stream
        assert declares(cls, Operator) == [], cls
        assert isinstance(cls.resources, base.Resources)
        kinds.append("stage")
    if hasattr(cls, "status_column"):
        assert declares(cls, FilterOperator) == [], cls
        assert OUTCOME_KEPT in cls.outcomes and len(set(cls.outcomes)) == len(cls.outcomes)
        kinds.append("filter")
    if hasattr(cls, "classify_tensor"):
        assert declares(cls, DeviceHead) == [], cls
        params = inspect.signature(cls.classify_tensor).parameters
        assert ("prompts" in params) == bool(getattr(cls, "takes_prompts", False)), cls
        kinds.append("head")
    if hasattr(cls, "triplet_similarities"):
        assert declares(cls, DisparityHead) == [], cls
        kinds.append("disparity head")
    if hasattr(cls, "tally"):
        assert declares(cls, Tallying) == []
    # the dependency analysis of the triplet generator is its own kind: a capture context + analyse
    if not kinds:
        assert hasattr(cls, "capture") and hasattr(cls, "analyse"), f"{cls.__name__} declares no contract"


def test_declares_names_what_is_missing():
    class Half:
        stage_name = "half"

    assert declares(Half, Operator) == ["__call__", "resources"]
    assert declares(Half, FilterOperator) == ["__call__", "outcomes", "resources", "status_column"]


def test_one_row_accounting_for_streams_and_the_scan():
    import pyarrow as pa

    from operators.text_caption_validator import CaptionValidator

    batch = pa.table({"TEXT": ["a nurse", None, "   ", "a doctor"]})
    op = CaptionValidator("TEXT", None)
    kept, counts = base.run_counted(op, batch)
    assert kept.num_rows == 2 and counts[OUTCOME_KEPT] == 2 and sum(counts.values()) == 4

    class Named:
        stage_name = "named"

        def __call__(self, t):
            return t.slice(0, 1)

        def tally(self, out):
            return {"noted": 5}

    out, counts = base.run_counted(Named(), batch)
    assert out.num_rows == 1 and counts == {"rows_in": 4, "rows_out": 1, "noted": 5}
    assert base.run_counted(lambda t: t, batch)[1] is None

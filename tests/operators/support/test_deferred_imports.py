"""Deferring an optional package (wandb) that libraries import but no stage uses."""

import importlib
import inspect
import subprocess
import sys
import types

import pytest

from operators.support.deferred_imports import DeferredModule, defer


@pytest.fixture
def fake_package(tmp_path, monkeypatch):
    """A package that counts how often its code runs, with a submodule that uses the package."""
    pkg = tmp_path / "t2i_fake_optional"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "import sys\n"
        "sys.t2i_fake_runs = getattr(sys, 't2i_fake_runs', 0) + 1\n"
        "VALUE = 42\n"
        "def log(x):\n    return x + 1\n")
    (pkg / "sub.py").write_text("from t2i_fake_optional import VALUE\nDOUBLE = 2 * VALUE\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "t2i_fake_runs", 0, raising=False)
    yield "t2i_fake_optional"
    for name in ("t2i_fake_optional", "t2i_fake_optional.sub"):
        sys.modules.pop(name, None)


def test_import_binds_a_placeholder_that_runs_nothing_until_used(fake_package):
    assert defer(fake_package)
    mod = importlib.import_module(fake_package)
    assert type(mod) is DeferredModule and sys.t2i_fake_runs == 0
    # what inspect.getmodule (torch calls it at import), find_spec and hasattr read: no load
    assert mod.__file__.endswith("__init__.py") and mod.__name__ == fake_package
    assert inspect.getmodule(test_import_binds_a_placeholder_that_runs_nothing_until_used) is not None
    assert importlib.util.find_spec(fake_package) is mod.__spec__
    assert sys.t2i_fake_runs == 0
    # the first real use runs the package once, in place
    assert mod.log(1) == 2 and mod.VALUE == 42
    assert sys.t2i_fake_runs == 1 and type(mod) is types.ModuleType
    assert importlib.import_module(fake_package) is mod and mod.log(2) == 3 and sys.t2i_fake_runs == 1


def test_importing_a_submodule_first_loads_the_package(fake_package):
    assert defer(fake_package)
    sub = importlib.import_module(fake_package + ".sub")
    assert sub.DOUBLE == 84 and sys.t2i_fake_runs == 1
    assert sys.modules[fake_package].VALUE == 42 and hasattr(sys.modules[fake_package], "__path__")


def test_missing_attribute_after_loading_is_an_ordinary_error(fake_package):
    assert defer(fake_package)
    mod = importlib.import_module(fake_package)
    with pytest.raises(AttributeError):
        mod.no_such_name
    assert sys.t2i_fake_runs == 1


def test_not_deferred_when_missing_imported_or_a_submodule(fake_package):
    assert not defer("t2i_no_such_package_anywhere")
    assert not defer("json")  # imported already
    assert not defer(fake_package + ".sub")
    importlib.import_module(fake_package)
    assert not defer(fake_package) and sys.t2i_fake_runs == 1


def test_importing_operators_defers_wandb_for_timm():
    """In a fresh interpreter (as in a Ray worker): ``import operators`` first, then timm, which
    imports wandb at module level (img2dataset's logger does the same: ``import wandb``); wandb's
    code has not run, and runs when it is used."""
    code = (
        "import sys, operators, timm.utils\n"
        "w = sys.modules['wandb']\n"
        "print(type(w).__name__, timm.utils.summary.wandb is w)\n"
        "print(callable(w.log), type(w).__name__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[:2] == ["DeferredModule True", "True module"]

"""Deferring optional packages (wandb, webdataset, albumentations) that libraries import but no stage uses
(or uses only sometimes)."""

import importlib
import inspect
import os
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


def test_importing_operators_defers_what_timm_and_img2dataset_import_unused():
    """In a fresh interpreter (as in a Ray worker): ``import operators`` first, then timm, which
    imports wandb at module level, and the fetch stage's downloader (img2dataset's package imports
    wandb, webdataset and albumentations): none of their code has run. Each runs when it is used:
    albumentations at the first image the resizer shrinks, webdataset at a shard writer's first
    use, wandb at its first call."""
    code = (
        "import io, os, sys, numpy as np, operators, timm.utils\n"
        "from PIL import Image\n"
        "from operators.image_fetch import ImageFetcher\n"
        "kind = lambda name: type(sys.modules[name]).__name__\n"
        "fetcher = ImageFetcher(image_size=32)\n"
        "w = sys.modules['wandb']\n"
        "print(kind('wandb'), timm.utils.summary.wandb is w, kind('webdataset'), kind('albumentations'),\n"
        "      os.environ.get('NO_ALBUMENTATIONS_UPDATE'))\n"
        "buf = io.BytesIO()\n"
        "Image.fromarray(np.full((64, 48, 3), 200, np.uint8)).save(buf, 'PNG')\n"
        "img, width, height, *_, err = fetcher.resizer(io.BytesIO(buf.getvalue()))\n"
        "print(err, (width, height), Image.open(io.BytesIO(img)).size, kind('albumentations'), kind('webdataset'))\n"
        "import img2dataset.writer as writer\n"
        "print(callable(writer.wds.TarWriter), kind('webdataset'), callable(w.log), kind('wandb'))\n")
    env = {k: v for k, v in os.environ.items() if k != "NO_ALBUMENTATIONS_UPDATE"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[:3] == [
        "DeferredModule True DeferredModule DeferredModule 1",   # albumentations told not to phone home
        f"None {(32, round(64 * 32 / 48))} {(32, round(64 * 32 / 48))} module DeferredModule",  # keep_ratio
        "True module True module"]

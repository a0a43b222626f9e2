"""Defer the import of optional packages that libraries import but a run never uses.

``timm`` (imported by ``open_clip`` and ``sentence-transformers``) and ``img2dataset`` import
``wandb`` at module level, to log to Weights & Biases when asked to. Executing ``wandb``'s package
costs about 1.3 CPU-seconds (most of it building its API models), paid in every Ray actor that
loads CLIP, SBERT or the downloader: on a cluster, by every actor the autoscaler starts; in the
test suite, by a hundred or more actor starts. No stage here logs to W&B. ``img2dataset``'s
package also imports ``webdataset`` (for its shard writers; the fetch stage writes no shards) and
its resizer ``albumentations`` (its transforms resize an image larger than the target size, so a
worker that meets one loads it then): together about 2.2 of the 3.0 CPU-seconds a fetch worker
spent importing the downloader.

``defer("wandb")`` puts a placeholder module in ``sys.modules`` that carries the real module's
identity (``__name__``, ``__spec__``, ``__file__``, ...), so ``import wandb`` binds it and
``inspect``/``importlib.util.find_spec`` read it without loading anything. The first access to
anything else (``wandb.log``, ``wandb.__path__`` when a submodule is imported) executes the real
package in place, so code that does use it gets the real module. Unlike
``importlib.util.LazyLoader``, reading ``__file__`` (which ``inspect.getmodule`` does to every
module in ``sys.modules``, and ``torch`` calls at import) does not trigger the load.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
import types

# wandb: imported at module level by timm (open_clip, sentence-transformers) and img2dataset's logger;
# webdataset: by img2dataset's writers (the fetch stage only fetches and resizes: it writes no shards);
# albumentations: by img2dataset's resizer, whose transforms run only on an image that needs resizing.
DEFERRED = ("wandb", "webdataset", "albumentations")
# Set when the package is deferred: a deferred package can still load where nothing uses it (pickle's
# ``whichmodule`` reads an attribute of every module in ``sys.modules``, as ``torch.compile``'s cache
# key does), and albumentations' ``__init__`` asks PyPI for a newer release unless told not to.
QUIET_ENV = {"albumentations": ("NO_ALBUMENTATIONS_UPDATE", "1")}
_lock = threading.RLock()


class DeferredModule(types.ModuleType):
    """A module whose code runs at the first access to an attribute it does not have yet."""

    def __getattr__(self, attr: str):
        load(self)
        return getattr(self, attr)


def load(module: types.ModuleType) -> types.ModuleType:
    """Execute a deferred module's real code in place (once; a no-op for a loaded module)."""
    with _lock:
        if type(module) is not DeferredModule:
            return module
        module.__class__ = types.ModuleType  # from here on attribute errors are ordinary ones
        spec = module.__spec__
        if spec.submodule_search_locations is not None:
            module.__path__ = list(spec.submodule_search_locations)
        spec.loader.exec_module(module)
        return module


def defer(name: str) -> bool:
    """Defer top-level package ``name`` (see the module docstring). Returns whether it was deferred:
    not when it is imported already, not installed, or not a plain source/extension package."""
    with _lock:
        if name in sys.modules or "." in name:
            return False
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            return False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return False
        module = importlib.util.module_from_spec(spec)
        if hasattr(module, "__path__"):
            del module.__path__  # importing a submodule reads __path__: that loads the package first
        module.__class__ = DeferredModule
        sys.modules[name] = module
        if name in QUIET_ENV:
            os.environ.setdefault(*QUIET_ENV[name])
        return True


def defer_unused() -> None:
    """Defer every package in ``DEFERRED``; called when the ``operators`` package is imported, so
    it runs in the driver and in every Ray worker before an operator imports its libraries."""
    for name in DEFERRED:
        defer(name)

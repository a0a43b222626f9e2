"""The command-line options every study shares, declared once: the output root, run control (run
id, Ray address, CPUs, retries, progress, verbosity, overwrite) and the CLIP model options. A
study's entry script adds these groups and its own; the engine reads the attributes they define
(``args.run_id``, ``args.ray_address``, ...)."""

from __future__ import annotations

import argparse


def add_output(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument("--output", required=True, metavar="DIR",
                   help="root directory (local path or fsspec URI); the run writes <DIR>/<run id>/")


def add_run_control(group, label: str = "<study name>") -> None:
    """--run-id, --ray-address, --num-cpus, --max-retries, --no-progress, --verbose, --overwrite."""
    group.add_argument("--run-id", metavar="ID",
                       help=f"name of this run's directory under --output (default: {label}-<8 hex digits of the "
                            f"configuration fingerprint>, so the same command resumes in the same directory and a "
                            f"different job never overwrites it)")
    group.add_argument("--ray-address", metavar="ADDR",
                       help="Ray cluster to connect to (default: RAY_ADDRESS, else the cluster `ray submit` / "
                            "`ray job submit` started this job on, else a new local instance); 'local' always "
                            "starts a new local instance")
    group.add_argument("--num-cpus", type=int, help="logical CPUs of a new local Ray instance (default: all cores, "
                                                    "and at least the actors' CPUs + 2)")
    group.add_argument("--max-retries", type=int,
                       help="retries of a crashed Ray task and restarts of a crashed actor, per stage (default 3); "
                            "exceptions raised by the code itself are not retried")
    group.add_argument("--no-progress", action="store_true", help="no Ray Data progress bars and no progress lines")
    group.add_argument("--verbose", action="store_true", help="Ray execution plans, worker logs and model-library output")
    group.add_argument("--overwrite", action="store_true",
                       help="discard this run's directory (results and checkpoints) and start again instead of resuming")


def add_clip(group, what: str, default: str) -> None:
    """--clip-model, --clip-pretrained, --clip-revision for the CLIP of ``what`` (its default ``default``)."""
    group.add_argument("--clip-model", help=f"CLIP of {what}: open_clip architecture (default {default}), "
                                            f"local-dir:/path, a directory, or hf-hub:org/repo")
    group.add_argument("--clip-pretrained", help="open_clip pretrained tag or checkpoint file (default openai)")
    group.add_argument("--clip-revision", help="hub revision (commit, branch or tag) of the CLIP weights: an hf-hub: "
                                               "model or a pretrained tag hosted on the hub (default: main; the "
                                               "commit is recorded)")

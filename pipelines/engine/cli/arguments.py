"""The command-line options every study shares, declared once: the output root, run control (run
id, Ray address, CPUs, retries, progress, verbosity, overwrite) and the CLIP model options. A
study's entry script adds these groups and its own; the engine reads the attributes they define
(``args.run_id``, ``args.ray_address``, ...)."""

from __future__ import annotations

import argparse
import sys

from pipelines.engine.run import gpus, publish
from pipelines.engine.storage.inputs import IDENTITIES
from schemas.datasets import LAYOUTS

GEN_BATCH_SIZE = 8   # images per generator call (a study's parser may choose another default)
GEN_ACTORS = 1       # generator actors per model


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
    publish.add_arguments(group)


def add_intervals(group) -> None:
    """--interval-level, --interval-resamples, --interval-seed, --interval-method: the confidence
    intervals of the headline numbers (pipelines/engine/stats/intervals.py)."""
    group.add_argument("--interval-level", type=float, default=0.95, help="confidence level of every headline "
                                                                           "interval (default 0.95)")
    group.add_argument("--interval-resamples", type=int, default=2000,
                       help="bootstrap resamples per interval (default 2000)")
    group.add_argument("--interval-seed", type=int, default=0, help="seed of the bootstrap resampling (default 0)")
    group.add_argument("--interval-method", choices=["bca", "percentile"], default="bca",
                       help="bootstrap interval: bias-corrected and accelerated (default) or percentile")


def interval_settings(args):
    """The ``IntervalSettings`` of ``add_intervals``'s options (defaults where a parser lacks them)."""
    from pipelines.engine.stats.intervals import IntervalSettings  # deferred: scipy (stats.intervals)

    return IntervalSettings(level=getattr(args, "interval_level", 0.95),
                            resamples=getattr(args, "interval_resamples", 2000),
                            seed=getattr(args, "interval_seed", 0), method=getattr(args, "interval_method", "bca"))


def add_clip(group, what: str, default: str) -> None:
    """--clip-model, --clip-pretrained, --clip-revision for the CLIP of ``what`` (its default ``default``)."""
    group.add_argument("--clip-model", help=f"CLIP of {what}: open_clip architecture (default {default}), "
                                            f"local-dir:/path, a directory, or hf-hub:org/repo")
    group.add_argument("--clip-pretrained", help="open_clip pretrained tag or checkpoint file (default openai)")
    group.add_argument("--clip-revision", help="hub revision (commit, branch or tag) of the CLIP weights: an hf-hub: "
                                               "model or a pretrained tag hosted on the hub (default: main; the "
                                               "commit is recorded)")


def add_generation(group, generators: str, scheduler: str = "each model's own", safety: str = "check-all",
                   images_per_prompt: str | None = None, seed_unit: str = "image") -> None:
    """The generator options every image study shares (pipelines/engine/generation/specs.py): which
    models, each with its own settings (--generator MODEL:key=value,...), and the global settings
    that apply to every generator of the run. ``images_per_prompt``: its help, when the study has it."""
    group.add_argument("--generator", action="append", metavar="MODEL[:KEY=VALUE,...]",
                       help=f"a diffusers text-to-image model (hub id or directory) with its own settings; repeat per "
                            f"model (default: {generators}). Keys: steps, guidance_scale, height, width, "
                            f"negative_prompt, scheduler, dtype, revision, cpu_offload (true/false: diffusers' model CPU "
                            f"offload on GPU actors; on where the model card's example offloads); any other key is a pipeline "
                            f"call argument (e.g. max_sequence_length=256), checked against the pipeline before the run "
                            f"starts. Example: --generator stabilityai/sdxl-turbo:steps=1,guidance_scale=0")
    group.add_argument("--generators", nargs="+", metavar="MODEL", type=_model_list, action=_Extend,
                       help="diffusers models (hub ids or directories), separated by spaces or commas, each at its "
                            "defaults (the study's settings for the study's models and their family, its model "
                            "card's otherwise); --generator gives a model settings of its own")
    group.add_argument("--generator-revision", action="append", default=[], metavar="MODEL=REVISION",
                       help="hub revision (commit, branch or tag) to pin a hub generator to; repeat per generator "
                            "(a bare REVISION with one generator). The commit each loads is recorded either way")
    if images_per_prompt is not None:
        group.add_argument("--images-per-prompt", type=int, help=images_per_prompt)
    group.add_argument("--steps", type=int, help="inference steps of every generator (default 50)")
    group.add_argument("--guidance-scale", type=float, help="classifier-free guidance of every generator (default 7.5)")
    group.add_argument("--scheduler", help=f"diffusers scheduler class of every generator (default {scheduler}); "
                                           f"'model' keeps each model's own")
    group.add_argument("--height", type=int, help="image height (default: the model's)")
    group.add_argument("--width", type=int, help="image width (default: the model's)")
    group.add_argument("--negative-prompt", metavar="TEXT", help="negative prompt of every generator (default none)")
    group.add_argument("--dtype", choices=["auto", "float32", "float16", "bfloat16"],
                       help="weights' dtype on the device (default auto: float16 on CUDA, float32 on a CPU)")
    group.add_argument("--generation-seed", type=int,
                       help=f"base seed; each {seed_unit}'s seed derives from it and is recorded (default 0)")
    group.add_argument("--safety-checker", choices=["check-all", "model-default", "off"],
                       help=f"the run's one safety policy, the same for every model: check-all (no model's own "
                            f"checker; the NSFW check of --nsfw-check runs on every model's images and is recorded per "
                            f"image), model-default (each model's own checker as shipped: SD 1.x blanks what it flags "
                            f"(nsfw_blocked), SDXL, SD 3, FLUX and PixArt ship none), off (default {safety})")
    group.add_argument("--nsfw-check", metavar="MODEL",
                       help="the NSFW check of check-all: a Stable Diffusion pipeline with a safety_checker folder or a "
                            "StableDiffusionSafetyChecker (hub id or directory; default CompVis/stable-diffusion-v1-4, "
                            "SD 1.4's own checker)")
    group.add_argument("--exclude-nsfw", action=argparse.BooleanOptionalAction, default=None,
                       help="leave the images the NSFW check flags out of every measurement (nsfw_excluded), for every "
                            "model alike (default: the study file's generation.nsfw_check.exclude)")


# ------------------------------------------------------------------------------ one vocabulary
def deprecated_alias(action: type, old: tuple[str, ...]) -> type:
    """``action`` (an argparse action class) that warns once on stderr when one of the ``old``
    spellings is used; the old spelling still works for one release (README, "Command line")."""
    class Alias(action):
        def __call__(self, parser, namespace, values, option_string=None):
            if option_string in old:
                print(f"warning: {option_string} is deprecated and will be removed in the next release: use "
                      f"{self.option_strings[0]}", file=sys.stderr)
            super().__call__(parser, namespace, values, option_string)

    return Alias


def add_caption_column(group, default: str | None, old: tuple[str, ...] = (), what: str = "caption column") -> None:
    """--caption-column (every study that reads captions); ``old``: earlier spellings, deprecated."""
    group.add_argument("--caption-column", *old, dest="caption_column", default=default, metavar="COL",
                       action=deprecated_alias(argparse._StoreAction, old),
                       help=f"{what}{f' (default {default})' if default else ''}; matched case-insensitively"
                            + (f"; {', '.join(old)}: deprecated spelling" if old else ""))


def add_dataset_columns(group, old: tuple[str, ...] = (), url: bool = True) -> None:
    """--caption-column, --url-column, --dataset-name and --input-identity of a study that reads a
    caption dataset (pipelines/engine/storage/datasets.py: known layouts are recognised without flags)."""
    known = "; ".join(f"{lay.title}: {lay.caption}/{lay.url}" for lay in LAYOUTS)
    group.add_argument("--caption-column", *old, dest="caption_column", default=None, metavar="COL",
                       action=deprecated_alias(argparse._StoreAction, old),
                       help=f"caption column (default: the dataset's, recognised from its columns ({known}), else the "
                            f"one caption-like column; matched case-insensitively)"
                            + (f"; {', '.join(old)}: deprecated spelling" if old else ""))
    if url:
        group.add_argument("--url-column", default=None, metavar="COL",
                           help="image URL column (default: the dataset's, recognised like the caption column); "
                                "'none' if the data has no URLs")
    group.add_argument("--dataset-name", metavar="NAME",
                       help=f"which dataset the input is: {', '.join(lay.key for lay in LAYOUTS)}, a variant as its "
                            f"path names it (relaion2B-en-research-safe, ...) or any name to record (default: "
                            f"recognised from the columns and the path)")
    group.add_argument("--input-identity", choices=IDENTITIES, default="footer",
                       help="how a run identifies its input files' data: footer (size, ETag or modification time "
                            "and a hash of the parquet footer; the default) or full (also a SHA-256 of every byte, "
                            "read once: catches a rewrite that kept size, footer and time)")


def add_save_images(group, default: bool, what: str) -> None:
    """--save-images / --no-save-images (every image study; the default is the study's)."""
    group.add_argument("--save-images", action=argparse.BooleanOptionalAction, default=default,
                       help=f"write {what} (default: {'on' if default else 'off'})")


def add_generation_execution(group, label: str, batch: int = GEN_BATCH_SIZE, unit: str = "images", speed: bool = True,
                             save: str = "the images") -> None:
    """The execution options of a generation plan (pipelines/engine/generation/execute.py): generator
    actors and batch, GPUs per actor and device, the generator's speed options, the error budget,
    --save-images."""
    group.add_argument("--gen-actors", type=int, default=GEN_ACTORS, help=f"generator actors per model (default {GEN_ACTORS})")
    group.add_argument("--gen-batch-size", type=int, default=batch, help=f"{unit} per generator call (default {batch})")
    gpus.add_arguments(group, label)
    if speed:
        gpus.add_generation_options(group)
    gpus.add_offload(group)
    group.add_argument("--max-error-rate", type=float, help="stop when more images than this share fail (default 0.05)")
    add_save_images(group, True, save)


def _model_list(text: str) -> list[str]:
    """One --generators word: models separated by commas (a path may not hold one)."""
    models = [m.strip() for m in str(text).split(",")]
    if not all(models):
        raise argparse.ArgumentTypeError(f"{text!r}: an empty model name between commas")
    return models


class _Extend(argparse.Action):
    """--generators A,B C: the flat list [A, B, C]."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, [m for group in values for m in group])

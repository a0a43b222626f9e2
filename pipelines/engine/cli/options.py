"""The shared command-line options of a study run, typed and built once from the parsed flags.

Below the command line nothing reads the ``argparse`` namespace: the engine and the studies get a
``RunOptions``. Its fields are the flags every study shares (``arguments.py`` declares them); a
study's own settings are built from its flags by its ``settings`` (preset, file, flags), and the
flags that override stage resources (``--gen-actors``, ``--skin-actors``, ...) are read by name
from ``flags``, a read-only copy of every parsed value.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from pipelines.engine.cli import arguments
from pipelines.engine.cli.arguments import GEN_ACTORS, GEN_BATCH_SIZE


def speed_options(flags: Mapping[str, Any]) -> dict:
    """The generator operators' speed keyword arguments from --gen-channels-last, --gen-vae-slicing
    and --gen-compile (all off when a study's parser has none of them)."""
    slicing = {"off": False, "on": True, "auto": "auto"}[flags.get("gen_vae_slicing") or "off"]
    mode = flags.get("gen_compile") or "off"
    return {"channels_last": bool(flags.get("gen_channels_last")), "vae_slicing": slicing,
            "compile_unet": False if mode == "off" else (True if mode == "default" else mode)}


@dataclass(frozen=True)
class RunOptions:
    """How a run runs (never what it computes: that is the study's settings and its fingerprint)."""

    output: str = "."
    run_id: str | None = None
    ray_address: str | None = None
    num_cpus: int | None = None
    verbose: bool = False
    no_progress: bool = False
    overwrite: bool = False
    standin_models: bool = False
    save_images: bool = False
    gpus_per_actor: float | None = None
    device: str | None = None
    gen_actors: int = GEN_ACTORS
    gen_batch_size: int = GEN_BATCH_SIZE
    gen_cpu_offload: bool = False
    speed: Mapping[str, Any] = field(default_factory=dict)
    log_to: str | None = None
    tracking_uri: str | None = None
    push_to_hub: str | None = None
    hub_private: bool = False
    command: str = ""
    intervals: Any = None   # stats.intervals.IntervalSettings of --interval-* (its defaults without them)
    flags: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def from_args(cls, args) -> "RunOptions":
        """The options of a parsed command line (a flag a study's parser lacks keeps its default)."""
        values = dict(vars(args))
        known = {f.name for f in dataclasses.fields(cls)} - {"speed", "flags", "command", "intervals"}
        given = {k: values[k] for k in known if values.get(k) is not None}
        # a bad interval option fails here, before anything starts
        opts = cls(**given, speed=speed_options(values), command=" ".join(sys.argv),
                   intervals=arguments.interval_settings(args), flags=MappingProxyType(values))
        return dataclasses.replace(opts, gen_batch_size=max(1, int(opts.gen_batch_size)),
                                   gen_actors=max(1, int(opts.gen_actors)))

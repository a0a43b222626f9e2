"""The one study lifecycle: every study's `run` goes through ``run_study``.

    settings -> inputs checked -> fingerprint -> run directory -> Ray (+ GPU plan)
      -> real models checked on the driver -> run opened (or resumed)
      -> stand-ins built into it (--standin-models) -> streams and tables (the study)
      -> report (the study) -> run summary, metrics.json (here) -> run finished

A study is an object with the small interface ``Study`` below; the engine calls it and nothing
else (no module injection, no names looked up on the caller). What the engine owns: Ray start
and the GPU check, run ids, directories and resume, where stand-ins live, the order in which
models are checked and the run opened, failure recording, the run summary files and the common
keys of metrics.json. What a study owns: its settings, what its results depend on (the
fingerprint), its models, its stage lists, its tables, its report.

Behaviour that used to differ between the three studies' copies, and which one was kept:
- Real models are loaded and checked *before* the run directory is opened (an unloadable model
  leaves nothing behind, as the amplification and GEP studies did); stand-ins are built *after* it
  is opened and checked against this configuration (they are written into it, which DALL-Eval got
  right: a --run-id naming another job's directory is refused before anything is written there).
- Stand-ins of a run whose output is an object store live in a fixed local directory per run id
  (DALL-Eval's choice), not a fresh temporary one, so a resumed run finds the same model paths.
- Ray starts before any model loads (all three), so a run whose real models could get no GPU
  stops before loading anything.
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from pipelines.engine import dataset_card, generation, gpus, io, publish, rundir, runtime
from pipelines.engine.io import clean_json
from pipelines.engine import config as study_config
from pipelines.engine.models import hub_offline_if_unreachable, print_models, quiet_model_libraries, standin_hint
from pipelines.engine.summary import format_branch_summary, format_run_summary, run_summary_csv

STANDINS_DIR = "standin_models"
RUN_SUMMARY = "run_summary"
METRICS = "metrics.json"


class Study(Protocol):
    """What a study gives the engine. ``st`` is the study's own settings object: a frozen dataclass
    built once by ``settings`` from preset, file and flags, never edited afterwards. What the run
    learns as it goes lives in the ``Run`` (its generators, GPU plan, the models it loaded); a
    stand-in run runs with the settings ``use_standins`` returns (its models replaced)."""

    name: str  # recorded as metrics.json's "study", e.g. "paper001-gep"

    def settings(self, args) -> Any:
        """The effective settings: preset, --config file, command-line overrides. Bad settings
        and unreadable inputs fail here, before anything starts."""

    def label(self, st) -> str:
        """The job label of the default run id (``<label>-<8 hex digits of the fingerprint>``)."""

    def job(self, args, st) -> dict:
        """Everything the results depend on: its fingerprint names the run, and a resumed run
        must have the same (execution settings such as actors or batch sizes stay out)."""

    def announce(self, args, st) -> None:
        """Print what the run will do (one or two lines)."""

    def gpu_models(self, args, st) -> bool:
        """Whether the run has model actors that ask for GPUs (generators, CLIP, BLIP-2)."""

    def actor_cpus(self, args, st) -> float:
        """CPUs the study's actor pools hold at once (a local Ray instance gets at least this + 2)."""

    def use_standins(self, args, st, root: str) -> Any:
        """Build tiny random stand-ins under ``root``: the settings this run runs with (a copy of
        ``st`` whose model specs point at them; ``st`` itself is left as it is)."""

    def load_models(self, args, st, gpu: gpus.GpuPlan | None) -> list[dict]:
        """Load every model once on the driver (then let it go): their provenance records,
        ``{"role", "model", "standin", "detail"}``; an unloadable model raises ModelLoadError.
        The generators are not among them: the engine loads those (``generators``)."""

    # optional, for a study that generates images:
    #   generators(st) -> list[GeneratorSpec]      the run's generators (the engine builds their
    #                                               stand-ins, loads them and puts them in run.generators)
    #   safety(st) -> SafetySettings               the run's safety policy (default st.generation.safety)
    #   standin_generator_names: tuple[str, ...]   directory names of the generator stand-ins
    #   standin_shared_text_encoder: tuple[int, ...]  stand-ins sharing one text encoder
    #   check_generator(pipe, spec) -> None        a study's own check of a loaded generator
    #   printed_summary(rows) -> (rows, note)      the run summary rows printed at the end (and a note)

    def execute(self, run: "Run") -> "Outcome":
        """The streams and the tables: everything the run computes and writes besides the report."""

    def report(self, run: "Run", outcome: "Outcome") -> None:
        """Write the report (HTML, figures) and print the results."""


class StudyBase:
    """Defaults for the ``Study`` interface, for a study whose settings have ``label``,
    ``generation`` (``GenerationSettings``) and ``execution``: a new image study writes
    ``settings``, ``job``, ``execute`` and ``report`` (and ``load_models`` / ``use_standins`` for
    its models besides the generators)."""

    name = "study"

    def label(self, st) -> str:
        return st.label

    def announce(self, args, st) -> None:
        pass

    def gpu_models(self, args, st) -> bool:
        return True

    def actor_cpus(self, args, st) -> float:
        return getattr(args, "gen_actors", 1)

    def generators(self, st) -> list:
        return list(st.generation.generators)

    def use_standins(self, args, st, root: str) -> Any:
        return st

    def load_models(self, args, st, gpu) -> list[dict]:
        return []


@dataclass
class Run:
    """What a study's ``execute`` and ``report`` get: the open run and everything started for it."""

    args: Any
    st: Any                       # the settings this run runs with (stand-ins: ``use_standins``'s copy)
    rd: rundir.RunDir
    ray: Any
    gpu: gpus.GpuPlan | None
    models: list[dict]
    started: float
    stack: contextlib.ExitStack
    # what the run learned: the generators it runs (stand-in directories with --standin-models)
    generators: list = field(default_factory=list)
    # the run's one safety policy (generation.SafetySettings; its NSFW check a stand-in with
    # --standin-models) and, per generator, its images' NSFW counts (generation.safety_counts)
    safety: Any = None
    safety_counts: dict = field(default_factory=dict)
    # what a study's steps learned on the way, for its metrics (e.g. the caption side's SBERT screen)
    records: dict = field(default_factory=dict)
    # what a study's steps keep for its later steps, never written out (e.g. the exact SBERT cosines
    # of the caption side's refinement, which a walk's reselection reuses)
    memo: dict = field(default_factory=dict)

    @property
    def generator_models(self) -> list[str]:
        """The model (hub id or directory) of each generator this run runs."""
        return [g.model for g in self.generators]

    @property
    def echo(self) -> Callable:
        return runtime.progress_echo(bool(getattr(self.args, "no_progress", False)))

    def path(self, name: str) -> str:
        return self.rd.file(name)


@dataclass
class Outcome:
    """What ``execute`` computed: the study's part of metrics.json, the run summary rows (rows in,
    kept, dropped per reason per stage) and anything the report needs (``data``)."""

    metrics: dict
    summary_rows: list[dict] | None = None
    data: dict = field(default_factory=dict)


def plan_run(args, study: Study, st) -> rundir.RunDir:
    """This job's directory under --output (nothing is written yet)."""
    job = rundir.plain(study.job(args, st))
    fp = rundir.fingerprint(job)
    rd = rundir.RunDir(args.output, args.run_id or rundir.default_run_id(study.label(st), fp))
    rd.job, rd.fingerprint = job, fp
    return rd


def open_run(args, rd: rundir.RunDir, overwrite: bool = False) -> rundir.RunDir:
    """Start the run in its directory, or resume it there when it holds the same configuration."""
    rd.open(rd.fingerprint, rd.job, overwrite=overwrite, command=" ".join(sys.argv))
    print(f"run {rd.run_id}: {'resuming in' if rd.resumed else 'results ->'} {rd.display()}")
    return rd


def start_ray(args, execution: dict, actor_cpus: float, standin: bool, gpu_models: bool = True, specs=()):
    """The Ray instance of a study's run (local or the cluster's) and, for a study with model
    actors, their GPU plan: GPUs asked for from the configuration, held against what this Ray
    instance can provide before any model loads or data is read (pipelines/engine/gpus.py)."""
    gp = gpus.plan(execution, args.gpus_per_actor, getattr(args, "device", None), standin) if gpu_models else None
    ray = runtime.init_ray(args.ray_address, args.num_cpus, quiet=not args.verbose, progress=not args.no_progress,
                           actor_cpus=actor_cpus)
    runtime.configure(execution["max_retries"])
    if gp is not None:
        # the run's real generators: one too large for gpu_worker's card needs gpu_worker_large's resource
        gp = gpus.check_cluster(ray, gp, standin, local=runtime.is_local_instance(), specs=specs,
                                offload=bool(getattr(args, "gen_cpu_offload", False)))
        print(f"model actors: {gp.per_actor:g} GPU(s) each ({gp.source}), models on {gp.device}"
              + (f"; {gp.note}" if gp.note else ""))
    return ray, gp


def standin_root(rd: rundir.RunDir) -> str:
    """Where a run's stand-ins live: inside a local run directory (kept with the results, so
    recorded seeds can be regenerated), else a fixed local directory per run id."""
    if "://" not in rd.uri:
        root = Path(rd.uri) / STANDINS_DIR
    else:
        root = Path(tempfile.gettempdir()) / f"t2i-standins-{rd.run_id}"
    root.mkdir(parents=True, exist_ok=True)
    return str(root)


def run_study(study: Study, args) -> dict:
    """Run ``study`` end to end (see the module docstring); returns metrics.json's content."""
    started = time.time()
    standin = bool(getattr(args, "standin_models", False))
    publish.check(args)
    st = study.settings(args)
    rd = plan_run(args, study, st)
    if args.overwrite:
        io.clear_dir(rd.fs, rd.path)
    study.announce(args, st)
    ex = st.execution
    with contextlib.ExitStack() as stack:
        specs = list(study.generators(st)) if hasattr(study, "generators") else []
        if not getattr(args, "verbose", False):
            quiet_model_libraries(diffusers=bool(specs))
        # Ray first: a run whose real models could get no GPU stops here, before any model loads
        ray, gp = start_ray(args, ex, study.actor_cpus(args, st), standin, study.gpu_models(args, st), specs)
        if not getattr(args, "verbose", False):
            stack.enter_context(runtime.native_stderr_filtered())
        models = None
        safety = (study.safety(st) if hasattr(study, "safety") else
                  getattr(getattr(st, "generation", None), "safety", None)) if specs else None
        if not standin:  # every real model loads before the run starts: a failure leaves nothing behind
            stack.enter_context(hub_offline_if_unreachable())
            with standin_hint(False):
                models = (study.load_models(args, st, gp) + _load_generators(study, specs, False)
                          + generation.load_nsfw_check(safety, False))
        open_run(args, rd)
        try:
            if standin:  # written into the run directory, so only once it is open (and checked)
                root = standin_root(rd)
                print(f"building tiny random stand-in models (NOT the paper's models) in {root} ...")
                with io.naming_disk_full(root):  # safetensors' own error names no file
                    st = study.use_standins(args, st, root)
                    if st is None:
                        raise TypeError(f"{type(study).__name__}.use_standins must return the run's settings")
                    if specs:
                        specs = generation.build_standin_generators(
                            specs, root, getattr(study, "standin_generator_names", None),
                            getattr(study, "standin_shared_text_encoder", ()))
                    if safety is not None:
                        safety = generation.build_standin_checker(safety, root, specs)
                with standin_hint(True):
                    models = (study.load_models(args, st, gp) + _load_generators(study, specs, True)
                              + generation.load_nsfw_check(safety, True))
            print_models(models)
            run = Run(args, st, rd, ray, gp, models, started, stack, generators=specs, safety=safety)
            outcome = study.execute(run)
            metrics = finish(run, study, outcome)
        except BaseException as exc:
            rd.finish("failed", error=f"{type(exc).__name__}: {str(exc)[:2000]}")
            raise
    rd.finish("finished", duration_s=round(time.time() - started, 3))
    print(f"\nresults: {rd.display()}/" + ("  (open report.html)" if io.exists(rd.fs, rd.file("report.html")) else ""))
    publish.after_run(args, rd.uri, study.name, rd.run_id, metrics, publish.config_of(rd))
    return metrics


def _load_generators(study: Study, specs: list, standin: bool) -> list[dict]:
    """The provenance records of the run's generators, each loaded once on the driver."""
    if not specs:
        return []
    return generation.load_generators(specs, standin, getattr(study, "check_generator", None))


def write_run_summary(rd: rundir.RunDir, rows: list[dict]) -> None:
    io.write_text(json.dumps(rows, indent=2, default=str), rd.fs, rd.file(f"{RUN_SUMMARY}.json"))
    io.write_text(run_summary_csv(rows), rd.fs, rd.file(f"{RUN_SUMMARY}.csv"))


def finish(run: Run, study: Study, outcome: Outcome) -> dict:
    """Run summary files, the report, metrics.json (the study's keys plus the common ones), and
    the run summary printed last."""
    if outcome.summary_rows is not None:
        write_run_summary(run.rd, outcome.summary_rows)
    study.report(run, outcome)
    metrics = {"study": study.name, "run_id": run.rd.run_id, "started_unix": run.started,
               "duration_s": round(time.time() - run.started, 3), **outcome.metrics}
    metrics.setdefault("models", run.models)
    if run.safety is not None:
        metrics["safety"] = {**run.safety.job(), "per_model": run.safety_counts}
    if outcome.summary_rows is not None:
        metrics["run_summary"] = outcome.summary_rows
    metrics["environment"] = study_config.environment()
    io.write_text(json.dumps(clean_json(metrics), indent=2, default=str, allow_nan=False), run.rd.fs,
                  run.rd.file(METRICS))
    # the folder as a dataset: every table a datasets configuration, what was measured, how to cite
    dataset_card.write(run.rd.fs, run.rd.path, f"{study.name}: run {run.rd.run_id}", study.name, clean_json(metrics))
    if outcome.summary_rows is not None:
        rows, note = outcome.summary_rows, None
        if hasattr(study, "printed_summary"):   # a study may print a shorter one (the files hold all rows)
            rows, note = study.printed_summary(rows)
        print()
        table = format_run_summary(rows) if getattr(run.args, "verbose", False) else format_branch_summary(rows)
        print(table + (f"\n{note}" if note else ""))
    return metrics

"""The one study lifecycle: every study's `run` goes through ``run_study``.

    flags -> options + settings -> fingerprint -> run directory -> Ray (+ GPU plan)
      -> real models checked on the driver -> run opened (or resumed)
      -> stand-ins built into it (--standin-models) -> prepare (the study: its own streams, then
      the generation plan) -> generate (here: every generator in one execution, checkpointed,
      counted) -> analyse (the study: its tables) -> report (the study)
      -> run summary, metrics.json (here) -> run finished

A study is a ``Study`` (or an ``ImageStudy``, which generates): every member is declared below
with its default, and the engine calls those and nothing else. What the engine owns: Ray start and
the GPU check, run ids, directories and resume, where stand-ins live, the order in which models
are checked and the run opened, generation (stand-in generators, loading, one execution for all
generators, checkpoints, error budgets, NSFW counts, the generated images' table), failure
recording, the run summary files and the common keys of metrics.json. What a study owns: its
settings, its models besides the generators, its own streams, the plan's requests and heads, its
tables, its report.

Real models are loaded and checked *before* the run directory is opened (an unloadable model
leaves nothing behind); stand-ins are built *after* it is opened and checked against this
configuration (they are written into it: a --run-id naming another job's directory is refused
before anything is written there). Stand-ins of a run whose output is an object store live in a
fixed local directory per run id, so a resumed run finds the same model paths. Ray starts before
any model loads, so a run whose real models could get no GPU stops before loading anything.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from operators.base import gc_paused
from pipelines.engine import generation
from pipelines.engine.cli import config as study_config
from pipelines.engine.cli.options import RunOptions
from pipelines.engine.generation import Generated, GenerationPlan, GeneratorSpec, SafetySettings
from pipelines.engine.run import fingerprint, gpus, publish, rundir
from pipelines.engine.run.models import hub_offline_if_unreachable, print_models, quiet_model_libraries, standin_hint
from pipelines.engine.stats.summary import format_branch_summary, format_run_summary, run_summary_csv
from pipelines.engine.storage import dataset_card, io
from pipelines.engine.storage.io import clean_json
from pipelines.engine.stream import runtime

STANDINS_DIR = "standin_models"
RUN_SUMMARY = "run_summary"
METRICS = "metrics.json"


@dataclass
class Run:
    """What a study's ``prepare``, ``analyse`` and ``report`` get: the open run and everything
    started for it."""

    options: RunOptions
    st: Any                       # the settings this run runs with (stand-ins: ``use_standins``'s copy)
    rd: rundir.RunDir
    ray: Any
    gpu: gpus.GpuPlan | None
    models: list[dict]
    started: float
    stack: contextlib.ExitStack
    # the generators it runs (stand-in directories with --standin-models)
    generators: list = field(default_factory=list)
    # the run's one safety policy (its NSFW check a stand-in with --standin-models) and, per
    # generator, its images' NSFW counts (generation.safety_counts)
    safety: SafetySettings | None = None
    safety_counts: dict = field(default_factory=dict)
    # what a study's steps learned on the way, for its metrics (e.g. the caption side's SBERT screen)
    records: dict = field(default_factory=dict)
    # what a study's steps keep for its later steps, never written out (what ``prepare`` found and
    # ``analyse`` needs; the exact SBERT cosines a walk's reselection reuses)
    memo: dict = field(default_factory=dict)

    @property
    def generator_models(self) -> list[str]:
        """The model (hub id or directory) of each generator this run runs."""
        return [g.model for g in self.generators]

    @property
    def echo(self) -> Callable:
        return runtime.progress_echo(self.options.no_progress)

    def path(self, name: str) -> str:
        return self.rd.file(name)

    def generation_config(self) -> dict:
        """What metrics.json's config records of the run's generation: the GPU plan and the generators."""
        return {"gpus_per_actor": self.gpu.per_actor if self.gpu else None,
                "gpu_plan": self.gpu.as_dict() if self.gpu else None,
                "generators_loaded": self.generator_models, "save_images": self.options.save_images}


@dataclass
class Outcome:
    """What ``analyse`` computed: the study's part of metrics.json, the run summary rows (rows in,
    kept, dropped per reason per stage) and anything the report needs (``data``)."""

    metrics: dict
    summary_rows: list[dict] | None = None
    data: dict = field(default_factory=dict)


class Study:
    """A study the engine runs. ``st`` is the study's own settings object: a frozen dataclass built
    once by ``settings`` from preset, file and flags, never edited afterwards; ``opts`` the run's
    shared options. What the run learns as it goes lives in the ``Run``; a stand-in run runs with
    the settings ``use_standins`` returns. Every member has its default here."""

    name: str = "study"                                  # metrics.json's "study", e.g. "paper001-gep"
    standin_generator_names: tuple[str, ...] | None = None   # directory names of the generator stand-ins
    standin_shared_text_encoder: tuple[int, ...] = ()   # stand-ins sharing one text encoder (SD 2.0 / 2.1)

    def settings(self, args) -> Any:
        """The effective settings from the parsed command line: preset, --config file, flag
        overrides (the one place below the parser that reads it). Bad settings and unreadable
        inputs fail here, before anything starts."""
        raise NotImplementedError

    def label(self, st) -> str:
        """The job label of the default run id (``<label>-<8 hex digits of the fingerprint>``)."""
        return st.label

    def job(self, opts: RunOptions, st) -> dict:
        """Everything the checkpointed results depend on: its fingerprint names the run, and a
        resumed run must have the same. Derived from the settings themselves (``fingerprint``:
        every field but the declared execution and analysis-only ones) and the generation plan's
        operators, heads and stages; a study adds only what is not a setting (an input's identity)."""
        plan = self.plan_shape(st)
        return {"study": self.name, **fingerprint.settings_job(st),
                **({"plan": generation.plan_job(plan)} if plan is not None else {}),
                "standin_models": opts.standin_models}

    def plan_shape(self, st) -> GenerationPlan | None:
        """The generation plan as the run id sees it (its operator, heads and stages; no requests)."""
        return None

    def announce(self, opts: RunOptions, st) -> None:
        """Print what the run will do (one or two lines)."""

    def gpu_models(self, opts: RunOptions, st) -> bool:
        """Whether the run has model actors that ask for GPUs (generators, CLIP, BLIP-2)."""
        return False

    def actor_cpus(self, opts: RunOptions, st) -> float:
        """CPUs the study's actor pools hold at once (a local Ray instance gets at least this + 2)."""
        return 1.0

    def generators(self, st) -> list[GeneratorSpec]:
        """The run's generators: the engine builds their stand-ins, loads them and runs the plan with each."""
        return []

    def safety(self, st) -> SafetySettings | None:
        """The run's safety policy (with generators)."""
        return None

    def check_generator(self, pipe, spec: GeneratorSpec) -> None:
        """A study's own check of a loaded generator (on the driver, before the run opens)."""

    def use_standins(self, opts: RunOptions, st, root: str) -> Any:
        """Build tiny random stand-ins of the study's own models under ``root``: the settings this
        run runs with (a copy of ``st`` whose model specs point at them)."""
        return st

    def load_models(self, opts: RunOptions, st, gpu: gpus.GpuPlan | None) -> list[dict]:
        """Load every model besides the generators once on the driver (then let it go): their
        provenance records, ``{"role", "model", "standin", "detail"}``; an unloadable model raises
        ModelLoadError."""
        return []

    def prepare(self, run: Run) -> GenerationPlan | None:
        """The study's own streams, then what to generate (None: nothing)."""
        return None

    def analyse(self, run: Run, generated: Generated | None) -> Outcome:
        """Everything the run computes and writes from its streams and the generated rows, besides the report."""
        raise NotImplementedError

    def report(self, run: Run, outcome: Outcome) -> None:
        """Write the report (HTML, figures) and print the results."""

    def printed_summary(self, rows: list[dict]) -> tuple[list[dict], str | None]:
        """The run summary rows printed at the end (the files hold all rows), and a note under them."""
        return rows, None


class ImageStudy(Study):
    """A study that generates images, whose settings have ``label``, ``generation``
    (``GenerationSettings``) and ``execution``. ``plan_of(st, requests, save_images)`` builds its
    generation plan: by default the run generates ``st.requests`` with it, and the run id sees its
    shape."""

    def plan_of(self, st, requests, save_images: bool) -> GenerationPlan | None:
        """The study's generation plan for ``requests`` (None: a study that generates nothing)."""
        return None

    def plan_shape(self, st) -> GenerationPlan | None:
        return self.plan_of(st, None, True)

    def prepare(self, run: Run) -> GenerationPlan | None:
        return self.plan_of(run.st, run.st.requests, run.options.save_images)

    def gpu_models(self, opts: RunOptions, st) -> bool:
        return True

    def actor_cpus(self, opts: RunOptions, st) -> float:
        return opts.gen_actors

    def generators(self, st) -> list[GeneratorSpec]:
        return list(st.generation.generators)

    def safety(self, st) -> SafetySettings | None:
        return st.generation.safety


def plan_run(opts: RunOptions, study: Study, st) -> rundir.RunDir:
    """This job's directory under --output (nothing is written yet)."""
    job = rundir.plain(study.job(opts, st))
    fp = rundir.fingerprint(job)
    rd = rundir.RunDir(opts.output, opts.run_id or rundir.default_run_id(study.label(st), fp))
    rd.job, rd.fingerprint = job, fp
    return rd


def open_run(opts: RunOptions, rd: rundir.RunDir, overwrite: bool = False) -> rundir.RunDir:
    """Start the run in its directory, or resume it there when it holds the same configuration."""
    rd.open(rd.fingerprint, rd.job, overwrite=overwrite, command=opts.command)
    print(f"run {rd.run_id}: {'resuming in' if rd.resumed else 'results ->'} {rd.display()}")
    return rd


def start_ray(opts: RunOptions, execution: dict, actor_cpus: float, gpu_models: bool = True, specs=()):
    """The Ray instance of a study's run (local or the cluster's) and, for a study with model
    actors, their GPU plan: GPUs asked for from the configuration, held against what this Ray
    instance can provide before any model loads or data is read (pipelines/engine/run/gpus.py)."""
    standin = opts.standin_models
    gp = gpus.plan(execution, opts.gpus_per_actor, opts.device, standin) if gpu_models else None
    ray = runtime.init_ray(opts.ray_address, opts.num_cpus, quiet=not opts.verbose, progress=not opts.no_progress,
                           actor_cpus=actor_cpus)
    runtime.configure(execution["max_retries"])
    if gp is not None:
        # the run's real generators: one too large for gpu_worker's card needs gpu_worker_large's resource
        gp = gpus.check_cluster(ray, gp, standin, local=runtime.is_local_instance(), specs=specs,
                                offload=True if opts.gen_cpu_offload else None)   # else each spec's own
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
    """Run ``study`` end to end (see the module docstring) from its parsed command line; returns
    metrics.json's content."""
    started = time.time()
    opts = RunOptions.from_args(args)
    publish.check(opts)
    st = study.settings(args)
    rd = plan_run(opts, study, st)
    if opts.overwrite:
        io.clear_dir(rd.fs, rd.path)
    study.announce(opts, st)
    with contextlib.ExitStack() as stack:
        specs = study.generators(st)
        if not opts.verbose:
            quiet_model_libraries(diffusers=bool(specs))
        # Ray first: a run whose real models could get no GPU stops here, before any model loads
        ray, gp = start_ray(opts, st.execution, study.actor_cpus(opts, st), study.gpu_models(opts, st), specs)
        if not opts.verbose:
            stack.enter_context(runtime.native_stderr_filtered())
        safety = study.safety(st) if specs else None
        models = None
        if not opts.standin_models:  # every real model loads before the run starts: a failure leaves nothing behind
            stack.enter_context(hub_offline_if_unreachable())
            with standin_hint(False):
                models = _load_models(study, opts, st, gp, specs, safety)
        open_run(opts, rd)
        try:
            if opts.standin_models:  # written into the run directory, so only once it is open (and checked)
                st, specs, safety, checker = _build_standins(study, opts, st, rd, specs, safety)
                with standin_hint(True):
                    models = _load_models(study, opts, st, gp, specs, safety, checker)
            print_models(models)
            run = Run(opts, st, rd, ray, gp, models, started, stack, generators=specs, safety=safety)
            plan = study.prepare(run)
            generated = _generate(run, plan) if plan is not None else None
            outcome = study.analyse(run, generated)
            if generated is not None:   # the generation budgets after the study's own
                outcome.metrics["error_budgets"] = (list(outcome.metrics.get("error_budgets") or [])
                                                    + [b.as_dict() for b in generated.budgets])
            metrics = finish(run, study, outcome)
        except BaseException as exc:
            rd.finish("failed", error=f"{type(exc).__name__}: {str(exc)[:2000]}")
            raise
    rd.finish("finished", duration_s=round(time.time() - started, 3))
    print(f"\nresults: {rd.display()}/" + ("  (open report.html)" if io.exists(rd.fs, rd.file("report.html")) else ""))
    publish.after_run(opts, rd.uri, study.name, rd.run_id, metrics, publish.config_of(rd))
    return metrics


def _load_models(study: Study, opts: RunOptions, st, gp, specs: list, safety,
                 checker: generation.StandinChecker | None = None) -> list[dict]:
    """Every model of the run loaded once on the driver, in this order: the study's, the
    generators, the NSFW check (the first that cannot load is the error). A stand-in run's NSFW
    check (``checker``) is calibrated on the loaded generators and built before it loads. The
    collector is paused meanwhile, as in every actor that builds an operator
    (``operators.base.gc_paused``), and what outlives the loads is collected once after."""
    with gc_paused(collect_after=True):
        own = study.load_models(opts, st, gp)
        calibrate = checker.calibrate if checker is not None else None
        generators = (generation.load_generators(specs, opts.standin_models, study.check_generator, calibrate)
                      if specs else [])
        if checker is not None:
            with io.naming_disk_full(checker.root):
                checker.build(len(specs))
        return own + generators + generation.load_nsfw_check(safety, opts.standin_models)


def _build_standins(study: Study, opts: RunOptions, st, rd: rundir.RunDir, specs: list, safety):
    """The study's stand-ins and the generators', built into the run's stand-in directory, and the
    NSFW check's settings with the stand-in to build there while the generators load (``_load_models``)."""
    root = standin_root(rd)
    print(f"building tiny random stand-in models (NOT the paper's models) in {root} ...")
    # safetensors' own error names no file; no collection after: the loads that follow end with one
    with io.naming_disk_full(root), gc_paused():
        st = study.use_standins(opts, st, root)
        if st is None:
            raise TypeError(f"{type(study).__name__}.use_standins must return the run's settings")
        if specs:
            specs = generation.build_standin_generators(specs, root, study.standin_generator_names,
                                                        study.standin_shared_text_encoder)
        checker = None
        if safety is not None:
            safety, checker = generation.standin_checker(safety, root)
    return st, specs, safety, checker


def _generate(run: Run, plan: GenerationPlan) -> Generated:
    """The plan run with every generator, and its table of generated rows written where it asks."""
    generated = generation.generate(run, plan)
    if plan.images_file and generated.images is not None:
        write = io.write_table_and_csv if plan.images_csv else io.write_table
        write(generated.images, run.rd.fs, run.rd.file(plan.images_file))
    return generated


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
        rows, note = study.printed_summary(outcome.summary_rows)
        print()
        table = format_run_summary(rows) if run.options.verbose else format_branch_summary(rows)
        print(table + (f"\n{note}" if note else ""))
    return metrics

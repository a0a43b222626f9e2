"""Running a generation plan: every generator of the run in one Ray Data execution.

For each generator the engine builds its stage list (``generator_pipeline``: the plan's operator
with the generator's settings and the plan's heads on its device, the plan's stages after it, the
image sink), reads what its checkpoint already holds, and puts the requests still to do in one
stream ordered by generator. Generators whose stage lists ask for the same resources run in one
execution (``routing.ByModel`` gives each row to its generator's operator); a generator that needs
other resources (too large for ``gpu_worker``'s card) runs in an execution of its own. Rows are
checkpointed per generator as they arrive, each generator's failures counted against its own error
budgets, and the result is every generator's rows in request order.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Mapping

import pyarrow as pa

from operators.base import Stage, conform, with_column
from pipelines.engine.generation import routing
from pipelines.engine.generation.plan import GenerationPlan, Generated
from pipelines.engine.generation.safety import SafetySettings, record_safety
from pipelines.engine.generation.specs import GeneratorSpec
from pipelines.engine.run import gpus
from pipelines.engine.storage import checkpoint
from pipelines.engine.stream import runtime, stages
from pipelines.engine.stream.progress import ErrorBudget, Phase, drain
from schemas import images as I


def generator_pipeline(run, plan: GenerationPlan, spec: GeneratorSpec) -> list[Stage]:
    """The stage list of one generator: the plan's operator with the plan's heads on its device
    (pinned to the spec's revision, on the run's device, with the speed options it takes), the
    plan's stages after it, the plan's image sink; resources from execution.stages, the flags and
    the GPU plan."""
    opts = run.options
    op = plan.operator
    params = inspect.signature(op.__init__).parameters
    speed = {k: v for k, v in opts.speed.items() if k in params}
    # the run's policy (run_study sets it from the settings); a run built by hand without one: the spec's
    safety = run.safety or SafetySettings(policy=spec.safety_checker)
    offload = gpus.offloaded(spec, run.gpu, opts.gen_cpu_offload)
    if spec.cpu_offload and not offload:
        print(f"{spec.name}: CPU offload (cpu_offload=true) applies when the generator actors get a GPU; these ask "
              f"for none, so the whole model is loaded")
    gen = Stage(op, {**spec.operator_kwargs(), "micro_batch": opts.gen_batch_size,
                     "device": run.gpu.device if run.gpu else "auto", "heads": list(plan.heads),
                     **safety.operator_kwargs(), **speed, **({"cpu_offload": True} if offload else {}),
                     **dict(plan.operator_kwargs)})
    sink = [Stage(plan.sink, {"uri": f"{run.rd.uri}/{plan.images_dir}/{checkpoint.model_dir(spec.model)}",
                              "keys": [], "name_column": plan.key})] if plan.save_images and plan.sink else []
    pipeline = [gen, *plan.after, *sink]
    name = op.stage_name
    values = {name: {"num_gpus": run.gpu.per_actor if run.gpu else 0.0, "batch_size": opts.gen_batch_size}}
    extra = gpus.actor_resources(spec, run.gpu, offload=offload) if run.gpu else {}
    if extra:   # too large for gpu_worker's card: only cluster.yaml's gpu_worker_large declares it
        values[name]["resources"] = extra
    for stage, v in plan.overrides.items():
        values[stage] = {**values.get(stage, {}), **dict(v(opts.gen_batch_size) if callable(v) else v)}
    flags = {"gen_actors": [(name, "actors")], **dict(plan.resource_flags)}
    return stages.configure(pipeline, stages.overrides(run.st.execution, opts.flags, flags, values))


def generation_budget(execution: Mapping, model: str) -> ErrorBudget:
    """The error budget of ``model``'s generation failures (over --max-error-rate)."""
    return ErrorBudget(f"generation ({model})", {I.GENERATION_STATUS: I.GenerationStatus.FAILURES},
                       float(execution["max_error_rate"]), int(execution["error_budget_min_rows"]))


class ModelBudget:
    """An error budget that counts only the rows of one generator (MODEL) of a shared stream."""

    def __init__(self, model: str, budget):
        self.model, self.budget = model, budget

    def add(self, batch: pa.Table) -> None:
        self.budget.add(batch.filter(routing.of_model(batch, self.model)))

    def check(self, final: bool = False) -> None:
        self.budget.check(final)


def generate(run, plan: GenerationPlan) -> Generated:
    """Run ``plan`` with every generator of the run (``run.generators``), each with its own error
    budgets (default: generation failures over --max-error-rate), checkpointed per image, in as few
    Ray Data executions as their resources allow (one on a single kind of GPU node)."""
    execution = run.st.execution
    batch = run.options.gen_batch_size
    finish = plan.finish or (lambda t: conform(t, plan.schema))
    requests, key = plan.requests, plan.key
    if plan.share_key:   # one image per share key: generated once, given to each of its requests
        key = list(plan.share_key)
        requests = checkpoint.first_per_key(requests, key)
    rkey = plan.request_key or key
    order = list(plan.order or [(c, "ascending") for c in checkpoint.key_columns(rkey)])
    todo, phases, budgets, pipelines = {}, {}, {}, {}
    for spec in run.generators:
        model = spec.model
        print(f"{plan.what} {plan.requests.num_rows * plan.per_request:,} images with {spec.name} ...")
        budgets[model] = plan.budgets_of(model) if plan.budgets_of else [generation_budget(execution, model)]
        name = checkpoint.generation_checkpoint(model)
        done = checkpoint.checkpointed(run.rd, name, model, requests, plan.schema, key, plan.request_key,
                                       plan.per_request)
        todo[model] = checkpoint.still_to_do(requests, done, rkey)
        phases[model] = Phase(f"generate {Path(model.rstrip('/')).name}", "images",
                              requests.num_rows * plan.per_request, reused=done.num_rows)
        for b in budgets[model]:
            b.add(done)
        if todo[model].num_rows:
            pipelines[model] = generator_pipeline(run, plan, spec)
        else:
            for b in budgets[model]:
                b.check(final=True)
    for group in routing.resource_groups(pipelines):
        _run_group(run, plan, group, {m: pipelines[m] for m in group}, todo, phases, budgets, order, finish, batch)
    parts = []
    for spec in run.generators:
        model, phase = spec.model, phases[spec.model]
        images = checkpoint.checkpointed(run.rd, checkpoint.generation_checkpoint(model), model, requests,
                                         plan.schema, key, plan.request_key, plan.per_request)
        images = conform(checkpoint.in_request_order(images, requests, key, model, plan.request_key,
                                                     plan.per_request), plan.schema)
        if plan.share_key:
            images = checkpoint.per_request_rows(images, plan.requests, key)
        if phase.reused:
            print(f"  {phase.name}: {phase.reused:,} of {phase.total:,} {phase.unit} reused from the checkpoint, "
                  f"{phase.processed:,} processed now")
        parts.append(images)
        record_safety(run, model, images)
    return Generated(pa.concat_tables(parts) if parts else None, phases,
                     [b for spec in run.generators for b in budgets[spec.model]])


def _run_group(run, plan: GenerationPlan, models: list[str], pipelines: dict, todo: dict, phases: dict,
               budgets: dict, order: list, finish, batch: int) -> None:
    """One Ray Data execution generating the requests still to do of ``models``."""
    names = {m: checkpoint.generation_checkpoint(m) for m in models}
    rows_per_block = batch * 4
    # each request with the generator it asks for; blocks of one generator each, generator after generator
    requests = [with_column(todo[m], I.MODEL, pa.array([m] * todo[m].num_rows, pa.string())).sort_by(order)
                for m in models]
    shared = Phase(phases[models[0]].name if len(models) == 1 else f"generate ({len(models)} models)", "images",
                   sum(phases[m].total for m in models), reused=sum(phases[m].reused for m in models))
    group_budgets = [ModelBudget(m, b) for m in models for b in budgets[m]]

    def sink(table: pa.Table) -> None:
        for m in models:
            mine = table.filter(routing.of_model(table, m)) if len(models) > 1 else table
            if mine.num_rows:
                phases[m].processed += mine.num_rows
                run.rd.write_part(names[m], finish(mine))

    ds = runtime.from_tables(run.ray, requests, rows_per_block)
    ds = stages.run(ds, routing.merge(pipelines)).drop_columns(I.PAYLOAD)
    drain(ds, sink, shared, budgets=group_budgets, flush_rows=max(rows_per_block, 32), echo=run.echo)
    for m in models:   # the execution's time is every one of its generators' time
        phases[m].seconds, phases[m].ray_stats = shared.seconds, shared.ray_stats

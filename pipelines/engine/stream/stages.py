"""Pipelines as data: a study's stream is a list of ``operators.base.Stage`` (operator, arguments,
resources), and this module runs it.

Resources are declared once, on the operator (``resources``) or on the Stage where a study needs
something else; the only other place that changes them is ``configure``, which applies the
overrides of a run: the configuration's ``execution.stages`` mapping ({stage name: {actors,
num_gpus, num_cpus, batch_size, resources}}; ``resources``: custom Ray resources, e.g. {large_gpu: 1})
first, then the command-line flags a study maps onto stages (``--ner-actors`` -> names.actors,
``--gpus-per-actor`` -> the model actors' num_gpus, ...).
``run`` then turns every Stage into one Ray Data ``map_batches`` with exactly those resources.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping

from operators.base import Resources, Stage
from pipelines.engine.stream import runtime

FIELDS = tuple(f.name for f in dataclasses.fields(Resources))


def overrides(execution: Mapping | None, given: Mapping | None = None,
              flags: Mapping[str, Iterable[tuple[str, str]]] = (),
              values: Mapping[str, Mapping] | None = None) -> dict[str, dict]:
    """{stage name: {resource field: value}} for a run: ``execution["stages"]`` from the
    configuration, then each command-line flag of ``flags`` ({flag's dest: [(stage, field), ...]})
    that ``given`` (the parsed flags, ``RunOptions.flags``) sets (not None), then ``values`` (what
    the run decided, e.g. the GPU plan)."""
    out: dict[str, dict] = {}

    def put(stage: str, key: str, value, where: str) -> None:
        if key not in FIELDS:
            raise ValueError(f"{where}: {stage}.{key} is not a stage resource (one of {', '.join(FIELDS)})")
        if key == "resources" and value is not None:
            value = custom_resources(value, f"{where}: {stage}.resources")
        out.setdefault(stage, {})[key] = value

    for stage, fields in ((execution or {}).get("stages") or {}).items():
        if not isinstance(fields, Mapping):
            raise ValueError(f"execution.stages.{stage}: expected a mapping of {', '.join(FIELDS)}, got {fields!r}")
        for key, value in fields.items():
            put(stage, key, value, "execution.stages")
    for attr, targets in dict(flags).items():
        value = (given or {}).get(attr)
        if value is not None:
            for stage, key in targets:
                put(stage, key, value, f"--{attr.replace('_', '-')}")
    for stage, fields in (values or {}).items():
        for key, value in fields.items():
            put(stage, key, value, "run")
    return out


def custom_resources(value, where: str = "resources") -> dict[str, float]:
    """A stage's custom Ray resources as {name: amount}: a mapping of names to non-negative numbers."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: expected a mapping of custom Ray resources to amounts, got {value!r}")
    out = {}
    for name, amount in value.items():
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or amount < 0:
            raise ValueError(f"{where}: {name} = {amount!r}: expected a number >= 0")
        out[str(name)] = float(amount)
    return out


NESTED = ("heads", "dependency")   # keyword arguments holding stages that run inside their stage


def nested(stage: Stage) -> list[Stage]:
    """The stages that run inside ``stage`` (a generator's heads, its dependency analysis)."""
    out = []
    for key in NESTED:
        value = stage.kwargs.get(key)
        out += [v for v in (value if isinstance(value, (list, tuple)) else [value]) if isinstance(v, Stage)]
    return out


def inner_name(outer: Stage, head: Stage) -> str:
    """How ``execution.stages`` names a stage that runs inside another: ``<outer>.<head>``
    (``generate.fid_features``), so it never collides with a top-level stage of the same operator
    (the amplification study's CLIP is both)."""
    return f"{outer.name}.{head.name}"


def _configure_nested(head: Stage, change: Mapping, name: str, outer: str) -> Stage:
    """A head's override: it runs inside ``outer``'s actor, so only its ``batch_size`` (the images
    it takes at once, an argument of the head) applies."""
    wrong = sorted(set(change) - {"batch_size"})
    if wrong:
        raise ValueError(f"execution.stages.{name}: {wrong} cannot apply: {head.name} runs inside {outer} on its "
                         f"device (set them on {outer}); only batch_size applies to it")
    import inspect

    if "batch_size" not in inspect.signature(head.op.__init__).parameters:
        raise ValueError(f"execution.stages.{name}: {head.op.__name__} takes no batch_size")
    return dataclasses.replace(head, kwargs={**dict(head.kwargs), "batch_size": int(change["batch_size"])})


def pool_size(actors) -> int | tuple[int, int]:
    """An actor count (at least 1), or a (min, max) pair (``[1, 8]`` in a configuration file)."""
    if isinstance(actors, (tuple, list)):
        if len(actors) != 2:
            raise ValueError(f"an actor pool is a number or [min, max], got {actors!r}")
        lo = max(1, int(actors[0]))
        return lo, max(lo, int(actors[1]))
    return max(1, int(actors))


def configure(stages: list[Stage], changes: Mapping[str, Mapping]) -> list[Stage]:
    """``stages`` with the resource ``changes`` applied (by stage name; names of stages this list
    does not have are ignored, so one set of overrides serves every stream of a study). A stage
    that runs inside another (a head of the generator) is reached by its own name too (its
    ``batch_size``) as ``<outer>.<head>``."""
    out = []
    for s in stages:
        if {inner_name(s, h) for h in nested(s)} & set(changes):
            kwargs = dict(s.kwargs)

            def apply(v, outer=s):
                name = inner_name(outer, v) if isinstance(v, Stage) else None
                return _configure_nested(v, changes[name], name, outer.name) if name in changes else v

            for key in (k for k in NESTED if k in kwargs):
                value = kwargs[key]
                kwargs[key] = [apply(v) for v in value] if isinstance(value, (list, tuple)) else apply(value)
            s = dataclasses.replace(s, kwargs=kwargs)
        if s.name in changes:
            res = dataclasses.replace(s.declared(), **changes[s.name])
            if res.actors is not None:
                res = dataclasses.replace(res, actors=pool_size(res.actors))
            s = dataclasses.replace(s, resources=res)
        out.append(s)
    return out


def run(ds, stages: list[Stage], schema=None):
    """Chain ``stages`` onto the Ray dataset ``ds``. With ``schema`` the stream carries tally rows
    (caption stages that drop rows count them per reason); without, stages keep every row and
    write status columns (image stages)."""
    for s in stages:
        if schema is not None:
            ds = runtime.stage(ds, s.op, dict(s.kwargs), schema, s.declared())
        else:
            ds = runtime.map_stage(ds, s.op, dict(s.kwargs), s.declared())
    return ds


def describe(stages: list[Stage]) -> list[dict]:
    """What metrics.json records about a stream: each stage's name, operator and resources."""
    out = []
    for s in stages:
        d = {"stage": s.name, "operator": f"{s.op.__module__}.{s.op.__qualname__}",
             "resources": dataclasses.asdict(s.declared())}
        inner = nested(s)
        if inner:   # run inside this stage's actors, on its device
            d["inside"] = [{"stage": inner_name(s, h), "operator": f"{h.op.__module__}.{h.op.__qualname__}",
                            "batch_size": h.kwargs.get("batch_size")} for h in inner]
        out.append(d)
    return out

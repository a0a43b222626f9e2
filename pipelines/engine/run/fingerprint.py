"""What a run's checkpointed results depend on, read from its settings object itself.

A study's run id is ``<label>-<8 hex digits>`` of the fingerprint of its job; the job is derived
here from the study's settings (a frozen dataclass), never listed by hand: every field is in it,
recursively, so a new setting is in the run id by construction. What is left out is declared:

- fields and mapping keys named in ``EXECUTION`` anywhere (how the run executes: the execution
  block, actors, batch sizes, the device; the job's label);
- the fields a settings class names in its ``not_in_run_id`` class attribute, with the reason in
  a comment there: analysis-only settings, applied to checkpointed rows every time a run (or its
  resume) computes its tables (a threshold of the statistics, the groups a table compares), and
  inputs already fingerprinted through what is derived from them.

Values: an object with ``job()`` (generator specs, the safety policy) is its job; a model spec
its ``record()``; a dataclass its fields; a table a digest of its rows; a function its qualified
name; paths as text.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any, Mapping

import pyarrow as pa

EXECUTION = frozenset({"execution", "label", "actors", "batch_size", "device", "threads"})


def settings_job(value: Any, skip: frozenset = frozenset()) -> Any:
    """``value`` as the fingerprint sees it (plain JSON types), without what only says how it
    executes. ``skip``: names left out at this level, and ``name.inner`` below it."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    instance = not isinstance(value, type)
    job = getattr(value, "job", None)
    if instance and callable(job):
        return settings_job(job(), skip)
    declared = getattr(type(value), "not_in_run_id", None)
    record = getattr(value, "record", None)
    if instance and declared is None and callable(record):   # a model spec: its flat block
        return settings_job(record(), skip)
    if instance and dataclasses.is_dataclass(value):
        skip = skip | frozenset(declared or ())
        return {f.name: settings_job(getattr(value, f.name), _below(skip, f.name)) for f in dataclasses.fields(value)
                if f.name not in skip and f.name not in EXECUTION}
    if isinstance(value, Mapping):
        return {str(k): settings_job(v, _below(skip, str(k))) for k, v in value.items()
                if k not in EXECUTION and k not in skip}
    if isinstance(value, (list, tuple)):
        return [settings_job(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(settings_job(v) for v in value)
    if isinstance(value, pa.Table):
        return table_digest(value)
    if hasattr(value, "to_csv") and hasattr(value, "columns"):   # a pandas DataFrame
        return {"rows": len(value), "sha256": hashlib.sha256(value.to_csv(index=False).encode()).hexdigest()}
    if isinstance(value, Path):
        return str(value)
    if callable(value):
        return qualified_name(value)
    return json.loads(json.dumps(value, default=str))


def qualified_name(fn) -> str:
    """A function's or class's ``module.qualname``: what a fingerprint records of it."""
    return f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


def _below(skip: frozenset, name: str) -> frozenset:
    """The names ``skip`` leaves out inside ``name`` (``name.inner`` -> ``inner``)."""
    prefix = f"{name}."
    return frozenset(s[len(prefix):] for s in skip if s.startswith(prefix))


def table_digest(table: pa.Table) -> dict:
    """A table's rows and the sha256 of its columns' values (their order included)."""
    h = hashlib.sha256()
    for name in table.column_names:
        h.update(name.encode())
        h.update(json.dumps(table.column(name).to_pylist(), default=str, sort_keys=True).encode())
    return {"rows": table.num_rows, "sha256": h.hexdigest()}

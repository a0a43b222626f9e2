"""Headline numbers of a run with their intervals: one contract for every study and ``t2i compare``.

A study states its headline metrics as means over the units its paper samples (``Metric``: the
per-unit values, optional weights and strata), per *subject* (a generator model, or the training
data). ``summarize`` gives every metric its interval (``intervals.mean_interval``, or an exact
interval where the study names one) and ``write`` puts

- ``headline_units.parquet`` in the run directory: one row per (subject, metric, unit) with the
  unit's value, weight and stratum (``HEADLINE_UNITS``), so ``compare`` can pair two runs on the
  units they share (the same occupations, prompts, seeds);
- the ``headline`` section of ``metrics.json``: the protocol that must match for two runs to be
  comparable, the interval settings, and per subject its identity (``subject_identity``: the
  model's recorded spec, weight hash and commit) and each metric with its interval.

Keys of ``metrics.json["headline"]``::

    {"study": "paper002-amplification", "protocol": {...}, "interval": {level, resamples, seed, method},
     "standin": bool,
     "subjects": [{"key": "...", "name": "...", "display": "...", "kind": "model"|"data", "identity": {...},
                   "images": int, "excluded": {reason: count},
                   "metrics": [{"key", "label", "unit", "better", "scale", "value", "low", "high",
                                "method", "n", "level"}]}]}

``better`` says which way is less biased (or better), for ranks: ``lower``, ``higher`` or
``zero`` (closer to zero; the rank uses the absolute value).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from pipelines.engine.report import html as H
from pipelines.engine.stats import intervals as iv
from pipelines.engine.storage import io

HEADLINE_UNITS_FILE = "headline_units.parquet"
BETTER = ("lower", "higher", "zero")

# columns of headline_units.parquet
SUBJECT = "subject"
METRIC = "metric"
UNIT = "unit"
VALUE = "value"
WEIGHT = "weight"
STRATUM = "stratum"
REPLICATES = "replicates"     # the unit's value in each image resample (null: none recorded)
IMAGE_RESAMPLES = 200         # image resamples a study stores per metric (the two-level bootstrap picks among them)
HEADLINE_UNITS = pa.schema([pa.field(SUBJECT, pa.string()), pa.field(METRIC, pa.string()),
                            pa.field(UNIT, pa.string()), pa.field(VALUE, pa.float64()),
                            pa.field(WEIGHT, pa.float64()), pa.field(STRATUM, pa.string()),
                            pa.field(REPLICATES, pa.list_(pa.float64()))])


@dataclass
class Metric:
    """One headline metric of one subject: the mean of ``values`` over ``units``."""

    key: str                       # stable id, e.g. "expected_amplification/naive"
    label: str                     # what a reader sees, e.g. "E[A], naive captions (Table 3)"
    unit: str                      # what a unit is: "occupation", "prompt", "image", ...
    units: list                    # unit ids (text; the same id in two runs = the same unit)
    values: list                   # per-unit values (NaN: the unit has none; left out)
    better: str = "lower"
    scale: float = 1.0             # display factor (100: shown as a percentage)
    weights: list | None = None
    strata: list | None = None     # resampled within strata (e.g. occupation of an image)
    exact: str | None = None       # "t": Student's t instead of the bootstrap
    digits: int = 2                # decimals shown (after ``scale``)
    lead: bool = True              # one of the numbers a reader sees first (compare's overview); False
                                   # for the detail behind them (per-prompt values, vector entries)
    # (image resamples x units): every unit's value recomputed from the same resample of the run's
    # images (resampled within the units' images, jointly where units share images), so intervals
    # and comparisons carry the images' sampling noise as well as the units' (two-level bootstrap)
    replicates: np.ndarray | None = None

    def __post_init__(self):
        if self.better not in BETTER:
            raise ValueError(f"metric {self.key}: better must be one of {BETTER}, not {self.better!r}")
        if len(self.units) != len(self.values):
            raise ValueError(f"metric {self.key}: {len(self.units)} units, {len(self.values)} values")
        if len(set(map(str, self.units))) != len(self.units):
            raise ValueError(f"metric {self.key}: unit ids repeat")
        if self.replicates is not None:
            self.replicates = np.asarray(self.replicates, np.float64)
            if self.replicates.ndim != 2 or self.replicates.shape[1] != len(self.units):
                raise ValueError(f"metric {self.key}: replicates must be (resamples x {len(self.units)} units), "
                                 f"not {self.replicates.shape}")

    def interval(self, settings: iv.IntervalSettings) -> iv.Interval:
        if self.exact == "t":
            return iv.t_interval(self.values, settings.level)
        return iv.mean_interval(self.values, self.weights, self.strata, settings, self.replicates)

    def summary(self, settings: iv.IntervalSettings) -> dict:
        return {"key": self.key, "label": self.label, "unit": self.unit, "better": self.better, "scale": self.scale,
                "digits": self.digits, "lead": self.lead, **self.interval(settings).as_dict()}

    def table(self, subject: str) -> pa.Table:
        n = len(self.units)
        return pa.table({SUBJECT: pa.array([subject] * n, pa.string()), METRIC: pa.array([self.key] * n, pa.string()),
                         UNIT: pa.array([str(u) for u in self.units], pa.string()),
                         VALUE: pa.array(np.asarray(self.values, np.float64)),
                         WEIGHT: pa.array(np.ones(n) if self.weights is None else np.asarray(self.weights, np.float64)),
                         STRATUM: pa.array([None if s is None else str(s) for s in (self.strata or [None] * n)],
                                           pa.string()),
                REPLICATES: pa.array([None] * n if self.replicates is None else list(self.replicates.T),
                                     pa.list_(pa.float64()))}, schema=HEADLINE_UNITS)


@dataclass
class Subject:
    """What the metrics describe: a generator (``kind`` "model") or the training data ("data")."""

    name: str                      # shown: the hub id (or the dataset)
    identity: dict                 # what makes two runs' subjects the same (subject_identity)
    metrics: list[Metric]
    kind: str = "model"
    images: int | None = None      # images behind the numbers
    excluded: dict = field(default_factory=dict)   # {reason: count} left out of the numbers

    @property
    def key(self) -> str:
        return identity_key(self.identity)


def identity_key(identity: dict) -> str:
    """A short stable key of a subject identity (the weight hash where recorded)."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]


def subject_identity(record: dict) -> dict:
    """The identity of a generator from its provenance record (``{"role", "model", "detail"}``):
    its weights' sha256 where recorded (the same weights are the same model, whatever the path),
    else the hub id and commit or revision; plus the generation settings of its spec that change
    the images (scheduler, steps, guidance, size, dtype; not CPU offload, which moves weights only)."""
    detail = record.get("detail") or {}
    spec = dict(detail.get("spec") or {})
    for k in ("device", "model", "revision", "cpu_offload"):
        spec.pop(k, None)
    ident = {"weights_sha256": detail.get("weights_sha256")} if detail.get("weights_sha256") else \
        {"model": record.get("model"), "commit": detail.get("commit") or (detail.get("spec") or {}).get("revision")}
    if record.get("standin_for"):   # a stand-in: what it stands in for is part of what it is (and its name)
        ident["standin_for"] = record["standin_for"]
    return {**ident, "spec": spec}


def shown(subject: dict) -> str:
    """The name to show of a ``headline`` subject entry (its ``display``, else its ``name``)."""
    return subject.get("display") or subject["name"]


def display_name(subject: "Subject") -> str:
    """The name a reader sees: a stand-in's requested model (hub id), else the subject's own name."""
    return subject.identity.get("standin_for") or subject.name


def summarize(study: str, subjects: list[Subject], protocol: dict, settings: iv.IntervalSettings,
              standin: bool) -> dict:
    """metrics.json's ``headline`` section."""
    return {"study": study, "protocol": protocol, "interval": settings.record(), "standin": bool(standin),
            "subjects": [{"key": s.key, "name": s.name, "display": display_name(s), "kind": s.kind, "identity": s.identity, "images": s.images,
                          "excluded": s.excluded, "metrics": [m.summary(settings) for m in s.metrics]}
                         for s in subjects]}


def units_table(subjects: list[Subject]) -> pa.Table:
    parts = [m.table(s.key) for s in subjects for m in s.metrics]
    return pa.concat_tables([HEADLINE_UNITS.empty_table(), *parts])


def write(rd, study: str, subjects: list[Subject], protocol: dict, settings: iv.IntervalSettings,
          standin: bool) -> dict:
    """Write ``headline_units.parquet`` into the run directory ``rd`` (a RunDir); return the
    ``headline`` section for metrics.json."""
    io.write_table(units_table(subjects), rd.fs, rd.file(HEADLINE_UNITS_FILE))
    return summarize(study, subjects, protocol, settings, standin)


def protocol_digest(values) -> str:
    """sha256 of a list of prompts (or any JSON-able value): compared, not shown."""
    return hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()


# ------------------------------------------------------------------------------ the report
def interval_text(m: dict, digits: int | None = None) -> str:
    """A metric summary (``Metric.summary``) as "12.30 [8.10, 16.40]" (its own ``digits`` unless given)."""
    d = m.get("digits", 2) if digits is None else digits
    return iv.Interval(m["value"], m["low"], m["high"], m["method"], m["n"], m["level"]).text(d, m.get("scale", 1.0))


def interval_ends(headline: dict | None) -> dict:
    """{(subject name, metric key): (low, high)} of a ``headline`` section ({} without one): what a
    study's tables put beside their values."""
    if not headline:
        return {}
    return {(s["name"], m["key"]): (m["low"], m["high"]) for s in headline["subjects"] for m in s["metrics"]}


def better_text(better: str) -> str:
    return {"lower": "lower is less biased", "higher": "higher is better", "zero": "closer to 0 is less biased"}[better]


def summary_table(headline: dict) -> str:
    """The headline numbers with intervals as an HTML table (one row per subject and metric), for a
    report's opening box (``page.headline``), followed by how the intervals were made."""
    rows = []
    for s in headline["subjects"]:
        for m in s["metrics"]:
            rows.append(f"<tr><td>{H.esc(shown(s))}</td><td>{H.esc(m['label'])}</td>"
                        f"<td class=n>{H.esc(interval_text(m))}</td><td class=n>{m['n']:,} {H.esc(m['unit'])}s</td>"
                        f"<td>{H.esc(better_text(m['better']))}</td></tr>")
    lvl = headline["interval"]
    return ("<table class=headline-metrics><tr><th>subject</th><th>metric</th>"
            f"<th>value [{int(round(lvl['level'] * 100))}% interval]</th><th>units</th><th>direction</th></tr>"
            + "".join(rows) + "</table>" + f"<p class=behind>{H.esc(method_text(lvl))}</p>")


def behind_items(headline: dict) -> list[str]:
    """What stands behind the numbers, per subject (images, exclusions), as ``page.headline``'s items."""
    out = []
    for s in headline["subjects"]:
        if s.get("images") is None:
            continue
        excl = ", ".join(f"{v:,} {k}" for k, v in (s.get("excluded") or {}).items() if v)
        out.append(H.esc(f"{shown(s)}: {s['images']:,} images" + (f" (excluded: {excl})" if excl else "")))
    return out


def method_text(interval: dict) -> str:
    return (f"Intervals: {int(round(interval['level'] * 100))}% bootstrap over the units named "
            f"({interval['method']}, {interval['resamples']:,} resamples, seed {interval['seed']}), or Student's t "
            f"where the method says t; where the method says two-level, the images within the units are "
            f"resampled too.")

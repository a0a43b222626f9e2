"""What every DALL-Eval run directory must hold about its headline numbers: the
``headline`` section of metrics.json with an interval around each value, headline_units.parquet
whose per-subject per-metric mean is the reported value, and the summary box in report.html."""

import json
from pathlib import Path

import numpy as np
import pandas as pd

from pipelines.engine.stats import headline as HL
from pipelines.engine.stats.intervals import IntervalSettings


def check_headline(run: Path, study: str, keys: set[str], protocol_keys: set[str]) -> dict:
    """Assert the headline contract of the run directory ``run``; returns the headline section."""
    m = json.loads((run / "metrics.json").read_text())
    h = m["headline"]
    assert h["study"] == study and h["standin"] is True
    assert h["interval"] == IntervalSettings().record()
    assert protocol_keys <= set(h["protocol"]), set(h["protocol"])
    gens = {r["model"]: r for r in m["models"] if r["role"] == "generator"}
    models = [s for s in h["subjects"] if s["kind"] == "model"]
    assert {s["name"] for s in models} == set(gens)
    for s in models:
        assert s["identity"] == HL.subject_identity(gens[s["name"]]) and s["images"] >= 0
        assert keys <= {x["key"] for x in s["metrics"]}, s["metrics"]
    units = pd.read_parquet(run / HL.HEADLINE_UNITS_FILE)
    assert len(units)
    for s in h["subjects"]:
        for x in s["metrics"]:
            if x["value"] is None:
                continue
            assert x["low"] is None or x["low"] - 1e-12 <= x["value"] <= x["high"] + 1e-12, x
            mine = units[(units[HL.SUBJECT] == s["key"]) & (units[HL.METRIC] == x["key"])]
            v, w = mine[HL.VALUE].to_numpy(), mine[HL.WEIGHT].to_numpy()
            keep = np.isfinite(v)
            assert keep.sum() == x["n"] and not mine[HL.UNIT].duplicated().any()
            assert abs(np.average(v[keep], weights=w[keep]) - x["value"]) < 1e-9, x
    page = (run / "report.html").read_text()
    assert "class=headline-metrics" in page and "Headline numbers" in page
    assert all(x["label"].split(" (")[0].split(",")[0] in page.replace("&#x27;", "'")
               for s in h["subjects"] for x in s["metrics"])
    return h


def lookup(h: dict) -> dict:
    """{(subject name, metric key): the metric's summary}."""
    return {(s["name"], x["key"]): x for s in h["subjects"] for x in s["metrics"]}

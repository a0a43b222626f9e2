"""Agreement of a task set's answers, as the papers report it: α with its interval, the majority
per item, the classifier's agreement with the majority per stratum, its confusion matrix, and the
preset's own table (SD Exposed: nouns found by both, by the model only, by people only).

Written to ``TASKS_DIR/report/``: ``agreement.json`` and, as CSV and parquet (``datasets``
loads either), ``majority``, ``classifier_agreement`` and ``confusion``; the same text is printed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from pipelines.annotate import agreement as G
from pipelines.annotate.simulate import PREFIX as SIMULATED
from pipelines.annotate.tasks import AnnotateError, TaskSet
from pipelines.engine.stats import intervals as I
from schemas import annotation as A

REPORT_DIR = "report"


def alpha_block(labels: pd.DataFrame, scale: list[str], level: str, settings: I.IntervalSettings) -> dict:
    ids, counts = G.value_counts(labels, scale)
    ci = G.alpha_interval(counts, level, settings)
    return {"alpha": ci.as_dict(), "level": level, "items": int(labels[A.ITEM_ID].nunique()),
            "items_pairable": ci.n, "annotators": int(labels[A.ANNOTATOR].nunique()), "answers": int(len(labels))}


def nouns_table(items: pd.DataFrame, majorities: pd.DataFrame, yes: str = "yes", top: int = 5) -> dict:
    """SD Exposed's human evaluation: of the nouns with a majority, found by both, by the model
    only, by people only, by neither; the most frequent nouns of the two disagreements."""
    df = items.merge(majorities, on=A.ITEM_ID)
    df = df[(df[A.MAJORITY_STATUS] == A.MajorityStatus.MAJORITY) & df[A.PREDICTION].notna()]
    model, people = df[A.PREDICTION] == yes, df[A.MAJORITY] == yes
    cells = {"both": model & people, "model_only": model & ~people, "people_only": ~model & people,
             "neither": ~model & ~people}
    out = {k: int(v.sum()) for k, v in cells.items()}
    out["nouns"] = int(len(df))
    out["both_share"] = out["both"] / len(df) if len(df) else None
    for k in ("model_only", "people_only"):
        out[f"{k}_most_frequent"] = df[cells[k]][A.SUBJECT].value_counts().head(top).to_dict()
    return out


def build(tasks: TaskSet, labels: pd.DataFrame, settings: I.IntervalSettings = I.DEFAULT) -> dict:
    if labels.empty:
        raise AnnotateError(f"{tasks.path}: no answers yet (label on the page, or `t2i annotate import`)")
    majorities = G.majority(labels, tasks.unsure)
    by = [A.STRATUM]
    result = {"protocol": tasks.protocol["name"], "run_id": tasks.meta["run"]["id"],
              "simulated_answers": int(labels[A.ANNOTATOR].str.startswith(SIMULATED).sum()),
              "intervals": settings.record(),
              **alpha_block(labels, tasks.scale, tasks.level, settings),
              "unsure_answers": int((labels[A.ANSWER] == tasks.unsure).sum()) if tasks.unsure else 0,
              "majority_status": majorities[A.MAJORITY_STATUS].value_counts().to_dict()}
    has_prediction = tasks.items[A.PREDICTION].notna().any()
    agree = G.classifier_agreement(tasks.items, majorities, [], settings.level) if has_prediction else None
    if agree is not None:
        result["classifier_agreement"] = agree.to_dict("records")[0]
    if tasks.protocol["name"] == "exposed-nouns":
        result["nouns"] = nouns_table(tasks.items, majorities)
    tables = {"majority": majorities}
    if has_prediction:
        tables["classifier_agreement"] = G.classifier_agreement(tasks.items, majorities, by, settings.level)
        tables["confusion"] = G.confusion(tasks.items, majorities, by)
    return {"result": result, "tables": tables}


def write(tasks: TaskSet, built: dict) -> Path:
    out = tasks.path / REPORT_DIR
    out.mkdir(exist_ok=True)
    (out / "agreement.json").write_text(json.dumps(built["result"], indent=1, default=_plain))
    for name, table in built["tables"].items():
        table.to_csv(out / f"{name}.csv", index=False)
        table.to_parquet(out / f"{name}.parquet", index=False)
    return out


def _plain(x):
    return None if pd.isna(x) else x.item() if hasattr(x, "item") else str(x)


def text(built: dict) -> str:
    r = built["result"]
    a = I.Interval(**{k: r["alpha"][k] for k in ("value", "low", "high", "method", "n", "level")})
    lines = [f"{r['protocol']} labels of run {r['run_id']}: {r['answers']} answers by {r['annotators']} annotators "
             f"on {r['items']} items" + (f" ({r['simulated_answers']} simulated)" if r["simulated_answers"] else ""),
             f"Krippendorff's alpha ({r['level']}): {a.text(3)} over {r['items_pairable']} items with two answers or "
             f"more ({r['alpha']['method']}, {r['alpha']['level']:.0%})",
             "majority per item: " + ", ".join(f"{k} {v}" for k, v in r["majority_status"].items())]
    if r.get("unsure_answers"):
        lines.append(f"unsure answers: {r['unsure_answers']}")
    c = r.get("classifier_agreement")
    if c:
        ci = I.Interval(c["agreement"], c["agreement_low"], c["agreement_high"], "wilson", c["scored"], 0.95)
        lines.append(f"classifier agrees with the majority on {c['agree']} of {c['scored']} items: {ci.text(3)} "
                     f"(Wilson); not scored: {c['ties']} ties, {c['unsure_majority']} unsure, "
                     f"{c['unanswered']} unanswered")
    n = r.get("nouns")
    if n:
        share = "n/a" if n["both_share"] is None else f"{n['both_share']:.2%}"
        lines.append(f"nouns: {n['both']} of {n['nouns']} found by both ({share}), {n['model_only']} by the model only "
                     f"{n['model_only_most_frequent']}, {n['people_only']} by people only "
                     f"{n['people_only_most_frequent']}, {n['neither']} by neither")
    return "\n".join(lines)

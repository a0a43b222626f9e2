"""Agreement of a task set's answers, as the papers report it: α with its interval, the majority
per item, the classifier's agreement with the majority per stratum, its confusion matrix, and the
preset's own table (SD Exposed: nouns found by both, by the model only, by people only).

Written to ``TASKS_DIR/report/``: ``agreement.json``, ``report.html`` and, as CSV and parquet
(``datasets`` loads either), ``majority``, ``classifier_agreement`` and ``confusion``; the same text
is printed. The run the task set was drawn from gets the same "Checked by people" section in its
report.html (one per protocol, replaced when the report is made again) and the result under
``human_evaluation`` in its metrics.json.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pyarrow.fs as pafs

from pipelines.annotate import agreement as G
from pipelines.annotate.tasks import AnnotateError, TaskSet
from pipelines.engine.report import html as H
from pipelines.engine.report import page as Pg
from pipelines.engine.stats import intervals as I
from pipelines.engine.storage import io
from pipelines.engine.storage.io import clean_json
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
    # known-answer items check the annotators; every estimate is over the items drawn at random
    known = tasks.items[A.KNOWN_ANSWER].notna()
    items = tasks.items[~known]
    drawn = labels[labels[A.ITEM_ID].isin(items[A.ITEM_ID])]
    if drawn.empty:
        raise AnnotateError(f"{tasks.path}: no answers to the drawn items yet (only known-answer items)")
    result = {"protocol": tasks.protocol["name"], "run_id": tasks.meta["run"]["id"],
              "simulated_answers": int((labels[A.ORIGIN] == A.Origin.SIMULATED).sum()),
              "intervals": settings.record(), "level_ci": settings.level,
              **alpha_block(drawn, tasks.scale, tasks.level, settings),
              "unsure_answers": int((drawn[A.ANSWER] == tasks.unsure).sum()) if tasks.unsure else 0,
              "majority_status": majorities[majorities[A.ITEM_ID].isin(items[A.ITEM_ID])][A.MAJORITY_STATUS]
              .value_counts().to_dict()}
    has_prediction = items[A.PREDICTION].notna().any()
    tables = {"majority": majorities}
    agree = G.classifier_agreement(items, majorities, [], settings.level) if has_prediction else None
    if agree is not None:
        result["classifier_agreement"] = agree.to_dict("records")[0]
    if tasks.protocol["name"] == "exposed-nouns":
        result["nouns"] = nouns_table(items, majorities)
    if tasks.protocol["name"] == "dalleval-skills":
        tables["table3"] = skill_table(items, majorities, settings.level)
    if has_prediction:
        tables["classifier_agreement"] = G.classifier_agreement(items, majorities, by, settings.level)
        tables["confusion"] = G.confusion(items, majorities, by)
    if known.any():
        checks = known_answer_checks(tasks.items[known], labels)
        tables["known_answers"] = checks
        result["flagged_annotators"] = checks[checks["flagged"]][A.ANNOTATOR].tolist()
    return {"result": result, "tables": tables}


def skill_table(items: pd.DataFrame, majorities: pd.DataFrame, level: float = 0.95, yes: str = "yes") -> pd.DataFrame:
    """DALL-Eval's Table 3: per model and skill, the skill accuracy by people (the share of judged
    images whose majority says the image shows the prompt) beside the detector's on the same
    images, each with its Wilson interval."""
    df = items.merge(majorities, on=A.ITEM_ID)
    df = df[df[A.MAJORITY_STATUS] == A.MajorityStatus.MAJORITY]
    rows = []
    for (model, skill), part in df.groupby(["model", "skill"], sort=True):
        people = I.binomial_interval(int((part[A.MAJORITY] == yes).sum()), len(part), level)
        detector = I.binomial_interval(int((part[A.PREDICTION] == yes).sum()), len(part), level)
        rows.append({"model": model, "skill": skill, "images": len(part), "people": people.value,
                     "people_low": people.low, "people_high": people.high, "detector": detector.value,
                     "detector_low": detector.low, "detector_high": detector.high})
    return pd.DataFrame(rows)


KNOWN_MIN_ACCURACY = 0.8     # a project choice: an annotator missing more than 1 in 5 known answers is flagged


def known_answer_checks(known: pd.DataFrame, labels: pd.DataFrame) -> pd.DataFrame:
    """Per annotator: known-answer items answered, right, the share right, and whether it is below
    ``KNOWN_MIN_ACCURACY`` (flagged: look at their answers before trusting them)."""
    df = labels.merge(known[[A.ITEM_ID, A.KNOWN_ANSWER]], on=A.ITEM_ID)
    out = df.assign(right=df[A.ANSWER] == df[A.KNOWN_ANSWER]).groupby(A.ANNOTATOR)["right"].agg(["size", "sum"])
    out = out.rename(columns={"size": "known_answered", "sum": "known_right"}).reset_index()
    out["known_accuracy"] = out["known_right"] / out["known_answered"]
    out["flagged"] = out["known_accuracy"] < KNOWN_MIN_ACCURACY
    return out


def write(tasks: TaskSet, built: dict) -> Path:
    out = tasks.path / REPORT_DIR
    out.mkdir(exist_ok=True)
    (out / "agreement.json").write_text(json.dumps(clean_json(built["result"]), indent=1, default=_plain, allow_nan=False))
    for name, table in built["tables"].items():
        table.to_csv(out / f"{name}.csv", index=False)
        table.to_parquet(out / f"{name}.parquet", index=False)
    (out / "report.html").write_text(Pg.document(f"Checked by people: {tasks.protocol['name']}",
                                                 [section(tasks, built)]))
    return out


def _plain(x):
    return None if pd.isna(x) else x.item() if hasattr(x, "item") else str(x)



def sentences(r: dict) -> list[str]:
    """The result in plain sentences: printed one per line, and the report section's paragraphs."""
    a = I.Interval(**{k: r["alpha"][k] for k in ("value", "low", "high", "method", "n", "level")})
    out = [f"{r['protocol']} labels of run {r['run_id']}: {r['answers']} answers by {r['annotators']} annotators "
           f"on {r['items']} items" + (f" ({r['simulated_answers']} simulated)" if r["simulated_answers"] else ""),
           f"Krippendorff's alpha ({r['level']}): {a.text(3)} over {r['items_pairable']} items with two answers or "
           f"more ({r['alpha']['method']}, {r['alpha']['level']:.0%})",
           "majority per item: " + ", ".join(f"{k} {v}" for k, v in r["majority_status"].items())]
    if r.get("unsure_answers"):
        out.append(f"unsure answers: {r['unsure_answers']}")
    c = r.get("classifier_agreement")
    if c:
        ci = I.Interval(c["agreement"], c["agreement_low"], c["agreement_high"], "wilson", c["scored"], r["level_ci"])
        out.append(f"classifier agrees with the majority on {c['agree']} of {c['scored']} items: {ci.text(3)} "
                   f"(Wilson, {r['level_ci']:.0%}); not scored: {c['ties']} ties, {c['unsure_majority']} unsure, "
                   f"{c['unanswered']} unanswered")
    if "flagged_annotators" in r:
        out.append(f"annotators below {KNOWN_MIN_ACCURACY:.0%} on the known-answer items: "
                   + (", ".join(r["flagged_annotators"]) or "none"))
    n = r.get("nouns")
    if n:
        share = "n/a" if n["both_share"] is None else f"{n['both_share']:.2%}"
        out.append(f"nouns: {n['both']} of {n['nouns']} found by both ({share}), {n['model_only']} by the model only "
                   f"{n['model_only_most_frequent']}, {n['people_only']} by people only "
                   f"{n['people_only_most_frequent']}, {n['neither']} by neither")
    return out


def text(built: dict) -> str:
    return "\n".join(sentences(built["result"]))


def section(tasks: TaskSet, built: dict) -> str:
    """The "Checked by people" section (HTML) of one protocol's labels."""
    r, t = built["result"], built["tables"]
    p = tasks.protocol
    parts = [f"<section class=people id='people-{H.esc(p['name'])}'><h2>Checked by people: {H.esc(p['name'])}</h2>",
             f"<p>{H.esc(p['paper'])}. Question: <i>{H.esc(p['question'])}</i> ({H.esc(', '.join(p['choices']))}). "
             f"{H.esc(p.get('notes', ''))}</p>"]
    if r["simulated_answers"]:
        parts.append(f"<p class=warn><b>Simulated annotators: {r['simulated_answers']} of {r['answers']} answers are "
                     "not people's</b> (drawn from a known truth with a set error rate, for the demo).</p>")
    parts += [f"<p>{H.esc(line)}.</p>" for line in sentences(r)]
    if r.get("classifier_agreement"):
        parts.append(H.table(t["classifier_agreement"], 3))
        parts.append(Pg.details("Confusion: the classifier's answer against the people's", H.table(t["confusion"], 0)))
    if r.get("nouns"):
        n = r["nouns"]
        parts.append(H.table(pd.DataFrame([{k: n[k] for k in ("nouns", "both", "model_only", "people_only",
                                                               "neither")}]), 0))
        parts.append(f"<p>Most frequent nouns found by the model only: {H.esc(n['model_only_most_frequent'])}; by "
                     f"people only: {H.esc(n['people_only_most_frequent'])}.</p>")
    if "table3" in t:
        parts.append("<h3>Skill accuracy by people and by the detector (DALL-Eval Table 3)</h3>"
                     + H.table(t["table3"], 3))
    if "known_answers" in t:
        parts.append(f"<p>Known-answer items (left out of every number above): annotators below "
                     f"{KNOWN_MIN_ACCURACY:.0%} are flagged.</p>" + H.table(t["known_answers"], 2))
    parts.append("</section>")
    return "".join(parts)


_MARK = "<!-- checked-by-people:{name} -->"


def attach_to_run(tasks: TaskSet, built: dict) -> list[str]:
    """The section into the run's report.html (before ``</body>``, replacing this protocol's earlier
    one) and the result into its metrics.json; the files changed (none when the run is not there)."""
    return attach_block(tasks, _MARK, section(tasks, built), "human_evaluation",
                        json.loads(json.dumps(clean_json(built["result"]), default=_plain)))


def attach_block(tasks: TaskSet, mark: str, html: str, key: str, payload) -> list[str]:
    """``html`` into the task set's run's report.html between two ``mark`` comments (replacing the
    block of an earlier call, else before ``</body>``), and ``payload`` as metrics.json's
    ``key``/protocol name; the files changed (none when the run moved or another is there)."""
    run = Path(tasks.meta["run"]["path"])
    changed = []
    page, metrics = run / "report.html", run / "metrics.json"
    if not metrics.is_file() or json.loads(metrics.read_text()).get("run_id") != tasks.meta["run"]["id"]:
        return changed                  # the run moved, or another run is there now: leave it alone
    name = tasks.protocol["name"]
    if page.is_file():
        text_ = page.read_text()
        mark = mark.format(name=name)
        block = f"{mark}{html}{mark}"
        pattern = re.escape(mark) + ".*?" + re.escape(mark)
        text_ = (re.sub(pattern, lambda _: block, text_, flags=re.S) if mark in text_
                 else text_.replace("</body>", block + "</body>", 1))
        io.write_text(text_, pafs.LocalFileSystem(), str(page))
        changed.append(str(page))
    doc = json.loads(metrics.read_text())
    doc.setdefault(key, {})[name] = payload
    io.write_text(json.dumps(doc, indent=1, allow_nan=False), pafs.LocalFileSystem(), str(metrics))
    changed.append(str(metrics))
    return changed

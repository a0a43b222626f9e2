"""``t2i annotate estimate``: a classifier's proportions corrected by people's labels.

Two tables go in: the classifier's answer on every item of the population (``item_id, stratum,
prediction``, optionally ``score``, its probability of the positive class) and people's answers
on a simple random sample of them (``item_id, annotator, answer``). Out comes, per stratum, the
classifier's share of the positive class, the corrected share among the items people could decide
(``pipelines.engine.stats.correction``: PPI++ by default, Rogan-Gladen as an option), the share
of labelled items people found undecidable ("unsure"), and how many items stand behind each.

From a task set the two tables are its run's and its own: every candidate item of the preset in the
run (the same item ids and strata as the draw, the run's classifier answers), and the answers in
``answers.sqlite``. The labels must be a random sample of their stratum: a task set records how
its items were drawn; labels without one are refused unless the user states it
(``drawn_at_random``). Known-answer items (attention checks) never count.

An item's verdict is the majority of its answers (``agreement.majority``); items whose majority is
"unsure" or a tie are labelled but undecided, and the corrected share is among decided items.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from pipelines.annotate import candidates as C
from pipelines.annotate import plan as PL
from pipelines.annotate.agreement import majority
from pipelines.annotate.protocols import FEMALE, YES
from pipelines.annotate.tasks import AnnotateError, TaskSet
from pipelines.engine.stats import correction as K
from pipelines.engine.stats import intervals as I
from schemas import annotation as A

DRAWN_BY_PLAN = "a simple random sample within each stratum, drawn by t2i annotate plan (tasks.json)"
DRAWN_STATED = "stated by the user (--drawn-at-random): a simple random sample within each stratum"
NOT_RANDOM = ("labels without a task set: agreement works on them (t2i annotate agreement), but a corrected "
              "estimate needs items drawn at random within each stratum; if they were, say so with --drawn-at-random")


def default_positive(tasks: TaskSet) -> str | None:
    """The class whose share the preset's study reports: % female, or the share of "yes"."""
    choices = tasks.scale
    for c in (FEMALE, YES):
        if c in choices:
            return c
    return None


def run_predictions(tasks: TaskSet) -> pd.DataFrame:
    """Every candidate item of the task set's preset in its run: item id, stratum (the draw's), the
    run's classifier answer."""
    name = tasks.protocol["name"]
    if name not in C.BUILDERS:
        raise AnnotateError(f"{tasks.path}: a {name} task set: give the classifier's answers with --predictions")
    run_dir = Path(tasks.meta["run"]["path"])
    if not run_dir.is_dir():
        raise AnnotateError(f"{run_dir}: the task set's run is not there (moved?): give --predictions")
    info = C.run_info(run_dir)
    if info["id"] != tasks.meta["run"]["id"]:
        raise AnnotateError(f"{run_dir}: now holds run {info['id']}, not the task set's {tasks.meta['run']['id']}")
    cands = C.BUILDERS[name](run_dir)
    ids = [PL.item_id(info["id"], u, s) for u, s in zip(cands[C.UNIT], cands[A.SUBJECT])]
    return pd.DataFrame({A.ITEM_ID: ids, A.STRATUM: PL.stratum_labels(cands, tasks.strata).to_numpy(),
                         A.PREDICTION: cands[A.PREDICTION].to_numpy()})


def check_predictions(pred: pd.DataFrame, source: str) -> pd.DataFrame:
    need = [A.ITEM_ID, A.STRATUM, A.PREDICTION]
    missing = [c for c in need if c not in pred.columns]
    if missing:
        raise AnnotateError(f"{source}: no column {', '.join(missing)} (predictions have {', '.join(need)}"
                            f"{', optionally ' + A.SCORE})")
    if pred.empty:
        raise AnnotateError(f"{source}: no predictions in the file")
    out = pred[[*need, *([A.SCORE] if A.SCORE in pred else [])]].copy()
    if out[A.ITEM_ID].isna().any() or out[A.STRATUM].isna().any():
        raise AnnotateError(f"{source}: an empty item id or stratum")
    out[A.ITEM_ID] = out[A.ITEM_ID].astype(str)
    out[A.STRATUM] = out[A.STRATUM].astype(str)
    out[A.PREDICTION] = out[A.PREDICTION].astype(object).map(lambda v: None if pd.isna(v) else str(v))
    dup = out[A.ITEM_ID].duplicated()
    if dup.any():
        raise AnnotateError(f"{source}: item {out[A.ITEM_ID][dup].iloc[0]!r} appears twice")
    if A.SCORE in out:
        score = pd.to_numeric(out[A.SCORE], errors="coerce")
        bad = (out[A.PREDICTION].notna() & (score.isna() | (score < 0) | (score > 1)))
        if bad.any():
            raise AnnotateError(f"{source}: item {out[A.ITEM_ID][bad].iloc[0]!r} has a score outside [0, 1] "
                                "(the classifier's probability of the positive class)")
        out[A.SCORE] = score
    return out


def estimate(pred: pd.DataFrame, labels: pd.DataFrame, positive: str, unsure: str | None = None,
             methods=(K.PPI,), level: float = 0.95) -> pd.DataFrame:
    """One row per stratum and correction method (``schemas.annotation.ESTIMATE_COLUMNS``)."""
    unknown = sorted(set(labels[A.ITEM_ID]) - set(pred[A.ITEM_ID]))
    if unknown:
        raise AnnotateError(f"{len(unknown)} labelled item(s) have no prediction row, e.g. {unknown[0]!r}: "
                            "the predictions must cover every item of the population")
    seen = set(pred[A.PREDICTION].dropna()) | set(labels[A.ANSWER])
    if positive not in seen:
        raise AnnotateError(f"positive class {positive!r} is neither a prediction nor an answer "
                            f"({', '.join(sorted(seen)[:8])})")
    votes = majority(labels, unsure)
    df = pred.merge(votes[[A.ITEM_ID, A.MAJORITY, A.MAJORITY_STATUS]], on=A.ITEM_ID, how="left")
    rows = []
    for stratum, part in df.groupby(A.STRATUM, sort=True):
        pop = part[part[A.PREDICTION].notna()]
        answered = pop[A.MAJORITY_STATUS].notna().to_numpy()
        lab, unl = pop[answered], pop[~answered]
        status = lab[A.MAJORITY_STATUS]
        decided = (status == A.MajorityStatus.MAJORITY).to_numpy()
        y = (decided & (lab[A.MAJORITY] == positive).to_numpy()).astype(float)
        hard = (pop[A.PREDICTION] == positive).to_numpy()
        guess = pop[A.SCORE].to_numpy(np.float64) if A.SCORE in pop else hard.astype(float)
        f, fu = guess[answered], guess[~answered]
        classifier = I.binomial_interval(int(hard.sum()), len(pop), level)
        n_unsure = int((status == A.MajorityStatus.UNSURE).sum())
        unsure_share = I.binomial_interval(n_unsure, len(lab), level)
        base = {A.STRATUM: stratum, A.ITEMS: len(pop), A.NO_PREDICTION: int(len(part) - len(pop)),
                A.LABELLED: len(lab), A.DECIDED: int(decided.sum()), A.UNSURE_ITEMS: n_unsure,
                A.TIES: int((status == A.MajorityStatus.TIE).sum()), A.UNLABELLED: len(unl),
                **_cells(A.CLASSIFIER, classifier.value, classifier.low, classifier.high),
                **_cells(A.UNSURE_SHARE, unsure_share.value, unsure_share.low, unsure_share.high)}
        for method in methods:
            if method == K.PPI:
                r = K.ppi_proportion(y, f, fu, decided.astype(float), level)
            else:
                hard_lab = hard[answered] & decided
                pos = y.astype(bool)
                r = K.rogan_gladen(int(hard.sum()), len(pop), tp=int((hard_lab & pos).sum()),
                                   fn=int((~hard_lab & pos & decided).sum()), tn=int((~hard_lab & ~pos & decided).sum()),
                                   fp=int((hard_lab & ~pos).sum()), level=level)
            rows.append({**base, A.CORRECTION: method, **_cells(A.CORRECTED, r["value"], r["low"], r["high"]),
                         A.LAMBDA: r["lambda"], A.FLAG: r["flag"]})
    return pd.DataFrame(rows, columns=list(A.ESTIMATE_COLUMNS))


def _cells(name, value, low, high) -> dict:
    return {name: value, f"{name}_low": low, f"{name}_high": high}


def labels_of(tasks: TaskSet, labels: pd.DataFrame) -> pd.DataFrame:
    """The answers that may correct: known-answer items left out (they were not drawn at random)."""
    known = set(tasks.items.loc[tasks.items[A.KNOWN_ANSWER].notna(), A.ITEM_ID])
    return labels[~labels[A.ITEM_ID].isin(known)]


def write(out, table: pd.DataFrame, meta: dict) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "estimates.csv", index=False)
    table.to_parquet(out / "estimates.parquet", index=False)
    rows = json.loads(table.to_json(orient="records"))
    (out / "estimates.json").write_text(json.dumps({**meta, "estimates": rows}, indent=1))
    return out


def text(table: pd.DataFrame, positive: str) -> str:
    """The table as the console shows it: per stratum and method, classifier and corrected shares."""
    lines = [f"share of {positive!r} per stratum: the classifier over every item it answered, corrected among "
             "the items people could decide"]
    for _, r in table.iterrows():
        cls = I.Interval(r[A.CLASSIFIER], r[A.CLASSIFIER + "_low"], r[A.CLASSIFIER + "_high"], "", r[A.ITEMS], 0)
        cor = I.Interval(r[A.CORRECTED], r[A.CORRECTED + "_low"], r[A.CORRECTED + "_high"], "", r[A.DECIDED], 0)
        uns = I.Interval(r[A.UNSURE_SHARE], r[A.UNSURE_SHARE + "_low"], r[A.UNSURE_SHARE + "_high"], "", 0, 0)
        lines.append(f"  {r[A.STRATUM]}: classifier {cls.text(3)} ({r[A.ITEMS]} items); {r[A.CORRECTION]} "
                     f"{cor.text(3)} ({r[A.DECIDED]} decided of {r[A.LABELLED]} labelled); unsure {uns.text(3)}"
                     + (f" [{r[A.FLAG]}]" if r[A.FLAG] else ""))
    return "\n".join(lines)

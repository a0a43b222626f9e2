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
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.fs as pafs

from pipelines.annotate import candidates as C
from pipelines.annotate import plan as PL
from pipelines.annotate.agreement import majority
from pipelines.annotate.protocols import FEMALE, YES
from pipelines.annotate.tasks import AnnotateError, TaskSet
from pipelines.engine.report import html as H
from pipelines.engine.report import page as Pg
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


def run_items(tasks: TaskSet) -> pd.DataFrame:
    """Every candidate item of the task set's preset in its run, as its builder gives it (the
    images are not read), with the item ids the task set gives them."""
    name = tasks.protocol["name"]
    if name not in C.ITEM_BUILDERS:
        raise AnnotateError(f"{tasks.path}: a {name} task set: give the classifier's answers with --predictions")
    run_dir = Path(tasks.meta["run"]["path"])
    if not run_dir.is_dir():
        raise AnnotateError(f"{run_dir}: the task set's run is not there (moved?): give --predictions")
    info = C.run_info(run_dir)
    if info["id"] != tasks.meta["run"]["id"]:
        raise AnnotateError(f"{run_dir}: now holds run {info['id']}, not the task set's {tasks.meta['run']['id']}")
    cands = C.ITEM_BUILDERS[name](run_dir)
    return cands.assign(**{A.ITEM_ID: [PL.item_id(info["id"], u, s) for u, s in zip(cands[C.UNIT], cands[A.SUBJECT])]})


def run_predictions(tasks: TaskSet) -> pd.DataFrame:
    """Every candidate item of the task set's preset in its run: item id, stratum (the draw's), the
    run's classifier answer (and its probability, where the preset has one: GEP's CLS)."""
    cands = run_items(tasks)
    return pd.DataFrame({A.ITEM_ID: cands[A.ITEM_ID], A.STRATUM: PL.stratum_labels(cands, tasks.strata).to_numpy(),
                         A.PREDICTION: cands[A.PREDICTION].to_numpy(),
                         **({A.SCORE: cands[A.SCORE].to_numpy()} if A.SCORE in cands else {})})


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
             methods=(K.PPI,), level: float = 0.95, variant: str = K.CROSSFIT) -> pd.DataFrame:
    """One row per stratum and correction method (``schemas.annotation.ESTIMATE_COLUMNS``);
    ``variant``: PPI++'s (``correction.VARIANTS``)."""
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
                r = K.ppi_proportion(y, f, fu, decided.astype(float), level, variant)
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


PPI_WORDS = {K.CROSSFIT: "with lambda cross-fitted over two folds and the small-sample variance",
             K.PACKAGE: "as ppi_py packages it"}
CORRECTED_MARK = "<!-- corrected-by-people:{name} -->"


@dataclass
class Derived:
    """A number the study derives from corrected shares (paper 002's E[A], GEP's frequencies and
    scores): its table (with ``corrected``, ``corrected_low``, ``corrected_high``), written as
    ``<file>.csv`` and ``.parquet``, kept under ``key`` in the JSON record, shown under ``title``."""
    key: str
    file: str
    title: str
    note: str
    table: pd.DataFrame
    shown: list[str] = field(default_factory=list)
    digits: int = 2


def write(out, table: pd.DataFrame, meta: dict, name: str = "estimate", derived: list[Derived] = (),
          derived_said: list[str] = ()) -> tuple[Path, str, dict]:
    """estimates.csv, .parquet and .json, the forest plot (figures/) and report.html in ``out``;
    each ``derived`` table too. Returns the folder, the HTML section and the JSON record."""
    from pipelines.engine.report import figures      # deferred: matplotlib, which only a report needs

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "estimates.csv", index=False)
    table.to_parquet(out / "estimates.parquet", index=False)
    record = {**meta, "conclusions": [*conclusions(table, meta["positive"]), *derived_said],
              "estimates": json.loads(table.to_json(orient="records"))}
    for d in derived:
        d.table.to_csv(out / f"{d.file}.csv", index=False)
        d.table.to_parquet(out / f"{d.file}.parquet", index=False)
        record[d.key] = json.loads(d.table.to_json(orient="records"))
    (out / "estimates.json").write_text(json.dumps(record, indent=1))
    figs = figures.FigureDir(pafs.LocalFileSystem(), str(out))
    plot = figs.save(forest_figure(table, meta["positive"]), "corrected-shares",
                     caption=f"share of {meta['positive']!r} per stratum: the classifier's and the corrected ones")
    html = section(table, meta, plot, name, record["conclusions"], derived)
    (out / "report.html").write_text(Pg.document(f"Corrected by people: {name}", [html]))
    return out, html, record


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


# ------------------------------------------------------------------------------ what a reader sees
def conclusions(table: pd.DataFrame, positive: str) -> list[str]:
    """Plain sentences where the correction changes a conclusion: a stratum whose share crosses one
    half (a majority of the positive class becomes a minority, as % female crossing 50% turns a
    female skew into a male one), and two strata whose order flips. None when nothing changes."""
    out = []
    for method, part in table.groupby(A.CORRECTION, sort=False):
        part = part[part[A.CORRECTED].notna() & part[A.CLASSIFIER].notna()]
        for _, r in part.iterrows():
            if (r[A.CLASSIFIER] - 0.5) * (r[A.CORRECTED] - 0.5) < 0:
                out.append(f"{method}: in {r[A.STRATUM]} the share of {positive!r} crosses one half: the classifier "
                           f"gives {r[A.CLASSIFIER]:.3f}, corrected by people's labels {r[A.CORRECTED]:.3f}")
        rows = list(part.itertuples(index=False))
        for i, a in enumerate(rows):
            for b in rows[i + 1:]:
                raw = getattr(a, A.CLASSIFIER) - getattr(b, A.CLASSIFIER)
                fixed = getattr(a, A.CORRECTED) - getattr(b, A.CORRECTED)
                if raw * fixed < 0:
                    out.append(f"{method}: the correction flips the order of {getattr(a, A.STRATUM)} and "
                               f"{getattr(b, A.STRATUM)}: the classifier gives {getattr(a, A.CLASSIFIER):.3f} vs "
                               f"{getattr(b, A.CLASSIFIER):.3f}, corrected {getattr(a, A.CORRECTED):.3f} vs "
                               f"{getattr(b, A.CORRECTED):.3f}")
    return out


def order_changes(table: pd.DataFrame, what: str, raw: str, fixed: str, by: list[str] = ()) -> list[str]:
    """Plain sentences where the corrected values (column ``fixed``) order two models otherwise than
    the classifier's (``raw``), within each group of ``by``: a ranking that flips."""
    out = []
    for key, part in (table.groupby(list(by), sort=False) if by else [((), table)]):
        where = ", ".join(map(str, key if isinstance(key, tuple) else (key,)))
        rows = part[part[raw].notna() & part[fixed].notna()].to_dict("records")
        for i, a in enumerate(rows):
            for b in rows[i + 1:]:
                if (a[raw] - b[raw]) * (a[fixed] - b[fixed]) < 0:
                    out.append(f"{what}{f' ({where})' if where else ''}: the correction flips the order of "
                               f"{a['model']} and {b['model']}: the classifier gives {a[raw]:.3f} vs {b[raw]:.3f}, "
                               f"corrected {a[fixed]:.3f} vs {b[fixed]:.3f}")
    return out


def forest_figure(table: pd.DataFrame, positive: str):
    """Per stratum the classifier's share and each corrected one with their intervals."""
    from pipelines.engine.report import figures      # deferred: matplotlib, which only a report needs

    strata = list(dict.fromkeys(table[A.STRATUM]))
    methods = list(dict.fromkeys(table[A.CORRECTION]))
    longest = max((len(f"{s}: {m}") for s in strata for m in ["classifier", *methods]), default=0)
    # wide enough for the longest label beside a plot area of about 3.5 inches (else the axes collapse)
    fig = figures.new_figure(max(6.5, 3.5 + 0.075 * longest), 0.5 * len(strata) * (1 + len(methods)) + 1.0)
    ax = fig.add_subplot()
    colors = ["#555555", "#1f77b4", "#d62728", "#2ca02c"]
    ticks, labels, y = [], [], 0.0
    for s in strata:
        part = table[table[A.STRATUM] == s]
        first = part.iloc[0]
        rows = [("classifier", first[A.CLASSIFIER], first[A.CLASSIFIER + "_low"], first[A.CLASSIFIER + "_high"])]
        rows += [(r[A.CORRECTION], r[A.CORRECTED], r[A.CORRECTED + "_low"], r[A.CORRECTED + "_high"])
                 for _, r in part.iterrows()]
        for k, (name, v, lo, hi) in enumerate(rows):
            if pd.notna(v):
                if pd.notna(lo) and pd.notna(hi):
                    ax.plot([lo, hi], [y, y], color=colors[k % len(colors)], lw=2)
                ax.plot([v], [y], "o", color=colors[k % len(colors)])
            ticks.append(y)
            labels.append(f"{s}: {name}")
            y -= 1
        y -= 0.5
    ax.axvline(0.5, color="#999", lw=0.8, ls="--")
    ax.set_yticks(ticks, labels)
    ax.set_xlim(0, 1)
    ax.set_xlabel(f"share of {positive!r}")
    ax.grid(axis="x", alpha=0.3)
    return fig


def section(table: pd.DataFrame, meta: dict, figure_html: str, name: str, said: list[str],
            derived: list[Derived] = ()) -> str:
    """The "Corrected by people" HTML section: the table, the forest plot, ``said`` (where the
    correction changes a conclusion)."""
    shown = table[[A.STRATUM, A.CORRECTION, A.ITEMS, A.LABELLED, A.DECIDED, A.UNSURE_ITEMS, A.TIES]].copy()
    for col in (A.CLASSIFIER, A.CORRECTED, A.UNSURE_SHARE):
        shown[col] = [I.Interval(v, lo, hi, "", 0, 0).text(3)
                      for v, lo, hi in zip(table[col], table[col + "_low"], table[col + "_high"])]
    shown[A.FLAG] = table[A.FLAG]
    parts = [f"<section class=people id='corrected-{H.esc(name)}'><h2>Corrected by people: {H.esc(name)}</h2>",
             f"<p>The share of {H.esc(meta['positive'])} per stratum: the classifier's over every item it answered, "
             f"beside the share corrected by people's labels among the items they could decide "
             f"({H.esc(', '.join(meta['methods']))}, PPI++ {H.esc(PPI_WORDS[meta.get('ppi', K.CROSSFIT)])}; "
             f"labels: {H.esc(meta['drawn'])}). Each corrected number stands on "
             f"the labelled items counted beside it.</p>"]
    if meta.get("simulated_answers"):
        parts.append(f"<p class=warn><b>Simulated annotators: {meta['simulated_answers']} of {meta['answers']} answers "
                     "are not people's</b>.</p>")
    parts.append(H.table(shown, 3))
    parts.append(figure_html)
    for d in derived:
        t = d.table
        if len(t):
            t = t.assign(**{A.CORRECTED: [I.Interval(v, lo, hi, "", 0, 0).text(d.digits) for v, lo, hi in
                                          zip(t[A.CORRECTED], t[A.CORRECTED + "_low"], t[A.CORRECTED + "_high"])]})
        method = next((m + ". " for m in t["method"] if isinstance(m, str)), "") if "method" in t else ""
        parts.append(f"<h3>{H.esc(d.title)}</h3><p>{H.esc(method + d.note)}</p>"
                     + (H.table(t[d.shown], d.digits) if len(t) else "<p>None.</p>"))
    parts.append("".join(f"<p><b>{H.esc(s)}.</b></p>" for s in said) if said
                 else "<p>The correction changes no conclusion here: no share crosses one half and no two strata "
                      "change order.</p>")
    parts.append("</section>")
    return "".join(parts)

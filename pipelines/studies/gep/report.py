"""Tables and report of the GEP study (paper 001): frequency tables shaped like Tables 11-12, GEP
vector tables like Tables 13-14, GEP scores like Tables 3 and 6, and Figure 2-style bar charts of
the GEP vectors (symmetric-log y axis), as plain CSV and a self-contained HTML page."""

from __future__ import annotations

import math

import pandas as pd
from matplotlib.ticker import NullLocator

from pipelines.engine.report import figures as _figures
from pipelines.engine.stats import headline as HL
from pipelines.engine.report import html as H
from pipelines.engine.report import page as Pg
from pipelines.engine.report.page import COLORS
from pipelines.studies.gep import headline as GH
from pipelines.studies.gep import metrics as M
from schemas import gep as S
from schemas.images import MODEL

ESTIMATOR_ORDER = (S.Estimator.HUMAN, S.Estimator.C, S.Estimator.CC, S.Estimator.CLS)
def _est_rank(e: str) -> int:
    return ESTIMATOR_ORDER.index(e) if e in ESTIMATOR_ORDER else len(ESTIMATOR_ORDER)


def frequency_table(freq: pd.DataFrame, setting: str, names: list[str]) -> pd.DataFrame:
    """Rows (estimator, model, gender), one column per attribute and their average (Tables 11, 12)."""
    f = freq[freq[S.SETTING] == setting]
    rows = []
    for (est, model, gender), grp in f.groupby([S.ESTIMATOR, MODEL, S.GENDER], sort=False):
        vals = dict(zip(grp[S.ATTRIBUTE], grp[S.FREQUENCY]))
        present = [vals[a] for a in names if a in vals]
        rows.append({S.ESTIMATOR: est, MODEL: model, S.GENDER: gender, **{a: vals.get(a) for a in names},
                     "avg": sum(present) / len(present) if present else None})
    df = pd.DataFrame(rows, columns=[S.ESTIMATOR, MODEL, S.GENDER, *names, "avg"])
    return df.sort_values(S.ESTIMATOR, key=lambda s: s.map(_est_rank), kind="stable").reset_index(drop=True)


def _with_ends(frame: pd.DataFrame, column: str) -> list[str]:
    """``column`` and, where ``frame`` has them, its interval columns."""
    return [column] + [c for c in (S.low(column), S.high(column)) if c in frame.columns]


def _spread(names: list[str], ends: bool) -> list[str]:
    """Each name followed by its interval columns when there are intervals."""
    return [c for n in names for c in ((n, S.low(n), S.high(n)) if ends else (n,))]


def vector_table(vectors: pd.DataFrame, scores: pd.DataFrame, setting: str, names: list[str]) -> pd.DataFrame:
    """Rows (estimator, model, comparison), one column per attribute (v_j) and the GEP score (Tables 13, 14);
    with intervals (``headline.attach``), each value followed by ``<column>_low`` and ``<column>_high``."""
    v = vectors[vectors[S.SETTING] == setting]
    sc = scores[scores[S.SETTING] == setting]
    ends = S.low(M.DIFFERENCE) in vectors.columns
    gep_cols = _with_ends(scores, M.GEP)
    gep = {(r[S.ESTIMATOR], r[MODEL], r[M.COMPARISON]): r for r in sc.to_dict("records")}
    rows = []
    for (est, model, comp), grp in v.groupby([S.ESTIMATOR, MODEL, M.COMPARISON], sort=False):
        row = {S.ESTIMATOR: est, MODEL: model, M.COMPARISON: comp}
        for r in grp.to_dict("records"):
            a = r[S.ATTRIBUTE]
            row[a] = r[M.DIFFERENCE]
            if ends:
                row[S.low(a)], row[S.high(a)] = r[S.low(M.DIFFERENCE)], r[S.high(M.DIFFERENCE)]
        cell = gep.get((est, model, comp), {})
        rows.append({**row, **{c: cell.get(c) for c in gep_cols}})
    df = pd.DataFrame(rows, columns=[S.ESTIMATOR, MODEL, M.COMPARISON, *_spread(names, ends), *gep_cols])
    return df.sort_values(S.ESTIMATOR, key=lambda s: s.map(_est_rank), kind="stable").reset_index(drop=True)


def score_table(scores: pd.DataFrame) -> pd.DataFrame:
    """GEP scores: rows (model, comparison, estimator), one column per setting (Tables 3 and 6); with
    intervals, each setting followed by ``<setting>_low`` and ``<setting>_high``."""
    if scores.empty:
        return pd.DataFrame(columns=[MODEL, M.COMPARISON, S.ESTIMATOR])
    index = [MODEL, M.COMPARISON, S.ESTIMATOR]
    wide = scores.pivot_table(index=index, columns=S.SETTING, values=M.GEP, sort=False).reset_index()
    order = [c for c in S.Setting.ALL if c in wide.columns]
    ends = S.low(M.GEP) in scores.columns
    for end in ((S.low, S.high) if ends else ()):
        part = scores.pivot_table(index=index, columns=S.SETTING, values=end(M.GEP), sort=False)
        part.columns = [end(c) for c in part.columns]
        wide = wide.merge(part.reset_index(), on=index, how="left")
    wide = wide.reindex(columns=[*index, *_spread(order, ends)])
    wide.columns.name = None
    return wide.sort_values(S.ESTIMATOR, key=lambda s: s.map(_est_rank), kind="stable").reset_index(drop=True)


def interval_text(value, low, high, digits: int = 4) -> str:
    """"0.1234 [0.1000, 0.1500]"; the value alone without an interval, "-" without a value."""
    if value is None or pd.isna(value):
        return "-"
    if low is None or high is None or pd.isna(low) or pd.isna(high):
        return f"{value:.{digits}f}"
    return f"{value:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def text_intervals(df: pd.DataFrame, digits: int = 3) -> pd.DataFrame:
    """A table of ``vector_table`` / ``score_table`` with each value and its interval columns as one
    text column ("0.123 [0.050, 0.200]"): what a page shows."""
    out = df.copy()
    for col in [c for c in df.columns if S.low(c) in df.columns and S.high(c) in df.columns]:
        out[col] = [interval_text(v, lo, hi, digits) for v, lo, hi in zip(df[col], df[S.low(col)], df[S.high(col)])]
        out = out.drop(columns=[S.low(col), S.high(col)])
    return out


def with_human(results: dict, evaluation: dict | None) -> dict[str, pd.DataFrame]:
    """The automatic frequencies, vectors and scores (pandas), with the human ones first when there
    are annotations: what the tables, the report and the printed summary show."""
    freq = results["frequencies"]
    freq = freq.to_pandas() if hasattr(freq, "to_pandas") else freq
    vectors, scores = results["vectors"], results["gep"]
    if evaluation is not None:
        freq = pd.concat([evaluation["human_frequencies"][freq.columns], freq], ignore_index=True)
        vectors = pd.concat([evaluation["human_vectors"].assign(**{S.ESTIMATOR: S.Estimator.HUMAN}), vectors],
                            ignore_index=True)
        scores = pd.concat([evaluation["human_gep"].assign(**{S.ESTIMATOR: S.Estimator.HUMAN}), scores],
                           ignore_index=True)
    return {"frequencies": freq, "vectors": vectors, "gep": scores}


def paper_tables(shown: dict, names: list[str]) -> dict[str, pd.DataFrame]:
    """File stem -> table: frequencies and GEP vectors per setting, and the GEP scores, from
    ``with_human``'s frames."""
    freq, vectors, scores = shown["frequencies"], shown["vectors"], shown["gep"]
    out = {}
    for setting in [s for s in S.Setting.ALL if s in set(freq[S.SETTING])]:
        out[f"table_frequencies_{setting}"] = frequency_table(freq, setting, names)
        out[f"table_gep_vectors_{setting}"] = vector_table(vectors, scores, setting, names)
    out["table_gep_scores"] = score_table(scores)
    return out


def format_scores(shown: dict, evaluation: dict | None = None, standin: bool = False,
                  level: float | None = None) -> str:
    """The printed summary: GEP scores from ``with_human``'s frames (with their intervals where the
    frames have them, at ``level``), and the agreement with humans; models by their short labels
    (``page.model_labels``), never cut; a stand-in run's notice last."""
    table = score_table(shown["gep"])
    labels = Pg.model_labels(table[MODEL], *([evaluation["vector_agreement"][MODEL], evaluation["roc_mean"][MODEL]]
                                              if evaluation is not None else []))
    settings = [c for c in S.Setting.ALL if c in table.columns]
    mw = max([len("model")] + [len(v) for v in labels.values()]) + 1
    cw = max([len("comparison")] + [len(str(c)) for c in table[M.COMPARISON]]) + 1
    ends = bool(settings) and S.low(settings[0]) in table.columns
    sw = 26 if ends else 10
    lines = ["GEP scores (mean |v_j|, Eq. 2; automatic estimators are on their own scale, compare ranks)"
             + (f"; [{int(round(level * 100))}% interval over attributes]:" if ends and level else ":"),
             f"{'model':<{mw}} {'comparison':<{cw}} {'estimator':<9} " + " ".join(f"{s:>{sw}}" for s in settings)]
    for r in table.to_dict("records"):
        vals = " ".join(f"{interval_text(r[s], r.get(S.low(s)), r.get(S.high(s))):>{sw}}" for s in settings)
        lines.append(f"{Pg.label(labels, r[MODEL]):<{mw}} {str(r[M.COMPARISON]):<{cw}} {r[S.ESTIMATOR]:<9} {vals}")
    if evaluation is not None:
        lines.append("\nagreement with GEP_human per vector (Table 4: Kendall tau-b / MCC of signs):")
        for r in evaluation["vector_agreement"].to_dict("records"):
            lines.append(f"  {Pg.label(labels, r[MODEL]):<{mw}} {r[S.SETTING]:<9} {r[S.ESTIMATOR]:<4} n={r[M.N]:<3} "
                         f"tau={_fmt(r[M.KENDALL])} mcc={_fmt(r[M.MCC])}")
        for r in evaluation["roc_mean"].to_dict("records"):
            lines.append(f"  mean ROC-AUC (Table 7) {Pg.label(labels, r[MODEL]):<{mw}} {r[S.ESTIMATOR]:<4} "
                         f"{r['mean_roc_auc']:.3f}")
    if standin:
        lines.append(Pg.STANDIN_CONSOLE)
    return "\n".join(lines)


def _fmt(v) -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"


# ------------------------------------------------------------------------------------ charts
def symlog_threshold(peak: float) -> float:
    """The linear range of Figure 2's symmetric-log axis: a tenth of the largest |v_j|, rounded
    down to a power of ten (0.01 when there is none)."""
    return 10 ** math.floor(math.log10(peak / 10)) if peak > 0 else 0.01


def bars_figure(series: dict[str, dict[str, float]], names: list[str], title: str, lin: float | None = None):
    """Grouped bars: one group per attribute, one bar per series (model or estimator); y is the
    presentation difference v_j in symmetric-log scale (positive: more frequent for the first
    group). Returns (figure, bars drawn)."""
    values = [abs(v) for s in series.values() for v in s.values() if v is not None and not math.isnan(v)]
    peak = max(values, default=0.0)
    if lin is None:
        lin = symlog_threshold(peak)
    k = max(1, len(series))
    fig = _figures.new_figure(max(4.2, 0.46 * len(names) + 0.9), 3.4 + 0.2 * math.ceil(k / 3))
    ax = fig.add_subplot()
    bar_w = 0.8 / k
    drawn = 0
    for i, (label, vals) in enumerate(series.items()):
        xs, ys = [], []
        for j, name in enumerate(names):
            v = vals.get(name)
            if v is None or math.isnan(v):
                continue
            xs.append(j - 0.4 + bar_w * (i + 0.5))
            ys.append(float(v))
        ax.bar(xs, ys, width=bar_w * 0.9, color=COLORS[i % len(COLORS)], label=label, zorder=2)
        drawn += len(xs)
    ax.set_yscale("symlog", linthresh=lin)
    edge = max(peak, lin) * 1.15
    ax.set_ylim(-edge, edge)
    # 0, the linear range, the decades beyond it and the largest |v_j|
    decades = [lin * 10 ** i for i in range(1, 12) if lin * 10 ** i < peak * 0.5]
    ticks = sorted({0.0, lin, -lin} | {v * s for v in (peak, *decades) if v > lin for s in (1, -1)})
    ax.set_yticks(ticks, [f"{t:+.3g}" for t in ticks], fontsize=8)
    ax.yaxis.set_minor_locator(NullLocator())
    ax.grid(axis="y", color="#dddddd", linewidth=0.8, zorder=0)
    ax.axhline(0, color="#333333", linewidth=0.9, zorder=3)
    ax.set_xlim(-0.6, len(names) - 0.4)
    ax.set_xticks(range(len(names)), names, rotation=40, ha="right", rotation_mode="anchor", fontsize=8)
    ax.set_ylabel("$v_j$ (symmetric log)", fontsize=8)
    ax.set_title(title, fontsize=10)
    if series:
        fig.legend(loc="outside lower center", ncols=min(k, 3), fontsize=7, frameon=False)
    return fig, drawn


def _bars_html(sink, name: str, series: dict, names: list[str], title: str) -> str:
    fig, drawn = bars_figure(series, names, title)
    return sink.save(fig, name, alt=f"{title}: GEP vector bar chart, {drawn} bars")


# the GEP tables: missing values as "-", models by their labels
def _table(df: pd.DataFrame, digits: int = 3, labels: dict | None = None) -> str:
    return H.table(Pg.relabel(df, labels or {}), digits, na="-")


def _scored(freq: pd.DataFrame) -> pd.DataFrame:
    """Images scored per (model, setting): the neutral setting scores every attribute on every image
    (the most of any attribute per group), the explicit setting only the prompt's attribute (the sum)."""
    if freq.empty or S.IMAGES not in freq.columns:
        return pd.DataFrame(columns=[MODEL, S.SETTING, S.IMAGES])
    est = [e for e in ESTIMATOR_ORDER if e in set(freq[S.ESTIMATOR]) and e != S.Estimator.HUMAN]
    f = freq[freq[S.ESTIMATOR] == est[0]] if est else freq.iloc[:0]
    rows = []
    for (model, setting), g in f.groupby([MODEL, S.SETTING], sort=False):
        per_group = g.groupby(S.GENDER)[S.IMAGES]
        n = per_group.max().sum() if setting == S.Setting.NEUTRAL else per_group.sum().sum()
        rows.append({MODEL: model, S.SETTING: setting, S.IMAGES: int(n)})
    return pd.DataFrame(rows, columns=[MODEL, S.SETTING, S.IMAGES])


def render_html(meta: dict, shown: dict, tables: dict[str, pd.DataFrame], evaluation: dict | None,
                records: list[dict], *, figures: _figures.FigureDir | None = None, headline: dict | None = None) -> str:
    """report.html of a GEP run: the GEP scores first (with their intervals: ``headline``, metrics.json's
    section) with the images behind them, then the Figure 2 charts (PDF + PNG under ``figures/`` of
    the run when ``figures`` is a ``FigureDir``; embedded in the page either way), the paper's
    tables, the human comparison, and the models."""
    sink = _figures.sink(figures)
    names = meta["attributes"]
    vectors, freq = shown["vectors"], shown["frequencies"]
    labels = Pg.model_labels(meta.get("models", []), shown["gep"][MODEL], freq[MODEL])
    parts = Pg.run_page_top("Gender presentation differences (GEP, paper 001)", meta, records,
                            "CLIP and the generators are tiny random-weight stand-ins; the run only "
                            "exercises the pipeline.")
    lead = ("<p class=lead>GEP score per model and estimator (mean |v<sub>j</sub>| over "
            f"{len(names)} attributes, Eq. 2; Tables 3 and 6); larger: the attributes differ more between the "
            "groups. The automatic estimators are on their own scales: compare ranks across models and "
            "settings.</p>")
    if headline is not None:
        lead += ("<p>Shown &times;100 (GEP<sub>human</sub> in percentage points); each interval resamples the "
                 "attributes. The GEP vectors' intervals (over images, within prompts) are in the tables "
                 "below.</p>" + HL.summary_table(GH.scores_only(headline)))
    else:
        lead += _table(tables["table_gep_scores"], 4, labels)
    scored = _scored(freq)
    n_models = len(meta.get("models", [])) or len(labels)
    behind = [f"{meta['images']:,} generated images from {Pg.plural(n_models, 'generator')} "
              f"({H.esc(', '.join(Pg.label(labels, m) for m in meta.get('models', [])))}), settings "
              f"{H.esc(', '.join(meta['settings']))}"]
    if len(scored):
        total = int(scored[S.IMAGES].sum())
        per_model: dict[str, list[str]] = {}
        for r in scored.to_dict("records"):
            per_model.setdefault(Pg.label(labels, r[MODEL]), []).append(f"{r[S.IMAGES]:,} {H.esc(r[S.SETTING])}")
        behind.append("images scored: " + "; ".join((f"{H.esc(m)} " if len(per_model) > 1 else "") + ", ".join(v)
                                                    for m, v in per_model.items()))
        left = meta["images"] - total
        behind.append(f"{left:,} image(s) left out (not generated or blocked: see run_summary.csv)" if left > 0
                      else "no image left out")
    parts.append(Pg.headline(lead, (HL.behind_items(headline) if headline is not None else []) + behind))
    parts.append(f"<p>Reference string r(a) = &ldquo;{H.esc(meta['reference'])}&rdquo; (CC-f); CLS-f ensembles of "
                 f"{meta['ensemble']}. Run <code>{H.esc(meta['run_id'])}</code>; results in "
                 f"<code>{H.esc(meta['output'])}</code>.</p>")
    parts.append("<h2>GEP vectors (Figure 2)</h2><p>v<sub>j</sub> = f<sub>first</sub> &minus; f<sub>second</sub> "
                 "per attribute, symmetric-log y axis; positive: more frequent with the first group of the comparison. "
                 "Each chart is also saved as PDF and PNG under figures/.</p><div class='figs two'>")
    for setting in [s for s in S.Setting.ALL if s in set(vectors[S.SETTING])]:
        v = vectors[vectors[S.SETTING] == setting]
        for (est, comp), grp in v.groupby([S.ESTIMATOR, M.COMPARISON], sort=False):
            series = {Pg.label(labels, m): dict(zip(g[S.ATTRIBUTE], g[M.DIFFERENCE]))
                      for m, g in grp.groupby(MODEL, sort=False)}
            parts.append(_bars_html(sink, f"gep_vectors_{setting}_{est}_{comp}", series, names,
                                    f"{setting}: {est} ({comp})"))
    parts.append("</div>")
    if evaluation is not None:
        c = evaluation["counts"]
        parts.append(f"<h2>Against human annotations (section 6)</h2><p>{c['used']:,} of {c['annotations']:,} "
                     f"annotations used ({c['ignored_not_scored_in_setting']:,} name an attribute the setting does not "
                     f"score).</p><h3>Per GEP vector: Kendall tau-b and MCC of signs (Table 4)</h3>")
        parts.append(_table(evaluation["vector_agreement"], 3, labels))
        if evaluation["score_agreement"]:
            parts.append("<h3>Model level: Kendall tau-b of GEP scores (Table 6)</h3><ul>")
            for e in evaluation["score_agreement"]["estimators"]:
                parts.append(f"<li>{H.esc(e['estimator'])}: tau-b = {_fmt(e['kendall_tau_b'])} over {e['n']} cells</li>")
            parts.append("</ul>")
        parts.append("<h3>ROC-AUC per attribute (Tables 7 and 16)</h3>")
        roc = evaluation["roc"]
        if not roc.empty:
            wide = roc.pivot_table(index=[MODEL, S.ESTIMATOR], columns=S.ATTRIBUTE, values="roc_auc", sort=False)
            wide = wide.reindex(columns=[a for a in names if a in wide.columns]).reset_index()
            wide.columns.name = None
            parts.append(_table(wide, 3, labels))
        parts.append(_table(evaluation["roc_mean"], 3, labels))
    for setting in S.Setting.ALL:
        if f"table_frequencies_{setting}" in tables:
            parts.append(f"<h2>Attribute frequencies, {setting} setting (Table {11 if setting == 'neutral' else 12})</h2>")
            parts.append(_table(tables[f"table_frequencies_{setting}"], 3, labels))
            parts.append(f"<h3>GEP vectors, {setting} setting (Table {13 if setting == 'neutral' else 14})</h3>")
            parts.append(_table(text_intervals(tables[f"table_gep_vectors_{setting}"]), 3, labels))
    parts.append("<h2>Models</h2>" + H.model_table(records, labels))
    return Pg.document(f"GEP report {meta['run_id']}", parts)


def summary_table(result: dict) -> pd.DataFrame:
    """gep_summary.csv of `summarize`: ``summarize_frequencies``' results in long form, one row per
    (model, setting[, estimator], comparison) and attribute: the cell's GEP score (Eq. 2; the same on
    each of its rows) and the attribute's v_j = f_first - f_second (Eq. 1), attributes in the vector's
    order."""
    est = any("estimator" in r for r in result["results"])
    gep_cols = [c for c in (M.GEP, S.low(M.GEP), S.high(M.GEP)) if c == M.GEP or c in result["results"][0]] \
        if result["results"] else [M.GEP]
    cols = [MODEL, S.SETTING, *([S.ESTIMATOR] if est else []), M.COMPARISON, "attributes", *gep_cols,
            S.ATTRIBUTE, M.DIFFERENCE]
    rows = []
    for r in result["results"]:
        cell = {MODEL: r["model"], S.SETTING: r["setting"], **({S.ESTIMATOR: r.get("estimator")} if est else {}),
                M.COMPARISON: r["comparison"], "attributes": r["attributes"], **{c: r[c] for c in gep_cols}}
        rows += [{**cell, S.ATTRIBUTE: a, M.DIFFERENCE: v} for a, v in r["vector"].items()]
    return pd.DataFrame(rows, columns=cols)


def summary_html(source: str, result: dict, *, figures: _figures.FigureDir | None = None) -> str:
    """The `summarize` page: the GEP scores, then one Figure 2-style chart per setting, bars per
    model (and estimator); PDF + PNG under ``figures/`` beside the page when ``figures`` is a
    ``FigureDir``, embedded in the page either way."""
    sink = _figures.sink(figures)
    labels = Pg.model_labels(r["model"] for r in result["results"])

    def name(r):
        return Pg.label(labels, r["model"]) + (f" ({r['estimator']})" if "estimator" in r else "")

    parts = [f"<h1>GEP from {H.esc(source)}</h1><div class=tw><table><tr><th>model</th><th>setting</th>"
             "<th>comparison</th><th>GEP</th></tr>"]
    for r in result["results"]:
        gep = interval_text(r["gep"], r.get(S.low(M.GEP)), r.get(S.high(M.GEP)))
        parts.append(f"<tr><td>{H.esc(name(r))}</td><td>{H.esc(r['setting'])}</td>"
                     f"<td>{H.esc(r['comparison'])}</td><td class=n>{H.esc(gep)}</td></tr>")
    parts.append("</table></div>")
    if "interval" in result:
        lvl = result["interval"]
        parts.append(f"<p>GEP [{int(round(lvl['level'] * 100))}% interval]: bootstrap over the published "
                     f"per-attribute differences ({H.esc(lvl['method'])}, {lvl['resamples']:,} resamples, seed "
                     f"{lvl['seed']}); the vector entries have none (the tables give frequencies, not images).</p>")
    parts.append("<div class=figs>")
    settings = list(dict.fromkeys(r["setting"] for r in result["results"]))
    for setting in settings:
        rows = [r for r in result["results"] if r["setting"] == setting]
        names = list(dict.fromkeys(a for r in rows for a in r["vector"]))
        series = {name(r): r["vector"] for r in rows}
        parts.append(_bars_html(sink, f"gep_vectors_{setting}", series, names,
                                f"{setting}: GEP vectors ({rows[0]['comparison']})"))
    parts.append("</div>")
    return Pg.document("GEP summary", parts)

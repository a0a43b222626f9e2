"""Tables and report of the GEP study (paper 001): frequency tables shaped like Tables 11-12, GEP
vector tables like Tables 13-14, GEP scores like Tables 3 and 6, and Figure 2-style bar charts of
the GEP vectors (symmetric-log y axis), as plain CSV and a self-contained HTML page."""

from __future__ import annotations

import html
import math

import pandas as pd

from pipelines.studies.gep import metrics as M
from schemas import gep as S
from schemas.images import MODEL

ESTIMATOR_ORDER = (S.Estimator.HUMAN, S.Estimator.C, S.Estimator.CC, S.Estimator.CLS)
COLORS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C")


def _short(model) -> str:
    return str(model).rstrip("/").split("/")[-1] if model is not None else "-"


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


def vector_table(vectors: pd.DataFrame, scores: pd.DataFrame, setting: str, names: list[str]) -> pd.DataFrame:
    """Rows (estimator, model, comparison), one column per attribute (v_j) and the GEP score (Tables 13, 14)."""
    v = vectors[vectors[S.SETTING] == setting]
    sc = scores[scores[S.SETTING] == setting]
    gep = {(r[S.ESTIMATOR], r[MODEL], r[M.COMPARISON]): r[M.GEP] for r in sc.to_dict("records")}
    rows = []
    for (est, model, comp), grp in v.groupby([S.ESTIMATOR, MODEL, M.COMPARISON], sort=False):
        vals = dict(zip(grp[S.ATTRIBUTE], grp[M.DIFFERENCE]))
        rows.append({S.ESTIMATOR: est, MODEL: model, M.COMPARISON: comp, **{a: vals.get(a) for a in names},
                     M.GEP: gep.get((est, model, comp))})
    df = pd.DataFrame(rows, columns=[S.ESTIMATOR, MODEL, M.COMPARISON, *names, M.GEP])
    return df.sort_values(S.ESTIMATOR, key=lambda s: s.map(_est_rank), kind="stable").reset_index(drop=True)


def score_table(scores: pd.DataFrame) -> pd.DataFrame:
    """GEP scores: rows (model, comparison, estimator), one column per setting (Tables 3 and 6)."""
    if scores.empty:
        return pd.DataFrame(columns=[MODEL, M.COMPARISON, S.ESTIMATOR])
    wide = scores.pivot_table(index=[MODEL, M.COMPARISON, S.ESTIMATOR], columns=S.SETTING, values=M.GEP,
                              sort=False).reset_index()
    wide.columns.name = None
    order = [c for c in S.Setting.ALL if c in wide.columns]
    wide = wide[[MODEL, M.COMPARISON, S.ESTIMATOR, *order]]
    return wide.sort_values(S.ESTIMATOR, key=lambda s: s.map(_est_rank), kind="stable").reset_index(drop=True)


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


def format_scores(shown: dict, evaluation: dict | None = None) -> str:
    """The printed summary: GEP scores from ``with_human``'s frames, and the agreement with humans."""
    table = score_table(shown["gep"])
    settings = [c for c in S.Setting.ALL if c in table.columns]
    lines = ["GEP scores (mean |v_j|, Eq. 2; automatic estimators are on their own scale, compare ranks):",
             f"{'model':<28} {'comparison':<24} {'estimator':<9} " + " ".join(f"{s:>10}" for s in settings)]
    for r in table.to_dict("records"):
        vals = " ".join(f"{r[s]:>10.4f}" if r[s] is not None and not pd.isna(r[s]) else f"{'-':>10}" for s in settings)
        lines.append(f"{_short(r[MODEL])[:28]:<28} {str(r[M.COMPARISON])[:24]:<24} {r[S.ESTIMATOR]:<9} {vals}")
    if evaluation is not None:
        lines.append("\nagreement with GEP_human per vector (Table 4: Kendall tau-b / MCC of signs):")
        for r in evaluation["vector_agreement"].to_dict("records"):
            lines.append(f"  {_short(r[MODEL])[:28]:<28} {r[S.SETTING]:<9} {r[S.ESTIMATOR]:<4} n={r[M.N]:<3} "
                         f"tau={_fmt(r[M.KENDALL])} mcc={_fmt(r[M.MCC])}")
        for r in evaluation["roc_mean"].to_dict("records"):
            lines.append(f"  mean ROC-AUC (Table 7) {_short(r[MODEL])[:28]:<28} {r[S.ESTIMATOR]:<4} {r['mean_roc_auc']:.3f}")
    return "\n".join(lines)


def _fmt(v) -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"


# ------------------------------------------------------------------------------------ charts
def _symlog(y: float, lin: float) -> float:
    """Symmetric log scaling (Figure 2): linear within +-lin, logarithmic outside."""
    a = abs(y)
    t = a / lin if a <= lin else 1.0 + math.log10(a / lin)
    return math.copysign(t, y)


def svg_bars(series: dict[str, dict[str, float]], names: list[str], title: str, lin: float | None = None) -> str:
    """Grouped bars: one group per attribute, one bar per series (model or estimator); y is the
    presentation difference v_j in symmetric-log scale (positive: more frequent for the first group)."""
    values = [abs(v) for s in series.values() for v in s.values() if v is not None and not math.isnan(v)]
    peak = max(values, default=0.0)
    if lin is None:
        lin = 10 ** math.floor(math.log10(peak / 10)) if peak > 0 else 0.01
    top = max(_symlog(peak, lin), 1.0)
    w, h, left, pad_top, pad_bottom = max(420, 46 * len(names) + 90), 300, 56, 34, 70
    plot_h = h - pad_top - pad_bottom
    zero = pad_top + plot_h / 2
    scale = (plot_h / 2) / top
    group_w = (w - left - 10) / max(1, len(names))
    k = max(1, len(series))
    bar_w = max(2.0, group_w * 0.8 / k)
    out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' class='gep-bars'>",
           f"<text x='{w / 2}' y='16' text-anchor='middle' font-size='13'>{html.escape(title)}</text>",
           f"<line x1='{left}' y1='{zero}' x2='{w - 10}' y2='{zero}' stroke='#333'/>"]
    for tick in sorted({0.0, lin, -lin} | {v * s for v in (peak,) if v > lin for s in (1, -1)}):
        y = zero - _symlog(tick, lin) * scale
        out.append(f"<text x='{left - 4}' y='{y + 4:.1f}' text-anchor='end' font-size='10'>{tick:+.3g}</text>")
        out.append(f"<line x1='{left}' y1='{y:.1f}' x2='{w - 10}' y2='{y:.1f}' stroke='#ddd'/>")
    for j, name in enumerate(names):
        x0 = left + j * group_w + group_w * 0.1
        for i, (label, vals) in enumerate(series.items()):
            v = vals.get(name)
            if v is None or math.isnan(v):
                continue
            y = zero - _symlog(v, lin) * scale
            out.append(f"<rect x='{x0 + i * bar_w:.1f}' y='{min(y, zero):.1f}' width='{bar_w * 0.9:.1f}' "
                       f"height='{abs(zero - y):.1f}' fill='{COLORS[i % len(COLORS)]}'>"
                       f"<title>{html.escape(label)} {html.escape(name)}: {v:+.4f}</title></rect>")
        cx = left + j * group_w + group_w / 2
        out.append(f"<text x='{cx:.1f}' y='{h - pad_bottom + 14}' font-size='10' text-anchor='end' "
                   f"transform='rotate(-40 {cx:.1f} {h - pad_bottom + 14})'>{html.escape(name)}</text>")
    for i, label in enumerate(series):
        out.append(f"<rect x='{left + i * 150}' y='{h - 14}' width='10' height='10' fill='{COLORS[i % len(COLORS)]}'/>"
                   f"<text x='{left + i * 150 + 14}' y='{h - 5}' font-size='10'>{html.escape(label[:24])}</text>")
    out.append("</svg>")
    return "".join(out)


def _table_html(df: pd.DataFrame, digits: int = 3) -> str:
    def cell(v):
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "-"
        if isinstance(v, float):
            return f"{v:.{digits}f}"
        return html.escape(_short(v) if isinstance(v, str) and "/" in v else str(v))

    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>" for row in df.itertuples(index=False))
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


STYLE = ("<style>body{font-family:sans-serif;margin:2em;max-width:1300px}table{border-collapse:collapse;margin:.6em 0;"
         "font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}th{background:#f3f3f3}"
         ".warn{background:#fff3cd;border:1px solid #e0c060;padding:.6em}</style>")


def render_html(meta: dict, shown: dict, tables: dict[str, pd.DataFrame], evaluation: dict | None,
                records: list[dict]) -> str:
    names = meta["attributes"]
    vectors = shown["vectors"]
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>GEP report</title>", STYLE, "</head><body>",
             f"<h1>Gender presentation differences (GEP, paper 001): run {html.escape(meta['run_id'])}</h1>",
             f"<p>{meta['images']:,} images from {len(meta['models'])} generator(s), settings "
             f"{html.escape(', '.join(meta['settings']))}; reference string r(a) = &ldquo;"
             f"{html.escape(meta['reference'])}&rdquo;; CLS-f ensembles of {meta['ensemble']}. Results: "
             f"{html.escape(meta['output'])}</p>"]
    if meta.get("standin"):
        parts.append("<p class='warn'><b>Stand-in models.</b> CLIP and the generators are tiny random-weight "
                     "stand-ins: every number on this page is meaningless; the run only exercises the pipeline.</p>")
    parts.append("<h2>GEP scores (Eq. 2; Tables 3 and 6)</h2><p>Mean |v<sub>j</sub>| over the attributes. The "
                 "automatic estimators are on their own scales: compare ranks across models and settings.</p>")
    parts.append(_table_html(tables["table_gep_scores"], 4))
    parts.append("<h2>GEP vectors (Figure 2)</h2><p>v<sub>j</sub> = f<sub>first</sub> &minus; f<sub>second</sub> "
                 "per attribute, symmetric-log y axis; positive: more frequent with the first group of the comparison.</p>")
    for setting in [s for s in S.Setting.ALL if s in set(vectors[S.SETTING])]:
        v = vectors[vectors[S.SETTING] == setting]
        for (est, comp), grp in v.groupby([S.ESTIMATOR, M.COMPARISON], sort=False):
            series = {_short(m): dict(zip(g[S.ATTRIBUTE], g[M.DIFFERENCE])) for m, g in grp.groupby(MODEL, sort=False)}
            parts.append(svg_bars(series, names, f"{setting}: {est} ({comp})"))
    for setting in S.Setting.ALL:
        if f"table_frequencies_{setting}" in tables:
            parts.append(f"<h2>Attribute frequencies, {setting} setting (Table {11 if setting == 'neutral' else 12})</h2>")
            parts.append(_table_html(tables[f"table_frequencies_{setting}"]))
            parts.append(f"<h3>GEP vectors, {setting} setting (Table {13 if setting == 'neutral' else 14})</h3>")
            parts.append(_table_html(tables[f"table_gep_vectors_{setting}"]))
    if evaluation is not None:
        c = evaluation["counts"]
        parts.append(f"<h2>Against human annotations (section 6)</h2><p>{c['used']:,} of {c['annotations']:,} "
                     f"annotations used ({c['ignored_not_scored_in_setting']:,} name an attribute the setting does not "
                     f"score).</p><h3>Per GEP vector: Kendall tau-b and MCC of signs (Table 4)</h3>")
        parts.append(_table_html(evaluation["vector_agreement"]))
        if evaluation["score_agreement"]:
            parts.append("<h3>Model level: Kendall tau-b of GEP scores (Table 6)</h3><ul>")
            for e in evaluation["score_agreement"]["estimators"]:
                parts.append(f"<li>{html.escape(e['estimator'])}: tau-b = {_fmt(e['kendall_tau_b'])} over {e['n']} cells</li>")
            parts.append("</ul>")
        parts.append("<h3>ROC-AUC per attribute (Tables 7 and 16)</h3>")
        roc = evaluation["roc"]
        if not roc.empty:
            wide = roc.pivot_table(index=[MODEL, S.ESTIMATOR], columns=S.ATTRIBUTE, values="roc_auc", sort=False)
            wide = wide.reindex(columns=[a for a in names if a in wide.columns]).reset_index()
            wide.columns.name = None
            parts.append(_table_html(wide))
        parts.append(_table_html(evaluation["roc_mean"]))
    parts.append("<h2>Models</h2><ul>")
    for r in records:
        tag = "stand-in, random weights" if r.get("standin") else "real"
        parts.append(f"<li>{html.escape(r['role'])}: <code>{html.escape(str(r['model']))}</code> ({tag})</li>")
    parts.append("</ul></body></html>")
    return "".join(parts)


def summary_html(source: str, result: dict) -> str:
    """The `summarize` page: one Figure 2-style chart per setting, bars per model (and estimator)."""
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>GEP summary</title>", STYLE, "</head><body>",
             f"<h1>GEP from {html.escape(source)}</h1><table><tr><th>model</th><th>setting</th><th>comparison</th>"
             "<th>GEP</th></tr>"]
    for r in result["results"]:
        label = r["model"] + (f" ({r['estimator']})" if "estimator" in r else "")
        parts.append(f"<tr><td>{html.escape(label)}</td><td>{html.escape(r['setting'])}</td>"
                     f"<td>{html.escape(r['comparison'])}</td><td>{r['gep']:.4f}</td></tr>")
    parts.append("</table>")
    settings = list(dict.fromkeys(r["setting"] for r in result["results"]))
    for setting in settings:
        rows = [r for r in result["results"] if r["setting"] == setting]
        names = list(dict.fromkeys(a for r in rows for a in r["vector"]))
        series = {r["model"] + (f" ({r['estimator']})" if "estimator" in r else ""): r["vector"] for r in rows}
        parts.append(svg_bars(series, names, f"{setting}: GEP vectors ({rows[0]['comparison']})"))
    return "".join(parts) + "</body></html>"

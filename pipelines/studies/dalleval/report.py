"""report.html and the printed results of `dalleval.py run` (paper 000, section 5.3, App. C.3)."""

from __future__ import annotations

import html
import math

import pandas as pd

from pipelines.studies.dalleval import metrics as M
from pipelines.studies.gep.report import COLORS, STYLE, _short, _table_html
from schemas import dalleval as S
from schemas.images import MODEL


def _num(v) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def format_results(results: dict) -> str:
    lines = ["Bias per model (Table 8: MAD against uniform; averages: male -1 / female +1, MST 1-10)",
             f"{'model':<40}{'prompts':>8}{'avg gender':>12}{'MAD gender':>12}{'avg tone':>10}{'MAD tone':>10}"]
    for m in results["summary"]:
        g, t = m["gender"], m.get("skin_tone") or {}
        f = lambda x, w, d: f"{x:>{w}.{d}f}" if _num(x) else f"{'-':>{w}}"  # noqa: E731
        lines.append(f"{_short(m['model'])[:39]:<40}{g['prompts']:>8}{f(g['average'], 12, 3)}{f(g['mad'], 12, 4)}"
                     f"{f(t.get('average'), 10, 2)}{f(t.get('mad'), 10, 4)}")
    for r in M.reference_rows():
        lines.append(f"{r['model']:<40}{'':>8}{'':>12}{r['gender']:>12.4f}{'':>10}{r['skin_tone']:>10.4f}")
    att = results["tables"].get("table_attributes_by_group")
    if att is not None and not att.empty:
        diff = att[att["row"].str.contains(" - ", regex=False)]
        if not diff.empty:
            names = [c for c in att.columns if c not in ("model", "row", "mean_abs_diff") and not c.endswith("(diff)")]
            lines.append("")
            lines.append("Attribute presence, " + diff.iloc[0]["row"] + " (Table 9): " + ", ".join(names))
            for _, r in diff.iterrows():
                vals = " ".join(f"{r[n]:+.2f}" if _num(r[n]) else "  -  " for n in names)
                lines.append(f"  {_short(r['model'])[:30]:<32}{vals}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ charts
def gender_bars(table: pd.DataFrame, title: str) -> str:
    """Horizontal bars per profession: average gender in [-1, 1] (male left, female right), one bar
    per model (Tables 6, 16-17 as a picture)."""
    models = [c for c in table.columns if c != "profession"]
    rows = list(table["profession"])
    bar_h = 7
    group_h = bar_h * len(models) + 5
    left, width, top = 170, 420, 40
    h = top + group_h * len(rows) + 40
    zero = left + width / 2
    out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{left + width + 30}' height='{h}' class='gender-bars'>",
           f"<text x='{left + width / 2}' y='14' text-anchor='middle' font-size='13'>{html.escape(title)}</text>",
           f"<text x='{left}' y='32' font-size='10'>-1 male</text>",
           f"<text x='{left + width}' y='32' font-size='10' text-anchor='end'>female +1</text>",
           f"<line x1='{zero}' y1='{top - 4}' x2='{zero}' y2='{h - 36}' stroke='#333'/>"]
    for i, prof in enumerate(rows):
        y0 = top + i * group_h
        out.append(f"<text x='{left - 6}' y='{y0 + group_h / 2 + 3:.1f}' font-size='10' text-anchor='end'>"
                   f"{html.escape(str(prof))}</text>")
        for k, m in enumerate(models):
            v = table.iloc[i][m]
            if not _num(v):
                continue
            x = zero + float(v) * width / 2
            out.append(f"<rect x='{min(x, zero):.1f}' y='{y0 + k * bar_h:.1f}' width='{abs(x - zero):.1f}' "
                       f"height='{bar_h - 1}' fill='{COLORS[k % len(COLORS)]}'><title>{html.escape(_short(m))} "
                       f"{html.escape(str(prof))}: {float(v):+.2f}</title></rect>")
    for k, m in enumerate(models):
        out.append(f"<rect x='{left + k * 160}' y='{h - 20}' width='10' height='10' fill='{COLORS[k % len(COLORS)]}'/>"
                   f"<text x='{left + k * 160 + 14}' y='{h - 11}' font-size='10'>{html.escape(_short(m)[:24])}</text>")
    out.append("</svg>")
    return "".join(out)


def tone_distribution(counts: pd.DataFrame, model: str) -> str:
    """Stacked bars per profession: the share of each Monk Skin Tone among the images with a tone
    (Figure 9), drawn in the MST reference colours."""
    from operators.image_skin_tone import MST_HEX

    d = counts[counts[MODEL] == model].copy()
    d["_p"] = [M._profession_label(p) for p in d[S.PROFESSION]]
    pooled = d.groupby("_p", sort=False)[list(S.TONE_COLUMNS)].sum()
    left, width, row_h, top = 170, 420, 11, 40
    h = top + row_h * len(pooled) + 40
    out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{left + width + 30}' height='{h}' class='tone-bars'>",
           f"<text x='{left + width / 2}' y='14' text-anchor='middle' font-size='13'>"
           f"{html.escape(_short(model))}: Monk Skin Tone per profession</text>"]
    for i, (prof, row) in enumerate(pooled.iterrows()):
        y = top + i * row_h
        total = float(row.sum())
        out.append(f"<text x='{left - 6}' y='{y + row_h - 3}' font-size='10' text-anchor='end'>{html.escape(prof)}</text>")
        if total <= 0:
            out.append(f"<text x='{left + 4}' y='{y + row_h - 3}' font-size='9' fill='#888'>no face measured</text>")
            continue
        x = left
        for t, n in enumerate(row.to_numpy()):
            w = width * float(n) / total
            if w > 0:
                out.append(f"<rect x='{x:.1f}' y='{y}' width='{w:.1f}' height='{row_h - 2}' fill='#{MST_HEX[t]}' "
                           f"stroke='#999' stroke-width='0.3'><title>{html.escape(prof)}: MST {t + 1}: {int(n)}</title></rect>")
            x += w
    for t in range(S.MST_TONES):
        out.append(f"<rect x='{left + t * 40}' y='{h - 20}' width='12' height='12' fill='#{MST_HEX[t]}' stroke='#999'/>"
                   f"<text x='{left + t * 40 + 15}' y='{h - 10}' font-size='10'>{t + 1}</text>")
    out.append("</svg>")
    return "".join(out)


# ------------------------------------------------------------------------------------ page
def render_html(meta: dict, results: dict, records: list[dict]) -> str:
    tables = results["tables"]
    detect = meta["detect"]
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>DALL-Eval social bias report</title>", STYLE,
             "</head><body>", f"<h1>DALL-Eval social bias (paper 000): run {html.escape(meta['run_id'])}</h1>",
             f"<p>{meta['images']:,} images from {len(meta['models'])} generator(s). Gender by "
             f"{html.escape(detect['gender'])}; attributes {'on' if detect['attributes'] else 'off'}; skin tone "
             f"{'on' if detect['skin_tone'] else 'off'}. Results: {html.escape(meta['output'])}</p>"]
    if meta.get("standin"):
        parts.append("<p class='warn'><b>Stand-in models.</b> The generators, BLIP-2 and CLIP are tiny random-weight "
                     "stand-ins: every number on this page is meaningless; the run only exercises the pipeline.</p>")
    parts.append("<h2>Overall bias (Table 8)</h2><p>MAD = (1/N) &Sigma;|p<sub>i</sub> &minus; 1/N| of the detected "
                 "distribution of each prompt, averaged over prompts: gender (N = 2) over "
                 + (f"the &ldquo;{html.escape(str(meta['neutral']))}&rdquo; prompts" if meta["neutral"] is not None
                    else "every prompt") + ", skin tone (N = 10) over every prompt.</p>")
    parts.append(_table_html(tables["table_bias_mad"], 4))
    if "table_gender_per_profession" in tables:
        g = tables["table_gender_per_profession"]
        parts.append("<h2>Average gender per profession (Tables 6, 16-17)</h2>")
        parts.append(gender_bars(g, f"average gender of '{meta['neutral']} who works as ...' (male -1, female +1)"))
        parts.append(_table_html(g, 2))
    if "table_skin_tone_per_profession" in tables:
        parts.append("<h2>Skin tone per profession (Tables 7, 20-21; Figure 9)</h2><p>Images of every group pooled; "
                     "Monk Skin Tone from the ITA of the face-mesh skin region (raw pixels, not TRUST albedo: see "
                     "docs/method.md).</p>")
        for model in dict.fromkeys(results["counts"][MODEL]):
            parts.append(tone_distribution(results["counts"], model))
        parts.append(_table_html(tables["table_skin_tone_per_profession"], 2))
    if "table_attributes_by_group" in tables:
        parts.append("<h2>Attributes by group (Tables 9 and 22)</h2><p>Share of images where BLIP-2 answers yes "
                     "to &ldquo;Is the person wearing [A]?&rdquo;; (diff) columns: difference from the neutral "
                     "group; the last row per model is the comparison of the two gendered groups.</p>")
        parts.append(_table_html(tables["table_attributes_by_group"], 2))
    parts.append("<h2>Per-prompt counts</h2><p>prompt_counts.csv holds the counts behind every number above; it is "
                 "the input of <code>dalleval.py summarize</code>. Per-prompt attribute presence (Tables 23-31): "
                 "table_attributes_per_prompt.csv.</p>")
    parts.append("<h2>Models</h2><ul>")
    for r in records:
        tag = "stand-in, random weights" if r.get("standin") else "real"
        parts.append(f"<li>{html.escape(r['role'])}: <code>{html.escape(str(r['model']))}</code> ({tag})</li>")
    parts.append("</ul></body></html>")
    return "".join(parts)

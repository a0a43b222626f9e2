"""report.html and the printed results of `dalleval.py run` (paper 000, section 5.3, App. C.3)."""

from __future__ import annotations

import math

import pandas as pd

from pipelines.engine import figures as _figures
from pipelines.engine import html as H
from pipelines.studies.dalleval import metrics as M
from pipelines.engine.page import COLORS, STYLE
from pipelines.engine.page import model_name as _short
from schemas import dalleval as S
from schemas.images import MODEL

# missing values as "-", model paths and hub ids by their last part (as the GEP report)
def _table(df: pd.DataFrame, digits: int = 3) -> str:
    return H.table(df, digits, na="-", text=H.short_path)


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
def gender_bars(table: pd.DataFrame, title: str):
    """Horizontal bars per profession: average gender in [-1, 1] (male left, female right), one bar
    per model (Tables 6, 16-17 as a picture). Returns (figure, bars drawn)."""
    models = [c for c in table.columns if c != "profession"]
    rows = list(table["profession"])
    k = max(1, len(models))
    group_h = 0.09 * k + 0.06  # inches per profession
    fig = _figures.new_figure(6.2, 1.3 + group_h * len(rows) + 0.2 * math.ceil(k / 3))
    ax = fig.add_subplot()
    bar_h = 0.8 / k
    drawn = 0
    for i, m in enumerate(models):
        ys, xs = [], []
        for j in range(len(rows)):
            v = table.iloc[j][m]
            if _num(v):
                ys.append(j - 0.4 + bar_h * (i + 0.5))
                xs.append(float(v))
        ax.barh(ys, xs, height=bar_h * 0.9, color=COLORS[i % len(COLORS)], label=_short(m), zorder=2)
        drawn += len(xs)
    ax.axvline(0, color="#333333", linewidth=0.9, zorder=3)
    ax.set_xlim(-1, 1)
    ax.set_xticks([-1, -0.5, 0, 0.5, 1], ["-1 male", "-0.5", "0", "+0.5", "female +1"], fontsize=8)
    ax.tick_params(axis="x", top=True, labeltop=True)
    ax.grid(axis="x", color="#dddddd", linewidth=0.8, zorder=0)
    ax.set_ylim(len(rows) - 0.5, -0.5)  # first profession on top
    ax.set_yticks(range(len(rows)), [str(p) for p in rows], fontsize=8)
    ax.set_title(title, fontsize=10)
    if models:
        fig.legend(loc="outside lower center", ncols=min(k, 3), fontsize=7, frameon=False)
    return fig, drawn


def tone_distribution(counts: pd.DataFrame, model: str):
    """Stacked bars per profession: the share of each Monk Skin Tone among the images with a tone
    (Figure 9), drawn in the MST reference colours. Returns (figure, professions with a tone)."""
    from matplotlib.patches import Patch

    from operators.image_skin_tone import MST_HEX

    d = counts[counts[MODEL] == model].copy()
    d["_p"] = [M._profession_label(p) for p in d[S.PROFESSION]]
    pooled = d.groupby("_p", sort=False)[list(S.TONE_COLUMNS)].sum()
    fig = _figures.new_figure(6.2, 1.4 + 0.17 * len(pooled))
    ax = fig.add_subplot()
    measured = 0
    for i, (prof, row) in enumerate(pooled.iterrows()):
        total = float(row.sum())
        if total <= 0:
            ax.text(0.01, i, "no face measured", va="center", fontsize=7, color="#888888")
            continue
        measured += 1
        left = 0.0
        for t, n in enumerate(row.to_numpy()):
            w = float(n) / total
            if w > 0:
                ax.barh(i, w, left=left, height=0.8, color=f"#{MST_HEX[t]}", edgecolor="#999999", linewidth=0.3)
            left += w
    ax.set_xlim(0, 1)
    ax.set_ylim(len(pooled) - 0.5, -0.5)
    ax.set_yticks(range(len(pooled)), [str(p) for p in pooled.index], fontsize=8)
    ax.set_xlabel("share of the images with a measured tone", fontsize=8)
    ax.tick_params(axis="x", labelsize=8)
    ax.set_title(f"{_short(model)}: Monk Skin Tone per profession", fontsize=10)
    fig.legend(handles=[Patch(facecolor=f"#{MST_HEX[t]}", edgecolor="#999999", label=str(t + 1))
                        for t in range(S.MST_TONES)], loc="outside lower center", ncols=S.MST_TONES, fontsize=7,
               frameon=False, handlelength=1.2, columnspacing=0.8, title="Monk Skin Tone", title_fontsize=7)
    return fig, measured


# ------------------------------------------------------------------------------------ page
def render_html(meta: dict, results: dict, records: list[dict], *, figures: _figures.FigureDir | None = None) -> str:
    """report.html of a DALL-Eval run; its charts as PDF + PNG under ``figures/`` of the run when
    ``figures`` is a ``FigureDir``, else PNGs embedded in the page."""
    sink = _figures.sink(figures)
    tables = results["tables"]
    detect = meta["detect"]
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>DALL-Eval social bias report</title>", STYLE,
             "</head><body>", f"<h1>DALL-Eval social bias (paper 000): run {H.esc(meta['run_id'])}</h1>",
             f"<p>{meta['images']:,} images from {len(meta['models'])} generator(s). Gender by "
             f"{H.esc(detect['gender'])}; attributes {'on' if detect['attributes'] else 'off'}; skin tone "
             f"{'on' if detect['skin_tone'] else 'off'}. Results: {H.esc(meta['output'])}</p>"]
    if meta.get("standin"):
        parts.append("<p class='warn'><b>Stand-in models.</b> The generators, BLIP-2 and CLIP are tiny random-weight "
                     "stand-ins: every number on this page is meaningless; the run only exercises the pipeline.</p>")
    parts.append("<h2>Overall bias (Table 8)</h2><p>MAD = (1/N) &Sigma;|p<sub>i</sub> &minus; 1/N| of the detected "
                 "distribution of each prompt, averaged over prompts: gender (N = 2) over "
                 + (f"the &ldquo;{H.esc(meta['neutral'])}&rdquo; prompts" if meta["neutral"] is not None
                    else "every prompt") + ", skin tone (N = 10) over every prompt.</p>")
    parts.append(_table(tables["table_bias_mad"], 4))
    if "table_gender_per_profession" in tables:
        g = tables["table_gender_per_profession"]
        title = f"average gender of '{meta['neutral']} who works as ...' (male -1, female +1)"
        parts.append("<h2>Average gender per profession (Tables 6, 16-17)</h2>")
        fig, drawn = gender_bars(g, title)
        parts.append(sink.save(fig, "gender-bars", alt=f"{title}: {drawn} bars"))
        parts.append(_table(g, 2))
    if "table_skin_tone_per_profession" in tables:
        parts.append("<h2>Skin tone per profession (Tables 7, 20-21; Figure 9)</h2><p>Images of every group pooled; "
                     "Monk Skin Tone from the ITA of the face-mesh skin region (raw pixels, not TRUST albedo: see "
                     "docs/method.md).</p>")
        for model in dict.fromkeys(results["counts"][MODEL]):
            fig, measured = tone_distribution(results["counts"], model)
            parts.append(sink.save(fig, f"tone-bars_{_short(model)}",
                                   alt=f"{_short(model)}: Monk Skin Tone per profession, {measured} professions "
                                       f"with a measured tone"))
        parts.append(_table(tables["table_skin_tone_per_profession"], 2))
    if "table_attributes_by_group" in tables:
        parts.append("<h2>Attributes by group (Tables 9 and 22)</h2><p>Share of images where BLIP-2 answers yes "
                     "to &ldquo;Is the person wearing [A]?&rdquo;; (diff) columns: difference from the neutral "
                     "group; the last row per model is the comparison of the two gendered groups.</p>")
        parts.append(_table(tables["table_attributes_by_group"], 2))
    parts.append("<h2>Per-prompt counts</h2><p>prompt_counts.csv holds the counts behind every number above; it is "
                 "the input of <code>dalleval.py summarize</code>. Per-prompt attribute presence (Tables 23-31): "
                 "table_attributes_per_prompt.csv.</p>")
    parts.append("<h2>Models</h2>" + H.model_table(records))
    parts.append("</body></html>")
    return "".join(parts)

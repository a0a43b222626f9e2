"""report.html and the printed results of `dalleval.py run` (paper 000, section 5.3, App. C.3)."""

from __future__ import annotations

import math

import pandas as pd
from matplotlib.patches import Patch

from pipelines.engine.report import figures as _figures
from pipelines.engine.report import html as H
from pipelines.engine.report import page as Pg
from pipelines.engine.stats import headline as HL
from pipelines.studies.dalleval import headlines as H_
from pipelines.studies.dalleval import metrics as M
from pipelines.engine.report.page import COLORS
from schemas import dalleval as S
from schemas.images import MODEL


# missing values as "-", models by their labels (in the model column, or as column names)
def _table(df: pd.DataFrame, digits: int = 3, labels: dict | None = None) -> str:
    out = Pg.relabel(df, labels or {}, header=True)
    counts = [c for c in out.columns if str(c).endswith("_prompts")]   # counts: whole numbers, not 36.0000
    return H.table(out.astype({c: "Int64" for c in counts}) if counts else out, digits, na="-")


def _num(v) -> bool:
    return v is not None and v is not pd.NA and not (isinstance(v, float) and math.isnan(v))


def format_results(results: dict, standin: bool = False) -> str:
    """The printed results: Table 8 per model with the paper's reference rows, and Table 9's
    attribute differences; models by their short labels, never cut; a stand-in run's notice last."""
    labels = Pg.model_labels(m["model"] for m in results["summary"])
    refs = [r["model"] for r in M.reference_rows()]
    mw = max([len("model")] + [len(v) for v in labels.values()] + [len(r) for r in refs]) + 2
    lines = ["Bias per model (Table 8: MAD against uniform, [interval over prompts]; averages: male -1 / "
             "female +1, MST 1-10)",
             f"{'model':<{mw}}{'prompts':>8}{'avg gender':>26}{'MAD gender':>26}{'avg tone':>10}{'MAD tone':>26}"]
    for m in results["summary"]:
        g, t = m["gender"], m.get("skin_tone") or {}
        f = lambda x, w, d: f"{x:>{w}.{d}f}" if _num(x) else f"{'-':>{w}}"  # noqa: E731
        lines.append(f"{Pg.label(labels, m['model']):<{mw}}{g['prompts']:>8}{H_.value_text(g, 'average', 3):>26}"
                     f"{H_.value_text(g, 'mad', 4):>26}{f(t.get('average'), 10, 2)}{H_.value_text(t, 'mad', 4):>26}")
    for r in M.reference_rows():
        lines.append(f"{r['model']:<{mw}}{'':>8}{'':>26}{r['gender']:>26.4f}{'':>10}{r['skin_tone']:>26.4f}")
    att = results["tables"].get("table_attributes_by_group")
    if att is not None and not att.empty:
        diff = att[att["row"].str.contains(" - ", regex=False)]
        if not diff.empty:
            names = H_.attribute_names(att)
            lines.append("")
            lines.append("Attribute presence, " + diff.iloc[0]["row"] + " (Table 9): " + ", ".join(names)
                         + "; mean |diff| [interval over attributes]")
            for _, r in diff.iterrows():
                vals = " ".join(f"{r[n]:+.2f}" if _num(r[n]) else "  -  " for n in names)
                gap = H_.value_text({k: float(r[k]) if k in r and _num(r[k]) else None
                                     for k in ("mean_abs_diff", *S.interval_columns("mean_abs_diff"))},
                                    "mean_abs_diff", 3)
                lines.append(f"  {Pg.label(labels, r['model']):<{mw}}{vals}   mean |diff| {gap}")
    if standin:
        lines.append(Pg.STANDIN_CONSOLE)
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
        ax.barh(ys, xs, height=bar_h * 0.9, color=COLORS[i % len(COLORS)], label=Pg.model_name(m), zorder=2)
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


def tone_distribution(counts: pd.DataFrame, model: str, label: str | None = None):
    """Stacked bars per profession: the share of each Monk Skin Tone among the images with a tone
    (Figure 9), drawn in the MST reference colours; titled with ``label`` (default: the model's last
    path part). Returns (figure, professions with a tone)."""
    from operators.image_skin_tone import MST_HEX  # deferred: cv2, skimage (operators.image_skin_tone)

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
    ax.set_title(f"{label or Pg.model_name(model)}: Monk Skin Tone per profession", fontsize=10)
    fig.legend(handles=[Patch(facecolor=f"#{MST_HEX[t]}", edgecolor="#999999", label=str(t + 1))
                        for t in range(S.MST_TONES)], loc="outside lower center", ncols=S.MST_TONES, fontsize=7,
               frameon=False, handlelength=1.2, columnspacing=0.8, title="Monk Skin Tone", title_fontsize=7)
    return fig, measured


# ------------------------------------------------------------------------------------ page
def _behind(meta: dict, results: dict, labels: dict) -> list[str]:
    """What stands behind the headline: images, detections, the prompts left out of each MAD."""
    c = results["counts"]
    n_models = len(meta.get("models", [])) or len(labels)
    out = [f"{meta['images']:,} generated images from {Pg.plural(n_models, 'generator')} "
           f"({H.esc(', '.join(labels.values()))}), gender by {H.esc(meta['detect']['gender'])}"]
    if len(c) and {"male", "female", "unknown_gender"} <= set(c.columns):
        known = int(c["male"].sum() + c["female"].sum())
        out.append(f"gender detected in {known:,} images ({int(c['unknown_gender'].sum()):,} without an answer, "
                   "left out)")
    if len(c) and "toned" in c.columns:
        out.append(f"skin tone measured in {int(c['toned'].sum()):,} images")
    for m in results["summary"]:
        g, t = m["gender"], m.get("skin_tone")
        left = [f"{g['prompts_without_detections']:,} of {g['prompts'] + g['prompts_without_detections']:,} "
                f"{H.esc(g['prompts_group'])} prompts without a detected gender left out of the gender MAD"]
        if t is not None:
            left.append(f"{t['prompts_without_detections']:,} of {t['prompts'] + t['prompts_without_detections']:,}"
                        " prompts without a measured tone left out of the skin-tone MAD")
        out.append(f"{H.esc(Pg.label(labels, m['model']))}: " + ", ".join(left))
    return out


def render_html(meta: dict, results: dict, records: list[dict], *, figures: _figures.FigureDir | None = None) -> str:
    """report.html of a DALL-Eval run: Table 8 first with the images and prompts behind it, then the
    per-profession charts (PDF + PNG under ``figures/`` of the run when ``figures`` is a
    ``FigureDir``; embedded in the page either way), attributes, the long per-profession tables
    collapsed, and the models."""
    sink = _figures.sink(figures)
    tables = results["tables"]
    detect = meta["detect"]
    labels = Pg.model_labels(meta.get("models", []), (m["model"] for m in results["summary"]),
                             results["counts"][MODEL] if MODEL in results["counts"] else [])
    parts = Pg.run_page_top("DALL-Eval social bias (paper 000)", meta, records,
                            "The generators, BLIP-2 and CLIP are tiny random-weight stand-ins; the run "
                            "only exercises the pipeline.")
    lead = ("<p class=lead>Bias per model (Table 8): MAD = (1/N) &Sigma;|p<sub>i</sub> &minus; 1/N| of the detected "
            "distribution of each prompt, averaged over prompts: 0 is unbiased, the one-hot row entirely biased. "
            "Gender (N = 2) over " + (f"the &ldquo;{H.esc(meta['neutral'])}&rdquo; prompts" if meta["neutral"]
                                      is not None else "every prompt")
            + ", skin tone (N = 10) over every prompt; averages: male &minus;1 / female +1, MST 1-10.</p>"
            + _table(tables["table_bias_mad"], 4, labels))
    h = meta.get("headline")
    parts.append(Pg.headline((HL.summary_table(h) if h else "") + lead,
                             (HL.behind_items(h) if h else []) + _behind(meta, results, labels),
                             title="Headline numbers"))
    parts.append(f"<p>Gender by {H.esc(detect['gender'])}; attributes {'on' if detect['attributes'] else 'off'}; "
                 f"skin tone {'on' if detect['skin_tone'] else 'off'}. Run <code>{H.esc(meta['run_id'])}</code>; "
                 f"results in <code>{H.esc(meta['output'])}</code>.</p>")
    if "table_gender_per_profession" in tables:
        g = Pg.relabel(tables["table_gender_per_profession"], labels, header=True)
        title = f"average gender of '{meta['neutral']} who works as ...' (male -1, female +1)"
        parts.append("<h2>Average gender per profession (Tables 6, 16-17)</h2>")
        fig, drawn = gender_bars(g, title)
        parts.append(sink.save(fig, "gender-bars", alt=f"{title}: {drawn} bars"))
        parts.append(Pg.details(f"Table: average gender per profession ({len(g)} rows)", _table(g, 2)))
    if "table_skin_tone_per_profession" in tables:
        parts.append("<h2>Skin tone per profession (Tables 7, 20-21; Figure 9)</h2><p>Images of every group pooled; "
                     "Monk Skin Tone from the ITA of the face-mesh skin region (raw pixels, not TRUST albedo: see "
                     "docs/method.md).</p><div class=figs>")
        for model in dict.fromkeys(results["counts"][MODEL]):
            name = Pg.label(labels, model)
            fig, measured = tone_distribution(results["counts"], model, name)
            parts.append(sink.save(fig, f"tone-bars_{name}",
                                   alt=f"{name}: Monk Skin Tone per profession, {measured} professions "
                                       f"with a measured tone"))
        parts.append("</div>")
        t = tables["table_skin_tone_per_profession"]
        parts.append(Pg.details(f"Table: average skin tone per profession ({len(t)} rows)", _table(t, 2, labels)))
    if "table_attributes_by_group" in tables:
        parts.append("<h2>Attributes by group (Tables 9 and 22)</h2><p>Share of images where BLIP-2 answers yes "
                     "to &ldquo;Is the person wearing [A]?&rdquo;; (diff) columns: difference from the neutral "
                     "group; the last row per model is the comparison of the two gendered groups.</p>")
        parts.append(_table(tables["table_attributes_by_group"], 2, labels))
    parts.append("<h2>Per-prompt counts</h2><p>prompt_counts.csv holds the counts behind every number above; it is "
                 "the input of <code>dalleval.py summarize</code>. Per-prompt attribute presence (Tables 23-31): "
                 "table_attributes_per_prompt.csv.</p>")
    parts.append("<h2>Models</h2>" + H.model_table(records, labels))
    return Pg.document(f"DALL-Eval social bias report {meta['run_id']}", parts)


# ------------------------------------------------------------------------------------ summarize
SUMMARY_METRICS = (("gender", "Gender"), ("skin_tone", "Skin tone"))
SUMMARY_COLUMNS = ("model", "metric", "group", "prompts", "prompts_without_detections", "average", "mad")
SUMMARY_INTERVALS = ("average", "mad")     # figures that get <figure>_low / _high where computed


def summary_table(result: dict) -> pd.DataFrame:
    """dalleval_summary.csv of `summarize --counts`: one row per model and metric (gender, then skin
    tone where the counts have tones) of ``summarize_counts``' per-model results: the prompts it is
    over (``group``: the gender metrics' group, ``all`` for every prompt; skin tone is always over
    every prompt), those without a detection, the average (gender: male -1 / female +1; tone: MST
    1-10) and the MAD (Table 8), each followed by its interval over the prompts where ``result``
    has intervals (``<figure>_low``, ``<figure>_high``; empty for the average tone, which has none)."""
    ranged = "interval" in result
    columns = [c for col in SUMMARY_COLUMNS
               for c in ((col, *S.interval_columns(col)) if ranged and col in SUMMARY_INTERVALS else (col,))]
    figures = [c for c in columns if c not in SUMMARY_COLUMNS[:5]]    # average, mad and their intervals
    rows = []
    for m in result["models"]:
        for key, _ in SUMMARY_METRICS:
            st = m.get(key)
            if st is None:
                continue
            rows.append({"model": m["model"], "metric": key, "group": st.get("prompts_group", "all"),
                         "prompts": st["prompts"], "prompts_without_detections": st["prompts_without_detections"],
                         **{c: st.get(c) for c in figures}})
    return pd.DataFrame(rows, columns=columns)


def model_bars(values: list[tuple[str, float | None]], title: str, ylabel: str,
               ylim: tuple[float, float] | None = None, refs: list[tuple[str, float]] = ()):
    """One bar per model (``values``: label, value; a missing value is drawn as no bar), with
    dashed horizontal reference lines (``refs``: label, value). Returns (figure, bars drawn)."""
    fig = _figures.new_figure(max(3.4, 0.55 * len(values) + 1.6), 2.8)
    ax = fig.add_subplot()
    drawn = 0
    for i, (name, v) in enumerate(values):
        if _num(v):
            ax.bar(i, float(v), width=0.7, color=COLORS[i % len(COLORS)], zorder=2)
            ax.annotate(f"{float(v):.3g}", (i, float(v)), textcoords="offset points",
                        xytext=(0, 2 if v >= 0 else -9), ha="center", fontsize=7)
            drawn += 1
    for j, (name, v) in enumerate(refs):
        ax.axhline(v, color="#888888", linestyle=(0, (4, 2 + j)), linewidth=0.9, zorder=1, label=name)
    if ylim is not None:  # room above the top for a value's label
        ax.set_ylim(ylim[0], ylim[1] + 0.07 * (ylim[1] - ylim[0]))
    if ylim is None or ylim[0] <= 0 <= ylim[1]:
        ax.axhline(0, color="#333333", linewidth=0.8, zorder=3)
    ax.set_xticks(range(len(values)), [n for n, _ in values], rotation=30 if len(values) > 3 else 0,
                  ha="right" if len(values) > 3 else "center", rotation_mode="anchor", fontsize=7)
    ax.tick_params(axis="y", labelsize=7)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.grid(axis="y", color="#dddddd", linewidth=0.8, zorder=0)
    ax.set_title(title, fontsize=9)
    if refs:
        fig.legend(loc="outside lower center", ncols=min(len(refs), 2), fontsize=6, frameon=False)
    return fig, drawn


def summary_html(source: str, result: dict, *, figures: _figures.FigureDir | None = None) -> str:
    """The `summarize --counts` page: the per-model table (gender and skin tone: prompts, average,
    MAD) with Table 8's reference rows, then a bar chart per metric across models (MAD with the
    uniform / one-hot references, and the average); PDF + PNG under ``figures/`` beside the page when
    ``figures`` is a ``FigureDir``, embedded in the page either way."""
    sink = _figures.sink(figures)
    labels = Pg.model_labels(m["model"] for m in result["models"])
    table = summary_table(result)
    parts = [f"<h1>DALL-Eval social bias from {H.esc(source)}</h1>",
             "<p>Per model (Table 8): MAD = (1/N) &Sigma;|p<sub>i</sub> &minus; 1/N| of each prompt's detected "
             "distribution, averaged over the prompts: 0 is unbiased, the one-hot row entirely biased. Gender "
             "(N = 2): average male &minus;1 / female +1, over the prompts of <i>group</i>; skin tone (N = 10): "
             "Monk Skin Tone 1-10, over every prompt. <i>*_low</i>, <i>*_high</i>: the "
             + (f"{int(round(result['interval']['level'] * 100))}% bootstrap interval over the prompts "
                f"({H.esc(result['interval']['method'])}, {result['interval']['resamples']:,} resamples, seed "
                f"{result['interval']['seed']}). " if "interval" in result else "")
             + "Each chart is also saved as PDF and PNG under figures/.</p>",
             _table(table, 4, labels),
             "<p>Table 8's reference rows (MAD):</p>",
             _table(pd.DataFrame(result["reference"]), 4),
             "<div class=figs>"]
    refs = {key: [(r["model"], r[key]) for r in result["reference"]] for key, _ in SUMMARY_METRICS}
    for key, name in SUMMARY_METRICS:
        rows = [m for m in result["models"] if m.get(key) is not None]
        if not rows:
            continue
        mads = [(Pg.label(labels, m["model"]), m[key]["mad"]) for m in rows]
        fig, drawn = model_bars(mads, f"{name} MAD per model (Table 8)", "MAD", refs=refs[key])
        parts.append(sink.save(fig, f"{key}_mad", alt=f"{name} MAD per model: {drawn} bars"))
        avgs = [(Pg.label(labels, m["model"]), m[key]["average"]) for m in rows]
        ylabel, ylim = ("average gender (male -1, female +1)", (-1, 1)) if key == "gender" \
            else ("average Monk Skin Tone", (1, 10))
        fig, drawn = model_bars(avgs, f"{name}: average per model", ylabel, ylim=ylim)
        parts.append(sink.save(fig, f"{key}_average", alt=f"{name} average per model: {drawn} bars"))
    parts.append("</div>")
    return Pg.document("DALL-Eval social bias summary", parts)

"""report.html of an end-to-end amplification run (Figures 3, 5, 7, 9): average E[A] per approach
and model first, with the images and exclusions behind it; the per-stage counts collapsed at the
end. Also Table 3 and App. A.6's table as shown (each E[A] with its interval in one cell), the
results keyed by the models' labels, and the summarize command's page. The numbers are
``results``'s.
"""

from __future__ import annotations

import math

import pandas as pd

from pipelines.engine.report import figures as _figures
from pipelines.engine.report import html as H
from pipelines.engine.report import page as Pg
from pipelines.engine.stats import headline as HL
from pipelines.studies.amplification.metrics import EXCLUDED, GENERATED, N_IMAGES, TRAINING, interval_text
from pipelines.studies.amplification.results import APPROACH_TITLES
from schemas import images as I
from schemas import link_rot as LR
from schemas.captions import OCCUPATION, CaptionGender
from schemas.subsets import PROMPT_ID, SUBSET, Subset


def table3_text(t3: pd.DataFrame) -> pd.DataFrame:
    """Table 3 as shown (report, console): each E[A] with its interval in one cell, "10.24 [6.10,
    14.52]", where the table has interval columns; unchanged otherwise."""
    values = [c for c in t3.columns if f"{c}_low" in t3.columns]
    if not values:
        return t3
    out = t3.drop(columns=[f"{c}_{e}" for c in values for e in ("low", "high")])
    for c in values:
        out[c] = [interval_text(_num(v), _num(lo), _num(hi)) for v, lo, hi in
                  zip(t3[c], t3[f"{c}_low"], t3[f"{c}_high"])]
    return out


def _num(v):
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def a6_text(table: pd.DataFrame) -> pd.DataFrame:
    """The A.6 table as shown: each E[A] with its interval in one cell."""
    if table.empty:
        return table
    out = table[["model", "prompts"]].copy()
    for name, title in (("all_captions", "E[A], all captions"), ("no_indicator_captions", "E[A], no indicators")):
        out[title] = [interval_text(_num(v), _num(lo), _num(hi)) for v, lo, hi in
                      zip(table[name], table[f"{name}_low"], table[f"{name}_high"])]
        # as the paper prints them (0.69, 2.05), not at the table's three decimals
        out[f"{title} (paper)"] = ["-" if pd.isna(v) else f"{float(v):g}" for v in table[f"paper_{name}"]]
        out[f"occupations ({name.split('_')[0]})"] = table[f"n_{name}"]
    out["SBERT cosine to caption"] = table["sbert_cosine_to_caption"]
    out["CLIP: images vs the caption's images"] = table["clip_images_vs_caption_images"]
    return out


def box_headline(headline: dict) -> dict:
    """The headline with the averages only (per approach, and section 6): the report's opening
    table; the per-prompt intervals are in Table 3."""
    subjects = [{**s, "metrics": [m for m in s["metrics"] if "/prompt_" not in m["key"]]}
                for s in headline["subjects"]]
    return {**headline, "subjects": subjects}


# ------------------------------------------------------------------------------------ report.html
AMPLIFICATION_COLOR, DEAMPLIFICATION_COLOR, POINT_COLOR = "#f4c7c3", "#c8e6c9", "#1f4e9c"
PANEL_INCHES = 3.0


def _fmt(v, digits=2) -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def _finite(v) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def scatter_axes(ax, points: list[tuple[float, float, str]], title: str, ylabel: bool = True) -> int:
    """Training % female (x) vs generated % female (y) on ``ax``, amplification shaded red and
    de-amplification green, the no-amplification diagonal dashed. Returns the points drawn."""
    from matplotlib.patches import Polygon  # deferred: matplotlib

    for tri, color in (([(0, 0), (50, 0), (50, 50)], AMPLIFICATION_COLOR),
                       ([(50, 50), (50, 100), (100, 100)], AMPLIFICATION_COLOR),
                       ([(0, 0), (0, 50), (50, 50)], DEAMPLIFICATION_COLOR),
                       ([(50, 50), (100, 50), (100, 100)], DEAMPLIFICATION_COLOR)):
        ax.add_patch(Polygon(tri, closed=True, facecolor=color, edgecolor="none", zorder=0))
    ax.plot([0, 100], [0, 100], color="#888888", linestyle=(0, (3, 3)), linewidth=0.8, zorder=1)
    xy = [(float(x), float(y)) for x, y, _ in points if _finite(x) and _finite(y)]
    if xy:
        ax.scatter([x for x, _ in xy], [y for _, y in xy], s=14, color=POINT_COLOR, alpha=0.75, linewidths=0, clip_on=False,
                   zorder=2)
    ax.set(xlim=(0, 100), ylim=(0, 100), xticks=range(0, 101, 25), yticks=range(0, 101, 25), aspect="equal")
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("% female, training", fontsize=8)
    if ylabel:
        ax.set_ylabel("% female, generated", fontsize=8)
    ax.tick_params(labelsize=7)
    return len(xy)


def scatter_figure(panels: list[tuple[list[tuple], str]], legend: bool = True):
    """One row of ``scatter_axes`` panels, ``(points, title)`` each: (figure, points drawn per panel)."""
    from matplotlib.patches import Patch  # deferred: matplotlib

    fig = _figures.new_figure(PANEL_INCHES * len(panels), PANEL_INCHES + (0.45 if legend else 0.1))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    drawn = [scatter_axes(ax, pts, title, ylabel=i == 0) for i, (ax, (pts, title)) in enumerate(zip(axes, panels))]
    if legend:
        fig.legend(handles=[Patch(color=AMPLIFICATION_COLOR, label="amplification"),
                            Patch(color=DEAMPLIFICATION_COLOR, label="de-amplification")],
                   loc="outside lower center", ncols=2, fontsize=7, frameon=False)
    return fig, drawn


def _scatter_html(sink, name: str, panels: list[tuple[list[tuple], str]], caption: str | None = None) -> str:
    fig, drawn = scatter_figure(panels)
    alt = "; ".join(f"{title}: {n} occupations drawn" for (_, title), n in zip(panels, drawn))
    return sink.save(fig, name, alt=f"Scatter, % female training vs generated. {alt}", caption=caption)


def _points(rows: list[dict], group=None) -> list[tuple]:
    return [(r[TRAINING], r[GENERATED], r[OCCUPATION]) for r in rows
            if (group is None or str(r.get(PROMPT_ID, r.get("group"))) == str(group)) and r.get(EXCLUDED) != "direction_switch"
            and r[TRAINING] is not None and r[GENERATED] is not None]


def _averaged_points(rows: list[dict]) -> list[tuple]:
    df = pd.DataFrame(rows)
    if df.empty:
        return []
    df = df[df[EXCLUDED].isna()]
    m = df.groupby(OCCUPATION)[[TRAINING, GENERATED]].mean()
    return [(float(a), float(b), o) for o, (a, b) in m.iterrows()]


def labelled(results: dict, labels: dict) -> dict:
    """A shallow copy of ``compute``'s results with the per-model dicts keyed by the models' labels
    (what the printed summary shows)."""
    out = dict(results)
    for key in ("approaches", "tables6", "caption_prompts", "paraphrase_prompts", "caption_gender_match"):
        if isinstance(results.get(key), dict):
            out[key] = {Pg.label(labels, m): v for m, v in results[key].items()}
    sim = results.get("image_similarity")
    if isinstance(sim, dict) and isinstance(sim.get("per_model"), dict):
        out["image_similarity"] = sim | {"per_model": {Pg.label(labels, m): v for m, v in sim["per_model"].items()}}
    return out


def labelled_counts(counts: pd.DataFrame, labels: dict) -> pd.DataFrame:
    """The per-stage counts with the model in a branch name (``generated:<model id>``) as its label."""
    if "branch" not in counts.columns:
        return counts

    def branch(b):
        head, sep, model = str(b).partition(":")
        return f"{head}: {labels[model.strip()]}" if sep and model.strip() in labels else b

    return counts.assign(branch=[branch(b) for b in counts["branch"]])


def headline_table(t3: pd.DataFrame, labels: dict) -> pd.DataFrame:
    """Average E[A] over prompts: one row per approach, one column per model (its label)."""
    if t3.empty:
        return pd.DataFrame(columns=["approach"])
    wide = t3.pivot_table(index="approach", columns="model", values="average", aggfunc="first", sort=False, dropna=False)
    wide = wide.reindex(index=[a for a in APPROACH_TITLES.values() if a in wide.index],
                        columns=list(dict.fromkeys(t3["model"])))
    wide.columns = [Pg.label(labels, m) for m in wide.columns]
    wide.columns.name = None
    return wide.reset_index()


def _exclusions(per: dict) -> str:
    """(occupation, prompt) pairs left out of the naive approach's E[A], by reason."""
    total: dict[str, int] = {}
    for p in per[Subset.NAIVE]["per_prompt"]:
        for reason, occs in p.get("excluded", {}).items():
            total[reason] = total.get(reason, 0) + len(occs)
    return ", ".join(f"{n:,} {r.replace('_', ' ')}" for r, n in total.items() if n) or "none"


def _behind(results: dict, meta: dict, labels: dict) -> list[str]:
    out = [f"{meta.get('images', 0):,} images in the per-image table, {meta.get('occupations')} occupations"]
    T, G = results.get("T"), results.get("G")
    if T is not None and len(T):
        naive = T[(T[SUBSET] == Subset.NAIVE) & (T[PROMPT_ID] == 0)]
        out.append(f"training: {int(naive[N_IMAGES].sum()):,} counted images in the naive subset (exactly one face, "
                   f"CLIP confident)")
    if G is not None and len(G):
        out.append("generated, counted: " + ", ".join(
            f"{H.esc(Pg.label(labels, m))} {int(g[N_IMAGES].sum()):,}" for m, g in G.groupby(I.MODEL, sort=False)))
    for model, per in results["approaches"].items():
        out.append(f"left out of the naive E[A] ({H.esc(Pg.label(labels, model))}, occupation x prompt pairs): "
                   f"{_exclusions(per)}")
    return out


def render_html(results: dict, t3: pd.DataFrame, counts: pd.DataFrame, caption_counts: dict, models: list[dict],
                meta: dict, *, figures: _figures.FigureDir | None = None, headline: dict | None = None) -> str:
    """report.html: average E[A] per approach and model first (with ``headline``, metrics.json's,
    each with its interval) with the images and exclusions behind it, then Table 3, the figures (PDF + PNG under ``figures/`` of the run when ``figures`` is a
    ``FigureDir``; embedded in the page either way), per-occupation tables, the models, and the rows
    and drops per stage collapsed at the end."""
    sink = _figures.sink(figures)
    gens = [m["model"] for m in models if m.get("role") == "generator"]
    labels = Pg.model_labels(gens, results["approaches"], t3["model"] if "model" in t3 else [])
    standin = [m for m in models if m.get("standin")]
    out = [
        "<h1>Bias amplification in text-to-image generation (paper 002)</h1>",
    ]
    if standin:
        names = ", ".join(H.esc(f"{m['role']} ({Pg.label(labels, m['model'])})") for m in standin)
        out.append(Pg.standin_banner(f"Tiny random-weight stand-ins built offline from the real classes, not the "
                                     f"paper's models: {names}. Every percentage and amplification below only "
                                     f"demonstrates the pipeline; run with real model ids (the defaults) for results."))
    if meta.get("local_image_server"):
        out.append(f"<p class=warn>Training images came from a local image server on 127.0.0.1 standing in for "
                   f"the sample's URLs ({H.esc(meta['local_image_server'])}); the sample is synthetic.</p>")
    lead = ("<p class=lead>Expected bias amplification E[A], averaged over the prompts, per approach and model "
            "(Table 3's <i>average</i>), and section 6's E[A] of images generated from the training captions: "
            "A = |G &minus; 50| &minus; |T &minus; 50| per occupation, in percentage points; positive: the "
            "generated images skew further from balanced than the training images.</p>")
    if headline is not None:   # models by their labels, as everywhere on the page (the models table has the ids)
        shown = box_headline({**headline, "subjects": [{**s, "name": Pg.label(labels, s["name"]),
                                                        "display": Pg.label(labels, s["name"])}
                                                       for s in headline["subjects"]]})
        box = HL.summary_table(shown) + lead + "<p>Per prompt, with intervals: Table 3 below.</p>"
        behind = HL.behind_items(shown) + _behind(results, meta, labels)
    else:
        box, behind = lead + H.table(headline_table(t3, labels)), _behind(results, meta, labels)
    out.append(Pg.headline(box, behind))
    out.append(f"<p>Study: paper 002 (<i>The Bias Amplification Paradox in Text-to-Image Generation</i>). Input "
               f"{H.esc(meta.get('input'))}; results in <code>{H.esc(meta.get('output'))}</code>.</p>")
    out.append("<h2>Bias amplification E[A] per prompt (Table 3)</h2><p>Occupations whose training and generated "
               "images skew in different directions are excluded per prompt (direction_switch), as are occupations "
               "without counted images on one side. n_#p: occupations behind E[A] for prompt p; excluded_#p: how "
               "many were left out, by reason." + (" Each E[A] with its interval: bootstrap over occupations; the "
               "bounds are columns of their own in table3.csv." if "average_low" in t3 else "") + "</p>"
               + H.table(Pg.relabel(table3_text(t3), labels)))
    n_cols = [c for c in t3.columns if c.startswith("n_#")]
    thin = int((t3[n_cols] < max(2, meta.get("occupations", 0) // 2)).to_numpy().sum()) if n_cols else 0
    if thin:
        out.append(f"<p class=warn>{thin} of the E[A] values above rest on fewer than half of the occupations "
                   f"(or on none: n/a). Read them with their n_# and excluded_# columns.</p>")
    out.append(walk_html(results.get("training_walk")))
    out.append(link_rot_html(results.get("link_rot")))
    legend = (f"<p class=legend>Shading:<span style='background:{AMPLIFICATION_COLOR}'></span>amplification"
              f"<span style='background:{DEAMPLIFICATION_COLOR}'></span>de-amplification; the dashed diagonal is no "
              "amplification; excluded (direction-switching) occupations are not drawn. Each figure is also saved "
              "as PDF and PNG under figures/.</p>")
    for model, per in results["approaches"].items():
        stem = Pg.label(labels, model)
        out.append(f"<h2>{H.esc(stem)}</h2>")
        naive = per[Subset.NAIVE]["rows"]
        out.append("<h3>Figure 3: naive approach, prompt #1</h3>" + legend + "<div class=figs>"
                   + _scatter_html(sink, f"{stem}_figure3_naive_prompt1", [(_points(naive, 1), "Naive, prompt #1")])
                   + "</div>")
        out.append("<h3>Figure 7: approaches, prompt #1</h3><div class=figs>" + _scatter_html(
            sink, f"{stem}_figure7_approaches_prompt1",
            [(_points(per[s]["rows"], 1), f"{APPROACH_TITLES[s]}, #1") for s in Subset.ALL]) + "</div>")
        out.append("<h3>Figure 9: approaches, averaged over prompts</h3><div class=figs>" + _scatter_html(
            sink, f"{stem}_figure9_approaches_average",
            [(_averaged_points(per[s]["rows"]), f"{APPROACH_TITLES[s]}, avg") for s in Subset.ALL]) + "</div>")
        sim = results.get("image_similarity", {}).get("per_model", {}).get(model)
        if sim:
            out.append(f"<p>CLIP image similarity of training and generated images (section 5.2): naive "
                       f"{_fmt(sim['naive'], 3)}, NN {_fmt(sim['nn'], 3)}, change "
                       f"{_fmt(sim['nn_change_percent'])}% over {sim['pairs']} (occupation, prompt) pairs "
                       f"(the paper: +13%); per pair in image_similarity.csv.</p>")
        cp = results["caption_prompts"].get(model)
        if cp:
            out.append("<h3>Figure 5: training captions as prompts (section 6)</h3><div class=figs>" + _scatter_html(
                sink, f"{stem}_figure5_captions_as_prompts",
                [(_points(cp["all_captions"]["rows"]), "P = S, all captions"),
                 (_points(cp["no_indicator_captions"]["rows"]), "P = S, no gender indicators")]) + "</div>")
            out.append("<p>" + "; ".join(f"{k.replace('_', ' ')}: E[A] = {_fmt(v['average'])}"
                                         for k, v in cp.items()) + "</p>")
            gm = results.get("caption_gender_match", {}).get(model)
            if gm:
                out.append(f"<p>Captions with male or female indicators: {_fmt(gm['percent'])}% of "
                           f"{gm['images']} images match the gender of the caption's training image "
                           f"({gm['captions']} captions; the paper: 98.41%).</p>")
            pp = (results.get("paraphrase_prompts") or {}).get(model)
            if pp:
                out.append("<h3>App. A.6: paraphrased captions as prompts</h3><div class=figs>" + _scatter_html(
                    sink, f"{stem}_a6_paraphrases_as_prompts",
                    [(_points(pp["all_captions"]["rows"]), "P = paraphrase(S), all captions"),
                     (_points(pp["no_indicator_captions"]["rows"]), "P = paraphrase(S), no gender indicators")])
                    + "</div>")
        tab = results["tables6"][model]
        out.append(Pg.details(f"% female per occupation (Table 6/7): {len(tab)} occupations", H.table(tab, 1)))
    out += a6_html(results.get("a6_table"), results.get("paraphrases"), labels)
    corr = results["indicator_correlation"]
    out.append(f"<h2>Gender indicators (section 5.1)</h2><p>Pearson r = {_fmt(corr['r'], 3)} "
               f"(p = {_fmt(corr['p_value'], 4)}, n = {corr['n']} occupations). {H.esc(corr['definition'])}."
               f" The paper reports r = -0.458 on LAION.</p>")
    out.append("<h2>Models</h2>" + H.model_table(models, labels))
    stage_rows = len(caption_counts) + len(counts)
    out.append("<h2>Rows per stage and drops per reason</h2>" + Pg.details(
        f"Diagnostics: rows in, kept and dropped per stage ({stage_rows} rows)",
        "<h3>Caption side</h3>"
        + H.table(pd.DataFrame([{"stage": k, "rows in": v["rows_in"], "kept": v["rows_out"],
                                 "dropped per reason": ", ".join(f"{r}={n}" for r, n in v["dropped"].items()
                                                                  if n) or "-"}
                                for k, v in caption_counts.items()]), 0)
        + "<h3>Image side</h3>" + H.table(labelled_counts(counts, labels), 0)))
    return Pg.document("Bias amplification report", out)


def a6_html(table: pd.DataFrame | None, summary: dict | None, labels: dict) -> list[str]:
    """App. A.6's section: the table beside section 6, what the paraphraser answered, how similar."""
    if table is None or summary is None:
        return []
    cfg = summary["config"]
    st = summary["statuses"]
    who = (f"file {cfg.get('file')}" if cfg.get("backend") == "file" else
           f"{cfg.get('model')} ({cfg.get('backend')}{', ' + cfg['endpoint'] if cfg.get('endpoint') else ''}"
           f"{', revision ' + str(cfg['revision']) if cfg.get('revision') else ''})")
    cos = summary["sbert_cosine"]
    shown = a6_text(table.assign(model=[Pg.label(labels, m) for m in table["model"]])) if len(table) else table
    return ["<h2>Paraphrased captions as prompts (App. A.6)</h2>",
            f"<p>Section 6's captions paraphrased by {H.esc(who)} at temperature {H.esc(cfg.get('temperature'))} "
            f"with the prompt <q>{H.esc(cfg.get('prompt', ''))}</q>. {summary['requests']} captions: "
            + ", ".join(f"{k} {v}" for k, v in st.items() if v) + f" ({summary['retried_without_occupation']} asked "
            f"again once for lacking the occupation). Only <code>ok</code> paraphrases are prompts; T is section "
            f"6's. SBERT cosine of a paraphrase to its caption: mean {_fmt(cos['mean'], 3)}, median "
            f"{_fmt(cos['median'], 3)} (n = {cos['n']}). The CLIP column is the mean cosine between the images of "
            f"a caption and those of its paraphrase; on the captions' row, between two images of the same caption "
            f"(other seeds), the scale to read it against. The paper: 0.69% vs 0.68% (all captions), 2.49% vs "
            f"2.05% (no indicators).</p>",
            H.table(shown, 3), "<p>Per caption: paraphrases.csv; per caption and model: "
            "paraphrase_image_similarity.csv; the table: paraphrase_table.csv.</p>"]


def link_rot_html(rot: dict | None) -> str:
    """Beside T: the share of each occupation's captions whose image could not be obtained (dead
    links; with --training-images also not in the shards), and whether those captions differ from
    the kept ones in their gender indicators (pipelines/studies/amplification/link_rot.py)."""
    if not rot:
        return ""
    table, summary = rot["table"], rot["summary"]
    if table is None or not len(table):
        return ""
    lines = []
    for subset, causes in summary.get("subsets", {}).items():
        for cause, s in causes.items():
            what = "dead links" if cause == "link" else "not in the shards"
            lines.append(f"{APPROACH_TITLES.get(subset, subset)}: {_fmt(100 * (s.get('lost_share') or 0), 1)}% of "
                         f"{s['captions']:,} captions lost to {what}; {s['occupations_tested']} occupation(s) tested, "
                         f"{s['occupations_differing']} with lost captions whose gender indicators differ "
                         f"(q &lt; {summary.get('alpha')})")
    shown = table.copy()
    for side, cols in (("lost", LR.LOST_CLASS), ("kept", LR.KEPT_CLASS)):
        total = shown[list(cols.values())].sum(axis=1)
        shown[f"% female indicators, {side}"] = (100 * shown[cols[CaptionGender.FEMALE]] / total.where(total > 0)).round(1)
    shown["% lost"] = (100 * shown[LR.LOST_SHARE]).round(1)
    cols = [OCCUPATION, SUBSET, LR.CAUSE, LR.CAPTIONS, LR.LOST, "% lost", "% female indicators, lost",
            "% female indicators, kept", LR.METHOD, LR.P_VALUE, LR.Q_VALUE, LR.DIFFERS]
    flagged = shown[shown[LR.DIFFERS].eq(True)]
    head = ("<h2>Images T could not see (link rot)</h2><p>T is over the training images that could be obtained. "
            "Per occupation and approach: the share of walked captions whose image could not be obtained (a dead "
            "link, a timeout, an opt-out; with --training-images also a URL the shards lack), and a test of whether "
            "those captions differ from the kept ones in their gender indicators (chi-squared, or its Monte Carlo "
            f"permutation version on small counts; {H.esc(summary.get('correction'))}, "
            f"alpha {summary.get('alpha')}). A flagged occupation's T may be biased by what was lost. All rows in "
            "link_rot.csv.</p><ul>" + "".join(f"<li>{line}</li>" for line in lines) + "</ul>")
    if len(flagged):
        head += (f"<p class=warn>{len(flagged)} (occupation, approach) group(s) lost captions whose gender "
                 f"indicators differ from the kept ones'.</p>" + H.table(flagged[cols], 3))
    return head + Pg.details(f"Lost captions per occupation and approach ({len(shown)} rows)", H.table(shown[cols], 3))


def walk_html(walk: dict | None) -> str:
    """Section 4's training sample: how far each group's walk to k counted images went."""
    if not walk:
        return ""
    if not walk.get("walked"):
        return ("<h2>Training sample (section 4)</h2><p>T is over the first k captions per occupation, whatever "
                "their images gave (training_sample: captions); the paper's T is over k counted images "
                "(--training-sample counted_images).</p>")
    short = walk.get("short", [])
    random_walked, nn_walked = walk["training_sample"] == "counted_images", walk["nn_sample"] == "counted_images"
    what = ("T is over k counted images per occupation (exactly one face, CLIP p at or above the threshold), the "
            "paper's 500: each occupation's random captions were walked in sample_key order until k counted images"
            if random_walked else "T is over the first k random captions per occupation (--training-sample captions)")
    if nn_walked:
        what += "; each prompt's NN captions were walked in similarity order until k counted images"
    head = (f"<h2>Training sample (section 4)</h2><p>{what}. {walk['groups']} walked group(s), "
            f"{walk['captions_walked']:,} captions walked to {walk['counted_images']:,} counted images in "
            f"{walk['rounds']} round(s); per group in training_walk.csv.</p>")
    if not short:
        return head + "<p>Every group reached k counted images.</p>"
    table = pd.DataFrame(short)[["occupation", "subset", "prompt_id", "target", "walked_captions", "counted_images",
                                 "shortfall", "pool_rows"]].rename(columns={"pool_rows": "captions fetched"})
    return head + (f"<p class=warn>{len(short)} group(s) fell short of k counted images: every caption available "
                   f"(or the walk's limit, max_walk_factor x k) was walked. Their T is over fewer images.</p>"
                   + H.table(table, 0))


def summary_html(source: str, result: dict, *, figures: _figures.FigureDir | None = None) -> str:
    """Figure 3-style scatter plots (training vs generated % female), one per model and prompt
    (PDF + PNG under ``figures/`` beside the page when ``figures`` is a ``FigureDir``; embedded in
    the page either way)."""
    sink = _figures.sink(figures)
    labels = Pg.model_labels(result)
    parts = [f"<h1>Bias amplification from {H.esc(source)}</h1>",
             "<p>Shaded red: amplification; green: de-amplification; the dashed diagonal is no amplification; "
             "excluded occupations are not drawn. Each figure is also saved as PDF and PNG under figures/.</p>"]
    for model, res in result.items():
        name = Pg.label(labels, model)
        parts.append(f"<h2>{H.esc(name)}: average E[A] = "
                     f"{interval_text(res['average'], res.get('average_low'), res.get('average_high'))}</h2>")
        if "average_low" in res:
            parts.append("<p>E[A] per prompt [interval: bootstrap over occupations]: " + "; ".join(
                H.esc(f"{p['group']}: {interval_text(p['expected_amplification'], p.get('low'), p.get('high'))}")
                for p in res["per_prompt"]) + ".</p>")
        parts.append("<div class=figs>")
        for p in res["per_prompt"]:
            pts = [(r["training"], r["generated"], r["occupation"]) for r in res["rows"]
                   if r["group"] == p["group"] and r["excluded"] is None]
            ea = "n/a" if p["expected_amplification"] is None else f"{p['expected_amplification']:.2f}"
            parts.append(_scatter_html(sink, f"{name}_prompt_{p['group']}",
                                       [(pts, f"{p['group']}: E[A] = {ea} ({p['occupations']} occupations)")]))
        parts.append("</div>")
    return Pg.document("Amplification", parts)

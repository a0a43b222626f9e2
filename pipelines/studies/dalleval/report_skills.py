"""report.html of `dalleval.py skills` (paper 000, section 4.1, section 5.2): Table 2-shaped
accuracies with the number of images behind each first, Figure 5-shaped plots (a: per count /
relation, b: per task), example images per skill with the detected boxes drawn (an SVG overlay in
image-relative coordinates on a downscaled copy of the saved image, embedded in the page), and the
per-split table collapsed."""

from __future__ import annotations

import pandas as pd

from pipelines.engine.report import figures as _figures
from pipelines.engine.stats import headline as HL
from pipelines.engine.report import html as H
from pipelines.engine.report import page as Pg
from pipelines.engine.storage.checkpoint import model_dir
from pipelines.studies.dalleval import skills as K
from pipelines.studies.dalleval.report import model_bars
from pipelines.engine.report.page import COLORS
from schemas import paintskills as P
from schemas.dalleval import interval_columns
from schemas.images import IMAGE_ID
from schemas.images import GENERATION_STATUS, MODEL, SEED, GenerationStatus
from schemas.subsets import PROMPT

BOX_COLORS = ("#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#42d4f4", "#f032e6", "#9a6324")


def _table(df: pd.DataFrame, digits: int = 1, labels: dict | None = None) -> str:
    return H.table(Pg.relabel(df, labels or {}), digits, na="-")


def split_figure(splits: pd.DataFrame, skill: str, title: str, labels: dict | None = None):
    """Figure 5 (a): grouped bars, one group per split value, one bar per model (its label)."""
    d = splits[splits["skill"] == skill]
    models = list(dict.fromkeys(d["model"]))
    values = list(dict.fromkeys(d[P.SPLIT]))
    fig = _figures.new_figure(max(3.2, 0.9 * len(values) + 1.5), 2.6)
    ax = fig.add_subplot(1, 1, 1)
    width = 0.8 / max(1, len(models))
    for i, m in enumerate(models):
        mine = d[d["model"] == m].set_index(P.SPLIT)
        ys = [float(mine.loc[v, "accuracy"]) if v in mine.index and pd.notna(mine.loc[v, "accuracy"]) else 0.0
              for v in values]
        ax.bar([j + i * width - 0.4 + width / 2 for j in range(len(values))], ys, width=width,
               color=COLORS[i % len(COLORS)], label=Pg.label(labels or {}, m))
    ax.set_xticks(range(len(values)), [v.split("=", 1)[1] for v in values], fontsize=7)
    ax.set_ylim(0, 100)
    ax.set_ylabel("accuracy (%)", fontsize=7)
    ax.set_title(title, fontsize=8)
    ax.tick_params(axis="y", labelsize=7)
    if len(models) > 1:
        ax.legend(fontsize=6, frameon=False)
    return fig


def task_figure(tasks: pd.DataFrame, labels: dict | None = None):
    """Figure 5 (b): per skill, the first sub-task alone and both together, one bar per model."""
    keys = [(s, t) for s, ts in K.TASKS.items() for t, _ in ts]
    models = list(dict.fromkeys(tasks["model"]))
    fig = _figures.new_figure(6.0, 2.6)
    ax = fig.add_subplot(1, 1, 1)
    width = 0.8 / max(1, len(models))
    for i, m in enumerate(models):
        mine = tasks[tasks["model"] == m].set_index(["skill", P.TASK])
        ys = [float(mine.loc[k, "accuracy"]) if k in mine.index and pd.notna(mine.loc[k, "accuracy"]) else 0.0
              for k in keys]
        ax.bar([j + i * width - 0.4 + width / 2 for j in range(len(keys))], ys, width=width,
               color=COLORS[i % len(COLORS)], label=Pg.label(labels or {}, m))
    ax.set_xticks(range(len(keys)), [f"{s}:\n{t}" for s, t in keys], fontsize=6)
    ax.set_ylim(0, 100)
    ax.set_ylabel("accuracy (%)", fontsize=7)
    ax.set_title("Per task (Fig. 5b): 1) alone vs 1) + 2)", fontsize=8)
    ax.tick_params(axis="y", labelsize=7)
    if len(models) > 1:
        ax.legend(fontsize=6, frameon=False)
    return fig


def boxes_svg(labels, scores, boxes, threshold: float) -> str:
    """The detections above ``threshold`` as an SVG overlay in image-relative coordinates."""
    parts = ["<svg viewBox='0 0 1 1' preserveAspectRatio='none' style='position:absolute;left:0;top:0;"
             "width:100%;height:100%'>"]
    def seq(v):
        return [] if v is None else list(v)

    for k, (label, score, box) in enumerate(zip(seq(labels), seq(scores), seq(boxes))):
        if score is None or score <= threshold or box is None:
            continue
        x0, y0, x1, y1 = (float(v) for v in box)
        c = BOX_COLORS[k % len(BOX_COLORS)]
        parts.append(f"<rect x='{x0:.4f}' y='{y0:.4f}' width='{max(x1 - x0, 0):.4f}' height='{max(y1 - y0, 0):.4f}' "
                     f"fill='none' stroke='{c}' stroke-width='0.012'/>"
                     f"<text x='{x0 + 0.01:.4f}' y='{y0 + 0.06:.4f}' font-size='0.06' fill='{c}'>"
                     f"{H.esc(label)} {score:.2f}</text>")
    parts.append("</svg>")
    return "".join(parts)


def examples_html(images: pd.DataFrame, model: str, skill: str, k: int, images_dir: str | None,
                  threshold: float, sink=None) -> str:
    """Up to ``k`` judged images of ``model`` and ``skill``, correct and wrong ones alternating; each
    saved image (``<images_dir>/<model dir>/<image id>.png`` of the run) embedded through
    ``sink.image`` with its boxes drawn over it."""
    mine = images[(images[MODEL] == model) & (images[P.SKILL] == skill)
                  & (images[GENERATION_STATUS] == GenerationStatus.OK) & images[P.CORRECT].notna()]
    right, wrong = mine[mine[P.CORRECT].astype(bool)], mine[~mine[P.CORRECT].astype(bool)]
    picked = []
    for a, b in zip(list(right.itertuples(index=False)) + [None] * k, list(wrong.itertuples(index=False)) + [None] * k):
        picked += [r for r in (a, b) if r is not None]
        if len(picked) >= k or (a is None and b is None):
            break
    if not picked:
        return "<p>No judged image.</p>"
    cols = list(mine.columns)
    cells = []
    for tup in picked[:k]:
        r = dict(zip(cols, tup))
        img = ""
        uri = sink.image(f"{images_dir}/{model_dir(model)}/{r[IMAGE_ID]}.png") if images_dir and sink else None
        if uri:
            img = (f"<div style='position:relative;width:180px;height:180px;display:inline-block'>"
                   f"<img src='{H.esc(uri)}' alt='{H.esc(r[IMAGE_ID])}' style='width:180px;height:180px'>"
                   f"{boxes_svg(r[P.DET_LABELS], r[P.DET_SCORES], r[P.DET_BOXES], threshold)}</div><br>")
        verdict = "correct" if r[P.CORRECT] else "wrong"
        extra = ""
        if skill == P.Skill.COUNT:
            extra = f"; {r[P.PREDICTED_COUNT]} detected"
        elif skill == P.Skill.SPATIAL:
            extra = f"; relation {r[P.PREDICTED_RELATION] or 'n/a (objects missing)'}"
        cells.append(f"<td style='text-align:center;vertical-align:top;width:190px'>{img}<small>"
                     f"{H.esc(r[PROMPT])}<br><b>{verdict}</b>{H.esc(extra)}; seed {int(r[SEED])}</small></td>")
    return H.scroll("<table class='ex'><tr>" + "".join(cells) + "</tr></table>")


def _behind(meta: dict, images, labels: dict) -> list[str]:
    sizes = meta["sizes"]
    out = [f"{sizes[P.Skill.OBJECT]:,} object, {sizes[P.Skill.COUNT]:,} count and {sizes[P.Skill.SPATIAL]:,} "
           f"spatial prompts ({H.esc(meta['templates'])} templates), one image each from "
           f"{Pg.plural(len(meta['models']) or len(labels), 'generator')} ({H.esc(', '.join(labels.values()))})"]
    judged = K.judged_counts(images)
    n, ok = sum(v["images"] for v in judged.values()), sum(v["judged"] for v in judged.values())
    out.append(f"{ok:,} of {n:,} images judged (" + ", ".join(f"{s} {v['judged']:,}/{v['images']:,}"
                                                               for s, v in judged.items()) + ")")
    out.append(f"{n - ok:,} left out (no image: generation failed or blocked)" if n > ok else "none left out")
    thr = float(meta["detector"]["threshold"])
    out.append(f"detector {H.esc(Pg.model_name(meta['detector']['model']))}, detections counted above {thr:g}")
    return out


def render_html(meta: dict, images, results: dict, records: list[dict], *,
                figures: _figures.FigureDir | None = None) -> str:
    """report.html of a skills run: Table 2 first with the images behind it, then Figure 5 (PDF + PNG
    under ``figures/`` of the run when ``figures`` is a ``FigureDir``; embedded in the page either
    way), examples with their boxes, the per-split table collapsed, and the models."""
    sink = _figures.sink(figures)
    df = images.to_pandas()
    thr = float(meta["detector"]["threshold"])
    labels = Pg.model_labels(meta.get("models", []), results["table2"]["model"], df[MODEL] if len(df) else [])
    parts = Pg.run_page_top("DALL-Eval visual reasoning skills (paper 000, PaintSkills)", meta, records,
                            "The generators and the detector are tiny random-weight stand-ins; the run "
                            "only exercises the pipeline.")
    lead = ("<p class=lead>Skill accuracy (Table 2 shape): % of judged images whose detections satisfy the skill's "
            "rule (section 4.1); <i>n_*</i>: images behind each figure; <i>average</i>: mean over the skills.</p>"
            + _table(results["table2"], 1, labels)
            + "<p class='warn'>The detector is used <b>zero-shot</b> with its COCO weights. The paper fine-tuned "
              "DETR (and the generators) on PaintSkills' simulator images, which are not public, so these "
              "accuracies measure the models as released against a COCO detector, not the paper's Table 2 "
              "setting.</p>")
    h = meta.get("headline")
    parts.append(Pg.headline((HL.summary_table(h) if h else "") + lead,
                             (HL.behind_items(h) if h else []) + _behind(meta, images, labels),
                             title="Headline numbers"))
    parts.append(f"<p>Run <code>{H.esc(meta['run_id'])}</code>; results in <code>{H.esc(meta['output'])}</code>.</p>")
    ref = K.table2(K.reference_rows())
    parts.append("<p>The paper's Table 2 (fine-tuned DETR and fine-tuned generators), for orientation only:</p>"
                 + _table(ref.drop(columns=["skills_averaged"]), 1))
    splits, tasks = results["splits"], results["tasks"]
    parts.append("<h2>Per split (Figure 5a) and per task (Figure 5b)</h2><div class=figs>")
    if (splits["skill"] == P.Skill.COUNT).any():
        parts.append(sink.save(split_figure(splits, P.Skill.COUNT, "Count accuracy per N (Fig. 5a)", labels),
                               "figure5a_count", alt="count accuracy per N"))
    if (splits["skill"] == P.Skill.SPATIAL).any():
        parts.append(sink.save(split_figure(splits, P.Skill.SPATIAL, "Spatial accuracy per relation (Fig. 5a)",
                                            labels), "figure5a_spatial", alt="spatial accuracy per relation"))
    if len(tasks):
        parts.append(sink.save(task_figure(tasks, labels), "figure5b_tasks", alt="per-task accuracy"))
    parts.append("</div>")
    if len(tasks):
        parts.append(_table(tasks, 1, labels))
    parts.append("<h2>Examples</h2><p>Detections above the threshold drawn on the generated images.</p>")
    for model in dict.fromkeys(df[MODEL]) if len(df) else []:
        for skill in P.Skill.ALL:
            if (df[(df[MODEL] == model)][P.SKILL] == skill).any():
                parts.append(f"<h3>{H.esc(Pg.label(labels, model))}: {skill}</h3>")
                parts.append(examples_html(df, model, skill, int(meta.get("examples", 6)), meta.get("images_dir"),
                                           thr, sink))
    parts.append("<h2>Per split</h2>" + Pg.details(f"Table: accuracy per split ({len(splits)} rows)",
                                                    _table(splits, 1, labels)))
    parts.append("<h2>Models</h2>" + H.model_table(records, labels))
    return Pg.document(f"DALL-Eval PaintSkills report {meta['run_id']}", parts)


def summary_html(source: str, table: pd.DataFrame, *, figures: _figures.FigureDir | None = None) -> str:
    """The `summarize --skills` page: Table 2 (``skills.table2``: accuracy per skill, their average,
    images behind each where known), then a bar chart per skill and for the average, one bar per
    model; PDF + PNG under ``figures/`` beside the page when ``figures`` is a ``FigureDir``, embedded
    in the page either way."""
    sink = _figures.sink(figures)
    labels = Pg.model_labels(table["model"])
    parts = [f"<h1>DALL-Eval visual reasoning skills (Table 2) from {H.esc(source)}</h1>",
             "<p>Accuracy (%) per skill (section 4.1) and their <i>average</i> over the skills each model has "
             "(<i>skills_averaged</i>); <i>n_*</i>: images behind each figure, where given"
             + ("; <i>*_low</i>, <i>*_high</i>: the bootstrap interval over those images (round(accuracy x n / 100) "
                "correct)" if any(interval_columns(str(c))[1] in table.columns for c in table.columns) else "")
             + ". Each chart is also saved as PDF and PNG under figures/.</p>",
             _table(table, 1, labels), "<div class=figs>"]
    for skill in [*P.Skill.ALL, "average"]:
        if skill not in table.columns or table[skill].isna().all():
            continue
        values = [(Pg.label(labels, m), v) for m, v in zip(table["model"], table[skill])]
        fig, drawn = model_bars(values, f"{skill} accuracy per model" if skill != "average"
                                else "average accuracy over the skills", "accuracy (%)", ylim=(0, 100))
        parts.append(sink.save(fig, f"skill_{skill}", alt=f"{skill} accuracy per model: {drawn} bars"))
    parts.append("</div>")
    return Pg.document("DALL-Eval skills summary", parts)

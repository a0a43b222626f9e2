"""The objects and dependency-group half of the Exposed report (paper 004, sections 5-7, App. F):
Table 4, the chi-square tests, Figure 2- and Figure 5-shaped bias-score plots, Tables S4-S6 and
S8-S10, and example images with their object masks and word heat maps overlaid."""

from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd
from PIL import Image

from operators.support import rle
from pipelines.engine.report import figures as _figures
from pipelines.engine.report import html as H
from pipelines.engine.report import page as Pg
from pipelines.studies.exposed import headline_metrics as HM
from pipelines.studies.exposed import objects as O
from pipelines.engine.report.page import COLORS
from schemas import exposed as S
from schemas.images import GENERATION_STATUS, MODEL, GenerationStatus
from schemas.subsets import PROMPT

GROUP_LABELS = {S.DependencyGroup.EXPLICITLY_GUIDED: "explicitly guided",
                S.DependencyGroup.IMPLICITLY_GUIDED: "implicitly guided",
                S.DependencyGroup.EXPLICITLY_INDEPENDENT: "explicitly independent",
                S.DependencyGroup.IMPLICITLY_INDEPENDENT: "implicitly independent",
                S.DependencyGroup.HIDDEN: "hidden", O.NOUNS: "nouns"}
GROUP_COLORS = {S.DependencyGroup.EXPLICITLY_GUIDED: "#1b9e77", S.DependencyGroup.IMPLICITLY_GUIDED: "#d95f02",
                S.DependencyGroup.EXPLICITLY_INDEPENDENT: "#7570b3", S.DependencyGroup.IMPLICITLY_INDEPENDENT: "#e7298a"}


def _table(df: pd.DataFrame, digits: int = 3, labels: dict | None = None) -> str:
    return H.table(Pg.relabel(df, labels or {}), digits, na="-")


def _list(x) -> list:
    """A list cell as pandas gives it (None, list or numpy array) as a list."""
    return [] if x is None else list(x)


def _p(p: float) -> str:
    return "-" if pd.isna(p) else ("<1e-5" if p < 1e-5 else f"{p:.3g}")


def chi2_wide(tests: pd.DataFrame, by_group: bool) -> pd.DataFrame:
    """p-values in the paper's layout: one row per (model, source, comparison), one column per group
    (Tables S4-S6) or a single p-value column (section 5)."""
    if tests.empty:
        return tests
    t = tests.assign(p=tests[S.P_VALUE].map(_p))
    if S.TEST_NOT_RUN in t:   # a test not run (fewer objects than the rule asks): say why instead of a p-value
        t["p"] = [f"not run: {r}" if isinstance(r, str) else p for p, r in zip(t["p"], t[S.TEST_NOT_RUN])]
    if not by_group:
        return t[[MODEL, S.TRIPLET_SOURCE, "comparison", S.CHI2, S.DOF, "objects", "p"]]
    wide = t.pivot_table(index=[MODEL, S.TRIPLET_SOURCE, "comparison"], columns=S.DEPENDENCY_GROUP, values="p",
                         aggfunc="first", sort=False)
    return wide.reindex(columns=[g for g in S.DependencyGroup.ALL if g in wide.columns]).rename(
        columns=GROUP_LABELS).reset_index()


def bias_figure(scores: pd.DataFrame, model: str, source: str, top: int, title: str):
    """Figure 2 / 5 shape: the ``top`` objects most skewed toward each side (individuals left out),
    horizontal bars of BS(o) with the balance line at 0.5; None when nothing is left."""
    d = scores[(scores[MODEL] == model) & (scores[S.TRIPLET_SOURCE] == source) & ~scores["individual"]]
    d = d.sort_values(S.BIAS_SCORE, kind="stable")
    if d.empty:
        return None
    shown = pd.concat([d.head(top), d.tail(top)]).drop_duplicates(S.OBJECT).sort_values(S.BIAS_SCORE, kind="stable")
    fig = _figures.new_figure(5.0, 0.18 * len(shown) + 1.0)
    ax = fig.add_subplot(1, 1, 1)
    colors = [COLORS[0] if v > 0.5 else COLORS[1] for v in shown[S.BIAS_SCORE]]
    ax.barh(range(len(shown)), shown[S.BIAS_SCORE], color=colors)
    ax.axvline(0.5, color="#2ca02c", lw=1)
    ax.set_yticks(range(len(shown)), shown[S.OBJECT], fontsize=6)
    ax.set_xlim(0, 1)
    ax.set_xlabel("BS(o): 0 feminine only, 1 masculine only", fontsize=7)
    ax.tick_params(axis="x", labelsize=6)
    ax.set_title(title, fontsize=8)
    return fig


def top_objects_figure(top: pd.DataFrame, model: str, source: str, title: str):
    """Figure 4 shape: one panel per dependency group, its most frequent objects (individuals left
    out) as horizontal bars of their counts; None when no group has an object."""
    d = top[(top[MODEL] == model) & (top[S.TRIPLET_SOURCE] == source)]
    groups = [g for g in S.DependencyGroup.ALL if (d[S.DEPENDENCY_GROUP] == g).any()]
    if not groups:
        return None
    rows = max(int((d[S.DEPENDENCY_GROUP] == g).sum()) for g in groups)
    fig = _figures.new_figure(2.0 * len(groups), 0.16 * rows + 1.0)
    for i, g in enumerate(groups, start=1):
        mine = d[d[S.DEPENDENCY_GROUP] == g].sort_values(S.OBJECT_RANK, ascending=False)
        ax = fig.add_subplot(1, len(groups), i)
        ax.barh(range(len(mine)), mine[S.OBJECT_COUNT], color=GROUP_COLORS.get(g, "#666666"))
        ax.set_yticks(range(len(mine)), mine[S.OBJECT], fontsize=6)
        ax.tick_params(axis="x", labelsize=6)
        ax.set_title(GROUP_LABELS[g], fontsize=7)
    fig.suptitle(title, fontsize=8)
    return fig


def _overlay_masks(ax, image, masks, labels, groups):
    ax.imshow(image)
    overlay = np.zeros((*image.shape[:2], 4))
    for m, g in zip(masks, groups):
        rgb = np.array([int(GROUP_COLORS.get(g, "#888888")[i:i + 2], 16) / 255 for i in (1, 3, 5)])
        overlay[m] = [*rgb, 0.45]
    ax.imshow(overlay)
    ax.set_title(f"{len(masks)} objects by group", fontsize=6)
    ax.axis("off")


# the longest side an example panel keeps of its image and masks: a panel is 1.6 inches wide, 240 px in the
# PNG (figures.DPI); a 1024 px image drawn there is resampled anyway, and embedded whole in the PDF
# (a project choice: larger images are reduced by an integer factor, box-averaged; masks by striding)
EXAMPLE_PIXELS = 320


def _reduced(image: np.ndarray, step: int) -> np.ndarray:
    """``image`` (H x W x 3 uint8) reduced ``step`` times on each side by box averaging."""
    return image if step <= 1 else np.asarray(Image.fromarray(image).reduce(step))


def example_figure(row: dict, image: np.ndarray | None):
    """One image: its object masks coloured by group, then each noun's heat map with its mask's outline
    (images over ``EXAMPLE_PIXELS`` drawn reduced, with their masks)."""
    if image is not None:
        h, w = image.shape[:2]
    else:   # no saved image: the size from a mask's RLE (square images only; else no figure)
        rles = _list(row.get(S.OBJECT_MASKS)) + _list(row.get(S.ATTENTION_MASKS))
        if not rles:
            return None
        n = int(sum(rles[0]))
        side = int(round(n ** 0.5))
        if side * side != n:
            return None
        h = w = side
    step = -(-max(h, w) // EXAMPLE_PIXELS)
    base = _reduced(image if image is not None else np.full((h, w, 3), 200, np.uint8), step)
    words = _list(row.get(S.ATTENTION_WORDS))
    fig = _figures.new_figure(1.6 * (1 + len(words)), 1.9)
    ax = fig.add_subplot(1, 1 + len(words), 1)
    masks = [rle.decode(m, h, w)[::step, ::step] for m in _list(row.get(S.OBJECT_MASKS))]
    _overlay_masks(ax, base, masks, _list(row.get(S.OBJECT_LABELS)), _list(row.get(S.OBJECT_GROUPS)))
    heats, word_masks = _list(row.get(S.ATTENTION_MAPS)), _list(row.get(S.ATTENTION_MASKS))
    for k, (word, heat, mask) in enumerate(zip(words, heats, word_masks)):
        ax = fig.add_subplot(1, 1 + len(words), k + 2)
        ax.imshow(base)
        side = S.ATTENTION_MAP_SIZE
        ax.imshow(np.frombuffer(heat, np.uint8).reshape(side, side), cmap="jet", alpha=0.5,
                  extent=(0, base.shape[1], base.shape[0], 0), interpolation="bicubic")
        ax.contour(rle.decode(mask, h, w)[::step, ::step], levels=[0.5], colors="white", linewidths=0.6)
        ax.set_title(f"'{word}'", fontsize=6)
        ax.axis("off")
    return fig


def _examples(images: pd.DataFrame, model: str, source: str, k: int, sink, load_image, name: str) -> list[str]:
    mine = images[(images[MODEL] == model) & (images[S.TRIPLET_SOURCE] == source)
                  & (images[GENERATION_STATUS] == GenerationStatus.OK)
                  & (images[S.DETECTION_STATUS] == S.DetectionStatus.OK)]
    parts = []
    for unit in list(dict.fromkeys(mine[S.UNIT_ID]))[:k]:
        for _, r in mine[mine[S.UNIT_ID] == unit].iterrows():
            row = r.to_dict()
            fig = example_figure(row, load_image(model, row[S.IMAGE_ID]) if load_image else None)
            if fig is None:
                continue
            groups = {}
            for lab, g in zip(_list(row[S.OBJECT_LABELS]), _list(row[S.OBJECT_GROUPS])):
                groups.setdefault(GROUP_LABELS[g], []).append(lab)
            groups[GROUP_LABELS[S.DependencyGroup.HIDDEN]] = _list(row[S.HIDDEN_NOUNS])
            caption = (f"{row[S.VARIANT]}: {row[PROMPT]} | nouns: {', '.join(_list(row[S.PROMPT_NOUNS]))} | "
                       + "; ".join(f"{g}: {', '.join(v) or '-'}" for g, v in groups.items()))
            parts.append(sink.save(fig, f"objects_{name}_{row[S.IMAGE_ID]}", alt=caption, caption=caption))
    return parts


def render_html(t: dict, images: pd.DataFrame, sink, *, top: int = 10, examples: int = 2,
                load_image: Callable | None = None, labels: dict | None = None) -> str:
    """The report's sections 5-7 part; ``load_image(model, image_id)`` gives a saved image (or None);
    models by ``labels`` (default: ``page.model_labels`` of the images' models)."""
    labels = labels if labels is not None else Pg.model_labels(images[MODEL] if MODEL in images else [])
    parts = ["<h2>Objects in the generated images (section 5)</h2><p>Open-vocabulary detection (prompt nouns + tag "
             "list), class-agnostic NMS, one SAM mask per box. C(o, P) counts every detected instance (Eq. 3); "
             "|P| is the analysed images of each prompt set.</p>"]
    parts.append("<h3>Co-occurrence similarity s<sub>O</sub> (Table 4)</h3><p>Mean cosine of the per-image "
                 "object-count vectors of corresponding images (Eq. 4); <i>both_empty</i>: pairs where nothing was "
                 "detected in either image, left out of the mean.</p>")
    parts.append(_table(HM.interval_cells(t["cooccurrence_similarity"], (S.S_O,)), 3, labels))
    parts.append("<h3>Chi-square tests on object counts (RQ2)</h3><p>Pearson's test of independence on the "
                 "variants x objects table of each comparison; <i>objects</i>: columns of the table.</p>")
    parts.append(_table(chi2_wide(t["object_chi2"], False), 3, labels))
    scores, floors = t["bias_scores"], t["min_count"]
    parts.append("<h3>Bias scores (Figure 2)</h3><p>BS(o) (Eq. 5), 1 = masculine prompts only, 0 = feminine only. "
                 f"Objects whose larger count is below the minimum ({H.esc(', '.join(f'{k} {v}' for k, v in floors.items()))})"
                 " are left out; the plots leave out individuals (person, people, woman, man, girl, boy, ...); "
                 "all scores are in bias_scores.csv.</p>")
    parts += _bias_plots(scores, top, "BS", sink, "bias", labels)
    parts.append("<h2>Prompt-image dependency groups (section 6, App. F)</h2><p>Each detected object is "
                 "<i>explicit</i> when it is a prompt noun and <i>guided</i> when a noun's attention mask (DAAM heat "
                 "map binarised at θ) covers its mask by more than σ (lower σ when both refer to humans); prompt "
                 "nouns no object matches are <i>hidden</i>.</p>")
    top_objects = t.get("top_objects")
    if top_objects is not None:
        parts.append("<h3>Most frequent objects per group (Figure 4)</h3><p>The most frequent objects of each "
                     "dependency group, summed over the three variants; individuals (person, people, women, woman, "
                     "men, man, female, male, girl, boy) removed as footnote 8 says; the hidden group counts "
                     "hidden nouns. Data: figure4_top_objects.csv (all counts: group_counts.csv).</p>")
        if top_objects.empty:
            parts.append("<p>No object outside the individuals was found.</p>")
        figs = []
        for model in dict.fromkeys(top_objects[MODEL]):
            for source in dict.fromkeys(top_objects[top_objects[MODEL] == model][S.TRIPLET_SOURCE]):
                name = Pg.label(labels, model)
                fig = top_objects_figure(top_objects, model, source, f"{name} / {source}")
                if fig is not None:
                    figs.append(sink.save(fig, f"figure4_{name}_{source}",
                                          alt="the most frequent objects of each dependency group"))
        parts.append("<div class=figs>" + "".join(figs) + "</div>")
    parts.append("<h3>Chi-square tests per group (Tables S4-S6)</h3>"
                 + _table(chi2_wide(t["group_chi2"], True), 3, labels))
    parts.append("<h3>Images holding each group, % (Table S8)</h3>"
                 + _table(t["group_images"].rename(columns=GROUP_LABELS), 2, labels))
    parts.append("<h3>Distinct objects per group and nouns (Table S9)</h3>"
                 + _table(t["group_objects"].rename(columns=GROUP_LABELS), 0, labels))
    parts.append("<h3>Intersection ratios, % of the row's group (Table S10)</h3>"
                 + _table(t["group_intersections"].assign(over=t["group_intersections"]["over"].map(GROUP_LABELS))
                          .rename(columns=GROUP_LABELS), 2, labels))
    gb = t["group_bias_scores"]
    parts.append("<h3>Bias scores on the implicit groups (Figure 5)</h3>")
    for group in (S.DependencyGroup.IMPLICITLY_GUIDED, S.DependencyGroup.IMPLICITLY_INDEPENDENT):
        mine = gb[gb[S.DEPENDENCY_GROUP] == group] if not gb.empty else gb
        parts += _bias_plots(mine, top, GROUP_LABELS[group], sink, f"bias_{group}", labels)
    parts.append("<h3>Examples: object masks by group, word heat maps with their masks</h3><p>Colours: "
                 + ", ".join(f"<span style='color:{c}'>{GROUP_LABELS[g]}</span>" for g, c in GROUP_COLORS.items())
                 + "; heat maps are the stored 64 x 64 previews, outlines the nouns' masks.</p>")
    analysed = images[images[S.DETECTION_STATUS].notna()] if S.DETECTION_STATUS in images else images.iloc[:0]
    for model in dict.fromkeys(analysed[MODEL]):
        for source in dict.fromkeys(analysed[analysed[MODEL] == model][S.TRIPLET_SOURCE]):
            parts.append(f"<h4>{H.esc(Pg.label(labels, model))} / {H.esc(source)}</h4>")
            parts.append("<div class=figs>" + "".join(_examples(analysed, model, source, examples, sink, load_image,
                                                                Pg.label(labels, model))) + "</div>")
    return "".join(parts)


def _bias_plots(scores: pd.DataFrame, top: int, what: str, sink, stem: str, labels: dict | None = None) -> list[str]:
    if scores.empty:
        return ["<p>No object reaches the minimum count.</p>"]
    parts = []
    for model in dict.fromkeys(scores[MODEL]):
        name = Pg.label(labels or {}, model)
        for source in dict.fromkeys(scores[scores[MODEL] == model][S.TRIPLET_SOURCE]):
            fig = bias_figure(scores, model, source, top, f"{name} / {source}: {what}")
            if fig is None:
                parts.append(f"<p>{H.esc(name)} / {H.esc(source)}: only individuals left.</p>")
                continue
            parts.append(sink.save(fig, f"{stem}_{name}_{source}",
                                   alt=f"{what}: objects toward feminine (orange) and masculine (blue)"))
    return ["<div class=figs>" + "".join(p for p in parts if p.startswith("<figure")) + "</div>"] + \
        [p for p in parts if not p.startswith("<figure")]


def format_results(t: dict, standin: bool = False) -> str:
    """Printed after the run: Table 4 and the number of scored objects (models by their short
    labels); a stand-in run's notice last."""
    s = t["cooccurrence_similarity"]
    labels = Pg.model_labels(s[MODEL] if MODEL in s else [])
    lines = ["Objects (section 5): co-occurrence similarity s_O (Table 4), units behind each, pairs left out "
             "with nothing detected in either image"]
    for _, r in HM.interval_cells(s, (S.S_O,)).iterrows():
        value = r[S.S_O] if isinstance(r[S.S_O], str) else "-" if pd.isna(r[S.S_O]) else f"{r[S.S_O]:.3f}"
        lines.append(f"  {Pg.label(labels, r[MODEL])} / {r[S.TRIPLET_SOURCE]} ({r['pair']}): {value}  "
                     f"units {int(r['units'])}, both empty {int(r['both_empty'])}")
    lines.append(f"  {t['objects'].num_rows:,} object rows; {len(t['bias_scores']):,} bias scores above the minimum "
                 f"count; dependency groups in {len(t['group_images']):,} (model, source) rows")
    if standin:
        lines.append(Pg.STANDIN_CONSOLE)
    return "\n".join(lines)

"""report.html and the printed results of `exposed.py run` (papers 003/004, sections 3-4; sections 5-7 in
report_objects.py)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from pipelines.engine import figures as _figures
from pipelines.engine import html as H
from pipelines.engine.checkpoint import model_dir
from pipelines.studies.exposed import metrics as M
from pipelines.engine.page import COLORS, STYLE
from pipelines.engine.page import model_name as _short
from schemas import exposed as S
from schemas.images import GENERATION_STATUS, MODEL, SEED, GenerationStatus
from schemas.subsets import PROMPT

SPACE_LABELS = {S.Space.PROMPT: "prompt t", S.Space.DENOISING: "denoising z\u2080", S.Space.SSIM: "SSIM",
                S.Space.DIFF_PIX: "Diff. Pix. (%)", S.Space.RESNET: "ResNet", S.Space.CLIP: "CLIP",
                S.Space.DINO: "DINO", S.Space.SPLIT_PRODUCT: "split-product"}


def _table(df: pd.DataFrame, digits: int = 3) -> str:
    return H.table(df, digits, na="-", text=H.short_path)


def format_results(table3: pd.DataFrame, direction: pd.DataFrame) -> str:
    """Table 3-shaped text: per model and source, one line per pair, one column per space."""
    if table3.empty:
        return "No complete unit: no disparities (see the run summary)."
    spaces = [s for s in S.Space.ALL if s in table3.columns]
    lines = ["Representational disparities (Table 3 / S3): mean similarity per pair and space "
             "(Diff. Pix.: % differing pixels, lower = closer); units = (triplet, seed) units behind each row",
             f"{'model / source / pair':<48}" + "".join(f"{SPACE_LABELS[s][:12]:>13}" for s in spaces) + f"{'units':>8}"]
    for (model, source), g in table3.groupby([MODEL, S.TRIPLET_SOURCE], sort=False):
        lines.append(f"{_short(model)[:30]} / {source}")
        for _, r in g.iterrows():
            vals = "".join(f"{r[s]:>13.3f}" if not pd.isna(r[s]) else f"{'-':>13}" for s in spaces)
            lines.append(f"  ({r[S.PAIR]}){'':<{max(0, 44 - len(r[S.PAIR]))}}{vals}{int(r[S.UNITS]):>8}")
        d = direction[(direction[MODEL] == model) & (direction[S.TRIPLET_SOURCE] == source)]
        lines.append(f"  neutral closer to{'':<28}" + "".join(
            f"{str(d[d[S.SPACE] == s][M.CLOSER].iloc[0]) if (d[S.SPACE] == s).any() else '-':>13}" for s in spaces))
    return "\n".join(lines)


def space_bars(direction: pd.DataFrame, model: str, source: str):
    """Per-space bars of s(neutral, feminine) and s(neutral, masculine) for one model and source:
    each space in its own panel (their scales differ)."""
    d = direction[(direction[MODEL] == model) & (direction[S.TRIPLET_SOURCE] == source)]
    spaces = [s for s in S.Space.ALL if (d[S.SPACE] == s).any()]
    cols = 4
    rows = max(1, math.ceil(len(spaces) / cols))
    fig = _figures.new_figure(7.0, 1.8 * rows + 0.5)
    for i, space in enumerate(spaces):
        r = d[d[S.SPACE] == space].iloc[0]
        ax = fig.add_subplot(rows, cols, i + 1)
        vals = [r[M.NEUTRAL_FEMININE], r[M.NEUTRAL_MASCULINE]]
        ax.bar([0, 1], vals, color=[COLORS[1], COLORS[0]], width=0.6)
        finite = [v for v in vals if not pd.isna(v)]
        if finite:
            lo, hi = min(finite), max(finite)
            pad = max((hi - lo) * 0.6, abs(hi) * 0.01, 1e-3)
            ax.set_ylim(lo - pad, hi + pad)
        ax.set_xticks([0, 1], ["n\u2013f", "n\u2013m"], fontsize=7)
        ax.tick_params(axis="y", labelsize=6)
        ax.set_title(f"{SPACE_LABELS[space]}: {r[M.CLOSER]}", fontsize=7)
    fig.suptitle(f"{_short(model)} / {source}: neutral vs feminine (orange) and masculine (blue)", fontsize=8)
    return fig, len(spaces)


def example_units(images: pd.DataFrame, model: str, source: str, k: int) -> list[pd.DataFrame]:
    """Up to ``k`` complete units of (model, source), each its three rows in Variant order."""
    mine = images[(images[MODEL] == model) & (images[S.TRIPLET_SOURCE] == source)
                  & (images[S.UNIT_STATUS] == GenerationStatus.OK)]
    out = []
    for _, g in mine.groupby(S.UNIT_ID, sort=True):
        out.append(g.set_index(S.VARIANT).reindex(list(S.Variant.ALL)).reset_index())
        if len(out) >= k:
            break
    return out


def _examples_html(images: pd.DataFrame, model: str, source: str, k: int, images_dir: str | None) -> str:
    units = example_units(images, model, source, k)
    if not units:
        return "<p>No complete unit.</p>"
    parts = ["<table class='ex'>"]
    for u in units:
        cells = []
        for _, r in u.iterrows():
            img = (f"<img src='images/{H.esc(model_dir(model))}/{H.esc(r[S.IMAGE_ID])}.png' width=160><br>"
                   if images_dir and r[GENERATION_STATUS] == GenerationStatus.OK else "")
            cells.append(f"<td style='text-align:center;vertical-align:top'>{img}<small><b>{H.esc(r[S.VARIANT])}</b>: "
                         f"{H.esc(r[PROMPT])}</small></td>")
        sims = u.iloc[0]
        values = ", ".join(f"{SPACE_LABELS[s]} " + "/".join(f"{v:.3f}" for v in sims[S.disparity_column(s)])
                           for s in S.Space.ALL
                           if isinstance(sims.get(S.disparity_column(s)), (list, np.ndarray)))
        parts.append(f"<tr>{''.join(cells)}<td style='text-align:left;vertical-align:top'><small>unit "
                     f"{H.esc(sims[S.UNIT_ID])}, seed {int(sims[SEED])}<br>pairs n\u2013f / n\u2013m / f\u2013m: "
                     f"{H.esc(values)}</small></td></tr>")
    parts.append("</table>")
    return "".join(parts)


def render_html(meta: dict, data: dict, counts, records: list[dict], *,
                figures: _figures.FigureDir | None = None, examples: int = 3, extra=None) -> str:
    """report.html of an exposed run; figures as PDF + PNG under ``figures/`` (or inline)."""
    sink = _figures.sink(figures)
    table3, direction = data["table3"], data["direction"]
    images = data["images"].to_pandas()
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>Stable Diffusion Exposed report</title>", STYLE,
             "</head><body>", f"<h1>Stable Diffusion Exposed (papers 003/004): run {H.esc(meta['run_id'])}</h1>",
             f"<p>{meta['triplets']:,} triplets, {meta['units']:,} (triplet, seed) units, three images each, from "
             f"{len(meta['models'])} generator(s). Spaces: {H.esc(', '.join(meta['spaces']))}. "
             f"Results: {H.esc(meta['output'])}</p>"]
    if meta.get("standin"):
        parts.append("<p class='warn'><b>Stand-in models.</b> The generators and the image models are tiny "
                     "random-weight stand-ins: every number on this page is meaningless; the run only exercises the "
                     "pipeline.</p>")
    parts.append("<h2>Representational disparities (Tables 3 and S3)</h2><p>Mean similarity of corresponding images "
                 "(prompts, latents) of each pair over the units of a model and caption source (Eq. 1-2). Prompt "
                 "space: cosine of the text encoder's output sequence the UNet reads; denoising space: cosine of the "
                 "final latents z<sub>0</sub>; image space: mean SSIM, Diff. Pix. (% of pixels inside the contours "
                 "of the thresholded SSIM difference map; lower = closer), cosine of ResNet-50 logits, CLIP ViT-B/32 "
                 "image features and DINO ViT-S/16 class tokens, and split-product (DINO ViT-B/8 patch chunks). "
                 "<i>units</i>: the units behind each row.</p>")
    parts.append(_table(table3.rename(columns=SPACE_LABELS), 3))
    parts.append("<h2>RQ1: is the neutral set closer to the masculine set?</h2><p>Per model, source and space: "
                 "s(neutral, feminine), s(neutral, masculine), their gap (positive: closer to masculine) and the "
                 "answer.</p>")
    parts.append(_table(direction, 4))
    for model in dict.fromkeys(direction[MODEL]) if not direction.empty else []:
        for source in dict.fromkeys(direction[direction[MODEL] == model][S.TRIPLET_SOURCE]):
            fig, n = space_bars(direction, model, source)
            parts.append(sink.save(fig, f"spaces_{_short(model)}_{source}",
                                   alt=f"{_short(model)} / {source}: {n} spaces, neutral-feminine vs neutral-masculine"))
    parts.append("<h2>Example triplets</h2>")
    for model in dict.fromkeys(images[MODEL]) if len(images) else []:
        for source in dict.fromkeys(images[images[MODEL] == model][S.TRIPLET_SOURCE]):
            parts.append(f"<h3>{H.esc(_short(model))} / {H.esc(source)}</h3>")
            parts.append(_examples_html(images, model, source, examples, meta.get("images_dir")))
    if extra is not None:   # sections 5-7, rendered into the same figure sink
        parts.append(extra(sink))
    c = counts.to_pandas()
    parts.append("<h2>Triplet filter (Table S1)</h2><p>Captions read per source, kept as triplets or rejected with "
                 "the reason; human-word rows count the rejected captions containing each word.</p>")
    outcome_rows = c[c[S.HUMAN_WORD].isna()].pivot_table(index=S.TRIPLET_SOURCE, columns=S.TRIPLET_STATUS,
                                                         values=S.COUNT, aggfunc="sum", sort=False).reset_index()
    parts.append(_table(outcome_rows, 0))
    words = c[c[S.HUMAN_WORD].notna()].sort_values(S.COUNT, ascending=False).head(20)
    if len(words):
        parts.append("<p>Most frequent human words among the rejected captions:</p>" + _table(words, 0))
    parts.append("<h2>Models</h2>" + H.model_table(records))
    parts.append("</body></html>")
    return "".join(parts)

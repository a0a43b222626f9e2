"""report.html and the printed results of `exposed.py run` (papers 003/004, sections 3-4; sections 5-7 in
report_objects.py). The page opens with RQ1's answer per model, caption source and space and the
units behind it; example images are embedded (downscaled) so the page is one self-contained file."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from pipelines.engine.report import figures as _figures
from pipelines.engine.stats import headline as HL
from pipelines.engine.report import html as H
from pipelines.engine.report import page as Pg
from pipelines.engine.storage.checkpoint import model_dir
from pipelines.studies.exposed import headline_metrics as HM
from pipelines.studies.exposed.headline_metrics import SPACE_LABELS
from pipelines.studies.exposed import metrics as M
from pipelines.engine.report.page import COLORS
from schemas import exposed as S
from schemas.images import GENERATION_STATUS, MODEL, SEED, GenerationStatus
from schemas.subsets import PROMPT


def _table(df: pd.DataFrame, digits: int = 3, labels: dict | None = None) -> str:
    return H.table(Pg.relabel(df, labels or {}), digits, na="-")


def format_results(table3: pd.DataFrame, direction: pd.DataFrame, standin: bool = False) -> str:
    """Table 3-shaped text: per model (its short label) and source, one line per pair, one column per
    space, the column headers whole; a stand-in run's notice last."""
    if table3.empty:
        return "No complete unit: no disparities (see the run summary)." + (f"\n{Pg.STANDIN_CONSOLE}" if standin
                                                                           else "")
    labels = Pg.model_labels(table3[MODEL])
    spaces = [s for s in S.Space.ALL if s in table3.columns]
    w = max(len(SPACE_LABELS[s]) for s in spaces) + 2
    lead = max(len("model / source / pair"), len("neutral closer to") + 2,
               *(len(r) + 4 for r in table3[S.PAIR].astype(str))) + 2
    lines = ["Representational disparities (Table 3 / S3): mean similarity per pair and space "
             "(Diff. Pix.: % differing pixels, lower = closer); units = (triplet, seed) units behind each row",
             f"{'model / source / pair':<{lead}}" + "".join(f"{SPACE_LABELS[s]:>{w}}" for s in spaces) + f"{'units':>8}"]
    for (model, source), g in table3.groupby([MODEL, S.TRIPLET_SOURCE], sort=False):
        lines.append(f"{Pg.label(labels, model)} / {source}")
        for _, r in g.iterrows():
            vals = "".join(f"{r[s]:>{w}.3f}" if not pd.isna(r[s]) else f"{'-':>{w}}" for s in spaces)
            lines.append(f"{'  (' + str(r[S.PAIR]) + ')':<{lead}}{vals}{int(r[S.UNITS]):>8}")
        d = direction[(direction[MODEL] == model) & (direction[S.TRIPLET_SOURCE] == source)]
        lines.append(f"{'  neutral closer to':<{lead}}" + "".join(
            f"{str(d[d[S.SPACE] == s][M.CLOSER].iloc[0]) if (d[S.SPACE] == s).any() else '-':>{w}}" for s in spaces))
    if standin:
        lines.append(Pg.STANDIN_CONSOLE)
    return "\n".join(lines)


def without_pooled(images: pd.DataFrame) -> list[str]:
    """The models none of whose measured images has a pooled-prompt similarity: families whose
    denoiser receives no pooled embedding and whose text encoder has none (Chroma, FLUX.2,
    Qwen-Image; operators.image_triplet_generation.pooled_embeddings)."""
    column = f"sim_{S.Space.PROMPT_POOLED}"
    if column not in images.columns or not len(images):
        return []
    measured = images[images[f"sim_{S.Space.PROMPT}"].notna()] if f"sim_{S.Space.PROMPT}" in images.columns else images
    return [m for m, g in measured.groupby(MODEL, sort=False) if g[column].isna().all()]


def pooled_note(models: list[str], labels: dict | None = None) -> str:
    names = ", ".join(Pg.label(labels or {}, m) for m in models)
    return (f"Pooled prompt space: not defined for {names} (a T5 or language-model text encoder with no pooled "
            f"output, and a denoiser that receives no pooled embedding): that step is left out for "
            f"{'them' if len(models) > 1 else 'it'}.")


def format_headline(headline: dict, standin: bool = False) -> str:
    """The lead headline numbers with their intervals (models by their short labels); a stand-in
    run's notice last."""
    labels = Pg.model_labels([s["name"] for s in headline["subjects"]])
    return HM.format_headline(headline, labels) + (f"\n{Pg.STANDIN_CONSOLE}" if standin else "")


def rq1_table(direction: pd.DataFrame, labels: dict | None = None) -> pd.DataFrame:
    """RQ1 at a glance: one row per (model, source), the set the neutral one is closer to in each
    space, how many spaces say masculine / feminine, and the units behind the row (the fewest)."""
    cols = ["model", "source", *[SPACE_LABELS[s] for s in S.Space.ALL], "masculine", "feminine", "units"]
    if direction.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for (model, source), g in direction.groupby([MODEL, S.TRIPLET_SOURCE], sort=False):
        by = dict(zip(g[S.SPACE], g[M.CLOSER]))
        row = {"model": Pg.label(labels or {}, model), "source": source}
        row |= {SPACE_LABELS[s]: by[s] for s in S.Space.ALL if s in by}
        row |= {"masculine": int((g[M.CLOSER] == "masculine").sum()), "feminine": int((g[M.CLOSER] == "feminine").sum()),
                "units": int(g[S.UNITS].min())}
        rows.append(row)
    out = pd.DataFrame(rows)
    return out[[c for c in cols if c in out.columns]]


def space_bars(direction: pd.DataFrame, model: str, source: str, label: str | None = None):
    """Per-space bars of s(neutral, feminine) and s(neutral, masculine) for one model and source:
    each space in its own panel (their scales differ)."""
    d = direction[(direction[MODEL] == model) & (direction[S.TRIPLET_SOURCE] == source)]
    spaces = [s for s in S.Space.ALL if (d[S.SPACE] == s).any()]
    cols = 4
    rows = max(1, math.ceil(len(spaces) / cols))
    fig = _figures.new_figure(6.0, 1.8 * rows + 0.5)
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
    fig.suptitle(f"{label or Pg.model_name(model)} / {source}: neutral vs feminine (orange) and masculine (blue)",
                 fontsize=8)
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


def _examples_html(images: pd.DataFrame, model: str, source: str, k: int, images_dir: str | None, sink=None) -> str:
    units = example_units(images, model, source, k)
    if not units:
        return "<p>No complete unit.</p>"
    parts = ["<table class='ex'>"]
    for u in units:
        cells = []
        for _, r in u.iterrows():
            uri = (sink.image(f"images/{model_dir(model)}/{r[S.IMAGE_ID]}.png")
                   if images_dir and sink is not None and r[GENERATION_STATUS] == GenerationStatus.OK else None)
            img = f"<img src='{H.esc(uri)}' alt='{H.esc(r[S.IMAGE_ID])}' width=160><br>" if uri else ""
            cells.append(f"<td style='text-align:center;vertical-align:top;width:170px'>{img}<small>"
                         f"<b>{H.esc(r[S.VARIANT])}</b>: {H.esc(r[PROMPT])}</small></td>")
        sims = u.iloc[0]
        values = ", ".join(f"{SPACE_LABELS[s]} " + "/".join(f"{v:.3f}" for v in sims[S.disparity_column(s)])
                           for s in S.Space.ALL
                           if isinstance(sims.get(S.disparity_column(s)), (list, np.ndarray)))
        parts.append(f"<tr>{''.join(cells)}<td style='text-align:left;vertical-align:top;min-width:220px'><small>unit "
                     f"{H.esc(sims[S.UNIT_ID])}, seed {int(sims[SEED])}<br>pairs n\u2013f / n\u2013m / f\u2013m: "
                     f"{H.esc(values)}</small></td></tr>")
    parts.append("</table>")
    return H.scroll("".join(parts))


def _behind(meta: dict, images: pd.DataFrame, counts: pd.DataFrame, labels: dict) -> list[str]:
    n_models = len(meta.get("models", [])) or len(labels)
    out = [f"{meta['triplets']:,} triplets, {meta['units']:,} (triplet, seed) units of three images each, from "
           f"{Pg.plural(n_models, 'generator')} ({H.esc(', '.join(labels.values()))})"]
    if len(images) and S.UNIT_STATUS in images:
        per_unit = images.drop_duplicates([MODEL, S.UNIT_ID])
        done = per_unit.groupby(MODEL, sort=False)[S.UNIT_STATUS].agg(
            lambda st: (int((st == GenerationStatus.OK).sum()), len(st)))
        if all(ok == n for ok, n in done):
            out.append("every unit complete (all three images generated) for every generator")
        else:
            out.append("complete units (all three images generated; the others left out): " + ", ".join(
                f"{H.esc(Pg.label(labels, m))} {ok:,} of {n:,}" for m, (ok, n) in done.items()))
    if len(counts) and S.TRIPLET_STATUS in counts:
        rows = counts[counts[S.HUMAN_WORD].isna()]
        read = int(rows[S.COUNT].sum())
        is_kept = rows[S.TRIPLET_STATUS] == S.TripletOutcome.KEPT
        kept = int(rows[is_kept][S.COUNT].sum()) if is_kept.any() else None
        out.append(f"{read:,} captions read by the triplet filter" + (f", {kept:,} kept as triplets" if kept is not None
                                                                      else "") + " (Table S1 at the end)")
    return out


def render_html(meta: dict, data: dict, counts, records: list[dict], *,
                figures: _figures.FigureDir | None = None, examples: int = 3, extra=None) -> str:
    """report.html of an exposed run: RQ1 per model, source and space first with the units behind
    it, then Table 3, the per-space bars, example triplets, sections 5-7 (``extra(sink)``), the
    triplet filter and the models; figures as PDF + PNG under ``figures/`` (embedded either way)."""
    sink = _figures.sink(figures)
    table3, direction = data["table3"], data["direction"]
    images = data["images"].to_pandas()
    c = counts.to_pandas()
    labels = Pg.model_labels(meta.get("models", []), table3[MODEL] if len(table3) else [],
                             images[MODEL] if len(images) else [])
    parts = Pg.run_page_top("Stable Diffusion Exposed (papers 003/004)", meta, records,
                            "The generators and the image models are tiny random-weight stand-ins; the "
                            "run only exercises the pipeline.")
    head = data.get("headline")
    rq1 = rq1_table(direction, labels)
    lead = ("<p class=lead>RQ1: is the neutral set closer to the masculine set? Per model, caption source and space, "
            "the gendered set the neutral prompts' images (prompts, latents) are closer to; <i>masculine</i> / "
            "<i>feminine</i>: how many spaces say so; <i>units</i>: (triplet, seed) units behind the row.</p>"
            + (_table(rq1, 3) if len(rq1) else "<p>No complete unit: no disparities (see the run summary).</p>"))
    parts.append(Pg.headline((HM.box_html(head) if head else "") + lead,
                             (HL.behind_items(head) if head else []) + _behind(meta, images, c, labels)))
    parts.append(f"<p>Spaces: {H.esc(', '.join(meta['spaces']))}. Run <code>{H.esc(meta['run_id'])}</code>; results "
                 f"in <code>{H.esc(meta['output'])}</code>.</p>")
    parts.append("<h2>Representational disparities (Tables 3 and S3)</h2><p>Mean similarity of corresponding images "
                 "(prompts, latents) of each pair over the units of a model and caption source (Eq. 1-2). Prompt "
                 "space: cosine of the text encoder's output sequence the denoiser reads; denoising space: cosine of the "
                 "final latents z<sub>0</sub>; image space: mean SSIM, Diff. Pix. (% of pixels inside the contours "
                 "of the thresholded SSIM difference map; lower = closer), cosine of ResNet-50 logits, CLIP ViT-B/32 "
                 "image features and DINO ViT-S/16 class tokens, and split-product (DINO ViT-B/8 patch chunks). "
                 "<i>units</i>: the units behind each row; [low, high]: the interval of the opening box (bootstrap "
                 "over triplets).</p>")
    parts.append(_table(HM.interval_cells(table3, S.Space.ALL).rename(columns=SPACE_LABELS), 3, labels))
    unpooled = without_pooled(images)
    if unpooled:
        parts.append(f"<p class=note>{H.esc(pooled_note(unpooled, labels))}</p>")
    parts.append("<h2>RQ1 per space: the similarities behind the answer</h2><p>Per model, source and space: "
                 "s(neutral, feminine), s(neutral, masculine), their gap (positive: closer to masculine) and the "
                 "answer.</p><div class=figs>")
    for model in dict.fromkeys(direction[MODEL]) if not direction.empty else []:
        for source in dict.fromkeys(direction[direction[MODEL] == model][S.TRIPLET_SOURCE]):
            name = Pg.label(labels, model)
            fig, n = space_bars(direction, model, source, name)
            parts.append(sink.save(fig, f"spaces_{name}_{source}",
                                   alt=f"{name} / {source}: {n} spaces, neutral-feminine vs neutral-masculine"))
    parts.append("</div>")
    rq1_rows = HM.interval_cells(direction, (M.NEUTRAL_FEMININE, M.NEUTRAL_MASCULINE, M.GAP), 4)
    parts.append(Pg.details(f"Table: RQ1 per space ({len(direction)} rows)",
                            _table(rq1_rows.assign(**{S.SPACE: rq1_rows[S.SPACE].map(SPACE_LABELS)})
                                   if len(rq1_rows) else rq1_rows, 4, labels)))
    parts.append("<h2>Example triplets</h2>")
    for model in dict.fromkeys(images[MODEL]) if len(images) else []:
        for source in dict.fromkeys(images[images[MODEL] == model][S.TRIPLET_SOURCE]):
            parts.append(f"<h3>{H.esc(Pg.label(labels, model))} / {H.esc(source)}</h3>")
            parts.append(_examples_html(images, model, source, examples, meta.get("images_dir"), sink))
    if extra is not None:   # sections 5-7, rendered into the same figure sink
        parts.append(extra(sink))
    parts.append("<h2>Triplet filter (Table S1)</h2><p>Captions read per source, kept as triplets or rejected with "
                 "the reason; human-word rows count the rejected captions containing each word.</p>")
    outcome_rows = c[c[S.HUMAN_WORD].isna()].pivot_table(index=S.TRIPLET_SOURCE, columns=S.TRIPLET_STATUS,
                                                         values=S.COUNT, aggfunc="sum", sort=False).reset_index()
    parts.append(_table(outcome_rows, 0))
    words = c[c[S.HUMAN_WORD].notna()].sort_values(S.COUNT, ascending=False).head(20)
    if len(words):
        parts.append(Pg.details("The most frequent human words among the rejected captions", _table(words, 0)))
    parts.append("<h2>Models</h2>" + H.model_table(records, labels))
    return Pg.document(f"Stable Diffusion Exposed report {meta['run_id']}", parts)

"""report.html and the printed results of `dalleval.py alignment` (paper 000, App. D, Table 19):
R-precision, CLIPScore and FID per model with the number of images behind each first, the paper's
published figures beside them, and example images (downscaled, embedded in the page) with their
captions and CLIP cosines."""

from __future__ import annotations

import pandas as pd

from pipelines.engine.report import figures as _figures
from pipelines.engine.stats import headline as HL
from pipelines.engine.report import html as H
from pipelines.engine.report import page as Pg
from pipelines.engine.storage.checkpoint import model_dir
from schemas import alignment as A
from schemas.dalleval import interval_columns
from schemas.images import IMAGE_ID
from schemas.images import GENERATION_STATUS, MODEL, SEED, GenerationStatus
from schemas.subsets import PROMPT

# Table 19 (App. D): CLIP R-precision (%) and FID on 30K COCO val2014 captions / images
PAPER = pd.DataFrame([
    {"model": "GT (upper bound)", "r_precision": 62.5, "fid": 0.0},
    {"model": "X-LXMERT", "r_precision": 33.4, "fid": 37.4},
    {"model": "DALL-E Small", "r_precision": 9.4, "fid": 45.8},
    {"model": "minDALL-E", "r_precision": 40.2, "fid": 24.6},
    {"model": "Stable Diffusion", "r_precision": 73.7, "fid": 16.5},
])


def _num(v, digits: int = 2) -> str:
    return "-" if v is None or pd.isna(v) else f"{v:.{digits}f}"


def _int(v) -> str:
    return "-" if v is None or pd.isna(v) else str(int(v))


def _ranged(row, column: str, digits: int) -> str:
    """``row[column]`` with its interval beside it where the row has one: "41.20 [38.10, 44.30]"."""
    low, high = (row.get(c) for c in interval_columns(column))
    if low is None or pd.isna(low) or pd.isna(row[column]):
        return _num(row[column], digits)
    return f"{_num(row[column], digits)} [{_num(low, digits)}, {_num(high, digits)}]"


def format_table(table: pd.DataFrame, standin: bool = False) -> str:
    """Table 19's shape as text, models by their short labels (never cut); a stand-in run's notice last."""
    labels = Pg.model_labels(table["model"])
    mw = max([len("model")] + [len(Pg.label(labels, m)) for m in table["model"]]) + 1
    lines = ["Image-text alignment and image quality (DALL-Eval Table 19 shape; n = images behind each figure; "
             "[interval over the images])",
             f"{'model':<{mw}} {'R-prec. %':>22} {'n':>7} {'CLIPScore':>24} {'x100':>7} {'n':>7} {'FID':>9} "
             f"{'n gen':>7} {'n ref':>7}"]
    for _, r in table.iterrows():
        lines.append(f"{Pg.label(labels, r['model']):<{mw}} {_ranged(r, 'r_precision', 2):>22} "
                     f"{_int(r['r_precision_n']):>7} {_ranged(r, 'clip_score', 4):>24} {_num(r['clip_score_100']):>7} "
                     f"{_int(r['clip_score_n']):>7} {_num(r['fid']):>9} {_int(r['fid_n_generated']):>7} "
                     f"{_int(r['fid_n_reference']):>7}")
    if standin:
        lines.append(Pg.STANDIN_CONSOLE)
    return "\n".join(lines)


def examples_html(images: pd.DataFrame, model: str, k: int, images_dir: str | None, sink=None) -> str:
    """Up to ``k`` generated images of ``model`` with their captions and CLIP cosines, each saved
    image embedded through ``sink.image`` (downscaled); a strip that scrolls on its own."""
    mine = images[(images[MODEL] == model) & (images[GENERATION_STATUS] == GenerationStatus.OK)].head(k)
    if mine.empty:
        return "<p>No generated image.</p>"
    cells = []
    for _, r in mine.iterrows():
        uri = sink.image(f"{images_dir}/{model_dir(model)}/{r[IMAGE_ID]}.png") if images_dir and sink else None
        img = f"<img src='{H.esc(uri)}' alt='{H.esc(r[IMAGE_ID])}' width=160><br>" if uri else ""
        cells.append(f"<td style='text-align:center;vertical-align:top;width:170px'>{img}<small>{H.esc(r[PROMPT])}"
                     f"<br>cos {_num(r[A.CLIP_COSINE], 3)}; seed {int(r[SEED])}</small></td>")
    return H.scroll("<table class='ex'><tr>" + "".join(cells) + "</tr></table>")


def render_html(meta: dict, images, table: pd.DataFrame, records: list[dict], *,
                figures: _figures.FigureDir | None = None) -> str:
    """report.html of an alignment run: Table 19's shape first with the captions and images behind
    it, then how each figure is read, the paper's table, examples and the models."""
    sink = _figures.sink(figures)
    df = images.to_pandas()
    c = meta["captions"]
    labels = Pg.model_labels(meta.get("models", []), df[MODEL] if len(df) else [])
    parts = Pg.run_page_top("DALL-Eval image-text alignment and image quality (paper 000, App. D)", meta, records,
                            "The generators, CLIP and the FID feature extractor are tiny random-weight "
                            "stand-ins.")
    lead = ("<p class=lead>R-precision (%), CLIPScore and FID per model (Table 19 shape); <i>*_n</i>: images behind "
            "each figure. Higher R-precision and CLIPScore, lower FID: better.</p>"
            + H.table(Pg.relabel(table, labels), 3, na="-"))
    n_models = len(meta.get("models", [])) or len(labels)
    ok = int((df[GENERATION_STATUS] == GenerationStatus.OK).sum()) if len(df) else 0
    behind = [f"{c['kept']:,} captions ({c['read']:,} read, {c['null_or_blank']:,} null or blank left out), one image "
              f"each from {Pg.plural(n_models, 'generator')} ({H.esc(', '.join(labels.values()))})",
              f"{ok:,} of {len(df):,} images generated" + (f" ({len(df) - ok:,} left out: failed or blocked)"
                                                          if ok < len(df) else "")]
    if meta["reference"] == "bundled":
        behind.append("FID reference: scikit-image's handful of bundled photos (see the warning below)")
    h = meta.get("headline")
    parts.append(Pg.headline((HL.summary_table(h) if h else "") + lead, (HL.behind_items(h) if h else []) + behind,
                             title="Headline numbers"))
    if meta["reference"] == "bundled":
        parts.append("<p class='warn'>The FID reference is scikit-image's handful of bundled photos (the offline "
                     "default), not a real reference set: FID over so few images means nothing. Give the real images "
                     "with --reference.</p>")
    parts.append(f"<p>CLIP {H.esc(Pg.model_name(meta['clip']['model']))}; FID features: "
                 f"{H.esc(meta['fid']['extractor'])}; reference: {H.esc(meta['reference'])}. Run "
                 f"<code>{H.esc(meta['run_id'])}</code>; results in <code>{H.esc(meta['output'])}</code>.</p>")
    rp = meta["r_precision"]
    reading = ("the project's reading: cosines of unit CLIP vectors, distinct negatives never equal to the true "
               "caption, a tie is a miss, one draw" if rp.get("reading", "project") == "project" else
               f"the released code's reading: raw dot products of unnormalised CLIP features, negatives drawn with "
               f"replacement from all captions, a tie at the top is a hit, the mean of {int(rp.get('repeats', 5))} draws")
    parts.append(f"<h2>How the figures are read</h2><p>R-precision: % of images whose own caption CLIP ranks first "
                 f"among it and {int(rp['negatives'])} random other captions (R = {int(rp['r'])}; {reading}). "
                 f"CLIPScore: mean of 2.5 max(cos, 0) (Hessel et al.); x100: mean of 100 max(cos, 0). FID: Fréchet "
                 f"distance of the generated and reference feature sets. <i>*_n</i>: images behind each figure. "
                 f"The row <i>real images (reference)</i>, when present, scores the reference images against their "
                 f"own captions: the paper's upper bound (GT, 62.5).</p>")
    pairing = meta.get("pairing") or {}
    if pairing:
        found = (f" {pairing['images_found']:,} of the {pairing['drawn_captions']:,} drawn captions' images were "
                 f"found ({pairing['images_missing']:,} missing)." if "images_found" in pairing else "")
        comparable = ("This pairing is the released code's: the FID column is comparable with Table 19's."
                      if pairing.get("comparable_with_table19_fid") else
                      "This is not the released code's pairing, so the FID column is not comparable with Table 19's "
                      "(that needs " + H.esc(pairing["comparable_note"].split(": ", 1)[-1]) + ").")
        parts.append(f"<p>FID reference: {H.esc(pairing['kind'])}, pairing {H.esc(pairing['pairing'])}, features "
                     f"{H.esc(pairing['extractor'])}.{found} {comparable}</p>")
    parts.append("<p>The paper's Table 19 (30K COCO val2014 captions; CLIP ViT-B/32; Inception v3), for orientation:"
                 "</p>" + H.table(PAPER, 1, na="-"))
    parts.append("<h2>Examples</h2>")
    for model in dict.fromkeys(df[MODEL]) if len(df) else []:
        parts.append(f"<h3>{H.esc(Pg.label(labels, model))}</h3>"
                     + examples_html(df, model, int(meta.get("examples", 8)), meta.get("images_dir"), sink))
    parts.append("<h2>Models</h2>" + H.model_table(records, labels))
    return Pg.document(f"DALL-Eval alignment report {meta['run_id']}", parts)

"""Results of an end-to-end amplification run: T, G, the four approaches of Table 3, section 6,
section 5.1's correlation, the Table 3/6-shaped summaries, and report.html (Figures 3, 5, 7, 9).

Everything here works on the per-image table (pandas; its size is images, not captions).
"""

from __future__ import annotations

import html
import math

import numpy as np
import pandas as pd

from pipelines.studies.amplification.metrics import (
    EXCLUDED,
    GENERATED,
    N_IMAGES,
    TRAINING,
    compare,
    expected_amplification,
    female_indicator_share,
    json_rows,
    pearson,
    percent_female,
    result_dict,
)
from schemas import images as I
from schemas.captions import CAPTION_GENDER, OCCUPATION, CaptionGender
from schemas.subsets import PROMPT_ID, SUBSET, Subset

APPROACH_TITLES = {
    Subset.NAIVE: "Naive Approach",
    Subset.NO_INDICATORS: "No Gender Indicators",
    Subset.NN: "Nearest Neighbors (NN)",
    Subset.NN_NO_INDICATORS: "NN + No Indicators",
}
CAPTIONS_GROUP = "captions"


def compute(images: pd.DataFrame, occupations: list[str], n_prompts: int, models: list[str]) -> dict:
    """All amplification results of a run from its per-image table."""
    train = images[images[I.SOURCE] == I.Source.TRAINING]
    gen = images[images[I.SOURCE] == I.Source.GENERATED]
    cap = images[images[I.SOURCE] == I.Source.CAPTION_PROMPT]
    prompt_ids = list(range(1, n_prompts + 1))

    # T per (subset, occupation) for prompt-free subsets (prompt_id 0 here, null when written),
    # per (subset, occupation, prompt) for the subsets selected per prompt (NN)
    tp = percent_female(train.assign(**{PROMPT_ID: train[PROMPT_ID].fillna(0)}), [SUBSET, OCCUPATION, PROMPT_ID])
    free = [s for s in Subset.ALL if s not in Subset.PER_PROMPT]
    T = pd.concat([
        _complete(tp[tp[SUBSET].isin(free)], {SUBSET: free, OCCUPATION: occupations, PROMPT_ID: [0]}),
        _complete(tp[tp[SUBSET].isin(Subset.PER_PROMPT)],
                  {SUBSET: list(Subset.PER_PROMPT), OCCUPATION: occupations, PROMPT_ID: prompt_ids}),
    ], ignore_index=True)
    G = _complete(percent_female(gen, [I.MODEL, OCCUPATION, PROMPT_ID]),
                  {I.MODEL: models, OCCUPATION: occupations, PROMPT_ID: prompt_ids})
    approaches, tables6 = {}, {}
    for model in models:
        g = G[G[I.MODEL] == model][[OCCUPATION, PROMPT_ID, "percent_female", N_IMAGES]]
        per = {}
        for subset in Subset.ALL:
            t = T[T[SUBSET] == subset]
            if subset in Subset.PER_PROMPT:
                t, on = t[t[PROMPT_ID] > 0], [OCCUPATION, PROMPT_ID]
            else:
                t, on = t[t[PROMPT_ID] == 0], [OCCUPATION]
            rows = compare(t.drop(columns=[SUBSET]) if subset in Subset.PER_PROMPT else t.drop(columns=[SUBSET, PROMPT_ID]),
                           g, on, PROMPT_ID)
            res, avg = expected_amplification(rows, PROMPT_ID)
            per[subset] = result_dict(res, avg) | {"rows": json_rows(rows)}
        approaches[model] = per
        naive_t = T[(T[SUBSET] == Subset.NAIVE) & (T[PROMPT_ID] == 0)].set_index(OCCUPATION)
        tab = pd.DataFrame({OCCUPATION: occupations})
        tab["training"] = tab[OCCUPATION].map(naive_t["percent_female"])
        tab["n_training"] = tab[OCCUPATION].map(naive_t[N_IMAGES]).fillna(0).astype(int)
        for p in prompt_ids:
            gp = g[g[PROMPT_ID] == p].set_index(OCCUPATION)
            tab[f"prompt_{p}"] = tab[OCCUPATION].map(gp["percent_female"])
            tab[f"n_prompt_{p}"] = tab[OCCUPATION].map(gp[N_IMAGES]).fillna(0).astype(int)
        tables6[model] = tab

    captions = {model: caption_prompt_results(train, cap[cap[I.MODEL] == model], occupations) for model in models} \
        if len(cap) else {}

    naive_rows = train[(train[SUBSET] == Subset.NAIVE) & train[I.COUNTED]]
    naive_t = T[(T[SUBSET] == Subset.NAIVE) & (T[PROMPT_ID] == 0)].set_index(OCCUPATION)["percent_female"]
    share = female_indicator_share(naive_rows).set_index(OCCUPATION).iloc[:, 0] if len(naive_rows) else pd.Series(dtype=float)
    corr = pearson(naive_t.reindex(occupations), share.reindex(occupations))
    corr["definition"] = ("Pearson r over occupations between % female in the naive subset's counted training "
                          "images and % of those images' captions with female indicators (section 5.1)")
    return {"T": T, "G": G, "approaches": approaches, "tables6": tables6, "caption_prompts": captions,
            "indicator_correlation": corr}


def caption_prompt_results(train: pd.DataFrame, cap: pd.DataFrame, occupations: list[str]) -> dict:
    """Section 6: P_o = S_o. T of the naive subset vs G of images generated from its captions; the
    same for the captions without gender indicators."""
    out = {}
    naive = train[train[SUBSET] == Subset.NAIVE]
    for name, keep_t, keep_g in (
        ("all_captions", np.ones(len(naive), bool), np.ones(len(cap), bool)),
        ("no_indicator_captions", (naive[CAPTION_GENDER] == CaptionGender.NONE).to_numpy(),
         (cap[CAPTION_GENDER] == CaptionGender.NONE).to_numpy()),
    ):
        t = _complete(percent_female(naive[keep_t], [OCCUPATION]), {OCCUPATION: occupations})
        g = _complete(percent_female(cap[keep_g].assign(group=CAPTIONS_GROUP), [OCCUPATION, "group"]),
                      {OCCUPATION: occupations, "group": [CAPTIONS_GROUP]})
        rows = compare(t, g, [OCCUPATION], "group")
        res, avg = expected_amplification(rows, "group")
        out[name] = result_dict(res, avg) | {"rows": json_rows(rows)}
    return out


def _complete(df: pd.DataFrame, levels: dict) -> pd.DataFrame:
    """``df`` with a row for every combination of ``levels`` (n_images 0, NaN % where absent)."""
    keys = list(levels)
    idx = (pd.MultiIndex.from_product([levels[k] for k in keys], names=keys) if len(keys) > 1
           else pd.Index(levels[keys[0]], name=keys[0]))
    df = df.copy()
    for k in keys:
        if k == PROMPT_ID:
            df[k] = df[k].astype(int)
    out = df.set_index(keys).reindex(idx).reset_index()
    out[N_IMAGES] = out[N_IMAGES].fillna(0).astype(int)
    out["n_female"] = out["n_female"].fillna(0).astype(int)
    return out


def table3(approaches: dict, n_prompts: int) -> pd.DataFrame:
    """Table 3: rows approaches, columns model x (prompt #1..#n, average)."""
    recs = []
    for model, per in approaches.items():
        for subset in Subset.ALL:
            r = per[subset]
            rec = {"model": model, "approach": APPROACH_TITLES[subset]}
            by = {p["group"]: p for p in r["per_prompt"]}
            for p in range(1, n_prompts + 1):
                rec[f"#{p}"] = by[str(p)]["expected_amplification"] if str(p) in by else None
            rec["average"] = r["average"]
            for p in range(1, n_prompts + 1):  # occupations behind each E[A], and those left out
                res = by.get(str(p))
                rec[f"n_#{p}"] = res["occupations"] if res else 0
                rec[f"excluded_#{p}"] = "; ".join(f"{k}={len(v)}" for k, v in res["excluded"].items()) if res else ""
            recs.append(rec)
    df = pd.DataFrame(recs)
    num = ["average"] + [f"#{p}" for p in range(1, n_prompts + 1)]
    df[num] = df[num].astype(float)  # None (no value) -> NaN: an empty CSV cell, "n/a" in the report
    return df


# ------------------------------------------------------------------------------------ report.html
def _fmt(v, digits=2) -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def svg_scatter(points: list[tuple[float, float, str]], title: str, size: int = 300) -> str:
    """Training % female (x) vs generated % female (y) with amplification / de-amplification shaded."""
    pad = 34
    s = size - 2 * pad

    def X(v):
        return pad + v / 100 * s

    def Y(v):
        return size - pad - v / 100 * s

    def poly(pts, color):
        return f'<polygon points="{" ".join(f"{X(a):.1f},{Y(b):.1f}" for a, b in pts)}" fill="{color}" />'

    amp, deamp = "#f4c7c3", "#c8e6c9"
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{size}" height="{size + 18}" role="img">',
             f'<text x="{size / 2}" y="13" text-anchor="middle" font-size="12">{html.escape(title)}</text>',
             '<g transform="translate(0,18)">',
             poly([(0, 0), (50, 0), (50, 50)], amp), poly([(50, 50), (50, 100), (100, 100)], amp),
             poly([(0, 0), (0, 50), (50, 50)], deamp), poly([(50, 50), (100, 50), (100, 100)], deamp),
             f'<rect x="{pad}" y="{pad}" width="{s}" height="{s}" fill="none" stroke="#444"/>',
             f'<line x1="{X(0)}" y1="{Y(0)}" x2="{X(100)}" y2="{Y(100)}" stroke="#888" stroke-dasharray="3,3"/>']
    for t in (0, 25, 50, 75, 100):
        parts.append(f'<text x="{X(t)}" y="{size - pad + 12}" text-anchor="middle" font-size="9">{t}</text>')
        parts.append(f'<text x="{pad - 4}" y="{Y(t) + 3}" text-anchor="end" font-size="9">{t}</text>')
    parts.append(f'<text x="{size / 2}" y="{size - 4}" text-anchor="middle" font-size="10">% female, training</text>')
    parts.append(f'<text x="10" y="{size / 2}" font-size="10" transform="rotate(-90 10 {size / 2})" '
                 f'text-anchor="middle">% female, generated</text>')
    for x, y, label in points:
        if x is None or y is None or (isinstance(x, float) and math.isnan(x)) or (isinstance(y, float) and math.isnan(y)):
            continue
        parts.append(f'<circle cx="{X(x):.1f}" cy="{Y(y):.1f}" r="3" fill="#1f4e9c" fill-opacity="0.75">'
                     f'<title>{html.escape(label)}: {x:.1f} -&gt; {y:.1f}</title></circle>')
    parts.append("</g></svg>")
    return "".join(parts)


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


def _table_html(df: pd.DataFrame, digits: int = 2) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    body = []
    for rec in df.itertuples(index=False):
        cells = []
        for v in rec:
            if isinstance(v, (float, np.floating)):
                cells.append(f"<td class=n>{_fmt(float(v), digits)}</td>")
            elif v is None:
                cells.append("<td class=n>n/a</td>")
            else:
                cells.append(f"<td>{html.escape(str(v))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def render_html(results: dict, t3: pd.DataFrame, counts: pd.DataFrame, caption_counts: dict, models: list[dict],
                meta: dict) -> str:
    """report.html: headline tables, the figures, drop counts per reason, models (real or stand-in)."""
    standin = [m for m in models if m.get("standin")]
    out = [
        "<!doctype html><html><head><meta charset='utf-8'><title>Bias amplification report</title><style>",
        "body{font-family:sans-serif;max-width:1100px;margin:1em auto;color:#222} table{border-collapse:collapse;"
        "margin:.5em 0} td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px} td.n{text-align:right}"
        " .warn{background:#fff3cd;border:1px solid #e0c060;padding:.6em} .figs{display:flex;flex-wrap:wrap;gap:8px}"
        " .legend span{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px}",
        "</style></head><body>",
        "<h1>Bias amplification in text-to-image generation</h1>",
        f"<p>Study: paper 002 (<i>The Bias Amplification Paradox in Text-to-Image Generation</i>). Run: "
        f"{html.escape(str(meta.get('output')))}; input {html.escape(str(meta.get('input')))}; "
        f"{meta.get('occupations')} occupations, {meta.get('images')} images in the per-image table.</p>",
    ]
    if standin:
        names = ", ".join(html.escape(f"{m['role']} ({m['model']})") for m in standin)
        out.append(f"<p class=warn><b>Stand-in models.</b> These models are tiny random-weight stand-ins built "
                   f"offline from the real classes, not the paper's models: {names}. Their outputs are "
                   f"meaningless; every percentage and amplification below only demonstrates the pipeline. "
                   f"Run with real model ids (the defaults) for results.</p>")
    if meta.get("local_image_server"):
        out.append(f"<p class=warn>Training images came from a local image server on 127.0.0.1 standing in for "
                   f"the sample's URLs ({html.escape(meta['local_image_server'])}); the sample is synthetic.</p>")
    out.append("<h2>Models</h2>" + _table_html(pd.DataFrame(
        [{"role": m["role"], "model": m["model"], "real or stand-in": "STAND-IN (random weights)" if m.get("standin")
          else "real", "detail": m.get("detail", "")} for m in models])))
    out.append("<h2>Bias amplification E[A] (Table 3)</h2><p>A = |G - 50| - |T - 50| per occupation; occupations "
               "whose training and generated images skew in different directions are excluded per prompt "
               "(direction_switch), as are occupations without counted images on one side. Positive: "
               "amplification. n_#p: occupations behind E[A] for prompt p; excluded_#p: how many were left "
               "out, by reason.</p>" + _table_html(t3))
    n_cols = [c for c in t3.columns if c.startswith("n_#")]
    thin = int((t3[n_cols] < max(2, meta.get("occupations", 0) // 2)).to_numpy().sum()) if n_cols else 0
    if thin:
        out.append(f"<p class=warn>{thin} of the E[A] values above rest on fewer than half of the occupations "
                   f"(or on none: n/a). Read them with their n_# and excluded_# columns.</p>")
    legend = ("<p class=legend>Shading:<span style='background:#f4c7c3'></span>amplification"
              "<span style='background:#c8e6c9'></span>de-amplification; the dashed diagonal is no amplification; "
              "excluded (direction-switching) occupations are not drawn.</p>")
    for model, per in results["approaches"].items():
        out.append(f"<h2>{html.escape(model)}</h2>")
        naive = per[Subset.NAIVE]["rows"]
        out.append("<h3>Figure 3: naive approach, prompt #1</h3>" + legend + "<div class=figs>"
                   + svg_scatter(_points(naive, 1), "Naive, prompt #1") + "</div>")
        out.append("<h3>Figure 7: approaches, prompt #1</h3><div class=figs>" + "".join(
            svg_scatter(_points(per[s]["rows"], 1), f"{APPROACH_TITLES[s]}, #1") for s in Subset.ALL) + "</div>")
        out.append("<h3>Figure 9: approaches, averaged over prompts</h3><div class=figs>" + "".join(
            svg_scatter(_averaged_points(per[s]["rows"]), f"{APPROACH_TITLES[s]}, avg") for s in Subset.ALL) + "</div>")
        cp = results["caption_prompts"].get(model)
        if cp:
            out.append("<h3>Figure 5: training captions as prompts (section 6)</h3><div class=figs>"
                       + svg_scatter(_points(cp["all_captions"]["rows"]), "P = S, all captions")
                       + svg_scatter(_points(cp["no_indicator_captions"]["rows"]), "P = S, no gender indicators")
                       + "</div>")
            out.append("<p>" + "; ".join(f"{k.replace('_', ' ')}: E[A] = {_fmt(v['average'])}"
                                         for k, v in cp.items()) + "</p>")
        tab = results["tables6"][model]
        out.append("<h3>% female per occupation (Table 6/7)</h3>" + _table_html(tab, 1))
    corr = results["indicator_correlation"]
    out.append(f"<h2>Gender indicators (section 5.1)</h2><p>Pearson r = {_fmt(corr['r'], 3)} "
               f"(p = {_fmt(corr['p_value'], 4)}, n = {corr['n']} occupations). {html.escape(corr['definition'])}."
               f" The paper reports r = -0.458 on LAION.</p>")
    out.append("<h2>Rows per stage and drops per reason</h2><h3>Caption side</h3>"
               + _table_html(pd.DataFrame([{"stage": k, "rows in": v["rows_in"], "kept": v["rows_out"],
                                            "dropped per reason": ", ".join(f"{r}={n}" for r, n in v["dropped"].items()
                                                                             if n) or "-"}
                                           for k, v in caption_counts.items()]), 0)
               + "<h3>Image side</h3>" + _table_html(counts, 0))
    out.append("</body></html>")
    return "".join(out)


def clean_json(obj):
    """``obj`` with NaN / inf floats as None and numpy scalars as Python ones: strict JSON."""
    if isinstance(obj, dict):
        return {str(k): clean_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean_json(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return None if not math.isfinite(float(obj)) else float(obj)
    if obj is pd.NA or obj is pd.NaT:
        return None
    return obj


def summary_html(source: str, result: dict) -> str:
    """Figure 3-style scatter plots (training vs generated % female) per model and prompt."""
    import html

    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>Amplification</title></head><body>",
             f"<h1>Bias amplification from {html.escape(source)}</h1>",
             "<p>Shaded red: amplification; green: de-amplification; excluded occupations are not drawn.</p>"]
    for model, res in result.items():
        parts.append(f"<h2>{html.escape(model)}: average E[A] = "
                     f"{'n/a' if res['average'] is None else format(res['average'], '.2f')}</h2><div>")
        for p in res["per_prompt"]:
            pts = [(r["training"], r["generated"], r["occupation"]) for r in res["rows"]
                   if r["group"] == p["group"] and r["excluded"] is None]
            ea = "n/a" if p["expected_amplification"] is None else f"{p['expected_amplification']:.2f}"
            parts.append(svg_scatter(pts, f"{p['group']}: E[A] = {ea} ({p['occupations']} occupations)"))
        parts.append("</div>")
    return "".join(parts) + "</body></html>"

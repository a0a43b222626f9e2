"""Results of an end-to-end amplification run, from its per-image table: T, G, the four approaches of
Table 3, section 6 and App. A.6 (captions and their paraphrases as prompts), section 5.1's
correlation, the Table 3/6-shaped tables, the headline metrics per model, and the counted and
left-out generated images.

Everything here works on the per-image table (pandas; its size is images, not captions).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipelines.engine.stats import headline as HL
from pipelines.studies.amplification.metrics import (
    EA_KEY,
    N_IMAGES,
    REPLICATE,
    compare,
    expected_amplification,
    amplification_metrics,
    female_indicator_share,
    indicator_gender_match,
    json_rows,
    pearson,
    percent_female,
    result_dict,
)
from pipelines.studies.amplification.paraphrase_results import PAPER_VALUES, SECTION6_PAPER_VALUES
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


def compute(images: pd.DataFrame, occupations: list[str], n_prompts: int, models: list[str],
            percent=percent_female) -> dict:
    """All amplification results of a run from its per-image table. ``percent`` (images, keys) ->
    % female per group of ``keys`` with n_images (``metrics.percent_female``, the classifier's; the
    people-corrected one of ``pipelines/annotate/derived.py``, whose ``replicate`` column, an id of
    each percentage's resamples, ``compare`` carries into the rows)."""
    train = images[images[I.SOURCE] == I.Source.TRAINING]
    gen = images[images[I.SOURCE] == I.Source.GENERATED]
    cap = images[images[I.SOURCE] == I.Source.CAPTION_PROMPT]
    para = images[images[I.SOURCE] == I.Source.PARAPHRASE_PROMPT]
    prompt_ids = list(range(1, n_prompts + 1))

    # T per (subset, occupation) for prompt-free subsets (prompt_id 0 here, null when written),
    # per (subset, occupation, prompt) for the subsets selected per prompt (NN)
    tp = percent(train.assign(**{PROMPT_ID: train[PROMPT_ID].fillna(0)}), [SUBSET, OCCUPATION, PROMPT_ID])
    free = [s for s in Subset.ALL if s not in Subset.PER_PROMPT]
    T = pd.concat([
        _complete(tp[tp[SUBSET].isin(free)], {SUBSET: free, OCCUPATION: occupations, PROMPT_ID: [0]}),
        _complete(tp[tp[SUBSET].isin(Subset.PER_PROMPT)],
                  {SUBSET: list(Subset.PER_PROMPT), OCCUPATION: occupations, PROMPT_ID: prompt_ids}),
    ], ignore_index=True)
    G = _complete(percent(gen, [I.MODEL, OCCUPATION, PROMPT_ID]),
                  {I.MODEL: models, OCCUPATION: occupations, PROMPT_ID: prompt_ids})
    approaches, tables6 = {}, {}
    for model in models:
        g = G[G[I.MODEL] == model][[OCCUPATION, PROMPT_ID, "percent_female", N_IMAGES,
                                    *([REPLICATE] if REPLICATE in G else [])]]
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

    captions = {model: caption_prompt_results(train, cap[cap[I.MODEL] == model], occupations, percent) for model in models} \
        if len(cap) else {}
    # App. A.6: the same, prompted with the captions' paraphrases (T is section 6's)
    paraphrases = {model: caption_prompt_results(train, para[para[I.MODEL] == model], occupations, percent)
                   for model in models} if len(para) else {}
    match = {model: indicator_gender_match(train, cap[cap[I.MODEL] == model]) for model in models} if len(cap) else {}

    naive_rows = train[(train[SUBSET] == Subset.NAIVE) & train[I.COUNTED]]
    naive_t = T[(T[SUBSET] == Subset.NAIVE) & (T[PROMPT_ID] == 0)].set_index(OCCUPATION)["percent_female"]
    share = female_indicator_share(naive_rows).set_index(OCCUPATION).iloc[:, 0] if len(naive_rows) else pd.Series(dtype=float)
    corr = pearson(naive_t.reindex(occupations), share.reindex(occupations))
    corr["definition"] = ("Pearson r over occupations between % female in the naive subset's counted training "
                          "images and % of those images' captions with female indicators (section 5.1)")
    return {"T": T, "G": G, "approaches": approaches, "tables6": tables6, "caption_prompts": captions,
            "paraphrase_prompts": paraphrases, "caption_gender_match": match, "indicator_correlation": corr}


def caption_prompt_results(train: pd.DataFrame, cap: pd.DataFrame, occupations: list[str],
                           percent=percent_female) -> dict:
    """Section 6: P_o = S_o. T of the naive subset vs G of images generated from its captions; the
    same for the captions without gender indicators."""
    out = {}
    naive = train[train[SUBSET] == Subset.NAIVE]
    for name, keep_t, keep_g in (
        ("all_captions", np.ones(len(naive), bool), np.ones(len(cap), bool)),
        ("no_indicator_captions", (naive[CAPTION_GENDER] == CaptionGender.NONE).to_numpy(),
         (cap[CAPTION_GENDER] == CaptionGender.NONE).to_numpy()),
    ):
        t = _complete(percent(naive[keep_t], [OCCUPATION]), {OCCUPATION: occupations})
        g = _complete(percent(cap[keep_g].assign(group=CAPTIONS_GROUP), [OCCUPATION, "group"]),
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


def table3(approaches: dict, n_prompts: int, headline: dict | None = None) -> pd.DataFrame:
    """Table 3: rows approaches, columns model x (prompt #1..#n, average); with ``headline``
    (metrics.json's), each E[A]'s interval beside it (``#p_low``, ``#p_high``, ``average_low``, ...)."""
    ends = HL.interval_ends(headline)
    recs = []
    for model, per in approaches.items():
        for subset in Subset.ALL:
            r = per[subset]
            rec = {"model": model, "approach": APPROACH_TITLES[subset]}
            by = {p["group"]: p for p in r["per_prompt"]}
            for p in range(1, n_prompts + 1):
                rec[f"#{p}"] = by[str(p)]["expected_amplification"] if str(p) in by else None
                if headline is not None:
                    rec[f"#{p}_low"], rec[f"#{p}_high"] = ends.get((model, approach_key(subset, p)), (None, None))
            rec["average"] = r["average"]
            if headline is not None:
                rec["average_low"], rec["average_high"] = ends.get((model, approach_key(subset)), (None, None))
            for p in range(1, n_prompts + 1):  # occupations behind each E[A], and those left out
                res = by.get(str(p))
                rec[f"n_#{p}"] = res["occupations"] if res else 0
                rec[f"excluded_#{p}"] = "; ".join(f"{k}={len(v)}" for k, v in res["excluded"].items()) if res else ""
            recs.append(rec)
    df = pd.DataFrame(recs)
    num = [c for c in df.columns if c == "average" or c.startswith("average_")
           or (c.startswith("#") and not c.startswith(("n_", "excluded_")))]
    df[num] = df[num].astype(float)  # None (no value) -> NaN: an empty CSV cell, "n/a" in the report
    return df


def approach_key(subset: str, prompt: int | None = None) -> str:
    """The headline metric key of an approach's average E[A], or of one prompt's."""
    return f"{EA_KEY}/{subset}" + ("" if prompt is None else f"/prompt_{prompt}")


def captions_key(name: str) -> str:
    """The headline metric key of section 6's E[A] (``name``: all_captions, no_indicator_captions)."""
    return f"{EA_KEY}/captions_as_prompts/{name}"


CAPTION_TITLES = {"all_captions": "captions as prompts, all (section 6)",
                  "no_indicator_captions": "captions as prompts, no gender indicators (section 6)"}
PARAPHRASE_TITLES = {"all_captions": "paraphrases as prompts, all (App. A.6)",
                     "no_indicator_captions": "paraphrases as prompts, no gender indicators (App. A.6)"}


def paraphrases_key(name: str) -> str:
    """The headline metric key of App. A.6's E[A] (``name``: all_captions, no_indicator_captions)."""
    return f"{EA_KEY}/paraphrases_as_prompts/{name}"


def model_metrics(approaches: dict, caption_prompts: dict, paraphrase_prompts: dict | None = None,
                  image_seed: int = 0) -> dict[str, list]:
    """Per model, its headline metrics (``headline.Metric``, unit: the occupation): each approach's
    average E[A] over prompts and each prompt's (Table 3), then section 6's E[A] of images generated
    from the training captions. Each metric's (weighted) mean over occupations is the E[A] the
    study reports (``metrics.amplification_metrics``), with its image resamples (seeded by
    ``image_seed``: the run's interval seed)."""
    out = {}
    for model, per in approaches.items():
        metrics = []
        for subset in Subset.ALL:
            rows = pd.DataFrame(per[subset]["rows"])
            metrics += amplification_metrics(rows, PROMPT_ID, approach_key(subset), f"E[A], {APPROACH_TITLES[subset]}",
                                             training_per_group=subset in Subset.PER_PROMPT, image_seed=image_seed)
        for name, res in (caption_prompts.get(model) or {}).items():
            metrics += amplification_metrics(pd.DataFrame(res["rows"]), "group", captions_key(name),
                                             f"E[A], {CAPTION_TITLES.get(name, name)}", per_group=False,
                                             image_seed=image_seed)
        for name, res in ((paraphrase_prompts or {}).get(model) or {}).items():
            metrics += amplification_metrics(pd.DataFrame(res["rows"]), "group", paraphrases_key(name),
                                             f"E[A], {PARAPHRASE_TITLES.get(name, name)}", per_group=False,
                                             image_seed=image_seed)
        out[model] = metrics
    return out


def a6_table(results: dict, headline: dict | None, summary: dict | None = None) -> pd.DataFrame:
    """App. A.6 beside section 6, per model: E[A] prompting with the training captions and with
    their paraphrases, for all captions and for those without gender indicators, each with its
    interval (bootstrap over occupations) and the paper's value; with the paraphrases' SBERT cosine
    to their captions and the CLIP similarity of their images (``paraphrases.summary``)."""
    ends = HL.interval_ends(headline)
    sims = (summary or {}).get("image_similarity", {})
    recs = []
    for model, para in (results.get("paraphrase_prompts") or {}).items():
        cap = (results.get("caption_prompts") or {}).get(model) or {}
        for source, res, key, paper in (("captions (section 6)", cap, captions_key, SECTION6_PAPER_VALUES),
                                        ("paraphrases (App. A.6)", para, paraphrases_key, PAPER_VALUES)):
            rec = {"model": model, "prompts": source}
            for name in ("all_captions", "no_indicator_captions"):
                r = res.get(name) or {}
                rec[name] = r.get("average")
                rec[f"{name}_low"], rec[f"{name}_high"] = ends.get((model, key(name)), (None, None))
                rec[f"n_{name}"] = sum(p.get("occupations", 0) for p in r.get("per_prompt", []))
                rec[f"paper_{name}"] = paper[name]
            a6 = source.startswith("paraphrases")
            rec["sbert_cosine_to_caption"] = (summary or {}).get("sbert_cosine", {}).get("mean") if a6 else None
            rec["clip_images_vs_caption_images"] = (sims.get(model) or {}).get("caption_vs_paraphrase") if a6 else \
                (sims.get(model) or {}).get("caption_vs_caption")
            recs.append(rec)
    df = pd.DataFrame(recs)
    num = [c for c in df.columns if c not in ("model", "prompts") and not c.startswith("n_")]
    if len(df):
        df[num] = df[num].astype(float)
    return df


def generated_images(images: pd.DataFrame, model: str) -> tuple[int, dict]:
    """The counted images ``model`` generated (from the prompts and from the captions) and, per
    reason, those left out: the first stage that failed (generation, face filter) or CLIP's
    undecided gender."""
    mine = images[(images[I.MODEL] == model) & images[I.SOURCE].isin([I.Source.GENERATED, I.Source.CAPTION_PROMPT,
                                                                          I.Source.PARAPHRASE_PROMPT])]
    counted = mine[I.COUNTED].fillna(False).astype(bool)
    left = mine[~counted]
    gen = left[I.GENERATION_STATUS].fillna(I.GenerationStatus.OK)
    face = left[I.FACE_STATUS].fillna(I.FaceStatus.OK)
    reason = np.where(gen != I.GenerationStatus.OK, gen,
                      np.where(face != I.FaceStatus.OK, face, "gender " + left[I.GENDER].fillna("unknown").astype(str)))
    return int(counted.sum()), {str(k): int(v) for k, v in pd.Series(reason, dtype=object).value_counts().items()}

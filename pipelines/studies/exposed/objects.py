"""Objects in the generated images and prompt-image dependency groups: the statistics of paper 004,
sections 5 and 6 (Eq. 3-6), as plain functions on per-object tables.

These are the measures of Stable Diffusion Exposed part 2; the detection chain (open-vocabulary
boxes, masks) and the attention capture that feed them are separate stages. Inputs:

- an *object table*: one row per detected object instance, with MODEL, TRIPLET_SOURCE, UNIT_ID,
  VARIANT and OBJECT (the label, lemmatised, lower case);
- an *image table*: one row per generated image (``schemas.exposed.EXPOSED_IMAGES``); images where
  nothing was detected count in |P| all the same.

Readings where the paper is silent (docs/method.md):

- the bias score's minimum-count filter drops an object when max(C(o, P_m), C(o, P_f)) is below the
  threshold ("we filter objects if the maximum co-occurrence is less than 20");
- co-occurrence similarity s_O (Eq. 4): a pair of images where neither has a detected object has no
  defined cosine and is left out (and counted); where only one has objects the cosine is 0;
- chi-square tests use the objects seen at least once in the compared sets (an all-zero column has
  no expected count); with fewer than two such objects there is no test (NaN).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import pandas as pd

from schemas.exposed import (
    BIAS_SCORE,
    CHI2,
    DOF,
    OBJECT,
    OBJECT_COUNT,
    P_VALUE,
    PAIRS,
    TRIPLET_SOURCE,
    UNIT_ID,
    VARIANT,
    Variant,
)
from operators.support.dependency import attention_mask, coverage, dependency_groups  # noqa: F401 -- section 6
from schemas.images import GENERATION_STATUS, MODEL, GenerationStatus

KEYS = (MODEL, TRIPLET_SOURCE)


def cooccurrence(objects: pd.DataFrame) -> pd.DataFrame:
    """C(o, P) (Eq. 3): occurrences of each object in the images of each prompt set, one row per
    (model, source, variant, object)."""
    if objects.empty:
        return pd.DataFrame(columns=[*KEYS, VARIANT, OBJECT, OBJECT_COUNT])
    return (objects.groupby([*KEYS, VARIANT, OBJECT], sort=True).size().rename(OBJECT_COUNT).reset_index())


def prompt_set_sizes(images: pd.DataFrame) -> pd.DataFrame:
    """|P| per (model, source, variant): the generated images of each prompt set (status ok)."""
    ok = images[images[GENERATION_STATUS] == GenerationStatus.OK]
    return ok.groupby([*KEYS, VARIANT], sort=True).size().rename("images").reset_index()


def contingency(counts: pd.DataFrame, variants) -> pd.DataFrame:
    """Variants x objects table of C(o, P) for one (model, source), objects seen in ``variants``."""
    sub = counts[counts[VARIANT].isin(list(variants))]
    table = sub.pivot_table(index=VARIANT, columns=OBJECT, values=OBJECT_COUNT, aggfunc="sum", fill_value=0)
    table = table.reindex(list(variants), fill_value=0)
    return table.loc[:, table.sum(axis=0) > 0]


def chi_square(table: pd.DataFrame) -> dict:
    """Pearson's chi-square test of independence on a variants x objects contingency table (2 x K
    for a pair, 3 x K for the triplet): statistic, p-value, degrees of freedom, objects used."""
    from scipy.stats import chi2_contingency

    observed = np.asarray(table, dtype=np.float64)
    objects = observed.shape[1] if observed.ndim == 2 else 0
    if objects < 2 or (observed.sum(axis=1) == 0).any():
        return {CHI2: float("nan"), P_VALUE: float("nan"), DOF: 0, "objects": objects}
    stat, p, dof, _ = chi2_contingency(observed, correction=False)
    return {CHI2: float(stat), P_VALUE: float(p), DOF: int(dof), "objects": objects}


def chi_square_tests(counts: pd.DataFrame) -> pd.DataFrame:
    """Section 5.1: the chi-square test per (model, source) on the triplet and on each pair."""
    rows = []
    comparisons = {"triplet": Variant.ALL, **{f"{a}-{b}": (a, b) for a, b in PAIRS}}
    for (model, source), g in counts.groupby(list(KEYS), sort=False):
        for name, variants in comparisons.items():
            rows.append({MODEL: model, TRIPLET_SOURCE: source, "comparison": name,
                         **chi_square(contingency(g, variants))})
    return pd.DataFrame(rows)


def bias_score(c_m: float, c_f: float, n_m: int, n_f: int) -> float:
    """BS(o) (Eq. 5) = C(o, P_m) / (C(o, P_m) + |P_m| / |P_f| C(o, P_f)): 1 when the object is
    seen with masculine prompts only, 0 with feminine ones only, 0.5 when balanced."""
    if n_m <= 0 or n_f <= 0:
        raise ValueError(f"prompt-set sizes must be positive, got |P_m| = {n_m}, |P_f| = {n_f}")
    denominator = c_m + (n_m / n_f) * c_f
    return float("nan") if denominator == 0 else float(c_m / denominator)


def bias_scores(counts: pd.DataFrame, sizes: pd.DataFrame, min_count: int | Mapping[str, int],
                leave_out=()) -> pd.DataFrame:
    """BS(o) per (model, source, object) with C(o, P_m), C(o, P_f); objects whose larger count is
    below ``min_count`` (one number, or per source) and those in ``leave_out`` are dropped.
    Sorted from the most feminine to the most masculine."""
    rows = []
    for (model, source), g in counts.groupby(list(KEYS), sort=False):
        size = sizes[(sizes[MODEL] == model) & (sizes[TRIPLET_SOURCE] == source)].set_index(VARIANT)["images"]
        n_m, n_f = int(size.get(Variant.MASCULINE, 0)), int(size.get(Variant.FEMININE, 0))
        floor = min_count.get(source, 0) if isinstance(min_count, Mapping) else int(min_count)
        table = g.pivot_table(index=OBJECT, columns=VARIANT, values=OBJECT_COUNT, aggfunc="sum", fill_value=0)
        for obj, r in table.iterrows():
            c_m, c_f = int(r.get(Variant.MASCULINE, 0)), int(r.get(Variant.FEMININE, 0))
            if obj in leave_out or max(c_m, c_f) < floor or not (c_m or c_f):
                continue
            rows.append({MODEL: model, TRIPLET_SOURCE: source, OBJECT: obj, "masculine": c_m, "feminine": c_f,
                         BIAS_SCORE: bias_score(c_m, c_f, n_m, n_f)})
    out = pd.DataFrame(rows, columns=[MODEL, TRIPLET_SOURCE, OBJECT, "masculine", "feminine", BIAS_SCORE])
    return out.sort_values([MODEL, TRIPLET_SOURCE, BIAS_SCORE, OBJECT], kind="stable").reset_index(drop=True)


def cooccurrence_similarity(objects: pd.DataFrame, images: pd.DataFrame) -> pd.DataFrame:
    """s_O(P, P') (Eq. 4) per (model, source, pair): mean over units of the cosine between the two
    images' object-count vectors; ``units`` used and ``both_empty`` (left out: no object in either)."""
    ok = images[images[GENERATION_STATUS] == GenerationStatus.OK]
    counts = objects.groupby([*KEYS, UNIT_ID, VARIANT, OBJECT], sort=False).size().rename("n").reset_index()
    rows = []
    for (model, source), g in ok.groupby(list(KEYS), sort=False):
        mine = counts[(counts[MODEL] == model) & (counts[TRIPLET_SOURCE] == source)]
        vocab = {o: i for i, o in enumerate(sorted(set(mine[OBJECT])))}
        have = set(zip(g[UNIT_ID], g[VARIANT]))
        units = sorted(set(g[UNIT_ID]))
        vectors = {}
        for (unit, variant), h in mine.groupby([UNIT_ID, VARIANT], sort=False):
            v = np.zeros(len(vocab))
            v[[vocab[o] for o in h[OBJECT]]] = h["n"].to_numpy()
            vectors[(unit, variant)] = v
        zero = np.zeros(len(vocab))
        for a, b in PAIRS:
            cosines, empty = [], 0
            for unit in units:
                if (unit, a) not in have or (unit, b) not in have:
                    continue
                va, vb = vectors.get((unit, a), zero), vectors.get((unit, b), zero)
                na, nb = np.linalg.norm(va), np.linalg.norm(vb)
                if na == 0 and nb == 0:
                    empty += 1
                    continue
                cosines.append(0.0 if na == 0 or nb == 0 else float(va @ vb / (na * nb)))
            rows.append({MODEL: model, TRIPLET_SOURCE: source, "pair": f"{a}-{b}",
                         "s_o": float(np.mean(cosines)) if cosines else float("nan"), "units": len(cosines),
                         "both_empty": empty})
    return pd.DataFrame(rows, columns=[MODEL, TRIPLET_SOURCE, "pair", "s_o", "units", "both_empty"])

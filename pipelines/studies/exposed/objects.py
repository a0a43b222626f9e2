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
import pyarrow as pa
import pyarrow.compute as pc

from operators.base import conform
from schemas.exposed import (
    BIAS_SCORE,
    BOTH_EMPTY,
    CHI2,
    COSINE,
    DEPENDENCY_GROUP,
    DETECTION_STATUS,
    DOF,
    HIDDEN_NOUNS,
    IMAGE_ID,
    INDIVIDUALS,
    OBJECT,
    OBJECT_BOX,
    OBJECT_BOXES,
    OBJECT_COUNT,
    OBJECT_GROUPS,
    OBJECT_INDEX,
    OBJECT_LABELS,
    OBJECT_MASK,
    OBJECT_MASKS,
    OBJECT_RANK,
    OBJECT_SCORE,
    OBJECT_SCORES,
    OBJECTS,
    P_VALUE,
    PAIR,
    PAIR_NAMES,
    PAIRS,
    PROMPT_NOUNS,
    S_O,
    TEST_NOT_RUN,
    TRIPLET_SOURCE,
    UNIT_ID,
    UNITS,
    VARIANT,
    DependencyGroup,
    DetectionStatus,
    Variant,
)
from schemas.images import GENERATION_STATUS, MODEL, GenerationStatus

KEYS = (MODEL, TRIPLET_SOURCE)


def cooccurrence(objects: pd.DataFrame) -> pd.DataFrame:
    """C(o, P) (Eq. 3): occurrences of each object in the images of each prompt set, one row per
    (model, source, variant, object)."""
    if objects.empty:
        return pd.DataFrame(columns=[*KEYS, VARIANT, OBJECT, OBJECT_COUNT])
    return (objects.groupby([*KEYS, VARIANT, OBJECT], sort=True).size().rename(OBJECT_COUNT).reset_index())


def prompt_set_sizes(images: pd.DataFrame) -> pd.DataFrame:
    """|P| per (model, source, variant): the analysed images of each prompt set (generated, and,
    where detection ran, detected without error)."""
    ok = analysed_images(images)
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
    from scipy.stats import chi2_contingency  # deferred: scipy

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
    below ``min_count`` (one number, or per source) and those in ``leave_out`` are dropped; a
    (model, source) without analysed masculine or feminine images has no scores. Sorted from the
    most feminine to the most masculine."""
    rows = []
    for (model, source), g in counts.groupby(list(KEYS), sort=False):
        size = sizes[(sizes[MODEL] == model) & (sizes[TRIPLET_SOURCE] == source)].set_index(VARIANT)["images"]
        n_m, n_f = int(size.get(Variant.MASCULINE, 0)), int(size.get(Variant.FEMININE, 0))
        if n_m == 0 or n_f == 0:   # no analysed masculine or feminine image: BS is undefined
            continue
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


def unit_cosines(objects: pd.DataFrame, images: pd.DataFrame) -> pd.DataFrame:
    """The cosine of Eq. 4 per (model, source, unit, pair) between the object-count vectors of the
    unit's two images (``COSINE``; NaN where neither image has a detected object: left out of s_O;
    0 where only one has); a pair with an image not analysed has no row. ``cooccurrence_similarity``
    is its mean, the headline numbers resample it."""
    ok = analysed_images(images)
    counts = objects.groupby([*KEYS, UNIT_ID, VARIANT, OBJECT], sort=False).size().rename("n").reset_index()
    rows = []
    for (model, source), g in ok.groupby(list(KEYS), sort=False):
        mine = counts[(counts[MODEL] == model) & (counts[TRIPLET_SOURCE] == source)]
        vocab = {o: i for i, o in enumerate(sorted(set(mine[OBJECT])))}
        vectors = {}
        for (unit, variant), h in mine.groupby([UNIT_ID, VARIANT], sort=False):
            v = np.zeros(len(vocab))
            v[[vocab[o] for o in h[OBJECT]]] = h["n"].to_numpy()
            vectors[(unit, variant)] = v
        have, zero = set(zip(g[UNIT_ID], g[VARIANT])), np.zeros(len(vocab))
        for a, b in PAIRS:
            for unit in sorted(set(g[UNIT_ID])):
                if (unit, a) in have and (unit, b) in have:
                    rows.append({MODEL: model, TRIPLET_SOURCE: source, UNIT_ID: unit, PAIR: f"{a}-{b}",
                                 COSINE: _cosine(vectors.get((unit, a), zero), vectors.get((unit, b), zero))})
    return pd.DataFrame(rows, columns=[*KEYS, UNIT_ID, PAIR, COSINE])


def _cosine(va: np.ndarray, vb: np.ndarray) -> float:
    na, nb = np.linalg.norm(va), np.linalg.norm(vb)
    if na == 0 and nb == 0:
        return float("nan")
    return 0.0 if na == 0 or nb == 0 else float(va @ vb / (na * nb))


def cooccurrence_similarity(objects: pd.DataFrame, images: pd.DataFrame,
                            cosines: pd.DataFrame | None = None) -> pd.DataFrame:
    """s_O(P, P') (Eq. 4) per (model, source, pair): mean over units of the cosine between the two
    images' object-count vectors (``cosines``: ``unit_cosines``, computed when not given); ``units``
    used and ``both_empty`` (left out: no object in either)."""
    cos = unit_cosines(objects, images) if cosines is None else cosines
    rows = []
    for model, source in analysed_images(images)[list(KEYS)].drop_duplicates().itertuples(index=False):
        mine = cos[(cos[MODEL] == model) & (cos[TRIPLET_SOURCE] == source)]
        for name in PAIR_NAMES:
            values = mine.loc[mine[PAIR] == name, COSINE]
            rows.append({MODEL: model, TRIPLET_SOURCE: source, PAIR: name,
                         S_O: float(values.mean()) if values.notna().any() else float("nan"),
                         UNITS: int(values.notna().sum()), BOTH_EMPTY: int(values.isna().sum())})
    return pd.DataFrame(rows, columns=[*KEYS, PAIR, S_O, UNITS, BOTH_EMPTY])


# ------------------------------------------------------------------------------------ per-object rows
def object_rows(images: pa.Table) -> pa.Table:
    """``schemas.exposed.OBJECTS`` from the per-image lists (vectorised): one row per detected
    object of each analysed image (detection_status ok), then one per hidden noun (group hidden,
    no index, score, box or mask)."""
    analysed = images.filter(pc.equal(images.column(DETECTION_STATUS), DetectionStatus.OK))
    keys = (IMAGE_ID, UNIT_ID, TRIPLET_SOURCE, MODEL, VARIANT)
    parts = []
    labels = analysed.column(OBJECT_LABELS).combine_chunks()
    if len(labels):
        parent = pc.list_parent_indices(labels)
        offsets = np.asarray(labels.offsets)[:-1]
        index = np.arange(len(parent)) - offsets[np.asarray(parent)]
        cols = {k: analysed.column(k).take(parent) for k in keys}
        cols.update({OBJECT_INDEX: pa.array(index, pa.int32()), OBJECT: pc.list_flatten(labels),
                     DEPENDENCY_GROUP: pc.list_flatten(analysed.column(OBJECT_GROUPS).combine_chunks()),
                     OBJECT_SCORE: pc.list_flatten(analysed.column(OBJECT_SCORES).combine_chunks()),
                     OBJECT_BOX: pc.list_flatten(analysed.column(OBJECT_BOXES).combine_chunks()),
                     OBJECT_MASK: pc.list_flatten(analysed.column(OBJECT_MASKS).combine_chunks())})
        parts.append(conform(pa.table(cols), OBJECTS))
        hidden = analysed.column(HIDDEN_NOUNS).combine_chunks()
        parent = pc.list_parent_indices(hidden)
        cols = {k: analysed.column(k).take(parent) for k in keys}
        cols.update({OBJECT: pc.list_flatten(hidden),
                     DEPENDENCY_GROUP: pa.array([DependencyGroup.HIDDEN] * len(parent), pa.string())})
        parts.append(conform(pa.table(cols), OBJECTS))
    return pa.concat_tables(parts) if parts else OBJECTS.empty_table()


def detected(objects: pd.DataFrame) -> pd.DataFrame:
    """The detected objects (section 5): every row but the hidden nouns."""
    return objects[objects[DEPENDENCY_GROUP] != DependencyGroup.HIDDEN]


def analysed_images(images: pd.DataFrame) -> pd.DataFrame:
    """Images whose objects were analysed (generated and detection ok): the denominators of §5-6."""
    ok = images[images[GENERATION_STATUS] == GenerationStatus.OK]
    return ok[ok[DETECTION_STATUS] == DetectionStatus.OK] if DETECTION_STATUS in ok else ok


# ------------------------------------------------------------------------------------ section 6 / App. F
GROUPS = DependencyGroup.ALL
NOUNS = "nouns"


def group_counts(objects: pd.DataFrame) -> pd.DataFrame:
    """C_g(o, P) (section 6; C_g(n, P) for the hidden nouns): per (model, source, group, variant, object)."""
    cols = [*KEYS, DEPENDENCY_GROUP, VARIANT, OBJECT, OBJECT_COUNT]
    if objects.empty:
        return pd.DataFrame(columns=cols)
    return (objects.groupby([*KEYS, DEPENDENCY_GROUP, VARIANT, OBJECT], sort=True).size().rename(OBJECT_COUNT)
            .reset_index()[cols])


FIGURE4_TOP = 10


def top_objects_per_group(counts: pd.DataFrame, top: int = FIGURE4_TOP) -> pd.DataFrame:
    """Figure 4: the ``top`` most frequent objects of each dependency group per (model, source),
    summed over the three variants, individuals left out (footnote 8: "we remove individuals
    (person, people, women, woman, men, man, female, male, girl, boy)"); ties by object name.
    ``counts`` is ``group_counts``; the hidden group counts its hidden nouns."""
    cols = [*KEYS, DEPENDENCY_GROUP, OBJECT_RANK, OBJECT, OBJECT_COUNT]
    if counts.empty:
        return pd.DataFrame(columns=cols)
    d = counts[~counts[OBJECT].isin(INDIVIDUALS)]
    d = d.groupby([*KEYS, DEPENDENCY_GROUP, OBJECT], sort=True)[OBJECT_COUNT].sum().reset_index()
    d = d.sort_values([*KEYS, DEPENDENCY_GROUP, OBJECT_COUNT, OBJECT], ascending=[True, True, True, False, True],
                      kind="stable")
    d[OBJECT_RANK] = d.groupby([*KEYS, DEPENDENCY_GROUP], sort=False).cumcount() + 1
    return d[d[OBJECT_RANK] <= top][cols].reset_index(drop=True)


def group_chi_square_tests(objects: pd.DataFrame, min_objects: int = 0) -> pd.DataFrame:
    """Tables S4-S6: the chi-square test of each dependency group per (model, source), on the triplet
    and on each pair. ``min_objects`` > 0 (the intra-prompt experiment of section 7: "we do not
    apply chi-square test on explicitly guided, explicitly independent, and hidden, as the numbers of
    objects in these groups are less than 5"): a test whose table has fewer distinct objects is not
    run; its row stays, with a null statistic and the reason in ``not_run``."""
    frames = []
    for group in GROUPS:
        mine = objects[objects[DEPENDENCY_GROUP] == group]
        t = chi_square_tests(cooccurrence(mine))
        if not t.empty:
            t.insert(2, DEPENDENCY_GROUP, group)
            frames.append(t)
    cols = [*KEYS, DEPENDENCY_GROUP, "comparison", CHI2, P_VALUE, DOF, "objects", TEST_NOT_RUN]
    if not frames:
        return pd.DataFrame(columns=cols)
    out = pd.concat(frames, ignore_index=True)
    few = (out["objects"] < int(min_objects)).to_numpy() if min_objects else np.zeros(len(out), bool)
    out[TEST_NOT_RUN] = pd.Series([f"fewer than {int(min_objects)} objects ({n})" if f else None
                                   for f, n in zip(few, out["objects"])], dtype=object)
    out.loc[few, [CHI2, P_VALUE]] = np.nan
    out.loc[few, DOF] = 0
    return out[cols]


def images_with_group(objects: pd.DataFrame, images: pd.DataFrame) -> pd.DataFrame:
    """Table S8: per (model, source), the % of analysed images holding at least one object of each
    group (hidden: at least one hidden noun), and the images behind it."""
    base = analysed_images(images).groupby(list(KEYS)).size().rename("images")
    present = objects.drop_duplicates([*KEYS, IMAGE_ID, DEPENDENCY_GROUP]).groupby(
        [*KEYS, DEPENDENCY_GROUP]).size().unstack(DEPENDENCY_GROUP) if not objects.empty else pd.DataFrame()
    out = base.to_frame()
    for g in GROUPS:
        have = present[g] if g in present else pd.Series(dtype=float)
        out[g] = (have.reindex(out.index).fillna(0) / out["images"] * 100.0).where(out["images"] > 0)
    return out.reset_index()[[*KEYS, *GROUPS, "images"]]


def group_vocabularies(objects: pd.DataFrame, images: pd.DataFrame) -> dict:
    """{(model, source): {group or "nouns": set of distinct objects}}: the nouns are those of the
    analysed images' prompts."""
    out: dict = {}
    for key, g in objects.groupby(list(KEYS), sort=True):
        out[key] = {grp: set(g.loc[g[DEPENDENCY_GROUP] == grp, OBJECT]) for grp in GROUPS}
    for key, g in analysed_images(images).groupby(list(KEYS), sort=True):
        nouns = set()
        for lst in g[PROMPT_NOUNS]:
            nouns.update(lst if lst is not None else ())
        out.setdefault(key, {grp: set() for grp in GROUPS})[NOUNS] = nouns
    for v in out.values():
        v.setdefault(NOUNS, set())
    return out


def group_object_counts(vocabularies: dict) -> pd.DataFrame:
    """Table S9: distinct objects in each group and distinct nouns in the prompts, per (model, source)."""
    rows = [{MODEL: m, TRIPLET_SOURCE: s, **{g: len(v[g]) for g in (*GROUPS, NOUNS)}}
            for (m, s), v in vocabularies.items()]
    return pd.DataFrame(rows, columns=[*KEYS, *GROUPS, NOUNS])


def group_intersections(vocabularies: dict) -> pd.DataFrame:
    """Table S10: per (model, source) and stub group A, 100 |A ∩ B| / |A| for every group B and the
    nouns (NaN when A is empty)."""
    names = (*GROUPS, NOUNS)
    rows = []
    for (m, s), v in vocabularies.items():
        for a in names:
            rows.append({MODEL: m, TRIPLET_SOURCE: s, "over": a,
                         **{b: (100.0 * len(v[a] & v[b]) / len(v[a]) if v[a] else float("nan")) for b in names}})
    return pd.DataFrame(rows, columns=[*KEYS, "over", *names])


def group_bias_scores(objects: pd.DataFrame, sizes: pd.DataFrame, min_count,
                      groups=(DependencyGroup.IMPLICITLY_GUIDED, DependencyGroup.IMPLICITLY_INDEPENDENT)):
    """Figure 5: BS(o) on the objects of each of ``groups`` (same filter as Figure 2)."""
    frames = []
    for group in groups:
        t = bias_scores(cooccurrence(objects[objects[DEPENDENCY_GROUP] == group]), sizes, min_count)
        t.insert(2, DEPENDENCY_GROUP, group)
        frames.append(t)
    # a group without scores takes no part in the columns' types (all empty: the empty table)
    kept = [f for f in frames if len(f)] or frames[:1]
    return pd.concat(kept, ignore_index=True) if kept else pd.DataFrame()

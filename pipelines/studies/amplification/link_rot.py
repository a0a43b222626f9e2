"""Link rot in the training images: is T (paper 002, section 4) biased by the captions whose image
could not be obtained?

T is the % female among the training images that were fetched and classified. A caption whose
image cannot be obtained (dead URL, timeout, opt-out, not in the image shards, ...) only gets a
status; if such captions differ from the kept ones, T describes a different population than the
captions the study sampled. The image of a lost caption is unknown, but its caption is not: this
module compares the gender-indicator class (``CaptionGender``: male / female / both / none) of the
lost captions with that of the kept ones, per (occupation, training subset, cause of loss).

Causes (reported separately):

- ``link``: any fetch status other than ok and the shard statuses, and a null status (no URL);
- ``not_in_shards``: ``FetchStatus.NOT_IN_SHARDS`` / ``FetchStatus.SHARD_FAILED`` (the image was
  looked up in pre-downloaded shards, not fetched); rows of this cause appear only when some row
  of the input has one of these statuses.

Per (occupation, subset, cause): ``captions`` distinct captions walked, ``lost`` to that cause,
``kept`` (status ok: the same in both causes' rows; ``captions - lost - kept`` are the captions
lost to the other cause), ``lost_share = lost / captions``, the indicator-class counts of the lost
and the kept captions, and a test of independence on the 2 x K table (lost / kept x the K classes
present in the group; captions with a null or unknown class count in ``captions`` but not in the
table): Pearson's chi-squared without continuity correction when every expected count is >= 5,
else the same statistic with its permutation null distribution (Monte Carlo: ``resamples`` random
tables with the observed margins, ``scipy.stats.MonteCarloMethod``; a random table with fixed
margins is exactly a random permutation of the lost/kept labels over the captions), seeded from
``seed`` and the group so that a group's p-value depends on nothing else. p-values are corrected
by Benjamini-Hochberg across occupations within each (subset, cause); ``differs`` = q < alpha.

Rows: one per caption of one subset. When a ``source`` column is present only training rows are
read, and a caption appearing more than once in a subset (the NN subsets have one row per prompt)
counts once: its image, and so its status, is its URL's.

Pure functions over small pyarrow tables, no Ray. Every threshold here is a project choice: paper
002 does not discuss link rot.
"""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from scipy import stats

from schemas.captions import CAPTION_GENDER, CAPTION_ID, OCCUPATION
from schemas.images import FETCH_STATUS, SOURCE, FetchStatus, Source
from schemas.subsets import SUBSET

from schemas.link_rot import (
    CAUSE,
    CAPTIONS,
    LOST,
    KEPT,
    LOST_SHARE,
    STATISTIC,
    P_VALUE,
    METHOD,
    Q_VALUE,
    DIFFERS,
    CLASSES,
    LOST_CLASS,
    KEPT_CLASS,
    Cause,
    SHARD_STATUSES,
    LINK_ROT_COLUMNS,
    LINK_ROT_SCHEMA,
)

MIN_EXPECTED = 5.0  # project choice (Cochran's rule): below it, the permutation null replaces chi2's
CORRECTION = "benjamini-hochberg"
METHOD_CHI2 = "chi2"
METHOD_PERMUTATION = "chi2 permutation (monte carlo)"
NOT_APPLICABLE = "not applicable"
NA_NO_LOST = f"{NOT_APPLICABLE}: no lost captions"
NA_NO_KEPT = f"{NOT_APPLICABLE}: no kept captions"
NA_NO_LOST_CLASS = f"{NOT_APPLICABLE}: no lost caption with an indicator class"
NA_NO_KEPT_CLASS = f"{NOT_APPLICABLE}: no kept caption with an indicator class"
NA_ONE_CLASS = f"{NOT_APPLICABLE}: one indicator class"

METADATA_KEY = b"link_rot"   # schema metadata of a link-rot table: its alpha, seed and resamples

# row codes: where a caption's image went, and its indicator class
_KEPT_CODE, _LINK_CODE, _SHARD_CODE = 0, 1, 2
_CAUSE_CODE = {Cause.LINK: _LINK_CODE, Cause.NOT_IN_SHARDS: _SHARD_CODE}
_N_CODES = 3
_UNKNOWN_CLASS = len(CLASSES)   # null or a value outside CaptionGender.ALL
_N_CLASSES = len(CLASSES) + 1


def _strings(column) -> pa.Array:
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    return column if column.type == pa.string() else pc.cast(column, pa.string())


def _rows(training: pa.Table) -> pa.Table:
    """The training rows, one per (occupation, subset, caption); rows without a caption id are all kept."""
    if SOURCE in training.column_names:
        training = training.filter(pc.fill_null(pc.equal(_strings(training[SOURCE]), Source.TRAINING), False))
    t = pa.table({n: _strings(training[n]) for n in (OCCUPATION, SUBSET, CAPTION_GENDER, FETCH_STATUS)})
    if CAPTION_ID not in training.column_names or t.num_rows == 0:
        return t
    ids = training[CAPTION_ID]
    with_id = np.flatnonzero(np.asarray(pc.is_valid(ids)))
    keys = pa.table({"o": t[OCCUPATION].take(with_id), "s": t[SUBSET].take(with_id),
                     "c": ids.take(pa.array(with_id)), "r": pa.array(with_id, pa.int64())})
    first = keys.group_by(["o", "s", "c"], use_threads=False).aggregate([("r", "min")])["r_min"].to_numpy()
    keep = np.sort(np.concatenate([first, np.flatnonzero(~np.asarray(pc.is_valid(ids)))]))
    return t.take(pa.array(keep))


def _codes(t: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    status = t[FETCH_STATUS]
    ok = np.asarray(pc.fill_null(pc.equal(status, FetchStatus.OK), False))
    shard = np.asarray(pc.fill_null(pc.is_in(status, value_set=pa.array(SHARD_STATUSES)), False))
    code = np.where(ok, _KEPT_CODE, np.where(shard, _SHARD_CODE, _LINK_CODE))   # null status: link
    gender = t[CAPTION_GENDER]
    cls = np.full(t.num_rows, _UNKNOWN_CLASS, dtype=np.int64)
    for i, c in enumerate(CLASSES):
        cls[np.asarray(pc.fill_null(pc.equal(gender, c), False))] = i
    return code, cls


def _group_rng(seed: int, occupation, subset, cause: str) -> np.random.Generator:
    """A generator for one group: the same for (seed, group) in every call, whatever else is in the table."""
    key = json.dumps([occupation, subset, cause]).encode()
    words = np.frombuffer(hashlib.sha256(key).digest()[:16], dtype="<u4").tolist()
    return np.random.default_rng(np.random.SeedSequence([int(seed), *words]))


def independence_test(lost: np.ndarray, kept: np.ndarray, rng: np.random.Generator | None = None,
                      resamples: int = 9999) -> tuple[float | None, float | None, str]:
    """(statistic, p_value, method) of independence between lost/kept and the classes (counts per class).

    Chi-squared without continuity correction when every expected count is >= MIN_EXPECTED, else
    its Monte Carlo permutation p-value (``resamples`` tables with the observed margins)."""
    lost, kept = np.asarray(lost, dtype=np.int64), np.asarray(kept, dtype=np.int64)
    if lost.sum() == 0:
        return None, None, NA_NO_LOST
    if kept.sum() == 0:
        return None, None, NA_NO_KEPT
    observed = np.vstack([lost, kept])
    observed = observed[:, observed.sum(axis=0) > 0]   # the classes that occur in the group
    if observed.shape[1] < 2:
        return None, None, NA_ONE_CLASS
    expected = stats.contingency.expected_freq(observed)
    if expected.min() >= MIN_EXPECTED:
        res = stats.chi2_contingency(observed, correction=False)
        method = METHOD_CHI2
    else:
        mc = stats.MonteCarloMethod(n_resamples=int(resamples), rng=rng if rng is not None else np.random.default_rng(0))
        res = stats.chi2_contingency(observed, correction=False, method=mc)
        method = METHOD_PERMUTATION
    return float(res.statistic), float(min(1.0, res.pvalue)), method


def link_rot_table(training: pa.Table, seed: int = 0, resamples: int = 9999, alpha: float = 0.05) -> pa.Table:
    """One row per (occupation, subset, cause) with at least one caption: the share of captions
    whose image could not be obtained and whether their indicator classes differ from the kept
    ones' (LINK_ROT_SCHEMA; the module docstring has the details). ``training``: the training rows
    of the per-image table (occupation, subset, caption_id, caption_gender, fetch_status)."""
    rows = _rows(training)
    code, cls = _codes(rows)
    occ = pc.dictionary_encode(rows[OCCUPATION].combine_chunks(), null_encoding="encode")
    sub = pc.dictionary_encode(rows[SUBSET].combine_chunks(), null_encoding="encode")
    n_sub = max(len(sub.dictionary), 1)
    gid = occ.indices.to_numpy(zero_copy_only=False).astype(np.int64) * n_sub \
        + sub.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    groups, inverse = np.unique(gid, return_inverse=True)
    n_groups = len(groups)
    counts = np.bincount((inverse * _N_CODES + code) * _N_CLASSES + cls,
                         minlength=n_groups * _N_CODES * _N_CLASSES).reshape(n_groups, _N_CODES, _N_CLASSES)
    occupations = occ.dictionary.take(pa.array(groups // n_sub)).to_pylist()
    subsets = sub.dictionary.take(pa.array(groups % n_sub)).to_pylist()
    captions = counts.sum(axis=(1, 2))
    kept_counts = counts[:, _KEPT_CODE, :len(CLASSES)]
    causes = [Cause.LINK] + ([Cause.NOT_IN_SHARDS] if (code == _SHARD_CODE).any() else [])

    parts = []
    for cause in causes:
        lost_counts = counts[:, _CAUSE_CODE[cause], :len(CLASSES)]
        lost = counts[:, _CAUSE_CODE[cause], :].sum(axis=1)
        has_kept, kept_class = counts[:, _KEPT_CODE, :].sum(axis=1) > 0, kept_counts.sum(axis=1) > 0
        tests = []
        for g in range(n_groups):   # one test per group
            if lost[g] > 0 and has_kept[g] and not lost_counts[g].any():
                tests.append((None, None, NA_NO_LOST_CLASS))
            elif lost[g] > 0 and has_kept[g] and not kept_class[g]:
                tests.append((None, None, NA_NO_KEPT_CLASS))
            else:
                rng = _group_rng(seed, occupations[g], subsets[g], cause)
                tests.append(independence_test(lost_counts[g], kept_counts[g], rng, resamples))
        columns = {
            OCCUPATION: pa.array(occupations, pa.string()),
            SUBSET: pa.array(subsets, pa.string()),
            CAUSE: pa.array([cause] * n_groups, pa.string()),
            CAPTIONS: pa.array(captions, pa.int64()),
            LOST: pa.array(lost, pa.int64()),
            KEPT: pa.array(counts[:, _KEPT_CODE, :].sum(axis=1), pa.int64()),
            LOST_SHARE: pa.array(lost / np.maximum(captions, 1), pa.float64()),
            **{LOST_CLASS[c]: pa.array(lost_counts[:, i], pa.int64()) for i, c in enumerate(CLASSES)},
            **{KEPT_CLASS[c]: pa.array(kept_counts[:, i], pa.int64()) for i, c in enumerate(CLASSES)},
            STATISTIC: pa.array([t[0] for t in tests], pa.float64()),
            P_VALUE: pa.array([t[1] for t in tests], pa.float64()),
            METHOD: pa.array([t[2] for t in tests], pa.string()),
        }
        parts.append(columns)

    out = {n: pa.concat_arrays([p[n] for p in parts]) if parts else pa.array([], LINK_ROT_SCHEMA.field(n).type)
           for n in LINK_ROT_COLUMNS if n not in (Q_VALUE, DIFFERS)}
    q = _bh_within(out[SUBSET].to_pylist(), out[CAUSE].to_pylist(),
                   out[P_VALUE].to_numpy(zero_copy_only=False).astype(float))
    out[Q_VALUE] = pa.array(q, pa.float64(), from_pandas=True)   # NaN -> null
    out[DIFFERS] = pa.array(np.where(np.isnan(q), None, q < alpha).tolist(), pa.bool_())
    meta = {"alpha": float(alpha), "seed": int(seed), "resamples": int(resamples), "correction": CORRECTION,
            "min_expected": MIN_EXPECTED}
    table = pa.table(out, schema=LINK_ROT_SCHEMA.with_metadata({METADATA_KEY: json.dumps(meta)}))
    return table.sort_by([(OCCUPATION, "ascending"), (SUBSET, "ascending"), (CAUSE, "ascending")])


def _bh_within(subsets: list, causes: list, p: np.ndarray) -> np.ndarray:
    """Benjamini-Hochberg q-values over the tested rows of each (subset, cause); NaN where untested."""
    q = np.full(len(p), np.nan)
    family = np.array([json.dumps([s, c]) for s, c in zip(subsets, causes)], dtype=object)
    tested = ~np.isnan(p)
    for f in np.unique(family[tested]) if tested.any() else []:
        idx = np.flatnonzero(tested & (family == f))
        q[idx] = stats.false_discovery_control(p[idx], method="bh")
    return q


def _plain(x):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return None
    return x


def link_rot_summary(table: pa.Table) -> dict:
    """Per (subset, cause) of a ``link_rot_table``: captions, lost share, occupations tested and
    flagged; with the test, correction, alpha, seed and resamples. Plain JSON types, no NaN."""
    meta = json.loads((table.schema.metadata or {}).get(METADATA_KEY, b"{}"))
    rows = table.select([SUBSET, CAUSE, OCCUPATION, CAPTIONS, LOST, P_VALUE, METHOD, DIFFERS]).to_pylist()
    out: dict = {}
    for r in rows:
        s = out.setdefault(r[SUBSET], {}).setdefault(r[CAUSE], {
            "captions": 0, "lost": 0, "lost_share": None, "occupations": 0, "occupations_tested": 0,
            "permutation_tests": 0, "occupations_differing": 0, "differing": []})
        s["captions"] += int(r[CAPTIONS])
        s["lost"] += int(r[LOST])
        s["occupations"] += 1
        if r[P_VALUE] is not None:
            s["occupations_tested"] += 1
            s["permutation_tests"] += int(r[METHOD] == METHOD_PERMUTATION)
        if r[DIFFERS]:
            s["occupations_differing"] += 1
            s["differing"].append(r[OCCUPATION])
    for by_cause in out.values():
        for s in by_cause.values():
            s["lost_share"] = s["lost"] / s["captions"] if s["captions"] else None
            s["differing"].sort(key=lambda o: (o is None, o))
    return {
        "test": (f"lost vs kept captions x gender-indicator class: Pearson chi2 without continuity correction "
                 f"when every expected count >= {_plain(meta.get('min_expected', MIN_EXPECTED))}, else its Monte Carlo "
                 f"permutation p-value"),
        "correction": f"{meta.get('correction', CORRECTION)} across occupations within each (subset, cause)",
        "alpha": _plain(meta.get("alpha")),
        "seed": _plain(meta.get("seed")),
        "resamples": _plain(meta.get("resamples")),
        "subsets": out,
    }

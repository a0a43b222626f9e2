"""Training subsets per occupation (paper 002, sections 4, 5.1, 5.2, 5.3) as a mergeable top-k.

Every subset is "the k best rows of a group" for some order:

* naive:            per occupation, the ``sample_size`` rows with the smallest ``sample_key``
                    (a seeded uniform random sample, section 4);
* nn:               per (occupation, prompt), the ``nn_k`` rows with the highest SBERT cosine to
                    the prompt (section 5.2);
* no_indicators / nn_no_indicators (section 5.1 / 5.3):
    - mode "split" (the paper's): the rows of naive / nn whose caption has no gender indicator;
    - mode "resample": the same top-k, drawn from captions without indicators only.

Section 4 samples 500 training *examples* whose images are classified: T is the share over 500
counted images (every Training value of Tables 6 and 7 is a multiple of 1/500). So the selection
first keeps a larger *pool* per group (``pool_factor`` x k rows in the same order; a bottom-k of a
bottom-k is a prefix, so a larger pool extends a smaller one), and ``walk`` then takes each walked
group's rows in order until k of them are counted (one face, CLIP p >= threshold). With every row
counted (``counted=None``) the walk is the first k rows: the "k captions" reading.

``partial_top_k`` keeps the rows of a batch that are in the top k of their occupation for at least
one order. The top-k of a union lies inside the union of the partial top-ks, so batches reduce
independently on workers, the reduction can be repeated on its own output (a reduction tree),
and ``finalize`` computes the subsets from what is left. A partial never outputs more rows than
it received. Ties are broken by ``caption_id``, so the result does not depend on how the input
was split into files, blocks or batches.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from operators.base import conform
from schemas.captions import CAPTION_GENDER, CAPTION_ID, OCCUPATION, PROMPT_SIMILARITY, SAMPLE_KEY, URL, CaptionGender
from schemas.subsets import (ORDER_KEY, PROMPT, PROMPT_ID, RANK, SELECTION_CANDIDATES, SELECTION_INPUT, SIMILARITY,
                             SOURCE_ROW, SUBSET, TRAINING_SUBSETS, Subset)

MODES = ("split", "resample")
# the columns of a selected row taken from its annotated caption (the rest are its candidate's)
PAYLOAD = [n for n in SELECTION_INPUT.names if n in TRAINING_SUBSETS.names and n not in SELECTION_CANDIDATES.names]

SAMPLE_UNITS = ("counted_images", "captions")
# Rows of one URL within one selection group (LAION and its successors repeat rows): "fold" keeps
# the group's best row of each URL, so no image is counted twice in one T (project choice: the
# paper is silent); "keep" selects them all, the image counted once per row.
DUPLICATES = ("fold", "keep")


class SelectionConfig:
    """k per subset, the no-indicator mode, and what k counts: ``training_sample`` (naive and,
    in resample mode, no_indicators) and ``nn_sample`` (the NN subsets) are "counted_images"
    (walk until k counted images) or "captions" (the first k captions)."""

    def __init__(self, sample_size: int = 500, nn_k: int = 500, n_prompts: int = 4, mode: str = "split",
                 training_sample: str = "captions", nn_sample: str = "captions", pool_factor: float = 1.0,
                 duplicates: str = "fold"):
        if mode not in MODES:
            raise ValueError(f"no_indicator_mode must be one of {MODES}, not {mode!r}")
        if sample_size < 0 or nn_k < 0:
            raise ValueError("sample_size and nn_k must be >= 0")
        for name, value in (("training_sample", training_sample), ("nn_sample", nn_sample)):
            if value not in SAMPLE_UNITS:
                raise ValueError(f"{name} must be one of {SAMPLE_UNITS}, not {value!r}")
        if duplicates not in DUPLICATES:
            raise ValueError(f"duplicates must be one of {DUPLICATES}, not {duplicates!r}")
        self.duplicates = duplicates
        if not pool_factor >= 1:
            raise ValueError(f"pool_factor must be >= 1, not {pool_factor!r}")
        self.sample_size, self.nn_k, self.n_prompts, self.mode = int(sample_size), int(nn_k), int(n_prompts), mode
        self.training_sample, self.nn_sample, self.pool_factor = training_sample, nn_sample, float(pool_factor)

    def as_dict(self) -> dict:
        return {"sample_size": self.sample_size, "nn_k": self.nn_k, "n_prompts": self.n_prompts,
                "no_indicator_mode": self.mode, "training_sample": self.training_sample,
                "nn_sample": self.nn_sample, "duplicates": self.duplicates}

    def walked(self, subset: str) -> bool:
        """Whether ``subset``'s groups are walked to k counted images (else: the first k rows)."""
        if subset in (Subset.NAIVE, Subset.NO_INDICATORS):
            return self.training_sample == "counted_images"
        return self.nn_sample == "counted_images"

    @property
    def walks(self) -> bool:
        return "counted_images" in (self.training_sample, self.nn_sample)

    def pool(self, factor: float | None = None) -> "SelectionConfig":
        """The configuration of the candidate pool: k x ``factor`` (default ``pool_factor``) for
        the walked subsets, k for the others."""
        f = self.pool_factor if factor is None else float(factor)
        size = int(np.ceil(self.sample_size * f)) if self.walked(Subset.NAIVE) else self.sample_size
        nn = int(np.ceil(self.nn_k * f)) if self.walked(Subset.NN) else self.nn_k
        return SelectionConfig(size, nn, self.n_prompts, self.mode, self.training_sample, self.nn_sample,
                               duplicates=self.duplicates)

    def k(self, subset: str) -> int:
        return self.nn_k if subset in Subset.PER_PROMPT else self.sample_size


def _block(rows: pa.Table, subset: str, prompt_id: int, order: np.ndarray, similarity: np.ndarray,
           source: np.ndarray) -> pa.Table:
    n = rows.num_rows
    return pa.table(
        {
            OCCUPATION: rows.column(OCCUPATION),
            SUBSET: pa.array([subset] * n, pa.string()),
            PROMPT_ID: pa.array(np.full(n, prompt_id, np.int32)),
            ORDER_KEY: pa.array(order, pa.float64()),
            CAPTION_ID: rows.column(CAPTION_ID),
            URL: rows.column(URL),
            SIMILARITY: pa.array(similarity, pa.float32()),
            SOURCE_ROW: pa.array(source, pa.int64()),
        },
        schema=SELECTION_CANDIDATES,
    )


def candidates(batch: pa.Table, cfg: SelectionConfig) -> pa.Table:
    """Every (group, row) pair a batch of annotated captions contributes, with its order key and
    the row it came from."""
    batch = batch.select([OCCUPATION, CAPTION_ID, URL, CAPTION_GENDER, PROMPT_SIMILARITY, SAMPLE_KEY])
    sims = batch.column(PROMPT_SIMILARITY).combine_chunks()
    if len(sims):
        lengths = pc.min_max(pc.list_value_length(sims))
        if lengths["min"].as_py() != cfg.n_prompts or lengths["max"].as_py() != cfg.n_prompts:
            raise ValueError(f"{PROMPT_SIMILARITY} must hold {cfg.n_prompts} values per row")
    sim = similarity_matrix(sims, cfg.n_prompts)
    key = batch.column(SAMPLE_KEY).to_numpy()
    src = np.arange(batch.num_rows, dtype=np.int64)
    parts = [_block(batch, Subset.NAIVE, 0, order_key(False, None, key), sim.mean(axis=1), src)]
    parts += [_block(batch, Subset.NN, p + 1, order_key(True, sim[:, p], key), sim[:, p], src)
              for p in range(cfg.n_prompts)]
    if cfg.mode == "resample":
        none = pc.equal(batch.column(CAPTION_GENDER), CaptionGender.NONE).to_numpy(zero_copy_only=False)
        rows, s, k, r = batch.filter(pa.array(none)), sim[none], key[none], src[none]
        parts.append(_block(rows, Subset.NO_INDICATORS, 0, order_key(False, None, k), s.mean(axis=1), r))
        parts += [_block(rows, Subset.NN_NO_INDICATORS, p + 1, order_key(True, s[:, p], k), s[:, p], r)
                  for p in range(cfg.n_prompts)]
    return pa.concat_tables(parts)


def order_key(per_prompt, similarity, sample_key) -> np.ndarray:
    """Rows' ascending order within their selection group: the per-prompt subsets
    (``Subset.PER_PROMPT``: nearest neighbours first) by descending cosine to their prompt, the
    others by ``sample_key`` (a seeded random order). ``per_prompt``: one bool for a group, or one
    per row (``refine.limits`` on a pool of every group); ``similarity`` may be None where it is False."""
    if np.ndim(per_prompt) == 0:
        return (-np.asarray(similarity, np.float64) if per_prompt else np.asarray(sample_key, np.float64))
    return np.where(per_prompt, -np.asarray(similarity, np.float64), np.asarray(sample_key, np.float64))


def similarity_matrix(sims, n_prompts: int) -> np.ndarray:
    """A ``prompt_similarity`` column (n_prompts cosines per row) as a (rows x n_prompts) array."""
    sims = sims.combine_chunks() if isinstance(sims, pa.ChunkedArray) else sims
    if not len(sims):
        return np.zeros((0, n_prompts), np.float32)
    return pc.list_flatten(sims).to_numpy(zero_copy_only=False).reshape(-1, n_prompts)


def _ranked(table: pa.Table) -> tuple[pa.Table, np.ndarray]:
    """Sort by (occupation, subset, prompt_id, order key, caption_id); 0-based rank within group."""
    order = pc.sort_indices(
        table,
        sort_keys=[(OCCUPATION, "ascending"), (SUBSET, "ascending"), (PROMPT_ID, "ascending"),
                   (ORDER_KEY, "ascending"), (CAPTION_ID, "ascending")],
    )
    table = table.take(order)
    return table, _rank_in_group(table)


def first_per_url(table: pa.Table) -> pa.Table:
    """The rows of a ranked candidates table (``_ranked``) that are the first of their URL in their
    group; rows without a URL are all kept. Folding before the top-k selects the k best distinct
    URLs, and it commutes with the reduction tree (a URL's best row in a batch that is not in the
    batch's top k has k better distinct URLs, so its best row overall is not selected either)."""
    if table.num_rows < 2:
        return table
    start, group_id = _group_starts(table)
    url = table.column(URL)
    idx = pa.table({"g": pa.array(group_id, pa.int64()), "u": url, "i": pa.array(np.arange(table.num_rows))})
    have = idx.filter(pc.is_valid(url))
    first = have.group_by(["g", "u"], use_threads=False).aggregate([("i", "min")]).column("i_min").to_numpy()
    keep = np.zeros(table.num_rows, bool)
    keep[first] = True
    keep |= ~np.asarray(pc.is_valid(url).to_numpy(zero_copy_only=False), bool)
    return table.filter(pa.array(keep))


def top_k(table: pa.Table, cfg: SelectionConfig) -> pa.Table:
    """The best rows per (occupation, subset, prompt_id) of a candidates table: ``nn_k`` for the
    per-prompt subsets, ``sample_size`` for the others."""
    table, rank = _ranked(table)
    if cfg.duplicates == "fold":
        table = first_per_url(table)
        rank = _rank_in_group(table)
    per_prompt = pc.is_in(table.column(SUBSET), value_set=pa.array(Subset.PER_PROMPT)).to_numpy(zero_copy_only=False)
    return table.filter(pa.array(rank < np.where(per_prompt, cfg.nn_k, cfg.sample_size)))


def partial_top_k(batch: pa.Table, cfg: SelectionConfig) -> pa.Table:
    """Keep the rows of a batch that are among the best of their occupation for some subset order.

    The output has the input's rows and columns (never more rows than came in, at most
    occupations x orders x k), so it can be applied again to its own output, at any batching,
    before ``finalize``: a reduction tree of any shape gives the same subsets.
    """
    batch = conform(batch, SELECTION_INPUT)
    if batch.num_rows == 0:
        return batch
    best = top_k(candidates(batch, cfg), cfg)
    keep = np.unique(best.column(SOURCE_ROW).to_numpy())
    return batch.take(pa.array(keep, pa.int64()))


def finalize(rows: pa.Table, cfg: SelectionConfig, prompts: dict[str, list[str]]) -> pa.Table:
    """The TRAINING_SUBSETS rows of annotated captions (or of ``partial_top_k`` outputs of them):
    the first k rows per group (the "k captions" reading; ``walk`` without counted images)."""
    return walk(pool(rows, cfg, prompts), cfg)[0]


def pool(rows: pa.Table, cfg: SelectionConfig, prompts: dict[str, list[str]]) -> pa.Table:
    """The selected subsets before the no-indicator split: naive, nn and (resample mode)
    no_indicators, nn_no_indicators, each with up to ``cfg``'s k rows, ranked 1.. in their order."""
    rows = conform(rows, SELECTION_INPUT)
    best = top_k(candidates(rows, cfg), cfg)
    payload = rows.take(best.column(SOURCE_ROW)).select(PAYLOAD)
    best = pa.Table.from_arrays(best.columns + payload.columns, names=best.column_names + payload.column_names)
    best, rank = _ranked(best)
    pid = best.column(PROMPT_ID).to_numpy()
    occ = best.column(OCCUPATION).to_pylist()
    prompt_text = [prompts[o][p - 1] if p > 0 else None for o, p in zip(occ, pid)]
    out = (
        best.drop_columns([ORDER_KEY, PROMPT_ID, SOURCE_ROW])
        .append_column(PROMPT_ID, pa.array(pid, pa.int32(), mask=pid == 0))  # null: prompt-free subset
        .append_column(PROMPT, pa.array(prompt_text, pa.string()))
        .append_column(RANK, pa.array(rank + 1, pa.int32()))
    )
    return conform(out, TRAINING_SUBSETS)


WALK_COLUMNS = ["occupation", "subset", "prompt_id", "target", "walked_captions", "counted_images", "shortfall",
                "pool_rows"]


def walk(pool_rows: pa.Table, cfg: SelectionConfig, counted: np.ndarray | None = None) -> tuple[pa.Table, pa.Table]:
    """The subsets from a pool (``pool``'s output, any pool factor): per group, the rows in rank
    order while fewer than k rows before them are counted; for the groups ``cfg`` does not walk,
    or with ``counted=None``, the first k rows. Then (split mode) the no-indicator subsets are the
    walked rows without indicators. ``counted``: one boolean per pool row (the row's image is
    counted); rows past the walk's end may hold anything.

    Returns the TRAINING_SUBSETS table and, per walked group, the walk: its target k, the
    captions walked, the counted images among them, the shortfall and the pool's rows."""
    pool_rows = conform(pool_rows, TRAINING_SUBSETS)
    order = pc.sort_indices(pool_rows, sort_keys=[(OCCUPATION, "ascending"), (SUBSET, "ascending"),
                                                  (PROMPT_ID, "ascending"), (RANK, "ascending")])
    pool_rows = pool_rows.take(order)
    n = pool_rows.num_rows
    subset = np.asarray(pool_rows.column(SUBSET).to_pylist(), dtype=object)
    walked_group = np.array([cfg.walked(s) for s in subset], bool) if n else np.zeros(0, bool)
    if counted is None:
        walked_group[:] = False
        hit = np.ones(n, bool)
    else:
        counted = np.asarray(counted, bool)
        if counted.shape != (len(order),):
            raise ValueError(f"counted: one value per pool row expected ({len(order)}), got {counted.shape}")
        hit = np.where(walked_group, counted[order.to_numpy()], True)
    k = np.array([cfg.k(s) for s in subset], np.int64) if n else np.zeros(0, np.int64)
    start, group_id = _group_starts(pool_rows)
    excl = np.cumsum(hit) - hit                          # counted rows before each row, overall
    before = excl - excl[start][group_id] if n else excl  # ... within its group
    keep = before < k
    kept = pool_rows.filter(pa.array(keep))
    report = _walk_report(pool_rows, keep, hit, walked_group, k, start, group_id)
    if cfg.mode == "split":
        derived = kept.filter(pc.and_(pc.equal(kept.column(CAPTION_GENDER), CaptionGender.NONE),
                                      pc.is_in(kept.column(SUBSET), pa.array([Subset.NAIVE, Subset.NN]))))
        renamed = pc.if_else(pc.equal(derived.column(SUBSET), Subset.NAIVE), Subset.NO_INDICATORS, Subset.NN_NO_INDICATORS)
        derived = derived.set_column(derived.schema.get_field_index(SUBSET), SUBSET, renamed)
        kept = pa.concat_tables([kept, derived.cast(kept.schema)])
    kept = kept.sort_by([(OCCUPATION, "ascending"), (SUBSET, "ascending"), (PROMPT_ID, "ascending"),
                         (RANK, "ascending")])
    # ranks 1.. within each subset (the derived subsets' rows keep their order)
    kept = kept.set_column(kept.schema.get_field_index(RANK), RANK, pa.array(_rank_in_group(kept) + 1, pa.int32()))
    return conform(kept, TRAINING_SUBSETS), report


def _group_starts(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """For a table sorted by (occupation, subset, prompt_id): each group's first row, and each
    row's group number."""
    n = table.num_rows
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    codes = [pc.dictionary_encode(table.column(c)).combine_chunks().indices.to_numpy(zero_copy_only=False)
             for c in (OCCUPATION, SUBSET)]
    pid = pc.fill_null(table.column(PROMPT_ID), 0).to_numpy()
    new = np.ones(n, bool)
    new[1:] = (codes[0][1:] != codes[0][:-1]) | (codes[1][1:] != codes[1][:-1]) | (pid[1:] != pid[:-1])
    return np.flatnonzero(new), np.cumsum(new) - 1


def _rank_in_group(table: pa.Table) -> np.ndarray:
    """0-based position of each row within its (occupation, subset, prompt_id) group of a table
    sorted by them."""
    start, group_id = _group_starts(table)
    return np.arange(table.num_rows) - start[group_id]


def _walk_report(pool_rows, keep, hit, walked_group, k, start, group_id) -> pa.Table:
    if len(start) == 0 or not walked_group.any():
        return pa.table({c: pa.array([], t) for c, t in zip(WALK_COLUMNS, _WALK_TYPES)})
    groups = len(start)
    walked = np.bincount(group_id, weights=keep, minlength=groups).astype(np.int64)
    counted = np.bincount(group_id, weights=keep & hit, minlength=groups).astype(np.int64)
    rows = np.bincount(group_id, minlength=groups).astype(np.int64)
    sel = walked_group[start]
    first = pool_rows.take(pa.array(start[sel], pa.int64()))
    target = k[start][sel]
    return pa.table({
        "occupation": first.column(OCCUPATION), "subset": first.column(SUBSET), "prompt_id": first.column(PROMPT_ID),
        "target": pa.array(target, pa.int64()), "walked_captions": pa.array(walked[sel], pa.int64()),
        "counted_images": pa.array(counted[sel], pa.int64()),
        "shortfall": pa.array(np.maximum(target - counted[sel], 0), pa.int64()),
        "pool_rows": pa.array(rows[sel], pa.int64()),
    })


_WALK_TYPES = [pa.string(), pa.string(), pa.int32(), pa.int64(), pa.int64(), pa.int64(), pa.int64(), pa.int64()]

"""Training subsets per occupation (paper 002, sections 4, 5.1, 5.2, 5.3) as a mergeable top-k.

Every subset is "the k best rows of a group" for some order:

* naive:            per occupation, the ``sample_size`` rows with the smallest ``sample_key``
                    (a seeded uniform random sample, section 4);
* nn:               per (occupation, prompt), the ``nn_k`` rows with the highest SBERT cosine to
                    the prompt (section 5.2);
* no_indicators / nn_no_indicators (section 5.1 / 5.3):
    - mode "split" (the paper's): the rows of naive / nn whose caption has no gender indicator;
    - mode "resample": the same top-k, drawn from captions without indicators only.

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
from schemas.captions import (
    CAPTION,
    CAPTION_GENDER,
    CAPTION_ID,
    OCCUPATION,
    PROMPT_SIMILARITY,
    SAMPLE_KEY,
    URL,
    CaptionGender,
)
from schemas.subsets import (
    ORDER_KEY,
    PROMPT,
    PROMPT_ID,
    RANK,
    SELECTION_CANDIDATES,
    SELECTION_INPUT,
    SIMILARITY,
    SOURCE_ROW,
    SUBSET,
    TRAINING_SUBSETS,
    Subset,
)

MODES = ("split", "resample")



class SelectionConfig:
    def __init__(self, sample_size: int = 500, nn_k: int = 500, n_prompts: int = 4, mode: str = "split"):
        if mode not in MODES:
            raise ValueError(f"no_indicator_mode must be one of {MODES}, not {mode!r}")
        if sample_size < 0 or nn_k < 0:
            raise ValueError("sample_size and nn_k must be >= 0")
        self.sample_size, self.nn_k, self.n_prompts, self.mode = int(sample_size), int(nn_k), int(n_prompts), mode

    def as_dict(self) -> dict:
        return {"sample_size": self.sample_size, "nn_k": self.nn_k, "n_prompts": self.n_prompts,
                "no_indicator_mode": self.mode}


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
            SIMILARITY: pa.array(similarity, pa.float32()),
            SOURCE_ROW: pa.array(source, pa.int64()),
        },
        schema=SELECTION_CANDIDATES,
    )


def candidates(batch: pa.Table, cfg: SelectionConfig) -> pa.Table:
    """Every (group, row) pair a batch of annotated captions contributes, with its order key and
    the row it came from."""
    batch = batch.select([OCCUPATION, CAPTION_ID, CAPTION_GENDER, PROMPT_SIMILARITY, SAMPLE_KEY])
    sims = batch.column(PROMPT_SIMILARITY).combine_chunks()
    if len(sims):
        lengths = pc.min_max(pc.list_value_length(sims))
        if lengths["min"].as_py() != cfg.n_prompts or lengths["max"].as_py() != cfg.n_prompts:
            raise ValueError(f"{PROMPT_SIMILARITY} must hold {cfg.n_prompts} values per row")
    sim = pc.list_flatten(sims).to_numpy(zero_copy_only=False).reshape(-1, cfg.n_prompts) if len(sims) else np.zeros((0, cfg.n_prompts), np.float32)
    key = batch.column(SAMPLE_KEY).to_numpy()
    src = np.arange(batch.num_rows, dtype=np.int64)
    parts = [_block(batch, Subset.NAIVE, 0, key, sim.mean(axis=1), src)]
    parts += [_block(batch, Subset.NN, p + 1, -sim[:, p].astype(np.float64), sim[:, p], src) for p in range(cfg.n_prompts)]
    if cfg.mode == "resample":
        none = pc.equal(batch.column(CAPTION_GENDER), CaptionGender.NONE).to_numpy(zero_copy_only=False)
        rows, s, k, r = batch.filter(pa.array(none)), sim[none], key[none], src[none]
        parts.append(_block(rows, Subset.NO_INDICATORS, 0, k, s.mean(axis=1), r))
        parts += [_block(rows, Subset.NN_NO_INDICATORS, p + 1, -s[:, p].astype(np.float64), s[:, p], r)
                  for p in range(cfg.n_prompts)]
    return pa.concat_tables(parts)


def _ranked(table: pa.Table) -> tuple[pa.Table, np.ndarray]:
    """Sort by (occupation, subset, prompt_id, order key, caption_id); 0-based rank within group."""
    order = pc.sort_indices(
        table,
        sort_keys=[(OCCUPATION, "ascending"), (SUBSET, "ascending"), (PROMPT_ID, "ascending"),
                   (ORDER_KEY, "ascending"), (CAPTION_ID, "ascending")],
    )
    table = table.take(order)
    n = table.num_rows
    if n == 0:
        return table, np.zeros(0, np.int64)
    occ = pc.dictionary_encode(table.column(OCCUPATION)).combine_chunks().indices.to_numpy(zero_copy_only=False).astype(np.int64)
    sub = pc.dictionary_encode(table.column(SUBSET)).combine_chunks().indices.to_numpy(zero_copy_only=False).astype(np.int64)
    pid = table.column(PROMPT_ID).to_numpy().astype(np.int64)
    new_group = np.ones(n, bool)
    new_group[1:] = (occ[1:] != occ[:-1]) | (sub[1:] != sub[:-1]) | (pid[1:] != pid[:-1])
    starts = np.flatnonzero(new_group)
    group_start = starts[np.cumsum(new_group) - 1]
    return table, np.arange(n) - group_start


def top_k(table: pa.Table, cfg: SelectionConfig) -> pa.Table:
    """The best rows per (occupation, subset, prompt_id) of a candidates table: ``nn_k`` for the
    per-prompt subsets, ``sample_size`` for the others."""
    table, rank = _ranked(table)
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
    """The TRAINING_SUBSETS rows of annotated captions (or of ``partial_top_k`` outputs of them)."""
    rows = conform(rows, SELECTION_INPUT)
    best = top_k(candidates(rows, cfg), cfg)
    payload = rows.take(best.column(SOURCE_ROW)).select([URL, CAPTION, CAPTION_GENDER, SAMPLE_KEY])
    best = pa.Table.from_arrays(best.columns + payload.columns, names=best.column_names + payload.column_names)
    if cfg.mode == "split":
        derived = best.filter(pc.equal(best.column(CAPTION_GENDER), CaptionGender.NONE))
        renamed = pc.if_else(pc.equal(derived.column(SUBSET), Subset.NAIVE), Subset.NO_INDICATORS, Subset.NN_NO_INDICATORS)
        derived = derived.set_column(derived.schema.get_field_index(SUBSET), SUBSET, renamed)
        best = pa.concat_tables([best, derived])
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

"""One row per (caption, occupation), with a stable caption id and a seeded sampling key.

``caption_id`` is a 63-bit hash of (url, caption): the same caption gets the same id in every
run, on every partitioning of the input. ``sample_key`` is a seeded hash of (caption_id,
occupation) mapped to [0, 1); the random sample of an occupation is the n rows with the
smallest keys ("bottom-k" sampling), which is a uniform sample without replacement, exactly
reproducible from the seed, and computable as a streaming partial aggregation.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from operators.base import Resources, with_column
from operators.support.seeds import MASK63, hash64
from schemas.captions import (
    CAPTION,
    CAPTION_ID,
    OCCUPATION,
    OCCUPATIONS,
    SAMPLE_KEY,
    STAGE_EXPLODE,
    URL,
)

def caption_ids(urls: list, captions: list) -> np.ndarray:
    return np.array([hash64(f"{u or ''}\x1f{c}") & MASK63 for u, c in zip(urls, captions)], np.int64)


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: a bijective, well-mixed uint64 -> uint64 map (vectorised)."""
    x = x.astype(np.uint64, copy=True)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


def sample_keys(ids: np.ndarray, occupations: pa.Array, seed: int) -> np.ndarray:
    """Uniform [0, 1) keys, a deterministic function of (seed, caption_id, occupation)."""
    if isinstance(occupations, pa.ChunkedArray):
        occupations = occupations.combine_chunks()
    enc = pc.dictionary_encode(occupations)
    occ_hash = np.array([hash64(s) for s in enc.dictionary.to_pylist()], np.uint64)
    per_row = occ_hash[enc.indices.to_numpy(zero_copy_only=False)] if len(occ_hash) else np.zeros(0, np.uint64)
    x = _mix64(ids.astype(np.uint64) ^ per_row ^ _mix64(np.array([seed], np.uint64))[0])
    return (x >> np.uint64(11)).astype(np.float64) * 2.0**-53


class OccupationExploder:
    stage_name = STAGE_EXPLODE
    # small blocks: they are what the SBERT actors after it share and start on. At 16,384 rows the
    # 4 M-row stream's ~21,600 rows left in two blocks (one actor got three quarters, and SBERT
    # waited for them); at 2,048 the stream took 44.7 s instead of 59.6 s with one SBERT actor and
    # 33.3 s with two (benchmarks/bench_caption_stream.py --explode-batch; docs/benchmarks.md)
    resources = Resources(num_cpus=1, batch_size=2048)

    def __init__(self, seed: int):
        self.seed = int(seed)

    def __call__(self, batch: pa.Table) -> pa.Table:
        ids = caption_ids(batch.column(URL).to_pylist(), batch.column(CAPTION).to_pylist())
        occ = batch.column(OCCUPATIONS).combine_chunks()
        parent = pc.list_parent_indices(occ)
        out = batch.drop_columns([OCCUPATIONS]).take(parent)
        flat = pc.list_flatten(occ)
        row_ids = ids[parent.to_numpy(zero_copy_only=False)]
        out = with_column(out, CAPTION_ID, pa.array(row_ids, pa.int64()))
        out = with_column(out, OCCUPATION, flat)
        return with_column(out, SAMPLE_KEY, pa.array(sample_keys(row_ids, flat, self.seed), pa.float64()))

"""Repeated rows in the training selection: within each subset group a URL is selected
once (its best row), exact duplicate rows and the same URL under other captions are counted
(duplicate_row / duplicate_url), ``keep`` selects them all, and the result does not depend on how
the annotated captions were split into batches (the reduction tree)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from pipelines.studies.amplification.caption_selection import _url_rows, fold_counts, selected_keys
from pipelines.studies.amplification.prompts import prompt_table
from pipelines.studies.amplification.selection import SelectionConfig, finalize, partial_top_k
from schemas.occupations import Occupation
from schemas.subsets import DUPLICATE_ROW, DUPLICATE_URL

PROMPTS = prompt_table([Occupation("nurse"), Occupation("pilot")], ["A photo of {article} {occupation}", "A {occupation} at work"])


def annotated(n=200, seed=0, copies=0, url_dups=0, null_urls=0):
    """n distinct rows, then ``copies`` exact copies of random rows (same url, caption, caption_id,
    keys), ``url_dups`` rows reusing a URL under another caption, ``null_urls`` rows without URL."""
    rng = np.random.default_rng(seed)
    sims = rng.uniform(0, 1, (n, 2)).astype(np.float32)
    base = {"caption_id": rng.permutation(10 * n)[:n].astype(np.int64), "url": [f"u{i}" for i in range(n)],
            "caption": [f"caption {i}" for i in range(n)], "occupation": rng.choice(["nurse", "pilot"], n).tolist(),
            "caption_gender": rng.choice(["male", "female", "none"], n).tolist(), "sims": sims,
            "sample_key": rng.uniform(0, 1, n)}
    rows = [{k: (v[i]) for k, v in base.items()} for i in range(n)]
    for i in rng.integers(0, n, copies):
        rows.append(dict(rows[i]))
    for j, i in enumerate(rng.integers(0, n, url_dups)):
        r = dict(rows[i])
        r.update(caption_id=np.int64(10 * n + j), caption=f"other caption {j}", sample_key=rng.uniform(0, 1),
                 sims=rng.uniform(0, 1, 2).astype(np.float32))
        rows.append(r)
    for j in range(null_urls):
        r = dict(rows[j])
        r.update(caption_id=np.int64(20 * n + j), url=None, caption=f"no url {j}", sample_key=rng.uniform(0, 1) / 100)
        rows.append(r)
    rows = [rows[i] for i in rng.permutation(len(rows))]
    sims = np.stack([r["sims"] for r in rows])
    return pa.table({
        "caption_id": pa.array([int(r["caption_id"]) for r in rows], pa.int64()),
        "url": pa.array([r["url"] for r in rows], pa.string()),
        "caption": [r["caption"] for r in rows], "occupation": [r["occupation"] for r in rows],
        "caption_gender": [r["caption_gender"] for r in rows],
        "prompt_similarity": pa.ListArray.from_arrays(pa.array(np.arange(0, 2 * len(rows) + 1, 2, dtype=np.int32)),
                                                      pa.array(sims.ravel())),
        "sample_key": pa.array([float(r["sample_key"]) for r in rows], pa.float64()),
    })


def select(t, cfg, step=None):
    if step:
        t = pa.concat_tables([partial_top_k(t.slice(i, step), cfg) for i in range(0, t.num_rows, step)])
    return finalize(partial_top_k(t, cfg), cfg, PROMPTS)


def _groups(out):
    return out.to_pandas().groupby(["occupation", "subset", out.to_pandas()["prompt_id"].fillna(0)])


def test_fold_selects_each_url_once_per_group_and_the_k_best_distinct_urls():
    t = annotated(copies=60, url_dups=60)
    cfg = SelectionConfig(sample_size=30, nn_k=20, n_prompts=2)
    out = select(t, cfg)
    for _, g in _groups(out):
        assert g["url"].is_unique
    df = t.to_pandas()
    for occ in ("nurse", "pilot"):   # naive: the 30 smallest sample keys among each URL's best row
        d = df[df.occupation == occ].sort_values(["sample_key", "caption_id"]).drop_duplicates("url")
        got = out.filter(pc.and_(pc.equal(out["occupation"], occ), pc.equal(out["subset"], "naive")))
        assert got["caption_id"].to_pylist() == d.head(30).caption_id.tolist()
    keep = select(t, SelectionConfig(sample_size=30, nn_k=20, n_prompts=2, duplicates="keep"))
    assert any(not g["url"].is_unique for _, g in _groups(keep))       # keep: repeated URLs are selected


@pytest.mark.parametrize("step", [7, 33, 128])
def test_folding_does_not_depend_on_the_batching(step):
    t = annotated(n=400, seed=3, copies=120, url_dups=120, null_urls=10)
    cfg = SelectionConfig(sample_size=25, nn_k=15, n_prompts=2)
    assert select(t, cfg, step).equals(select(t, cfg))


def test_rows_without_url_are_never_folded():
    t = annotated(n=100, null_urls=8)
    out = select(t, SelectionConfig(sample_size=60, nn_k=5, n_prompts=2))
    naive = out.filter(pc.equal(out["subset"], "naive"))
    assert naive["url"].null_count == 8        # their tiny sample keys put all of them in the naive sample


def test_fold_counts_are_exact():
    t = annotated(n=50, copies=0)
    # nurse's first URL three times: twice the same row, once under another caption
    first = t.filter(pc.equal(t["occupation"], "nurse")).slice(0, 1)
    other = first.set_column(0, "caption_id", pa.array([999999], pa.int64())).set_column(
        2, "caption", pa.array(["another caption"]))
    rows = pa.concat_tables([t, first, first, other])
    pool = select(rows, SelectionConfig(sample_size=50, nn_k=5, n_prompts=2))
    keys = selected_keys(pool)
    schema = rows.select(["occupation", "url", "caption_id"]).schema
    parts = [_url_rows(rows.slice(i, 20).select(schema.names), keys) for i in range(0, rows.num_rows, 20)]
    counts = fold_counts(parts, schema)
    assert counts["dropped"] == {DUPLICATE_ROW: 2, DUPLICATE_URL: 1}
    assert counts["rows_out"] == len(keys) and counts["rows_in"] == len(keys) + 3

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from types import SimpleNamespace

from pipelines.studies.amplification.prompts import prompt_table
from pipelines.studies.amplification.selection import SelectionConfig, finalize, partial_top_k
from schemas.occupations import Occupation
from schemas.subsets import TRAINING_SUBSETS

PROMPTS = prompt_table([Occupation("nurse"), Occupation("pilot")], ["A photo of {article} {occupation}", "A {occupation} at work"])


def annotated(n=300, seed=0):
    rng = np.random.default_rng(seed)
    sims = rng.uniform(0, 1, (n, 2)).astype(np.float32)
    return pa.table({
        "caption_id": pa.array(rng.permutation(10 * n)[:n], pa.int64()),
        "url": [f"u{i}" for i in range(n)],
        "caption": [f"caption {i}" for i in range(n)],
        "occupation": rng.choice(["nurse", "pilot"], n).tolist(),
        "caption_gender": rng.choice(["male", "female", "both", "none"], n).tolist(),
        "prompt_similarity": pa.ListArray.from_arrays(pa.array(np.arange(0, 2 * n + 1, 2, dtype=np.int32)), pa.array(sims.ravel())),
        "sample_key": rng.uniform(0, 1, n),
    })


def select(t, cfg):
    return finalize(partial_top_k(t, cfg), cfg, PROMPTS)


def rows(out, occ, subset, prompt_id=None):
    m = pc.and_(pc.equal(out["occupation"], occ), pc.equal(out["subset"], subset))
    part = out.filter(m)
    if prompt_id is not None:
        part = part.filter(pc.equal(part["prompt_id"], prompt_id))
    return part


def test_naive_is_the_bottom_k_of_the_seeded_keys():
    t, cfg = annotated(), SelectionConfig(sample_size=20, nn_k=10, n_prompts=2)
    out = select(t, cfg)
    df = t.to_pandas()
    for occ in ("nurse", "pilot"):
        want = df[df.occupation == occ].nsmallest(20, "sample_key").caption_id.tolist()
        got = rows(out, occ, "naive")
        assert got["caption_id"].to_pylist() == want
        assert got["rank"].to_pylist() == list(range(1, 21))
        assert got["prompt_id"].null_count == 20 and got["prompt"].null_count == 20


def test_nn_is_the_top_k_by_cosine_per_prompt():
    t, cfg = annotated(), SelectionConfig(sample_size=20, nn_k=10, n_prompts=2)
    out = select(t, cfg)
    df = t.to_pandas()
    for p in (1, 2):
        df["s"] = df.prompt_similarity.apply(lambda v: v[p - 1])
        want = df[df.occupation == "pilot"].nlargest(10, "s").caption_id.tolist()
        got = rows(out, "pilot", "nn", p)
        assert got["caption_id"].to_pylist() == want
        assert set(got["prompt"].to_pylist()) == {PROMPTS["pilot"][p - 1]}
        np.testing.assert_allclose(got["similarity"].to_numpy(), df.set_index("caption_id").loc[want, "s"].to_numpy())


def test_split_mode_takes_no_indicator_rows_of_the_selection():
    t, cfg = annotated(), SelectionConfig(sample_size=40, nn_k=30, n_prompts=2, mode="split")
    out = select(t, cfg)
    naive = rows(out, "nurse", "naive").to_pandas()
    noind = rows(out, "nurse", "no_indicators").to_pandas()
    assert noind.caption_id.tolist() == naive[naive.caption_gender == "none"].caption_id.tolist()
    nn = rows(out, "nurse", "nn", 1).to_pandas()
    nnno = rows(out, "nurse", "nn_no_indicators", 1).to_pandas()
    assert nnno.caption_id.tolist() == nn[nn.caption_gender == "none"].caption_id.tolist()
    assert nnno["rank"].tolist() == list(range(1, len(nnno) + 1))


def test_resample_mode_draws_k_from_no_indicator_captions():
    t, cfg = annotated(), SelectionConfig(sample_size=20, nn_k=10, n_prompts=2, mode="resample")
    out = select(t, cfg)
    df = t.to_pandas()
    want = df[(df.occupation == "nurse") & (df.caption_gender == "none")].nsmallest(20, "sample_key").caption_id.tolist()
    assert rows(out, "nurse", "no_indicators")["caption_id"].to_pylist() == want
    assert rows(out, "nurse", "nn_no_indicators", 2).num_rows == 10


@pytest.mark.parametrize("mode", ["split", "resample"])
def test_partial_aggregation_does_not_depend_on_batching(mode):
    t, cfg = annotated(500, seed=4), SelectionConfig(sample_size=25, nn_k=15, n_prompts=2, mode=mode)
    whole = finalize(t, cfg, PROMPTS)
    rng = np.random.default_rng(1)
    shuffled = t.take(rng.permutation(t.num_rows))
    cuts = np.sort(rng.choice(np.arange(1, t.num_rows), 9, replace=False))
    parts = [partial_top_k(shuffled.slice(a, b - a), cfg) for a, b in zip([0, *cuts], [*cuts, t.num_rows])]
    assert finalize(pa.concat_tables(parts), cfg, PROMPTS).equals(whole)
    # a second reduction level over the partials (a reduction tree) changes nothing
    level2 = [partial_top_k(pa.concat_tables(parts[i:i + 4]), cfg) for i in range(0, len(parts), 4)]
    merged = finalize(pa.concat_tables(level2), cfg, PROMPTS)
    assert merged.equals(whole)
    assert merged.schema.equals(TRAINING_SUBSETS)


def test_partials_never_grow_and_are_bounded_by_k():
    t, cfg = annotated(2000, seed=5), SelectionConfig(sample_size=10, nn_k=5, n_prompts=2, mode="resample")
    part = partial_top_k(t, cfg)
    # at most occupations x (naive + 2 NN + no-ind + 2 NN-no-ind) x k rows, and never more than came in
    assert part.num_rows <= 2 * (10 + 2 * 5 + 10 + 2 * 5)
    small = t.slice(0, 7)
    assert partial_top_k(small, cfg).num_rows <= 7


def test_fewer_captions_than_k():
    t = annotated(12)
    out = select(t, SelectionConfig(sample_size=500, nn_k=500, n_prompts=2))
    assert rows(out, "nurse", "naive").num_rows == pc.sum(pc.equal(t["occupation"], "nurse")).as_py()


def test_bad_configuration():
    with pytest.raises(ValueError):
        SelectionConfig(mode="sometimes")
    with pytest.raises(ValueError, match="3 values"):
        partial_top_k(annotated(5), SelectionConfig(n_prompts=3))


@pytest.mark.ray
@pytest.mark.parametrize("mode", ["split", "resample"])
def test_selection_in_the_driver_equals_the_distributed_one(ray_local, mode):
    """Small annotated sets are selected in the driver process: the same subsets and counts as the
    Ray Data reduction (partial top-k, shuffle by occupation, finalize) and its per-block counts."""
    from pipelines.studies.amplification import caption_selection

    t, cfg = annotated(n=150_000, seed=3), SelectionConfig(sample_size=300, nn_k=200, n_prompts=2, mode=mode)
    # a kept --shard-key column (an int id, as COYO's) rides through both reductions as join_key text
    t = t.append_column("id", pc.multiply(t["caption_id"], 3))
    data = ray_local.data.from_arrow([t.slice(i, 20_000) for i in range(0, t.num_rows, 20_000)])
    data = data.map_batches(caption_selection.with_join_key, fn_args=("id",), batch_format="pyarrow", batch_size=None)
    want_subsets, want_stats = caption_selection.select_subsets(ray_local, data, t.num_rows, cfg, PROMPTS, 2)
    subsets, stats = caption_selection.select_subsets_local(caption_selection.with_join_key(t, "id"), cfg, PROMPTS)
    assert subsets.num_rows > 0 and subsets.equals(want_subsets)
    assert stats.equals(want_stats)
    assert subsets["join_key"].to_pylist() == [str(3 * c) for c in subsets["caption_id"].to_pylist()]
    assert pc.all(pc.is_null(select(t, cfg)["join_key"])).as_py()      # without --shard-key: null
    empty, no_stats = caption_selection.select_subsets_local(t.slice(0, 0), cfg, PROMPTS)
    assert empty.num_rows == 0 and empty.schema.equals(TRAINING_SUBSETS) and no_stats.num_rows == 0


# ------------------------------------------- section 4: walk the captions to k counted images
def _pool(t, cfg, factor):
    from pipelines.studies.amplification.selection import pool

    pc_ = cfg.pool(factor)
    return pool(partial_top_k(t, pc_), pc_, PROMPTS)


def test_a_larger_pool_extends_a_smaller_one_and_the_captions_walk_is_finalize():
    from pipelines.studies.amplification.selection import walk

    t = annotated(600)
    cfg = SelectionConfig(sample_size=20, nn_k=10, n_prompts=2, training_sample="counted_images")
    small, big = _pool(t, cfg, 2).to_pandas(), _pool(t, cfg, 5).to_pandas()
    for occ in ("nurse", "pilot"):
        a = small[(small.occupation == occ) & (small.subset == "naive")].caption_id.tolist()
        b = big[(big.occupation == occ) & (big.subset == "naive")].caption_id.tolist()
        assert len(a) == 40 and len(b) == 100 and b[:40] == a   # a prefix, in sample_key order
    # NN is not walked by default: its pool is k rows
    assert len(small[(small.occupation == "nurse") & (small.subset == "nn") & (small.prompt_id == 1)]) == 10
    # with every image counted, the walk is the first k captions: today's selection exactly
    plain = SelectionConfig(sample_size=20, nn_k=10, n_prompts=2)
    assert walk(_pool(t, cfg, 5), cfg)[0].equals(select(t, plain))


def test_walk_stops_at_the_kth_counted_image_in_order_and_reports_shortfalls():
    from pipelines.studies.amplification.selection import walk

    t = annotated(600, seed=3)
    cfg = SelectionConfig(sample_size=20, nn_k=10, n_prompts=2, training_sample="counted_images")
    p = _pool(t, cfg, 3)
    rng = np.random.default_rng(0)
    counted = rng.uniform(size=p.num_rows) < 0.4
    counted[(pc.equal(p["occupation"], "pilot").to_numpy(zero_copy_only=False))] = False  # pilot: nothing counts
    out, report = walk(p, cfg, counted)
    df = p.to_pandas().assign(counted=counted)
    nurse = df[(df.occupation == "nurse") & (df.subset == "naive")].sort_values("rank")
    end = int(np.flatnonzero(nurse.counted.to_numpy().cumsum() == 20)[0])   # the 20th counted row
    got = rows(out, "nurse", "naive")
    assert got["caption_id"].to_pylist() == nurse.caption_id.tolist()[:end + 1]
    assert int(nurse.counted.iloc[:end + 1].sum()) == 20
    # split mode: no_indicators is the walked rows without indicators, ranked 1..
    walked = nurse.iloc[:end + 1]
    assert rows(out, "nurse", "no_indicators")["caption_id"].to_pylist() == \
        walked[walked.caption_gender == "none"].caption_id.tolist()
    # NN is the first k (captions reading), whatever counts
    assert rows(out, "nurse", "nn", 1).num_rows == 10
    r = {(o, s): (w, c, sh) for o, s, w, c, sh in zip(*(report[k].to_pylist() for k in (
        "occupation", "subset", "walked_captions", "counted_images", "shortfall")))}
    assert r[("nurse", "naive")] == (end + 1, 20, 0)
    assert r[("pilot", "naive")] == (60, 0, 20)          # the whole pool walked, 20 short
    assert rows(out, "pilot", "naive").num_rows == 60
    # NN walked too with nn_sample=counted_images
    cfg_nn = SelectionConfig(sample_size=20, nn_k=10, n_prompts=2, training_sample="counted_images",
                             nn_sample="counted_images")
    p2 = _pool(t, cfg_nn, 3)
    out2, report2 = walk(p2, cfg_nn, np.arange(p2.num_rows) % 2 == 0)
    assert set(report2["subset"].to_pylist()) == {"naive", "nn"}
    assert all(c == 10 for s, c in zip(report2["subset"].to_pylist(), report2["counted_images"].to_pylist())
               if s == "nn")


def test_a_walk_limit_below_k_is_refused():
    from pipelines.studies.amplification.caption_settings import selection_config
    from pipelines.studies.amplification.training_walk import walk_training

    cfg = SelectionConfig(sample_size=5, nn_k=5, n_prompts=2, training_sample="counted_images")
    with pytest.raises(ValueError, match="max_walk_factor"):
        walk_training(None, None, TRAINING_SUBSETS.empty_table(), cfg, None, [], None, max_walk_factor=0.5)
    st = SimpleNamespace(selection={"sample_size": 5, "nn_k": 5, "no_indicator_mode": "split", "max_walk_factor": 0},
                         prompts=[1])
    with pytest.raises(ValueError, match="max_walk_factor"):
        selection_config(st)


@pytest.mark.parametrize("first_round", [0.5, 21.0])
def test_a_first_walk_round_below_k_or_past_the_walk_limit_is_refused(first_round):
    from pipelines import amplification
    from pipelines.studies.amplification.caption_settings import selection_config, settings
    from pipelines.studies.amplification.training_walk import walk_training

    cfg = SelectionConfig(sample_size=5, nn_k=5, n_prompts=2, training_sample="counted_images")
    with pytest.raises(ValueError, match="first round must fetch 1 to max_walk_factor"):
        walk_training(None, None, TRAINING_SUBSETS.empty_table(), cfg, None, [], None, first_round=first_round)
    args = amplification.build_parser().parse_args(["run", "--output", "unused", "--walk-first-round", str(first_round)])
    with pytest.raises(ValueError, match=r"walk_first_round \(--walk-first-round\) must be 1 to max_walk_factor"):
        selection_config(settings(args))

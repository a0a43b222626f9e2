"""The bf16 screen's exact subsets (refine.py): from cosines off by up to a margin, the
candidates re-encoded exactly give the pool an all-exact run selects."""

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from pipelines.studies.amplification import refine
from pipelines.studies.amplification.caption_selection import select_subsets_local
from pipelines.studies.amplification.prompts import prompt_table
from pipelines.studies.amplification.selection import SelectionConfig, similarity_matrix
from schemas.occupations import Occupation
from schemas.subsets import Subset

PROMPTS = prompt_table([Occupation("nurse"), Occupation("pilot")], ["A photo of {article} {occupation}", "A {occupation} at work"])


def _sims(values: np.ndarray) -> pa.ListArray:
    n, p = values.shape
    return pa.ListArray.from_arrays(pa.array(np.arange(0, n * p + 1, p, dtype=np.int32)),
                                    pa.array(values.astype(np.float32).ravel()))


def exact_and_screen(n=6000, noise=2e-3, seed=0):
    """Annotated captions with exact cosines packed tightly (many near-ties at every rank), URLs
    repeated (the fold picks each URL's best row), and screen cosines off by up to ``noise``."""
    rng = np.random.default_rng(seed)
    exact = rng.uniform(0.3, 0.5, (n, 2))
    screen = exact + rng.uniform(-noise, noise, (n, 2))
    table = pa.table({
        "caption_id": pa.array(rng.permutation(10 * n)[:n], pa.int64()),
        "url": [f"u{i % (n // 2)}" for i in range(n)],
        "caption": [f"caption {i}" for i in range(n)],
        "occupation": rng.choice(["nurse", "pilot"], n).tolist(),
        "caption_gender": rng.choice(["male", "female", "both", "none"], n).tolist(),
        "prompt_similarity": _sims(exact),
        "sample_key": rng.uniform(0, 1, n),
    })
    return table, table.set_column(table.schema.get_field_index("prompt_similarity"), "prompt_similarity", _sims(screen))


def lookup_encoder(exact: pa.Table, calls: list | None = None):
    """``encode`` for exact_pool: each row's exact cosines, by caption id."""
    where = {c: i for i, c in enumerate(exact["caption_id"].to_pylist())}

    def encode(rows):
        if calls is not None:
            calls.append(rows.num_rows)
        idx = pa.array([where[c] for c in rows["caption_id"].to_pylist()], pa.int64())
        return rows.set_column(rows.schema.get_field_index("prompt_similarity"), "prompt_similarity",
                               exact["prompt_similarity"].take(idx))
    return encode


def refined(screen, exact, cfg, margin=refine.DEFAULT_MARGIN, encode=None, memo=None):
    screen_pool = select_subsets_local(screen, cfg, PROMPTS)[0]
    return refine.exact_pool(screen_pool, cfg, lambda rows: select_subsets_local(rows, cfg, PROMPTS)[0],
                             lambda limits: refine.candidate_rows(screen, limits, cfg),
                             encode or lookup_encoder(exact), margin, memo=memo)


@pytest.mark.parametrize("cfg", [
    SelectionConfig(sample_size=100, nn_k=150, n_prompts=2),
    SelectionConfig(sample_size=100, nn_k=150, n_prompts=2, mode="resample"),
    # the paper preset's shape: a walked naive pool 3x k, the NN subsets their first k captions
    SelectionConfig(sample_size=100, nn_k=150, n_prompts=2, training_sample="counted_images", pool_factor=3).pool(),
    SelectionConfig(sample_size=100, nn_k=150, n_prompts=2, duplicates="keep"),
], ids=["split", "resample", "walk-pool", "keep-duplicates"])
def test_the_screened_pool_is_the_exact_pool(cfg):
    exact, screen = exact_and_screen()
    want = select_subsets_local(exact, cfg, PROMPTS)[0]
    assert not select_subsets_local(screen, cfg, PROMPTS)[0].equals(want)   # the screen alone differs
    calls = []
    got, record = refined(screen, exact, cfg, encode=lookup_encoder(exact, calls))
    assert got.num_rows > 0 and got.equals(want)      # members, ranks and (exact) similarities
    assert record["rounds"] == 1 and record["max_screen_error"] <= 2e-3 + 1e-6
    # only the candidates were encoded again, each once, and they are far fewer than the rows
    assert sum(calls) == record["re_encoded"] == record["candidates"] < screen.num_rows // 2


def test_an_encoder_may_return_the_rows_in_any_order():
    """Ray Data actors hand rows back in any order: they are matched by row, and a lost row is an error."""
    exact, screen = exact_and_screen()
    cfg = SelectionConfig(sample_size=100, nn_k=150, n_prompts=2)
    inner = lookup_encoder(exact)

    def shuffled(rows):
        out = inner(rows)
        return out.take(pa.array(np.random.default_rng(1).permutation(out.num_rows)))
    got, _ = refined(screen, exact, cfg, encode=shuffled)
    assert got.equals(select_subsets_local(exact, cfg, PROMPTS)[0])
    with pytest.raises(RuntimeError, match="returned other rows"):
        refined(screen, exact, cfg, encode=lambda rows: inner(rows).slice(1))
    with pytest.raises(RuntimeError, match="returned other rows"):   # as many rows, one of them twice
        refined(screen, exact, cfg, encode=lambda rows: inner(pa.concat_tables([rows.slice(1), rows.slice(1, 1)])))


def test_limits_per_group():
    """Full similarity groups: the k-th screen key plus twice the margin; full random groups: the
    k-th key itself; groups short of k rows: every row."""
    exact, screen = exact_and_screen(n=600)
    cfg = SelectionConfig(sample_size=100, nn_k=150, n_prompts=2)
    pool = select_subsets_local(screen, cfg, PROMPTS)[0]
    lim = refine.limits(pool, cfg, 0.004)
    for row in lim.to_pylist():
        group = pool.filter(pc.and_(pc.equal(pool["occupation"], row["occupation"]), pc.equal(pool["subset"], row["subset"])))
        if row["prompt_id"]:
            group = group.filter(pc.equal(group["prompt_id"], row["prompt_id"]))
            assert row["subset"] == Subset.NN and group.num_rows == 150
            assert row["limit"] == pytest.approx(-min(group["similarity"].to_pylist()) + 0.008)
        else:
            assert row["subset"] == Subset.NAIVE and group.num_rows == 100
            assert row["limit"] == max(group["sample_key"].to_pylist())
    short = refine.limits(pool, SelectionConfig(sample_size=1000, nn_k=1000, n_prompts=2), 0.004)
    assert np.isinf(short["limit"].to_numpy()).all()


def test_candidates_do_not_depend_on_batching():
    exact, screen = exact_and_screen()
    cfg = SelectionConfig(sample_size=100, nn_k=150, n_prompts=2)
    lim = refine.limits(select_subsets_local(screen, cfg, PROMPTS)[0], cfg, 0.003)
    whole = refine.candidate_rows(screen, lim, cfg)
    parts = pa.concat_tables([refine.candidate_rows(screen.slice(i, 700), lim, cfg) for i in range(0, screen.num_rows, 700)])
    assert whole.num_rows > 0 and sorted(whole["caption_id"].to_pylist()) == sorted(parts["caption_id"].to_pylist())


def test_a_screen_worse_than_the_margin_widens_it_and_stays_exact():
    exact, screen = exact_and_screen(noise=8e-3)
    cfg = SelectionConfig(sample_size=100, nn_k=150, n_prompts=2)
    calls = []
    got, record = refined(screen, exact, cfg, margin=1e-3, encode=lookup_encoder(exact, calls))
    assert got.equals(select_subsets_local(exact, cfg, PROMPTS)[0])
    assert record["rounds"] >= 2 and record["margin"] >= 2 * 7e-3 and record["max_screen_error"] > 1e-3
    # later rounds encode only rows not encoded before: every candidate once
    assert len(calls) >= 2 and sum(calls) == record["re_encoded"] == record["candidates"]


@pytest.mark.parametrize("duplicates", ["keep", "fold"])
def test_exact_repeats_of_a_row_with_different_screens_are_all_kept(duplicates):
    """LAION repeats rows (same URL and caption, so the same caption_id). bf16 may give two copies
    different cosines (their batches differ), so one copy can become a candidate only after the
    margin widened: it takes the exact cosines its twin was encoded with, and no copy is lost."""
    exact, screen = exact_and_screen(noise=8e-3)
    copies = np.arange(0, exact.num_rows, 7)
    twin = screen.take(pa.array(copies))
    moved = similarity_matrix(twin["prompt_similarity"], 2) + np.random.default_rng(5).uniform(-8e-3, 8e-3, (len(copies), 2))
    twin = twin.set_column(twin.schema.get_field_index("prompt_similarity"), "prompt_similarity", _sims(moved))
    exact2 = pa.concat_tables([exact, exact.take(pa.array(copies))])
    screen2 = pa.concat_tables([screen, twin])
    cfg = SelectionConfig(sample_size=100, nn_k=150, n_prompts=2, duplicates=duplicates)
    got, record = refined(screen2, exact2, cfg, margin=1e-3)
    assert record["rounds"] >= 2
    want = select_subsets_local(exact2, cfg, PROMPTS)[0]
    assert got.num_rows > 0 and got.equals(want)


def test_a_walk_s_reselection_encodes_only_rows_not_encoded_before():
    """A walk that runs out of candidates selects again with a larger pool (study.py's reselect):
    with the run's memo the rows already encoded exactly are not encoded again, and the pool is
    the one a refinement from scratch gives."""
    exact, screen = exact_and_screen()
    walk = SelectionConfig(sample_size=100, nn_k=150, n_prompts=2, training_sample="counted_images", pool_factor=3)
    memo, first, again, scratch = {}, [], [], []
    got, record = refined(screen, exact, walk.pool(), encode=lookup_encoder(exact, first), memo=memo)
    assert got.equals(select_subsets_local(exact, walk.pool(), PROMPTS)[0]) and record["refinements"] == 1
    larger = walk.pool(6)
    got, record = refined(screen, exact, larger, encode=lookup_encoder(exact, again), memo=memo)
    want, fresh = refined(screen, exact, larger, encode=lookup_encoder(exact, scratch))
    assert got.num_rows > 0 and got.equals(want) and want.equals(select_subsets_local(exact, larger, PROMPTS)[0])
    assert 0 < sum(again) < sum(scratch) == fresh["re_encoded"]      # only the rows the larger pool added
    assert record["re_encoded"] == sum(first) + sum(again) and record["refinements"] == 2
    assert memo["exact"].num_rows == sum(first) + sum(again)
    # the margin starts no narrower than the errors seen before: a memo that saw a larger error
    # widens the next call's margin at once (one more round), and the pool is still the exact one
    memo["max_screen_error"] = 0.01
    got, record = refined(screen, exact, larger, encode=lookup_encoder(exact), memo=memo)
    assert got.equals(want) and record["rounds"] == 2 and record["margin"] == 0.02


def test_a_screen_that_never_stays_within_a_margin_is_an_error(monkeypatch):
    exact, screen = exact_and_screen(n=600)
    cfg = SelectionConfig(sample_size=100, nn_k=150, n_prompts=2)
    monkeypatch.setattr(refine, "MAX_ROUNDS", 1)     # a round's re-encoded rows are off by more than its margin
    with pytest.raises(refine.ScreenBoundExceeded, match="--sbert-backend torch"):
        refined(screen, exact, cfg, margin=1e-4)
    with pytest.raises(ValueError, match="margin"):
        refined(screen, exact, cfg, margin=0)


def test_rows_of_occupations_not_screened_are_taken_as_they_are():
    """Backend "auto" screens some occupations only: the rows of the others already hold torch's
    cosines, so the refinement keeps them without encoding them again and the pool is still the exact
    one. Told (wrongly) that none was screened, the screened rows' cosines would decide it."""
    cfg = SelectionConfig(sample_size=100, nn_k=150, n_prompts=2)
    exact, screen = exact_and_screen()
    nurse = pc.equal(screen["occupation"], "nurse")
    # the stream screened the pilots only: the nurses' rows carry their exact cosines
    mixed = pa.table({c: pc.if_else(nurse, exact[c], screen[c]) if c == "prompt_similarity" else screen[c]
                      for c in screen.column_names})
    want = select_subsets_local(exact, cfg, PROMPTS)[0]
    screen_pool = select_subsets_local(mixed, cfg, PROMPTS)[0]
    calls = []
    got, record = refine.exact_pool(screen_pool, cfg, lambda rows: select_subsets_local(rows, cfg, PROMPTS)[0],
                                    lambda limits: refine.candidate_rows(mixed, limits, cfg),
                                    lookup_encoder(exact, calls), screened_occupations=["pilot"])
    assert got.num_rows > 0 and got.equals(want)
    pilots = pc.sum(pc.equal(want["occupation"], "pilot")).as_py()
    assert 0 < sum(calls) == record["re_encoded"] < record["candidates"] and pilots > 0
    # every row encoded again was a pilot's
    encoded = []
    refine.exact_pool(screen_pool, cfg, lambda rows: select_subsets_local(rows, cfg, PROMPTS)[0],
                      lambda limits: refine.candidate_rows(mixed, limits, cfg),
                      lambda rows: encoded.append(set(rows["occupation"].to_pylist())) or lookup_encoder(exact)(rows),
                      screened_occupations=["pilot"])
    assert encoded == [{"pilot"}]
    # with no occupation screened nothing is encoded and the pool is the one selected as it is
    calls.clear()
    got, record = refine.exact_pool(select_subsets_local(exact, cfg, PROMPTS)[0], cfg,
                                    lambda rows: select_subsets_local(rows, cfg, PROMPTS)[0],
                                    lambda limits: refine.candidate_rows(exact, limits, cfg),
                                    lookup_encoder(exact, calls), screened_occupations=[])
    assert got.equals(want) and calls == [] and record["re_encoded"] == 0


def test_the_screen_plan_estimates_each_occupations_captions_from_the_start_of_the_input(tmp_path):
    """``screen_plan``: the captions naming each occupation in the first rows read, scaled to the
    input's rows; screened where that is at least ``factor`` x what its pool can hold."""
    import pyarrow.parquet as pq

    from pipelines.engine.storage.inputs import resolve_parquet_inputs

    nurses = ["a nurse at work"] * 300 + ["two nurses"] * 100 + ["a pilot"] * 40 + ["a tree", None, ""] * 20
    for i in range(2):
        pq.write_table(pa.table({"TEXT": nurses, "URL": [f"u{j}" for j in range(len(nurses))]}),
                       tmp_path / f"part-{i}.parquet")
    from operators.base import Stage
    from operators.text_caption_validator import CaptionValidator
    from operators.text_occupation_matcher import OccupationMatcher

    inp = resolve_parquet_inputs([str(tmp_path)], "footer")
    occs = [Occupation("nurse"), Occupation("pilot")]
    cfg = SelectionConfig(sample_size=2, nn_k=3, n_prompts=2)

    def screen_plan(forms, cfg, **kw):   # through the scan's own stages, as `planned` calls it
        stages = [Stage(CaptionValidator, {"text_column": "TEXT", "url_column": "URL"}),
                  Stage(OccupationMatcher, {"occupations": occs, "forms": forms})]
        return refine.screen_plan(inp, ["TEXT", "URL"], stages, ["nurse", "pilot"], cfg, **kw)

    assert refine.pool_rows(cfg) == 2 + 2 + 3 * 2 + 3 * 2
    plan = screen_plan("plural", cfg, sample_rows=250, factor=10, min_rows=0)
    # 250 rows read: 250 nurse captions, no pilot; scaled to the 1,000 rows of both files
    assert plan["sampled_rows"] == 250 and plan["input_rows"] == 1000
    assert plan["estimated_captions"] == {"nurse": 1000, "pilot": 0} and plan["screened"] == ["nurse"]
    plan = screen_plan("plural", cfg, sample_rows=10_000, factor=2, min_rows=880)
    assert plan["sampled_rows"] == 1000 and plan["estimated_captions"] == {"nurse": 800, "pilot": 80}
    assert plan["screened"] == ["nurse", "pilot"]
    # too few captions to screen in all (the actors' OpenVINO start-up would not pay back): none
    assert screen_plan("plural", cfg, factor=2, min_rows=881)["screened"] == []
    assert screen_plan("singular", cfg, factor=2)["estimated_captions"]["nurse"] == 600
    # a file that cannot be read ends the sample (the scan reports it): the estimate is from what was read
    data = bytearray((tmp_path / "part-1.parquet").read_bytes())
    data[4:400] = bytes(b ^ 0x5A for b in data[4:400])
    (tmp_path / "part-1.parquet").write_bytes(bytes(data))
    plan = screen_plan("plural", cfg, sample_rows=10_000, factor=2, min_rows=0)
    assert plan["sampled_rows"] == 500 and "part-1.parquet" in plan["sample_stopped"]
    assert plan["estimated_captions"] == {"nurse": 800, "pilot": 80}


def test_the_screen_plan_samples_an_input_sorted_by_caption_across_its_order(tmp_path):
    """An input larger than the sample is read at places spread over its rows (the row group holding
    each): sorted by caption, with every nurse first and every pilot after them, both are estimated
    near their counts; read from its start, the pilots would be estimated at none."""
    import pyarrow.parquet as pq

    from operators.base import Stage
    from operators.text_caption_validator import CaptionValidator
    from operators.text_occupation_matcher import OccupationMatcher
    from pipelines.engine.storage.inputs import resolve_parquet_inputs

    def write(folder, rows, group_rows):
        folder.mkdir()
        for i, (a, b) in enumerate(zip([0, *np.cumsum(rows)[:-1]], np.cumsum(rows))):
            pq.write_table(pa.table({"TEXT": text[a:b], "URL": [f"u{j}" for j in range(a, b)]}),
                           folder / f"part-{i}.parquet", row_group_size=group_rows[i])
        return resolve_parquet_inputs([str(folder)], "footer")

    text = ["a nurse at work"] * 400 + ["a pilot in the cockpit"] * 400 + ["a tree"] * 200
    inp = write(tmp_path / "sorted", [500, 500], [25, 25])      # 40 row groups of 25 rows
    occs = [Occupation("nurse"), Occupation("pilot")]
    stages = [Stage(CaptionValidator, {"text_column": "TEXT", "url_column": "URL"}),
              Stage(OccupationMatcher, {"occupations": occs, "forms": "plural"})]
    cfg = SelectionConfig(sample_size=2, nn_k=3, n_prompts=2)

    def plan(inp, rows):
        return refine.screen_plan(inp, ["TEXT", "URL"], stages, ["nurse", "pilot"], cfg, sample_rows=rows,
                                  factor=2, min_rows=0)

    def where(inp, rows, **kw):
        return [(p.rsplit("/", 1)[-1], g[0] if g else None, n) for p, g, n in refine.sample_spots(inp, rows, **kw)]

    # 8 places of 30 rows from rows 50, 175, 300 (nurses), 425, 550, 675 (pilots), 800, 925 (trees)
    assert where(inp, 240) == [(f"part-{f}.parquet", g, 30) for f in (0, 1) for g in (2, 7, 12, 17)]
    got = plan(inp, 240)
    assert got["sampled_rows"] == 240 and got["sampled_from"] == "spread"
    assert got["estimated_captions"] == {"nurse": 375, "pilot": 375}        # 90 of 240 each, of 1,000 rows
    # read from the start (one place) the sorted input shows nurses only
    found, read, _ = refine.sample_occupations(inp, ["TEXT", "URL"], stages, 240, spots=1)
    assert read == 240 and found == {"nurse": 240}
    start = refine.screen_plan(inp, ["TEXT", "URL"], stages, ["nurse", "pilot"], cfg, sample_rows=240, spots=1)
    assert start["sampled_from"] == "start" and start["estimated_captions"] == {"nurse": 1000, "pilot": 0}
    # an input no larger than the sample is read whole: the counts themselves
    whole = plan(inp, 1000)
    assert whole["sampled_from"] == "all" and whole["estimated_captions"] == {"nurse": 400, "pilot": 400}
    # a place reads on through its file's later row groups (rows 250-499 and 750-999), not beyond
    assert [g for _, g, _ in refine.sample_spots(inp, 800, spots=2)] == [list(range(10, 20))] * 2
    assert refine.sample_occupations(inp, ["TEXT", "URL"], stages, 800, spots=2)[:2] == ({"nurse": 150, "pilot": 150}, 500)
    # at most a quarter of the row groups: 9 row groups give 2 places; here both fall in the first
    # file's one row group of 800 rows, read there once with both places' rows
    uneven = write(tmp_path / "uneven", [800, 200], [800, 25])
    assert where(uneven, 240) == [("part-0.parquet", 0, 240)]
    # under 8 row groups: read from the start of the input, as it comes
    few = write(tmp_path / "few", [500, 500], [100, 500])
    assert where(few, 240) == [("part-0.parquet", None, 240), ("part-1.parquet", None, 240)]
    assert plan(few, 240)["sampled_from"] == "start" and plan(few, 240)["estimated_captions"]["pilot"] == 0

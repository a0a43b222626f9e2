"""Every tally and error budget is a property of the rows, not of how they were cut or resumed.

Property-based (hypothesis): the same rows, cut at random into files, row groups, scan fragments,
batches and stream blocks, and killed and resumed at random points, must give the same rows in,
kept and dropped per reason at every stage, the same error-budget counts and the same verdict, as
one uninterrupted pass over one block. The real code of each phase's accounting and resume path
runs here, in process (no Ray: the fast tier): the caption scan (``FragmentScan``, the shard
tallies and the caption budget), the paraphrases (checkpointed answers), the training walk (its
per-URL checkpoint and round budgets) and generation (per-image checkpoints).
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.engine.storage import checkpoint, io
from pipelines.engine.storage.inputs import resolve_parquet_inputs
from pipelines.engine.stream import scan
from pipelines.engine.generation import generation_budget
from pipelines.engine.stream.progress import ErrorBudget, ErrorBudgetExceeded
from pipelines.engine.run.rundir import RunDir
from pipelines.engine.stats.summary import check_chain, stage_counts, summarize
from schemas import captions as C
from schemas import images as I
from schemas.occupations import Occupation

PROPERTY = settings(max_examples=25, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def cuts(draw, n: int, most: int) -> list[int]:
    """Random lengths (each >= 1) that add up to ``n``: how ``n`` rows are cut into pieces."""
    out, left = [], n
    while left > 0:
        size = draw(st.integers(1, max(1, min(left, most))))
        out.append(size)
        left -= size
    return out


def pieces(table: pa.Table, lengths: list[int]) -> list[pa.Table]:
    out, at = [], 0
    for n in lengths:
        out.append(table.slice(at, n))
        at += n
    return out


# ------------------------------------------------------------------------------ the caption scan
CAPTIONS = ["a nurse at work", "Portrait of a doctor and her son", "the pilot, a man", "Doctor\x00Susan Wilson",
            "chef\u00adcooking", "a landscape", None, "", "   ", "two lawyers\u200bin court", "a woman who is a CEO",
            "teacher", "boys with a firefighter"]


@pytest.fixture(scope="module")
def caption_stages():
    """The fusable prefix of the real caption stage list (validate, normalise, occupations, words)."""
    from pipelines import amplification
    from pipelines.engine.cli.options import RunOptions
    from pipelines.studies.amplification.caption_settings import settings as caption_settings
    from pipelines.studies.amplification.caption_stages import caption_stages as stages_of

    args = amplification.build_parser().parse_args(["captions", "--output", "/tmp/unused", "--no-names"])
    pipeline = stages_of(caption_settings(args), RunOptions.from_args(args), {"text_column": "TEXT", "url_column": "URL"})
    return pipeline[:scan.fusable(pipeline)]


def scan_once(stages, files: list[pa.Table], row_group: int, fragment_rows: int, batch_rows: int,
              root: Path) -> list[pa.Table]:
    """What the fused scan's tasks emit over ``files`` (one output table per fragment)."""
    for old in root.glob("*.parquet"):
        old.unlink()
    for i, t in enumerate(files):
        pq.write_table(t, root / f"part-{i:03d}.parquet", row_group_size=row_group, **io.WRITE_OPTIONS)
    inp = resolve_parquet_inputs(str(root))
    fused = scan.FragmentScan(inp.filesystem, ["TEXT", "URL"], stages, C.stream_schema(), batch_rows)
    return [fused.scan(f["path"], f["row_groups"]) for f in scan.fragments(inp, fragment_rows)]


def tallies_of(table: pa.Table) -> pa.Table:
    return table.filter(pc.is_valid(table.column(C.TALLY_STAGE)))


def kept_rows(outputs: list[pa.Table]) -> list[tuple]:
    """The (caption, url) of the data rows the scan kept, sorted."""
    rows = pa.concat_tables(outputs)
    rows = rows.filter(pc.is_null(rows.column(C.TALLY_STAGE)))
    return sorted(zip(rows.column(C.CAPTION).to_pylist(), rows.column(C.URL).to_pylist()))


def caption_budget() -> ErrorBudget:
    return ErrorBudget(C.STAGE_CAPTIONS, {}, 0.05, 1)


def verdict(budget: ErrorBudget) -> bool:
    try:
        budget.check(final=True)
    except ErrorBudgetExceeded:
        return False
    return True


@st.composite
def caption_cuts(draw):
    captions = draw(st.lists(st.sampled_from(CAPTIONS), min_size=1, max_size=120))
    return {"captions": captions, "files": cuts(draw, len(captions), 50), "row_group": draw(st.integers(1, 40)),
            "fragment_rows": draw(st.integers(1, 64)), "batch_rows": draw(st.integers(1, 64)),
            "blocks": draw(st.integers(1, 6)), "done_shards": draw(st.integers(0, 4))}


@PROPERTY
@given(case=caption_cuts())
def test_the_caption_scan_counts_the_same_however_the_input_is_cut_and_resumed(caption_stages, case):
    from pipelines.studies.amplification.caption_scan import CAPTION_TALLIES, TALLY_SCHEMA, _TallyBudget

    captions = case["captions"]
    table = pa.table({"TEXT": pa.array(captions, pa.string()), "URL": [f"u{i}" for i in range(len(captions))]})
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "in"
        root.mkdir()
        one = scan_once(caption_stages, [table], len(captions), 1 << 20, 1 << 20, root)
        cut = scan_once(caption_stages, pieces(table, case["files"]), case["row_group"], case["fragment_rows"],
                        case["batch_rows"], root)
        order = [s.name for s in caption_stages]
        want = summarize(stage_counts(tallies_of(pa.concat_tables(one))), order)
        got = summarize(stage_counts(tallies_of(pa.concat_tables(cut))), order)
        assert got == want
        check_chain(got)
        assert got[C.STAGE_CAPTIONS]["rows_in"] == len(captions)
        assert kept_rows(cut) == kept_rows(one)
        # the caption budget: every fragment's tally rows, in stream blocks of several fragments,
        # some of them from shards a killed attempt finished (read back from their tally part)
        reference = caption_budget()
        _TallyBudget(reference).add(pa.concat_tables(one))
        nulls = sum(c is None for c in captions)
        empty = sum(c is not None and not c.strip() for c in captions)
        assert reference.seen == len(captions)
        assert {k: v for k, v in reference.failed.items() if v} == {k: v for k, v in (
            (C.DROP_NULL, nulls), (C.DROP_EMPTY, empty)) if v}
        budget = caption_budget()
        rd = RunDir(str(Path(tmp) / "runs"), "r")
        shards = [cut[i:i + 2] for i in range(0, len(cut), 2)]
        for i, shard in enumerate(shards):
            tallies = tallies_of(pa.concat_tables(shard)).select(TALLY_SCHEMA.names).cast(TALLY_SCHEMA)
            if i < case["done_shards"]:   # finished before the kill: its committed tallies are read back
                rd.write_part(CAPTION_TALLIES, tallies, key=f"shard-{i:05d}")
                _TallyBudget(budget).add(rd.read_part(CAPTION_TALLIES, f"shard-{i:05d}", TALLY_SCHEMA))
                continue
            size = -(-len(shard) // case["blocks"])
            for j in range(0, len(shard), size):
                _TallyBudget(budget).add(pa.concat_tables(shard[j:j + size]))
        assert (budget.seen, budget.failed) == (reference.seen, reference.failed)
        assert verdict(budget) == verdict(reference)


def test_one_block_of_many_fragments_sums_each_outcome():
    """The case that was wrong: 8 row groups of 5.4% null captions each, in one block, against a
    5% budget: the block's 8 null_caption rows were kept as the last one (216 for 864)."""
    from pipelines.studies.amplification.caption_scan import _TallyBudget
    from operators.base import tally_rows

    block = pa.concat_tables([tally_rows(C.STAGE_CAPTIONS, {C.OUTCOME_KEPT: 1892, C.DROP_NULL: 108}, C.stream_schema())
                              for _ in range(8)])
    budget = caption_budget()
    _TallyBudget(budget).add(block)
    assert budget.seen == 16000 and budget.failed == {C.DROP_NULL: 864}
    assert not verdict(budget)


# -------------------------------------------------------------------------------- the paraphrases
@st.composite
def paraphrase_cuts(draw):
    n = draw(st.integers(1, 30))
    texts = [draw(st.sampled_from(["a nurse", "the nurse at work", "nurses"])) for _ in range(n)]
    answers = [draw(st.sampled_from(["Two nurses", "A nurse smiling", "", "  ", "a person", None])) for _ in range(n)]
    done = draw(st.lists(st.integers(0, n - 1), unique=True, max_size=n))
    return {"texts": texts, "answers": answers, "done": done, "blocks": cuts(draw, n, 7),
            "retried": draw(st.booleans())}


@PROPERTY
@given(case=paraphrase_cuts())
def test_paraphrases_count_every_request_once_however_killed_and_resumed(case):
    import pandas as pd

    from pipelines.studies.amplification import paraphrases as PP
    from schemas import paraphrases as P

    occupations = [Occupation("nurse")]
    n = len(case["texts"])
    rows = pa.table({"caption_id": pa.array(range(n), pa.int64()), "occupation": ["nurse"] * n,
                     "caption": case["texts"], "caption_gender": ["none"] * n, "url": [f"u{i}" for i in range(n)]})
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "answers.csv"
        listed = [i for i in range(n) if case["answers"][i] is not None]
        pd.DataFrame({"caption_id": listed, "caption": [case["texts"][i] for i in listed],
                      "paraphrase": [case["answers"][i] for i in listed]}).to_csv(path, index=False)
        pst = PP.ParaphraseSettings(None, file=str(path), file_sha256="f")
        requests = PP.requests_from(rows, pst, occupations)

        def attempt(rd, todo_filter=None):
            budget = PP.budget({"max_error_rate": 0.5, "error_budget_min_rows": 1})
            keys = requests.column(P.PARAPHRASE_KEY)
            done = PP._answers(rd, keys)
            todo = requests.filter(pc.invert(pc.is_in(keys, done.column(P.PARAPHRASE_KEY))))
            budget.add(done)
            if todo_filter is not None:
                todo = todo.filter(pc.is_in(todo.column("caption_id"), pa.array(todo_filter, pa.int64())))
            answered = PP.from_file(todo, str(path), occupations, "plural") if todo.num_rows else None
            for block in (pieces(answered, cuts_of(case["blocks"], answered.num_rows)) if answered else []):
                rd.write_part(PP.CHECKPOINT, block)
                if case["retried"]:        # a retried task wrote its block twice
                    rd.write_part(PP.CHECKPOINT, block)
                budget.add(block)
            return budget

        whole = RunDir(str(Path(tmp) / "runs"), "whole")
        one = attempt(whole)
        want = PP.with_answers(whole, requests)
        resumed = RunDir(str(Path(tmp) / "runs"), "resumed")
        attempt(resumed, todo_filter=case["done"])     # killed after these requests' answers
        again = attempt(resumed)
        got = PP.with_answers(resumed, requests)
        assert one.seen == again.seen == n == want.num_rows
        assert again.failed == one.failed
        cols = ["caption_id", P.PARAPHRASE, P.PARAPHRASE_STATUS]
        assert got.select(cols).equals(want.select(cols))
        # each caption id has its own file row's answer, whatever other ids with the same text have
        status = dict(zip(want["caption_id"].to_pylist(), want[P.PARAPHRASE_STATUS].to_pylist()))
        for i in range(n):
            a = case["answers"][i]
            expect = (P.ParaphraseStatus.NOT_IN_FILE if a is None else P.ParaphraseStatus.EMPTY if not a.strip()
                      else P.ParaphraseStatus.NO_OCCUPATION if a == "a person" else P.ParaphraseStatus.OK)
            assert status[i] == expect, (i, case["texts"][i], a)


def cuts_of(lengths: list[int], n: int) -> list[int]:
    """``lengths`` reused to cut ``n`` rows (the last piece takes what is left)."""
    out, left = [], n
    for size in lengths:
        if left <= 0:
            break
        out.append(min(size, left))
        left -= out[-1]
    if left > 0:
        out.append(left)
    return out


# ------------------------------------------------------------------------ generation checkpoints
@st.composite
def generation_cuts(draw):
    n = draw(st.integers(1, 40))
    statuses = [draw(st.sampled_from(I.GenerationStatus.ALL)) for _ in range(n)]
    return {"statuses": statuses, "done": draw(st.lists(st.integers(0, n - 1), unique=True, max_size=n)),
            "blocks": cuts(draw, n, 9), "retried": draw(st.booleans()), "per_request": draw(st.sampled_from([1, 3]))}


@PROPERTY
@given(case=generation_cuts())
def test_generation_budgets_and_rows_do_not_depend_on_blocks_or_kill_points(case):
    model, name = "org/model", checkpoint.generation_checkpoint("org/model")
    per = case["per_request"]
    n = len(case["statuses"])
    requests = pa.table({I.MODEL: [model] * n, "request_id": pa.array(range(n), pa.int64())})
    schema = pa.schema([pa.field(I.MODEL, pa.string()), pa.field("request_id", pa.int64()),
                        pa.field("image_id", pa.int64()), pa.field(I.GENERATION_STATUS, pa.string())])
    images = pa.table({I.MODEL: [model] * (n * per), "request_id": [i for i in range(n) for _ in range(per)],
                       "image_id": list(range(n * per)),
                       I.GENERATION_STATUS: [s for s in case["statuses"] for _ in range(per)]}, schema=schema)
    key, rkey = ("image_id", "request_id") if per > 1 else ("request_id", None)
    execution = {"max_error_rate": 0.3, "error_budget_min_rows": 1}

    def attempt(rd, only=None):
        """``checkpoint.generate``'s accounting with the generator replaced by ``images``."""
        budget = generation_budget(execution, model)
        done = checkpoint.checkpointed(rd, name, model, requests, schema, key, rkey, per)
        todo = checkpoint.still_to_do(requests, done, rkey or key)
        budget.add(done)
        if only is not None:
            todo = todo.filter(pc.is_in(todo.column("request_id"), pa.array(only, pa.int64())))
        made = images.filter(pc.is_in(images.column("request_id"), todo.column("request_id")))
        for block in pieces(made, cuts_of(case["blocks"], made.num_rows)):
            rd.write_part(name, block)
            if case["retried"]:
                rd.write_part(name, block)
            budget.add(block)
        rows = checkpoint.checkpointed(rd, name, model, requests, schema, key, rkey, per)
        return budget, rows

    with tempfile.TemporaryDirectory() as tmp:
        whole = RunDir(tmp, "whole")
        one, rows = attempt(whole)
        want = checkpoint.in_request_order(rows, requests, key, model, rkey, per)
        resumed = RunDir(tmp, "resumed")
        # killed after the requests in ``done`` and inside the block of another: a triplet unit
        # with only its first image written stays to do (and a done unit's first image written
        # again is read once)
        attempt(resumed, only=case["done"])
        if per > 1:
            cut = [i for i in range(n) if i not in case["done"]][:1] + case["done"][:1]
            for request in cut:
                part = images.filter(pc.equal(images.column("request_id"), request)).slice(0, 1)
                RunDir(tmp, "resumed").write_part(name, part)
        again, rows = attempt(resumed)
        got = checkpoint.in_request_order(rows, requests, key, model, rkey, per)
        assert got.equals(want)
        assert one.seen == again.seen == n * per
        assert again.failed == one.failed
        failures = sum(s in I.GenerationStatus.FAILURES for s in case["statuses"]) * per
        assert sum(one.failed.values()) == failures
        assert verdict(one) == verdict(again)


# ---------------------------------------------------------------------------- the training walk
@st.composite
def walk_cuts(draw):
    n = draw(st.integers(4, 40))
    kinds = [draw(st.sampled_from(["counted", "no_face", "http_error", "timeout", "not_image"])) for _ in range(n)]
    return {"kinds": kinds, "kill_after": draw(st.integers(0, n)), "blocks": cuts(draw, n, 6),
            "retried": draw(st.booleans()), "k": draw(st.integers(1, 4))}


@PROPERTY
@given(case=walk_cuts())
def test_the_training_walk_and_its_budgets_do_not_depend_on_blocks_or_kill_points(case):
    from pipelines.engine.stream.progress import Phase
    from pipelines.studies.amplification import images as image_side
    from pipelines.studies.amplification.selection import SelectionConfig
    from pipelines.studies.amplification.run_settings import image_budgets
    from pipelines.studies.amplification.training_walk import walk_training
    from schemas.subsets import TRAINING_SUBSETS

    n, k = len(case["kinds"]), case["k"]
    pool = pa.Table.from_pylist([{"occupation": "nurse", "subset": "naive", "prompt_id": None, "prompt": None,
                                  "rank": r + 1, "caption_id": r, "url": f"http://x/{r}.jpg", "caption": f"a nurse {r}",
                                  "caption_gender": "none", "similarity": 0.5, "sample_key": r / 100}
                                 for r in range(n)], schema=TRAINING_SUBSETS)
    schema = image_side.TRAINING_RESULT_SCHEMA

    def result(url: str) -> dict:
        kind = case["kinds"][int(url.rsplit("/", 1)[1].split(".")[0])]
        fetch = kind if kind in ("http_error", "timeout", "not_image") else "ok"
        return {C.URL: url, I.FETCH_STATUS: fetch, I.FACE_STATUS: "ok" if kind == "counted" else
                ("no_face" if kind == "no_face" else None), I.COUNTED: kind == "counted"}

    class Killed(Exception):
        pass

    def fetcher(rd, kill_after):
        fetched = [0]

        def fetch(rows, budgets):   # the image side: its per-URL checkpoint, the budgets fed as on Ray
            urls = image_side.unique_urls(rows, [])
            done = image_side.checkpointed_results(rd, urls)
            for b in budgets:
                b.add(done)
            todo = urls.filter(pc.invert(pc.is_in(urls.column(C.URL), done.column(C.URL))))
            made = pa.Table.from_pylist([result(u) for u in todo.column(C.URL).to_pylist()], schema=schema)
            for block in pieces(made, cuts_of(case["blocks"], made.num_rows)):
                if kill_after is not None and fetched[0] + block.num_rows > kill_after:
                    raise Killed
                rd.write_part(image_side.TRAINING_CHECKPOINT, block)
                if case["retried"]:
                    rd.write_part(image_side.TRAINING_CHECKPOINT, block)
                fetched[0] += block.num_rows
                for b in budgets:
                    b.add(block)
            got = image_side.checkpointed_results(rd, urls)
            return got, Phase("training images", "URLs", urls.num_rows, processed=todo.num_rows)
        return fetch

    cfg = SelectionConfig(sample_size=k, nn_k=k, n_prompts=4, training_sample="counted_images", pool_factor=1.0)
    training, _ = image_budgets({"error_budget_min_rows": 1, "max_fetch_failures": 0.5, "max_error_rate": 0.5})
    quiet = {"echo": lambda *a, **kw: None, "say": lambda *a: None, "max_walk_factor": float(n)}
    with tempfile.TemporaryDirectory() as tmp:
        def walk(rd, kill_after=None):
            return walk_training(None, rd, pool, cfg, None, copy.deepcopy(training), lambda f: pool,
                                 fetch=fetcher(rd, kill_after), **quiet)

        want = walk(RunDir(tmp, "whole"))
        rd = RunDir(tmp, "resumed")
        try:
            walk(rd, case["kill_after"])
        except Killed:
            pass
        got = walk(rd)
        assert got.subsets.equals(want.subsets) and got.groups.equals(want.groups)
        assert got.url_results.sort_by(C.URL).equals(want.url_results.sort_by(C.URL))
        for a, b in zip(got.budgets, want.budgets):
            assert (a.seen, a.failed) == (b.seen, b.failed) and a.seen == got.url_results.num_rows
        fetch_failed = sum(got.url_results[I.FETCH_STATUS].to_pylist().count(s) for s in I.FetchStatus.FAILURES)
        assert sum(got.budgets[0].failed.values()) == fetch_failed

"""Checkpoints and resume of the image phases, run directories, error budgets and bounded retries
of crashed workers, on a local Ray instance (tiny random CLIP / SD stand-ins, local image server)."""

from __future__ import annotations

import dataclasses
import json
import os
import re

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from fsspec.implementations.local import LocalFileOpener, LocalFileSystem

from operators.base import Resources
from pipelines.engine.generation import SafetySettings
from pipelines import amplification
from pipelines.engine.run import rundir
from pipelines.engine.stream import runtime
from pipelines.studies.amplification import images as image_side
from pipelines.engine.run import models
from pipelines.studies.amplification import run_settings
from pipelines.engine.cli.config import load_config
from pipelines.engine.stream.progress import ErrorBudget, ErrorBudgetExceeded, Phase, drain
from pipelines.studies.amplification.sample_server import LocalImageServer
from schemas import images as I
from schemas.captions import URL
from schemas.subsets import PROMPT

pytestmark = pytest.mark.ray

PREFIX = "https://images.example.org/"


@pytest.fixture(scope="module")
def standins(tmp_path_factory):
    from pipelines.engine import generation

    root = str(tmp_path_factory.mktemp("standins"))
    specs = [generation.GeneratorSpec(m, steps=2) for m in models.STANDIN_GENERATORS]
    return models.build_standin_clip(root), generation.build_standin_generators(specs, root)


def settings(standins, server, extra=()):
    args = amplification.build_parser().parse_args(
        ["run", "--output", "unused", "--steps", "2", "--images-per-prompt", "3", "--caption-images", "0",
         "--allow-local-urls", "--url-rewrite", f"{PREFIX}={server.base_url}/", *extra])
    st, _ = run_settings.image_settings(args, load_config())
    # no NSFW check (its model is a hub download): what is resumed here does not depend on it
    return dataclasses.replace(st, clip=st.clip.standin_at(standins[0], pretrained=None),
                               generators=list(standins[1]), fetch_block_rows=4, safety=SafetySettings(policy="off"))


def generate(ray, requests, spec, st, rd):
    """The run's generation of ``requests`` with ``spec``, through the engine (as the study does):
    the rows in the study's order and the Phase; and the stage list it ran."""
    from types import SimpleNamespace

    from pipelines.engine import generation

    from pipelines.engine.cli.options import RunOptions

    args = amplification.build_parser().parse_args(["run", "--output", "unused"])
    run = SimpleNamespace(options=RunOptions.from_args(args), safety=st.safety, gpu=None, rd=rd, ray=ray, st=st,
                          generators=[spec], echo=lambda *a, **k: None, models=[], safety_counts={})
    plan = image_side.generation_plan(st, requests)
    out = generation.generate(run, plan)
    return out.images.sort_by(image_side.RESULT_ORDER), out.phases[spec.model], \
        generation.generator_pipeline(run, plan, spec)


def open_run(tmp_path, name="r") -> rundir.RunDir:
    return rundir.RunDir(str(tmp_path), name).open("fp", {"job": name})


def _key_columns(t: pa.Table, cols) -> list:
    return sorted(zip(*(t.column(c).to_pylist() for c in cols)))


def test_training_images_resume_fetches_only_the_urls_not_yet_done(ray_local, standins, tmp_path):
    from helpers import run_stages_here   # not at module level: Ray workers import this module (_CrashOnce)

    urls = [f"{PREFIX}img/{i}.jpg" for i in range(14)]
    with LocalImageServer() as server:
        st = settings(standins, server)
        rd = open_run(tmp_path)
        first, p1 = image_side.training_images(ray_local, pa.table({URL: urls[:6]}), st, run=rd)
        hits_after_first = sum(server.hits.values())
        assert p1.processed == 6 and p1.reused == 0 and first.num_rows == 6
        both, p2 = image_side.training_images(ray_local, pa.table({URL: urls}), st, run=rd)
        assert p2.reused == 6 and p2.processed == 8 and both.num_rows == 14
        # only the 8 new URLs were requested from the server (a 404 or a broken body is one request too)
        new_hits = sum(server.hits.values()) - hits_after_first
        assert 8 <= new_hits <= 8 * (1 + st.fetch["retries"])
        # the uninterrupted reference: the same stages, in this process, on every URL at once
        fresh = run_stages_here(image_side.unique_urls(pa.table({URL: urls}), st.url_rewrite),
                                image_side.training_stages(st))
    cols = [URL, I.FETCH_STATUS, I.FACE_STATUS, I.FACE_COUNT, I.GENDER]
    assert _key_columns(both, cols) == _key_columns(fresh, cols)
    a, b = both.sort_by(URL), fresh.sort_by(URL)
    assert pc.max(pc.abs(pc.subtract(pc.fill_null(a[I.P_FEMALE], 0.0), pc.fill_null(b[I.P_FEMALE], 0.0)))).as_py() < 1e-5


def test_generated_images_resume_by_model_prompt_and_seed(ray_local, standins, tmp_path):
    from helpers import run_stages_here

    with LocalImageServer() as server:
        st = settings(standins, server)
    prompts = {"nurse": ["A photo of a nurse", "A portrait photo of a nurse"]}
    requests = image_side.generation_requests(prompts, I.IMAGE_RESULTS.empty_table(), st, caption_prompts=False)
    assert requests.num_rows == 6
    model = st.generators[0]
    rd = open_run(tmp_path)
    part, p1, _ = generate(ray_local, requests.slice(0, 4), model, st, rd)
    assert p1.processed == 4 and part.num_rows == 4
    done, p2, stage_list = generate(ray_local, requests, model, st, rd)
    assert (p2.reused, p2.processed, done.num_rows) == (4, 2, 6)
    # another model shares nothing with the first one's checkpoint
    _, p3, _ = generate(ray_local, requests.slice(0, 2), st.generators[1], st, rd)
    assert (p3.reused, p3.processed) == (0, 2)
    fresh = run_stages_here(requests, stage_list)   # uninterrupted, in this process
    cols = [I.MODEL, PROMPT, I.SEED, I.GENERATION_STATUS, I.FACE_STATUS, I.GENDER]
    assert _key_columns(done, cols) == _key_columns(fresh, cols)
    order = [(PROMPT, "ascending"), (I.SEED, "ascending")]
    a, b = done.sort_by(order), fresh.sort_by(order)
    assert pc.max(pc.abs(pc.subtract(a[I.P_FEMALE], b[I.P_FEMALE]))).as_py() < 1e-4


def test_a_caption_in_two_occupations_is_generated_once_and_counted_in_each(ray_local, standins, tmp_path):
    """Section 6: a caption naming two occupations is a prompt of both with the same seed: one
    image, one row per request (the run checks rows out == requests)."""
    from schemas.captions import CAPTION, CAPTION_GENDER, CAPTION_ID, OCCUPATION

    with LocalImageServer() as server:
        st = settings(standins, server, ["--caption-images", "1"])
    training = pa.Table.from_pylist([
        {OCCUPATION: occ, "subset": "naive", CAPTION_ID: 7, CAPTION: "a nurse and a teacher at school",
         CAPTION_GENDER: "none", URL: f"{PREFIX}x.jpg", I.COUNTED: True} for occ in ("nurse", "teacher")])
    requests = image_side.generation_requests({}, training, st, caption_prompts=True)
    assert requests.num_rows == 2 and len(set(requests[I.SEED].to_pylist())) == 1
    gen, phase, _ = generate(ray_local, requests, st.generators[0], st, open_run(tmp_path))
    assert phase.total == 1 and gen.num_rows == 2
    assert sorted(gen[OCCUPATION].to_pylist()) == ["nurse", "teacher"]
    assert len(set(gen[I.P_FEMALE].to_pylist())) == 1 and gen[I.GENERATION_STATUS].to_pylist() == ["ok", "ok"]


def test_a_half_written_part_is_never_read(tmp_path):
    rd = open_run(tmp_path)
    rd.write_part("x", pa.table({"a": [1, 2]}))
    # what a kill during a write leaves behind: a temporary file, never a truncated part
    (tmp_path / "r" / "_work" / "x" / "part-9.parquet.1234abcd.tmp").write_bytes(b"PAR1 trunc")
    assert rd.read_parts("x", pa.schema([("a", pa.int64())]))["a"].to_pylist() == [1, 2]


def test_run_directory_refuses_another_configuration_and_records_attempts(tmp_path):
    rundir.RunDir(str(tmp_path), "job").open("fp1", {"occupations": ["nurse"], "k": 1})
    again = rundir.RunDir(str(tmp_path), "job").open("fp1", {"occupations": ["nurse"], "k": 1})
    assert again.resumed and len(again.record["attempts"]) == 2
    with pytest.raises(Exception, match=r"different configuration \(differs in: occupations\)"):
        rundir.RunDir(str(tmp_path), "job").open("fp2", {"occupations": ["pilot"], "k": 1})
    fresh = rundir.RunDir(str(tmp_path), "job").open("fp2", {"occupations": ["pilot"], "k": 1}, overwrite=True)
    assert not fresh.resumed and json.loads((tmp_path / "job" / "run.json").read_text())["fingerprint"] == "fp2"
    with pytest.raises(Exception, match="--run-id"):
        rundir.RunDir(str(tmp_path), "../escape")


class _FakeDataset:
    def __init__(self, blocks):
        self.blocks = blocks

    def iter_batches(self, **_):
        yield from self.blocks

    def stats(self):
        return "stats"


def test_error_budget_stops_a_phase_early_with_a_clear_message():
    blocks = [pa.table({I.FETCH_STATUS: ["timeout"] * 90 + ["ok"] * 10}) for _ in range(10)]
    budget = ErrorBudget("fetch (training images)", {I.FETCH_STATUS: I.FetchStatus.FAILURES}, 0.8, min_rows=200,
                         flag="--max-fetch-failures")
    written = []
    with pytest.raises(ErrorBudgetExceeded) as err:
        drain(_FakeDataset(blocks), written.append, Phase("p", "URLs", 1000), budgets=[budget], flush_rows=100,
              echo=lambda *a: None)
    msg = str(err.value)
    assert "fetch (training images)" in msg and "180 of 200" in msg and "timeout=180" in msg
    assert "--max-fetch-failures" in msg and "resumes" in msg
    assert sum(t.num_rows for t in written) == 200  # what arrived before the stop is checkpointed


def test_error_budget_allows_failures_within_budget_and_ignores_measurements():
    blocks = [pa.table({I.FETCH_STATUS: ["ok"] * 70 + ["http_error"] * 20 + ["disallowed"] * 10,
                        I.FACE_STATUS: ["no_face"] * 100})]
    b = ErrorBudget("fetch", {I.FETCH_STATUS: I.FetchStatus.FAILURES}, 0.25, min_rows=50)
    ph = drain(_FakeDataset(blocks), lambda t: None, Phase("p", "URLs", 100), budgets=[b], echo=lambda *a: None)
    assert ph.processed == 100 and b.failed == {"http_error": 20}
    tight = ErrorBudget("fetch", {I.FETCH_STATUS: I.FetchStatus.FAILURES}, 0.1, min_rows=500)
    drain(_FakeDataset(blocks), lambda t: None, Phase("p", "URLs", 100), budgets=[tight], echo=lambda *a: None)
    assert tight.seen == 100  # under min_rows: counted, not judged


def test_caption_error_budget_fails_the_job_then_resumes(ray_local, tmp_path, capsys):
    import pyarrow.parquet as pq

    n = 300
    text = [None if i % 3 == 0 else f"a nurse at work {i}" for i in range(n)]
    pq.write_table(pa.table({"URL": [f"u{i}" for i in range(n)], "TEXT": text}), tmp_path / "in.parquet")
    argv = ["captions", "--captions", str(tmp_path / "in.parquet"), "--output", str(tmp_path / "out"),
            "--occupations", "nurse", "--no-names", "--nn-k", "1", "--sample-size", "3", "--no-progress"]
    assert amplification.main(argv) == 3
    err = capsys.readouterr().err
    assert "error budget exceeded at stage read_captions: 100 of 300 rows failed" in err
    assert "null_caption=100" in err and "--max-error-rate" in err
    (run,) = (tmp_path / "out").iterdir()
    assert json.loads((run / "run.json").read_text())["status"] == "failed"
    # a larger budget is an execution setting: the same run directory, resumed
    assert amplification.main(argv + ["--max-error-rate", "0.5"]) == 0
    assert [p.name for p in (tmp_path / "out").iterdir()] == [run.name]
    record = json.loads((run / "run.json").read_text())
    assert record["status"] == "finished" and [a["resumed"] for a in record["attempts"]] == [False, True]


class _CrashOnce:
    """Kills its worker process the first time it sees a batch (a node or OOM failure)."""

    def __init__(self, marker: str):
        self.marker = marker

    def __call__(self, batch: pa.Table) -> pa.Table:
        if not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os._exit(1)
        return batch.append_column("seen", pa.array([True] * batch.num_rows))


@pytest.mark.parametrize("actors", [0, 1])
def test_crashed_workers_are_retried_within_bounds(ray_local, tmp_path, actors):
    table = pa.table({"x": list(range(20))})
    runtime.configure(max_retries=2)
    try:
        ds = runtime.map_stage(runtime.from_table(ray_local, table, 10), _CrashOnce, {"marker": str(tmp_path / "m")},
                               Resources(num_cpus=1, batch_size=10, actors=actors))
        out = pa.concat_tables(list(ds.iter_batches(batch_size=None, batch_format="pyarrow")))
        assert sorted(out["x"].to_pylist()) == list(range(20)) and all(out["seen"].to_pylist())
        assert (tmp_path / "m").exists()  # it did crash once
        runtime.configure(max_retries=0)
        ds = runtime.map_stage(runtime.from_table(ray_local, table, 10), _CrashOnce,
                               {"marker": str(tmp_path / "m2")}, Resources(num_cpus=1, batch_size=10, actors=actors))
        from ray.exceptions import RayError

        with pytest.raises(RayError):
            list(ds.iter_batches(batch_size=None, batch_format="pyarrow"))
    finally:
        runtime.configure(max_retries=3)


def test_a_failed_checkpoint_flush_is_never_swallowed():
    from pipelines.engine.stream.progress import CheckpointError

    class _Failing(_FakeDataset):
        def __init__(self, blocks, error):
            super().__init__(blocks)
            self.error = error

        def iter_batches(self, **_):
            yield from self.blocks
            raise self.error

    def full_disk(table):
        raise OSError(28, "No space left on device")

    blocks = [pa.table({I.FETCH_STATUS: ["ok"] * 5})]
    quiet = {"flush_rows": 100, "echo": lambda *a: None}
    # the stream fails (a worker beyond its retries), then checkpointing what arrived fails too
    with pytest.raises(CheckpointError) as err:
        drain(_Failing(blocks, RuntimeError("worker died")), full_disk, Phase("p", "URLs", 10), **quiet)
    assert "No space left on device" in str(err.value) and "worker died" in str(err.value)
    assert isinstance(err.value.__cause__, OSError) and isinstance(err.value.__cause__.__context__, RuntimeError)
    # the same while an error budget stops the phase
    budget = ErrorBudget("fetch", {I.FETCH_STATUS: I.FetchStatus.FAILURES}, 0.1, min_rows=1)
    with pytest.raises(CheckpointError, match="No space left on device.*ErrorBudgetExceeded"):
        drain(_FakeDataset([pa.table({I.FETCH_STATUS: ["timeout"] * 5})]), full_disk, Phase("p", "URLs", 10),
              budgets=[budget], **quiet)
    # a KeyboardInterrupt stays one, and carries the flush failure
    with pytest.raises(KeyboardInterrupt) as kb:
        drain(_Failing(blocks, KeyboardInterrupt()), full_disk, Phase("p", "URLs", 10), **quiet)
    assert any("No space left on device" in n for n in kb.value.__notes__)
    # with nothing else in flight the sink's own error propagates, written once, not retried
    calls = []
    with pytest.raises(OSError, match="No space left"):
        drain(_FakeDataset(blocks), lambda t: (calls.append(t), full_disk(t)), Phase("p", "URLs", 10), **quiet)
    assert len(calls) == 1


def test_a_failure_to_record_a_failure_does_not_hide_it(tmp_path, monkeypatch):
    rd = open_run(tmp_path)

    def full_disk(fs, path, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(rundir, "write_atomic", full_disk)
    with pytest.raises(ErrorBudgetExceeded) as err:  # the error the run stopped on, with its exit code
        try:
            raise ErrorBudgetExceeded("error budget exceeded at stage generation")
        except BaseException as exc:
            rd.finish("failed", error=str(exc))
            raise
    assert any("run.json" in n and "No space left on device" in n for n in err.value.__notes__)
    with pytest.raises(OSError, match="No space left"):  # with nothing in flight it is the error
        rd.finish("finished")


# -- crash-safe caption sink: a crash injected inside the real sink's writes -------------------------------
class _SimulatedKill(BaseException):
    """The driver killed (nothing may catch it, as nothing can catch SIGKILL)."""


_SHARD1 = re.compile(r"/annotated_captions/shard-00001/")
_SHARD1_PART = re.compile(r"/annotated_captions/shard-00001/part-[0-9a-f]+\.parquet$")


class _CrashingFS(LocalFileSystem):
    """Local disk (fsspec) that crashes inside the caption sink of shard 1, once at each point of
    ``points`` (a marker file per point records that it fired); it travels with the RunDir into
    the Ray tasks. ``mid`` kills the worker halfway through the first write of a file in the
    shard's directory; ``after`` kills it once a part is complete under its final name; ``done``
    kills the driver when it writes the shard's done marker."""

    def __init__(self, points, markers, **kw):
        super().__init__(**kw)
        self.points, self.markers = tuple(points), dict(markers)

    def crash_now(self, how: str) -> bool:
        if how not in self.points or os.path.exists(self.markers[how]):
            return False
        open(self.markers[how], "w").close()
        return True

    def _open(self, path, mode="rb", **kw):
        path = self._strip_protocol(path)
        if "w" in mode and "shard-00001.done" in path and self.crash_now("done"):
            raise _SimulatedKill()
        if "w" in mode and _SHARD1.search(path):
            return _CrashingOpener(path, mode, fs=self, **kw)
        return super()._open(path, mode, **kw)

    def mv(self, path1, path2, **kw):
        super().mv(path1, path2, **kw)
        if _SHARD1_PART.search(str(path2)) and self.crash_now("after"):
            os._exit(1)


class _CrashingOpener(LocalFileOpener):
    def write(self, data):
        if self.fs.crash_now("mid"):
            super().write(bytes(data)[:max(1, len(data) // 2)])
            self.flush()
            os._exit(1)
        return super().write(data)

    def close(self):
        super().close()
        if _SHARD1_PART.search(self.path) and self.fs.crash_now("after"):
            os._exit(1)


def _caption_attempt(argv):
    try:
        return amplification.main(argv)
    except _SimulatedKill:
        return "killed"
    except BaseException as exc:  # noqa: BLE001  (the old code's count check raises)
        return f"{type(exc).__name__}: {exc}"


@pytest.fixture(scope="module")
def caption_runs(ray_local, tmp_path_factory):
    """Two input files (two caption shards) and the uninterrupted run of them."""
    from pipelines.synthetic_laion import generate, write

    base = tmp_path_factory.mktemp("crash")
    write(generate(300, seed=3), base / "laion", files=2)
    argv = lambda out: ["captions", "--captions", str(base / "laion"), "--output", str(out), "--run-id", "r",  # noqa: E731
                        "--files-per-shard", "1", "--no-names", "--sample-size", "5", "--nn-k", "4", "--no-progress"]
    assert amplification.main(argv(base / "clean")) == 0
    return base, argv


def _same_results(a, b):
    import pyarrow.parquet as pq

    order = [("caption_id", "ascending"), ("occupation", "ascending")]
    ann = [pq.read_table(d / "annotated_captions").sort_by(order) for d in (a, b)]  # directory readers too
    assert ann[0].num_rows > 0 and ann[0].equals(ann[1])
    assert pq.read_table(a / "training_subsets.parquet").equals(pq.read_table(b / "training_subsets.parquet"))
    assert (a / "stage_counts.csv").read_text() == (b / "stage_counts.csv").read_text()
    ma, mb = (json.loads((d / "metrics.json").read_text()) for d in (a, b))
    assert ma["counts"] == mb["counts"] and ma["annotated_rows"] == mb["annotated_rows"]
    # nothing but the committed parts is left in the shard directories
    for shard in sorted((b / "annotated_captions").iterdir()):
        done = json.loads((b / "_work" / "captions" / f"{shard.name}.done").read_text())
        assert sorted(p.name for p in shard.iterdir()) == sorted(p["name"] for p in done["parts"])


def test_caption_sink_crashes_at_every_point_then_resume_equals_an_uninterrupted_run(caption_runs, tmp_path,
                                                                                     monkeypatch):
    """One run directory, three crashes inside the real sink of shard 1, in the order a run meets
    them: a worker killed halfway through writing a part (``mid``), then the retried worker
    killed once its part is complete under its final name (``after``): Ray retries the sink task
    both times and the run recovers by itself, reaching the shard's commit; there the driver is
    killed as it writes the shard's done marker (``done``). The same command then resumes to the
    uninterrupted run's results, and once more is a no-op on the finished run."""
    from pipelines.engine.storage import io

    base, argv = caption_runs
    out = tmp_path / "out"
    markers = {how: str(tmp_path / f"crashed-{how}") for how in ("mid", "after", "done")}
    real_output_fs = io.output_fs
    crashing = _CrashingFS(("mid", "after", "done"), markers)

    def output_fs(uri):
        if not str(uri).startswith(str(out)):
            return real_output_fs(uri)
        import pyarrow.fs as pafs

        return pafs.PyFileSystem(pafs.FSSpecHandler(crashing)), str(uri).rstrip("/")

    monkeypatch.setattr(io, "output_fs", output_fs)
    first = _caption_attempt(argv(out))
    # every crash fired: the two in the workers were retried by Ray (the driver went on to commit
    # the shard: the done marker is written only once all of the shard's sink tasks succeeded)
    assert all(os.path.exists(m) for m in markers.values()), {h: os.path.exists(m) for h, m in markers.items()}
    assert first == "killed", first
    assert not (out / "r" / "_work" / "captions" / "shard-00001.done").exists()
    assert _caption_attempt(argv(out)) == 0  # the resume
    _same_results(base / "clean" / "r", out / "r")
    assert _caption_attempt(argv(out)) == 0  # and a resume of the finished run, without --overwrite, is a no-op
    _same_results(base / "clean" / "r", out / "r")


# ------------------------------------------- section 4: T over k counted images, walked in rounds
def _walk_pool(n_nurse=60, n_pilot=12):
    """A pool as the caption side writes it: nurse's first captions fail (404, not an image, no
    face, two faces), then the synthetic mix; pilot's images never have exactly one face."""
    from pipelines.studies.amplification.sample_server import synthetic_kind
    from schemas.subsets import TRAINING_SUBSETS

    failing = [i for i in range(200) if synthetic_kind(i) in ("not_found", "broken", "coffee", "chelsea", "montage")]
    nurse = failing[:8] + [i for i in range(200) if i not in failing[:8]][:n_nurse - 8]
    pilot = [i for i in range(200, 400) if synthetic_kind(i) in ("coffee", "chelsea")][:n_pilot]
    rows = []
    for occ, idx in (("nurse", nurse), ("pilot", pilot)):
        for r, i in enumerate(idx):
            rows.append({"occupation": occ, "subset": "naive", "prompt_id": None, "prompt": None, "rank": r + 1,
                         "caption_id": i, "url": f"{PREFIX}synthetic/0/{i}.jpg", "caption": f"a {occ} {i}",
                         "caption_gender": "none" if i % 3 else "female", "similarity": 0.5,
                         "sample_key": (r + 1) / 1000 + (occ == "pilot")})
    return pa.Table.from_pylist(rows, schema=TRAINING_SUBSETS)


def test_training_walk_reaches_exactly_k_counted_images_in_order_under_any_batching_and_resume(
        ray_local, standins, tmp_path):
    from helpers import run_stages_here
    from pipelines.studies.amplification.selection import SelectionConfig, walk
    from pipelines.studies.amplification.training_walk import counted_of, url_counted, walk_training

    k = 10
    full = _walk_pool()

    def reselect(factor):   # the caption side's pool at a larger factor: a prefix of every group
        return full.filter(pc.less_equal(full["rank"], int(k * factor)))

    def config(factor):
        return SelectionConfig(sample_size=k, nn_k=k, n_prompts=4, training_sample="counted_images",
                               pool_factor=factor)

    quiet = {"echo": lambda *a, **kw: None, "say": lambda *a: None, "max_walk_factor": 5.0}
    with LocalImageServer() as server:
        st = settings(standins, server, ["--gender-threshold", "0.5000001"])
        # the reference: every candidate fetched at once, in this process, then walked
        every = run_stages_here(image_side.unique_urls(full, st.url_rewrite), image_side.training_stages(st))
        every = every.select(image_side.TRAINING_RESULT_SCHEMA.names).cast(image_side.TRAINING_RESULT_SCHEMA)
        want, want_groups = walk(full, config(1.0), counted_of(full, url_counted(every)))

        def lookup(rows, budgets):   # the image side as a pure function of the URL (what the walk reads)
            got = every.filter(pc.is_in(every[URL], rows[URL]))
            return got, Phase("training images", "URLs", got.num_rows, processed=got.num_rows)

        # any number of rounds and re-selections: pool factors 1 (re-selects), 2 and 4
        walks = [(f"factor {f}", walk_training(None, None, reselect(f), config(f), st, [], reselect, fetch=lookup,
                                               **quiet)) for f in (1.0, 2.0, 4.0)]
        # and a first round of 2 or 3 x k captions (--walk-first-round): fewer rounds, the same walk
        walks += [(f"first round {r} x k", walk_training(None, None, reselect(2.0), config(2.0), st, [], reselect,
                                                         fetch=lookup, first_round=r, **quiet)) for r in (2.0, 3.0)]
        # and the real image side on Ray in blocks of 3 URLs, resumed over a killed attempt's
        # checkpoint (17 URLs, not a prefix of the walk), re-selecting from a pool of k
        st = dataclasses.replace(st, fetch_block_rows=3)
        rd = open_run(tmp_path, "resumed")
        image_side.training_images(ray_local, full.take(pa.array(range(3, 20))), st, run=rd)
        hits = sum(server.hits.values())
        resumed = walk_training(ray_local, rd, reselect(1.0), config(1.0), st, [], reselect, **quiet)
        new_hits = sum(server.hits.values()) - hits
        walks.append(("resumed on Ray", resumed))
    nurse = want.filter(pc.and_(pc.equal(want["occupation"], "nurse"), pc.equal(want["subset"], "naive")))
    flags = counted_of(nurse, url_counted(every))
    assert flags[:8].sum() == 0 and flags.sum() == k and flags[-1]   # first 8 fail; ends at the k-th counted
    assert nurse["rank"].to_pylist() == list(range(1, nurse.num_rows + 1))
    g = {o: (wc, c, s) for o, wc, c, s in zip(*(want_groups[c].to_pylist() for c in (
        "occupation", "walked_captions", "counted_images", "shortfall")))}
    assert g["nurse"] == (nurse.num_rows, k, 0)
    assert g["pilot"] == (12, 0, k)          # every candidate walked, the shortfall reported
    cols = ["occupation", "walked_captions", "counted_images", "shortfall"]
    for name, w in walks:
        assert w.subsets.equals(want), name
        assert w.groups.select(cols).equals(want_groups.select(cols)), name
        assert set(want["url"].to_pylist()) <= set(w.url_results[URL].to_pylist()), name
        assert w.phase.processed + w.phase.reused == w.phase.total == w.url_results.num_rows, name
    assert walks[0][1].rounds > 1 and walks[0][1].reselections          # the pool of k ran out: re-selected
    rounds = {name: w.rounds for name, w in walks}
    assert rounds["first round 2.0 x k"] < rounds["factor 2.0"] and rounds["first round 3.0 x k"] == 1
    assert resumed.reselections and resumed.phase.reused >= 17           # the checkpoint was read ...
    assert new_hits <= (resumed.url_results.num_rows - 17) * (1 + st.fetch["retries"])   # ... not fetched again

def test_a_checkpoint_written_twice_counts_each_key_once_with_its_first_row():
    """Two attempts may checkpoint the same batch: the reader keeps the first row per key (it kept
    the wrong rows when a key repeated)."""
    t = pa.table({URL: ["a", "a", "b", "c", "b"], "v": [1, 2, 3, 4, 5],
                  "emb": pa.array([[0.0], [1.0], [2.0], [3.0], [4.0]], pa.list_(pa.float32()))})
    from pipelines.engine.storage.checkpoint import first_per_key   # the training images' checkpoint reader

    out = first_per_key(t, [URL])
    assert out[URL].to_pylist() == ["a", "b", "c"] and out["v"].to_pylist() == [1, 3, 4]
    assert out["emb"].to_pylist() == [[0.0], [2.0], [3.0]]

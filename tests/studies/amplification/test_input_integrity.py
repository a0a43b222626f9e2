"""What identifies the input's data (a rewritten file never resumes the old run), corrupt data
pages (the file and the cause named, no crashed-worker story), and what the footers tell before
any work starts (a caption column that holds no text, a zero-row input)."""

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from s3_server import s3_server  # noqa: F401  (fixture)

from pipelines import amplification
from pipelines.engine.storage import io
from pipelines.engine.storage.inputs import resolve_parquet_inputs
from pipelines.engine.run import rundir

OCC = ["--occupations", "nurse,pilot", "--no-names", "--nn-k", "2", "--sample-size", "2", "--no-progress"]


def captions(path, texts):
    pq.write_table(pa.table({"URL": [f"u{i}" for i in range(len(texts))], "TEXT": texts}), path)


class ModelsLoaded(Exception):
    """Raised instead of starting Ray or loading models: the run got past input validation."""


@pytest.fixture
def no_models(monkeypatch):
    """The run stops where the work would start: at Ray's start (the first step after the input
    checks, before any model loads; a local instance costs seconds and lingers for the rest of
    the test process) and at the caption models' loading."""
    def refuse(*a, **k):
        raise ModelsLoaded

    from pipelines.engine.run import lifecycle
    from pipelines.studies.amplification import captions

    monkeypatch.setattr(lifecycle, "start_ray", refuse)
    monkeypatch.setattr(captions, "load_caption_models", refuse)


# ------------------------------------------------------------------------------ data identity
def test_a_file_rewritten_with_the_same_size_and_time_changes_its_identity(tmp_path):
    f = tmp_path / "in.parquet"
    captions(f, ["a nurse at work", "a pilot"])
    before = resolve_parquet_inputs(str(f)).data_identity()
    assert resolve_parquet_inputs(str(f)).data_identity() == before  # stable while the file is
    stat = f.stat()
    captions(f, ["a pilot at work", "a nurse"])  # same rows, same byte count, other captions
    os.utime(f, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert f.stat().st_size == stat.st_size
    after = resolve_parquet_inputs(str(f)).data_identity()
    assert list(after) == list(before) == [str(f)] and after != before


def test_object_store_identity_follows_the_etag(s3_server):  # noqa: F811
    fs = s3_server.fs()
    key = f"{s3_server.bucket}/laion/part-0.parquet"

    def put(texts):
        with fs.open(key, "wb") as fh:
            pq.write_table(pa.table({"TEXT": texts}), fh)
        fs.invalidate_cache()
        return fs.info(key)["ETag"].strip('"')

    etag = put(["a nurse"])
    first = resolve_parquet_inputs(s3_server.url("laion")).data_identity()
    assert f"etag={etag}" in first[s3_server.url("laion", "part-0.parquet")]
    assert resolve_parquet_inputs(s3_server.url("laion")).data_identity() == first
    put(["a pilot"])
    assert resolve_parquet_inputs(s3_server.url("laion")).data_identity() != first


def test_run_id_of_other_input_data_is_refused_saying_the_input_changed(tmp_path):
    cfg = {"input": {"files": ["a.parquet"], "rows": 2, "data": {"a.parquet": "size=1 footer=x"}}, "k": 1}
    rundir.RunDir(str(tmp_path), "r").open(rundir.fingerprint(cfg), cfg)
    new = {**cfg, "input": {**cfg["input"], "data": {"a.parquet": "size=1 footer=y"}}}
    with pytest.raises(io.InputError, match=r"input data changed .*a\.parquet.*stale"):
        rundir.RunDir(str(tmp_path), "r").open(rundir.fingerprint(new), new)


@pytest.mark.ray
def test_an_input_rewritten_in_place_never_returns_the_old_results(ray_local, tmp_path, capsys):
    f, out = tmp_path / "in.parquet", tmp_path / "out"
    captions(f, ["a nurse at work", "a nurse", "a cat", "a dog"])
    argv = ["captions", "--captions", str(f), "--output", str(out), *OCC]
    assert amplification.main(argv) == 0
    (first,) = [d for d in out.iterdir() if d.is_dir()]
    assert sorted(pq.read_table(first / "annotated_captions")["occupation"].to_pylist()) == ["nurse", "nurse"]
    captions(f, ["a pilot at work", "a pilot", "a cat", "a dog"])  # same rows, other captions
    assert amplification.main(argv) == 0  # a run of its own, not a resume of the old one
    (second,) = [d for d in out.iterdir() if d.is_dir() and d != first]
    assert sorted(pq.read_table(second / "annotated_captions")["occupation"].to_pylist()) == ["pilot", "pilot"]
    capsys.readouterr()
    # the old run's id, named on purpose: refused, saying the input changed (never the old results)
    assert amplification.main([*argv, "--run-id", first.name]) == 2
    err = capsys.readouterr().err
    assert "input data changed" in err and str(f) in err and "stale" in err


# ------------------------------------------------------------------------------ corrupt data pages
@pytest.mark.ray
def test_corrupt_data_pages_name_the_file_and_the_cause(ray_local, tmp_path, capsys):
    (tmp_path / "in").mkdir()
    texts = [f"a photo of a nurse number {i}, " * 3 for i in range(5000)]
    captions(tmp_path / "in" / "good.parquet", texts)
    bad = tmp_path / "in" / "bad.parquet"
    captions(bad, texts)
    chunk = pq.read_metadata(bad).row_group(0).column(1)  # TEXT: corrupt its pages, keep the footer
    data = bytearray(bad.read_bytes())
    start = (chunk.dictionary_page_offset or chunk.data_page_offset) + 100
    data[start:start + 2000] = bytes(b ^ 0x5A for b in data[start:start + 2000])
    bad.write_bytes(bytes(data))
    assert pq.read_metadata(bad).num_rows == 5000  # the footer check passes
    with pytest.raises((OSError, pa.ArrowException)) as direct:
        pq.read_table(bad, columns=["TEXT"])
    cause = str(direct.value).splitlines()[0]

    out = tmp_path / "out"
    rc = amplification.main(["captions", "--captions", str(tmp_path / "in"), "--output", str(out), "--run-id", "r", *OCC])
    assert rc == 2
    line = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")][-1]
    assert str(bad) in line and cause in line
    assert "worker" not in line and "resume" not in line and "\x1b" not in line
    attempt = json.loads((out / "r" / "run.json").read_text())["attempts"][-1]
    assert attempt["status"] == "failed" and str(bad) in attempt["error"] and cause in attempt["error"]
    assert "\x1b" not in attempt["error"] and "worker" not in attempt["error"]


def test_ansi_codes_are_stripped():
    assert io.plain("\x1b[36mray::ReadParquet()\x1b[39m failed") == "ray::ReadParquet() failed"


# ------------------------------------------------------------------------------ what the footers tell
def test_a_caption_column_without_text_fails_before_any_model_loads(tmp_path, no_models, capsys):
    pq.write_table(pa.table({"URL": ["a", "b"], "TEXT": pa.array([1, 2], pa.int64())}), tmp_path / "in.parquet")
    assert amplification.main(["captions", "--captions", str(tmp_path / "in.parquet"), "--output",
                               str(tmp_path / "out"), *OCC]) == 2
    err = capsys.readouterr().err
    assert "'TEXT'" in err and "int64" in err and "--caption-column" in err


def test_non_text_rows_over_the_error_budget_fail_before_any_model_loads(tmp_path, no_models, capsys):
    (tmp_path / "in").mkdir()
    captions(tmp_path / "in" / "p0.parquet", ["a nurse at work"] * 300)
    pq.write_table(pa.table({"URL": ["x"] * 100, "TEXT": pa.array(range(100), pa.int64())}),
                   tmp_path / "in" / "p1.parquet")
    argv = ["captions", "--captions", str(tmp_path / "in"), "--output", str(tmp_path / "out"), *OCC]
    assert amplification.main(argv) == 3  # 25% of the rows, the budget is 5%
    err = capsys.readouterr().err
    assert "p1.parquet" in err and "int64" in err and "--max-error-rate" in err
    # within the budget: announced, and the run goes on (to Ray and the models, here refused)
    with pytest.raises(ModelsLoaded):
        amplification.main([*argv, "--max-error-rate", "0.5"])
    assert "warning" in capsys.readouterr().err


def test_a_zero_row_input_prints_a_warning(tmp_path, no_models, capsys):
    captions(tmp_path / "in.parquet", pa.array([], pa.string()))
    with pytest.raises(ModelsLoaded):
        amplification.main(["captions", "--captions", str(tmp_path / "in.parquet"), "--output", str(tmp_path / "out"), *OCC])
    err = capsys.readouterr().err
    assert "warning" in err and "no rows" in err

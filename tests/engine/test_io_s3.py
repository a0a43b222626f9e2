"""pipelines.engine.storage.io on s3:// URIs, against a local moto S3 server (no network, no AWS)."""

from helpers import FORKED_WORKERS, REPO_ROOT
from forked_workers import python_command
import os
import subprocess
import sys

import fsspec
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from s3_server import DEFAULT_BUCKET, moto_s3, s3_server  # noqa: F401  (s3_server: fixture)

from pipelines.engine.storage import io
from pipelines.engine.storage.inputs import resolve_column, resolve_parquet_inputs


def put_parquet(s3, key, **cols):
    with s3.fs().open(f"{s3.bucket}/{key}", "wb") as fh:
        pq.write_table(pa.table(cols), fh)
    return s3.url(key)


def test_plain_url_to_fs_reaches_the_server(s3_server):  # noqa: F811
    fs, path = fsspec.core.url_to_fs(s3_server.url("a", "b.txt"))
    assert fs.protocol[0] == "s3" and path == f"{DEFAULT_BUCKET}/a/b.txt"
    fs.pipe_file(path, b"hello")
    assert s3_server.fs().cat_file(path) == b"hello"


def test_environment_restored_and_cache_cleared(monkeypatch):
    monkeypatch.setenv("AWS_PROFILE", "someone-elses")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with moto_s3() as server:
        assert "AWS_PROFILE" not in os.environ
        assert os.environ["AWS_ENDPOINT_URL_S3"] == server.endpoint_url
        fs, _ = fsspec.core.url_to_fs(server.url())
    assert os.environ["AWS_PROFILE"] == "someone-elses"
    assert "AWS_ENDPOINT_URL" not in os.environ and "AWS_ENDPOINT_URL_S3" not in os.environ
    # a cached S3FileSystem bound to the stopped server must not be handed out again
    import s3fs

    assert not s3fs.S3FileSystem._cache


def test_each_server_starts_empty():
    for _ in range(2):
        with moto_s3() as server:
            fs = server.fs()
            assert fs.ls(server.bucket) == []
            fs.pipe_file(f"{server.bucket}/left-over", b"x")


def test_processes_started_later_reach_the_server(s3_server):  # noqa: F811
    s3_server.fs().pipe_file(f"{s3_server.bucket}/k.txt", b"from the parent")
    code = "import fsspec,sys; fs,p=fsspec.core.url_to_fs(sys.argv[1]); print(fs.cat_file(p).decode())"
    out = subprocess.run([sys.executable, "-c", code, s3_server.url("k.txt")],
                         capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "from the parent"


def test_write_and_read_back_table_and_text(s3_server):  # noqa: F811
    fs, root = io.output_fs(s3_server.url("runs", "r1") + "/")
    assert root == f"{DEFAULT_BUCKET}/runs/r1"
    table = pa.table({"occupation": ["nurse", "ceo"], "female_share": [0.9, 0.1]})
    io.write_table(table, fs, f"{root}/tables/shares.parquet")
    io.write_text("# report\nok\n", fs, f"{root}/report.md")

    assert io.exists(fs, f"{root}/tables/shares.parquet")
    assert io.exists(fs, f"{root}/tables")            # a prefix reads as a directory
    assert not io.exists(fs, f"{root}/missing.parquet")
    with fs.open_input_file(f"{root}/tables/shares.parquet") as fh:
        assert pq.read_table(fh).equals(table)
    assert io.read_text(s3_server.url("runs", "r1", "report.md")) == "# report\nok\n"
    # the objects really are in the bucket, under the keys the pipeline chose
    assert sorted(s3_server.fs().find(f"{DEFAULT_BUCKET}/runs")) == [
        f"{DEFAULT_BUCKET}/runs/r1/report.md", f"{DEFAULT_BUCKET}/runs/r1/tables/shares.parquet"]


def test_write_table_and_csv_from_arrow_and_pandas(s3_server):  # noqa: F811
    fs, root = io.output_fs(s3_server.url("out"))
    io.write_table_and_csv(pa.table({"a": [1, 2]}), fs, f"{root}/arrow")
    io.write_table_and_csv(pd.DataFrame({"b": ["x", "y"]}), fs, f"{root}/frame")
    assert io.read_text(s3_server.url("out", "arrow.csv")) == "a\n1\n2\n"
    assert io.read_text(s3_server.url("out", "frame.csv")) == "b\nx\ny\n"
    with fs.open_input_file(f"{root}/frame.parquet") as fh:
        assert pq.read_table(fh).column("b").to_pylist() == ["x", "y"]


def test_clear_dir(s3_server):  # noqa: F811
    fs, root = io.output_fs(s3_server.url("run"))
    for name in ("a.txt", "sub/b.txt"):
        io.write_text(name, fs, f"{root}/{name}")
    io.write_text("keep", fs, f"{DEFAULT_BUCKET}/other/c.txt")

    io.clear_dir(fs, root)
    assert s3_server.fs().find(f"{DEFAULT_BUCKET}/run") == []
    assert not io.exists(fs, root)                   # S3 has no empty directories
    assert io.read_text(s3_server.url("other", "c.txt")) == "keep"

    io.write_text("again", fs, f"{root}/a.txt")      # the location is usable afterwards
    io.clear_dir(fs, f"{root}/a.txt")                # a single object
    assert not io.exists(fs, f"{root}/a.txt")
    io.clear_dir(fs, f"{root}/never-written")        # nothing there: no error


def test_resolve_parquet_inputs_on_s3(s3_server):  # noqa: F811
    for i in range(3):
        put_parquet(s3_server, f"laion/part-{i}.parquet", URL=[f"u{i}", f"v{i}"], TEXT=[f"t{i}", f"s{i}"])
    s3_server.fs().pipe_file(f"{DEFAULT_BUCKET}/laion/_SUCCESS", b"")

    directory = resolve_parquet_inputs(s3_server.url("laion"))
    assert directory.protocol == "s3" and directory.num_rows == 6
    assert directory.files == [f"{DEFAULT_BUCKET}/laion/part-{i}.parquet" for i in range(3)]
    assert directory.display(directory.files[0]) == s3_server.url("laion", "part-0.parquet")
    assert resolve_column(directory, "text", "text") == "TEXT"
    # the resolved filesystem reads the data itself, as Ray Data will
    got = pq.read_table(directory.files[1], filesystem=directory.filesystem)
    assert got.column("TEXT").to_pylist() == ["t1", "s1"]

    glob = resolve_parquet_inputs(s3_server.url("laion", "part-[01].parquet"))
    assert len(glob.files) == 2 and glob.num_rows == 4
    one = resolve_parquet_inputs(s3_server.url("laion", "part-2.parquet"))
    assert one.files == [f"{DEFAULT_BUCKET}/laion/part-2.parquet"] and one.num_rows == 2


def test_bad_s3_inputs_name_the_uri(s3_server):  # noqa: F811
    with pytest.raises(io.InputError, match="does not exist"):
        resolve_parquet_inputs(s3_server.url("nope.parquet"))
    with pytest.raises(io.InputError, match="no files match"):
        resolve_parquet_inputs(s3_server.url("nope", "*.parquet"))
    bad = put_parquet(s3_server, "cols/part-0.parquet", URL=["u"], caption=["t"])
    with pytest.raises(io.InputError) as exc:
        resolve_column(resolve_parquet_inputs(s3_server.url("cols")), "TEXT", "text")
    assert bad in str(exc.value)
    s3_server.fs().pipe_file(f"{DEFAULT_BUCKET}/broken/part-0.parquet", b"not parquet")
    with pytest.raises(io.InputError, match=r"s3://.*/broken/part-0\.parquet"):
        resolve_parquet_inputs(s3_server.url("broken"))


def test_read_text_missing_object_is_input_error(s3_server):  # noqa: F811
    uri = s3_server.url("configs", "missing.yaml")
    with pytest.raises(io.InputError, match="no such file") as exc:
        io.read_text(uri)
    assert uri in str(exc.value)
    with pytest.raises(io.InputError):
        io.read_text(f"s3://{DEFAULT_BUCKET}-does-not-exist/x.yaml")


@pytest.mark.ray
def test_ray_workers_reach_the_server_through_runtime_env(s3_server, ray_local):  # noqa: F811
    """A Ray instance started before the server (the session fixture) gets the variables through
    runtime_env; Ray started after entering inherits them."""
    s3_server.fs().pipe_file(f"{s3_server.bucket}/ray.txt", b"from ray")

    @ray_local.remote
    def read(uri):
        from pipelines.engine.storage import io as worker_io

        return worker_io.read_text(uri)

    task = read.options(runtime_env={"env_vars": s3_server.env})
    assert ray_local.get(task.remote(s3_server.url("ray.txt")), timeout=120) == "from ray"


@pytest.mark.ray
def test_pipeline_writes_its_run_to_s3_and_resumes_there(s3_server, tmp_path):  # noqa: F811
    """The caption side with --output on S3 (moto server on 127.0.0.1, reached through s3fs by
    the driver and by the Ray workers that write the annotated shards), then the same command
    again: it resumes in the same run directory and reuses the finished shard.

    One driver process runs both attempts (``main`` twice, each from the command line's
    arguments): what the second attempt knows of the first is what is on S3, and the driver's
    Ray instance, started with the server's variables in its environment, serves both."""
    import json

    n = 400
    pq.write_table(pa.table({"URL": [f"u{i}" for i in range(n)],
                             "TEXT": [f"a nurse at work {i}" if i % 2 else f"a pilot {i}" for i in range(n)]}),
                   tmp_path / "in.parquet")
    repo = REPO_ROOT
    out = s3_server.url("runs")
    argv = ["captions", "--captions", str(tmp_path / "in.parquet"), "--output", out, "--run-id", "s3run",
            "--occupations", "nurse,pilot", "--no-names", "--nn-k", "2", "--sample-size", "5",
            "--ray-address", "local", "--num-cpus", "3", "--no-progress"]
    twice = (FORKED_WORKERS + "from pipelines import amplification\n"
             "for attempt in (1, 2):\n"
             "    rc = amplification.main(sys.argv[1:])\n"
             "    print(f'attempt {attempt}: exit {rc}', file=sys.stderr)\n"
             "    if rc:\n"
             "        sys.exit(rc)\n")
    # forked from the tests' template (its libraries imported), with the server's variables: none
    # of those libraries reads them at import
    cmd, env = python_command([sys.executable, "-c", twice, *argv], tmp_dir=str(tmp_path))
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=repo)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "attempt 1: exit 0" in res.stderr and "attempt 2: exit 0" in res.stderr, res.stderr[-3000:]
    fs = s3_server.fs()
    base = f"{s3_server.bucket}/runs/s3run"
    m = json.loads(fs.cat_file(f"{base}/metrics.json"))
    assert m["output"] == f"{out}/s3run" and m["annotated_rows"] == n
    assert m["caption_phase"]["reused"] == n and m["caption_phase"]["processed"] == 0  # the second attempt
    record = json.loads(fs.cat_file(f"{base}/run.json"))
    assert record["status"] == "finished" and [a["resumed"] for a in record["attempts"]] == [False, True]
    parts = [p for p in fs.find(f"{base}/annotated_captions") if p.endswith(".parquet")]
    assert sum(pq.ParquetFile(fs.open(p)).metadata.num_rows for p in parts) == n
    assert fs.exists(f"{base}/training_subsets.parquet") and fs.exists(f"{base}/run_summary.csv")

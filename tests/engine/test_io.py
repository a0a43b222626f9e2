import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from fsspec.implementations.local import LocalFileOpener, LocalFileSystem

from pipelines.engine.storage import io
from pipelines.engine.storage.inputs import resolve_column, resolve_parquet_inputs


def write(path, **cols):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(cols), path)
    return path


@pytest.fixture
def laion_dir(tmp_path):
    for i in range(3):
        write(tmp_path / "laion" / f"part-{i}.parquet", URL=[f"u{i}"], TEXT=[f"t{i}"])
    (tmp_path / "laion" / "_SUCCESS").write_text("")
    return tmp_path / "laion"


def test_file_directory_glob_and_uri(laion_dir):
    one = resolve_parquet_inputs(str(laion_dir / "part-0.parquet"))
    assert len(one.files) == 1 and one.num_rows == 1
    assert len(resolve_parquet_inputs(str(laion_dir)).files) == 3
    assert len(resolve_parquet_inputs(str(laion_dir / "part-[01].parquet")).files) == 2
    uri = resolve_parquet_inputs(f"file://{laion_dir}")
    assert len(uri.files) == 3 and uri.num_rows == 3
    many = resolve_parquet_inputs([str(laion_dir / "part-0.parquet"), str(laion_dir / "part-2.parquet")])
    assert many.num_rows == 2


def test_column_names_configurable_and_lower_case_accepted(tmp_path):
    lower = resolve_parquet_inputs(str(write(tmp_path / "a.parquet", url=["u"], text=["t"])))
    assert resolve_column(lower, "TEXT", "text") == "text"
    assert resolve_column(lower, "URL", "url") == "url"
    custom = resolve_parquet_inputs(str(write(tmp_path / "b.parquet", link=["u"], caption_text=["t"])))
    assert resolve_column(custom, "caption_text", "text") == "caption_text"


def test_missing_column_names_file_and_column(laion_dir):
    bad = write(laion_dir / "part-9.parquet", URL=["u"], caption=["t"])
    inp = resolve_parquet_inputs(str(laion_dir))
    with pytest.raises(io.InputError) as exc:
        resolve_column(inp, "TEXT", "text")
    assert str(bad) in str(exc.value) and "'TEXT'" in str(exc.value)


def test_unreadable_file_is_named(laion_dir):
    broken = laion_dir / "part-5.parquet"
    broken.write_bytes(b"this is not parquet")
    with pytest.raises(io.InputError, match=str(broken)):
        resolve_parquet_inputs(str(laion_dir))


def test_missing_inputs(tmp_path):
    with pytest.raises(io.InputError, match="does not exist"):
        resolve_parquet_inputs(str(tmp_path / "nope.parquet"))
    with pytest.raises(io.InputError, match="no files match"):
        resolve_parquet_inputs(str(tmp_path / "*.parquet"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(io.InputError, match="no .parquet files"):
        resolve_parquet_inputs(str(tmp_path / "empty"))


def test_outputs_through_fsspec(tmp_path):
    fs, path = io.output_fs("memory://results/run1")
    io.write_text("{}", fs, f"{path}/metrics.json")
    assert io.exists(fs, f"{path}/metrics.json")
    fs, path = io.output_fs(f"file://{tmp_path}/out")
    io.write_table(pa.table({"a": [1]}), fs, f"{path}/t.parquet")
    assert pq.read_table(tmp_path / "out" / "t.parquet")["a"].to_pylist() == [1]


def test_uri_without_its_driver_is_a_clear_error(monkeypatch):
    import fsspec

    def no_driver(uri, **kw):
        raise ImportError("Install s3fs to access S3")

    monkeypatch.setattr(fsspec.core, "url_to_fs", no_driver)
    with pytest.raises(io.InputError, match=r"s3://bucket/x.parquet.*\[cloud\]"):
        resolve_parquet_inputs("s3://bucket/x.parquet")


class _DiskFullMidWrite(LocalFileSystem):
    """Local disk where every write stops halfway with ENOSPC (what a kill mid-write leaves)."""

    def _open(self, path, mode="rb", **kw):
        if "w" in mode:
            return _HalfOpener(self._strip_protocol(path), mode, fs=self, **kw)
        return super()._open(path, mode, **kw)


class _HalfOpener(LocalFileOpener):
    def write(self, data):
        super().write(bytes(data)[:len(data) // 2])
        raise OSError(28, "No space left on device")


def test_a_write_that_fails_midway_leaves_the_previous_file_or_none(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.json").write_text('{"old": true}')
    fs = pafs.PyFileSystem(pafs.FSSpecHandler(_DiskFullMidWrite()))
    with pytest.raises(OSError, match="No space left"):
        io.write_text('{"new": true}' * 1000, fs, str(out / "metrics.json"))
    with pytest.raises(OSError, match="No space left"):
        io.write_table(pa.table({"a": list(range(1000))}), fs, str(out / "t.parquet"))
    assert (out / "metrics.json").read_text() == '{"old": true}'  # never a truncated file
    assert sorted(p.name for p in out.iterdir()) == ["metrics.json"]  # nor a temporary one
    io.write_table(pa.table({"a": [1, 2]}), pafs.LocalFileSystem(), str(out / "t.parquet"))
    assert pq.read_table(out / "t.parquet")["a"].to_pylist() == [1, 2]
    assert sorted(p.name for p in out.iterdir()) == ["metrics.json", "t.parquet"]

"""Files anywhere pyarrow/fsspec reaches: resolving a URI to its filesystem, reading parquet and
text, and writing results atomically (a full disk is an error naming the file); ``clean_json``
makes the strict JSON every run writes.

The input files of a run are resolved in ``inputs``; an output location is checked before a run in
``output_check``.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import posixpath
import re
import uuid
from concurrent.futures import ThreadPoolExecutor

import fsspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq


class InputError(ValueError):
    """Bad input detected before the run starts: the message names the file and the column."""


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def plain(text: str) -> str:
    """``text`` without terminal colour codes (Ray colours the tracebacks of failed tasks)."""
    return _ANSI.sub("", text)


def listing_error(spec: str, exc: BaseException, what: str = "") -> str:
    """One line for a failure to list or open ``spec`` (a ``what``, e.g. "parquet file ") on its filesystem."""
    first = (plain(str(exc)).strip().splitlines() or [""])[0]
    text = f"{type(exc).__name__} {first}"
    hint = ""
    if spec.startswith("hf://") and any(k in text for k in ("Gated", "401", "403", "Unauthorized", "gated")):
        hint = (" (a gated or private Hub dataset: accept its terms on its Hub page with the account whose token "
                "is in HF_TOKEN, or run `hf auth login`)")
    return f"cannot read {what}{spec}: {type(exc).__name__}: {first}{hint}"


def fs_protocol(fs: fsspec.AbstractFileSystem) -> str:
    return fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]


def display_path(protocol: str, path: str) -> str:
    """A path as the user would write it: bare for local files, with its scheme otherwise."""
    return path if protocol in ("file", "local") else f"{protocol}://{path}"


def to_pyarrow_fs(fs: fsspec.AbstractFileSystem) -> pafs.FileSystem:
    if fs_protocol(fs) in ("file", "local"):
        return pafs.LocalFileSystem()
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs))


# Hugging Face Hub datasets (hf://datasets/ORG/NAME/PATH) are read through huggingface_hub's fsspec
# filesystem; the token comes from HF_TOKEN (or the login cache `hf auth login` writes): gated
# datasets (Re-LAION, ...) need one whose account accepted the dataset's terms.
HF_TOKEN_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


def storage_options(uri: str) -> dict:
    """What a filesystem needs beyond the URI: for hf:// the Hub token of the environment."""
    if uri.startswith("hf://"):
        token = next((os.environ[v] for v in HF_TOKEN_VARS if os.environ.get(v)), None)
        return {"token": token} if token else {}
    return {}


def url_to_fs(uri: str):
    try:
        return fsspec.core.url_to_fs(uri, **storage_options(uri))
    except ImportError as exc:  # e.g. s3:// without s3fs
        raise InputError(
            f"cannot open {uri!r}: {exc}. Install the filesystem driver, e.g. pip install -e '.[cloud]' "
            f"for s3:// and gs://"
        ) from exc


def read_footers(fs: pafs.FileSystem, files: list[str], protocol: str) -> list[pq.FileMetaData]:
    """The parquet footers (metadata only) of ``files``, read in parallel threads; an InputError
    naming the first file that cannot be read as parquet."""
    def one(path: str) -> pq.FileMetaData:
        try:
            with fs.open_input_file(path) as fh:
                return pq.read_metadata(fh)
        except Exception as exc:  # ArrowInvalid (not parquet), OSError (permissions), a gated Hub dataset ...
            raise InputError(listing_error(display_path(protocol, path), exc, "parquet file ")) from None

    with ThreadPoolExecutor(max_workers=16) as pool:
        return list(pool.map(one, files))


def output_fs(uri: str) -> tuple[pafs.FileSystem, str]:
    """(pyarrow filesystem, path) for an output location: a local path or any fsspec URI."""
    fs, path = url_to_fs(uri)
    return to_pyarrow_fs(fs), path.rstrip("/")


# Every parquet file the project writes carries a CRC-32 per data page, and every read of one (and
# of an input file that has them) verifies it: a bit flipped on disk or in transit is an error
# naming the file, never a changed number. Files without checksums are read unverified.
WRITE_OPTIONS = {"write_page_checksum": True}
READ_OPTIONS = {"page_checksum_verification": True}


def parquet_bytes(table: pa.Table) -> bytes:
    """``table`` as the bytes of a parquet file with page checksums."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, **WRITE_OPTIONS)
    return sink.getvalue().to_pybytes()


def read_parquet(source, **kwargs) -> pa.Table:
    """``pq.read_table`` with page checksums verified."""
    return pq.read_table(source, **READ_OPTIONS, **kwargs)


def read_parquet_file(fs: pafs.FileSystem, path: str, **kwargs) -> pa.Table:
    """The parquet file ``path`` of ``fs`` (``read_parquet``'s ``kwargs``: columns, schema); a read
    error names the file (a Ray task passes its exception on as text)."""
    try:
        with fs.open_input_file(path) as fh:
            return read_parquet(fh, **kwargs)
    except (OSError, pa.ArrowException) as err:
        err.add_note(f"while reading parquet file {path}")
        raise


def write_table(table: pa.Table, fs: pafs.FileSystem, path: str) -> None:
    """``table`` as parquet (with page checksums) at ``path``, atomically (see ``write_bytes``)."""
    write_bytes(fs, path, parquet_bytes(table))


def write_table_and_csv(data, fs: pafs.FileSystem, stem: str, csv_without=()) -> None:
    """``stem``.parquet and ``stem``.csv from a pyarrow Table or a pandas DataFrame (the CSV is
    written from the pandas form either way). ``csv_without``: columns only the parquet file has
    (masks, binary previews: a CSV cell cannot hold them faithfully)."""
    if isinstance(data, pa.Table):
        table = data
        frame = data.drop_columns([c for c in csv_without if c in data.column_names]).to_pandas()
    else:
        table, frame = pa.Table.from_pandas(data, preserve_index=False), data.drop(
            columns=[c for c in csv_without if c in data.columns])
    write_table(table, fs, f"{stem}.parquet")
    write_text(frame.to_csv(index=False), fs, f"{stem}.csv")


def write_text(text: str, fs: pafs.FileSystem, path: str) -> None:
    """``text`` (UTF-8) at ``path``, atomically (see ``write_bytes``)."""
    write_bytes(fs, path, text.encode("utf-8"))


# Object stores publish an object only when its upload completes (S3 PutObject or
# CompleteMultipartUpload, GCS and Azure likewise): one upload of the whole object is atomic there,
# while a "rename" would be a copy and a delete that a crash can leave half done.
OBJECT_STORES = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss", "memory")
TMP_SUFFIX = ".tmp"


def temp_path(path: str) -> str:
    """A hidden temporary name next to ``path``: dataset readers skip names starting with '.'
    (pyarrow, Ray, ``resolve_parquet_inputs``), and it does not end in .parquet."""
    return posixpath.join(posixpath.dirname(path), f".{posixpath.basename(path)}.{uuid.uuid4().hex[:8]}{TMP_SUFFIX}")


# ENOSPC and EDQUOT: the disk, or the user's quota, is full (the command line's exit code 5)
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
_OS_ERROR_CODE = re.compile(r"\[Errno (\d+)\]|\(os error (\d+)\)|\bOs \{ code: (\d+)")


def disk_full_errno(exc: BaseException | str) -> int | None:
    """ENOSPC or EDQUOT when ``exc`` says the disk (or quota) is full, else None: an OSError with
    that errno, or another library's error that gives the OS error only in its text (safetensors'
    ``SafetensorError: ... No space left on device (os error 28)``), or such a text (what a Ray
    task raised, as the driver gets it)."""
    if isinstance(exc, OSError) and exc.errno is not None:
        return exc.errno if exc.errno in DISK_FULL else None
    text = exc if isinstance(exc, str) else str(exc)
    for match in _OS_ERROR_CODE.finditer(text):
        code = int(next(g for g in match.groups() if g))
        if code in DISK_FULL:
            return code
    if "No space left on device" in text:
        return errno.ENOSPC
    if "Disk quota exceeded" in text:
        return errno.EDQUOT
    return None


def write_bytes(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one, never a
    part of it, whatever kills the writer (also a Ray task retried after its worker died): on an
    object store one upload of the whole object; elsewhere a temporary name in the same directory,
    then a rename (atomic on POSIX, and it replaces the target). A full disk is an OSError naming
    ``path`` (pyarrow's names no file)."""
    with naming_disk_full(path):
        _write_bytes(fs, path, data)


@contextlib.contextmanager
def naming_disk_full(where: str):
    """A full disk inside (an OSError naming no file, or a library's own error that says so only in
    its text: safetensors' ``SafetensorError``) is raised as an OSError naming ``where``."""
    try:
        yield
    except Exception as exc:
        code = disk_full_errno(exc)
        if code is None or getattr(exc, "filename", None):
            raise
        raise OSError(code, os.strerror(code), where) from exc


def _write_bytes(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    fs.create_dir(posixpath.dirname(path), recursive=True)
    store = _object_store(fs)
    if store is not None:
        store.pipe_file(path, data)  # one PUT (multipart for large data: visible only once complete)
        return
    if fs.type_name in OBJECT_STORES:  # pyarrow's own S3/GCS streams publish on close
        with fs.open_output_stream(path) as fh:
            fh.write(data)
        return
    tmp = temp_path(path)
    try:
        with fs.open_output_stream(tmp) as fh:
            fh.write(data)
        fs.move(tmp, path)
    except BaseException:
        try:  # the temporary file is never read; removing it is tidiness, not correctness
            fs.delete_file(tmp)
        except Exception:
            pass
        raise


def _object_store(fs: pafs.FileSystem):
    """The fsspec filesystem behind ``fs`` when it is an object store, else None."""
    handler = getattr(fs, "handler", None)
    inner = getattr(handler, "fs", None)
    if isinstance(fs, pafs.PyFileSystem) and inner is not None and fs_protocol(inner) in OBJECT_STORES:
        return inner
    return None


def clear_dir(fs: pafs.FileSystem, path: str) -> None:
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.Directory:
        fs.delete_dir_contents(path)
    elif info.type == pafs.FileType.File:
        fs.delete_file(path)


def read_parquet_files(fs: pafs.FileSystem, files: list[str], schema: pa.Schema) -> pa.Table:
    """The rows of ``files`` as one table of ``schema`` (read in parallel threads)."""
    with ThreadPoolExecutor(max_workers=8) as pool:
        tables = list(pool.map(lambda path: read_parquet_file(fs, path, schema=schema), files))
    return pa.concat_tables(tables) if tables else schema.empty_table()


def count_parquet_rows(fs: pafs.FileSystem, path: str | list[str]) -> int:
    """Rows of every ``*.parquet`` file under directory ``path``, or of the files of a list (from
    the footers); 0 when there is none."""
    if isinstance(path, list):
        files = path
    elif not exists(fs, path):
        return 0
    else:
        infos = fs.get_file_info(pafs.FileSelector(path, recursive=True))
        files = [i.path for i in infos if i.type == pafs.FileType.File and i.path.endswith(".parquet")]
    return sum(m.num_rows for m in read_footers(fs, files, "file"))


def exists(fs: pafs.FileSystem, path: str) -> bool:
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def read_text(uri: str) -> str:
    """The text of a local file or fsspec URI; InputError when it cannot be read."""
    fs, path = url_to_fs(uri)
    try:
        with fs.open(path, "rb") as fh:
            return fh.read().decode("utf-8")
    except FileNotFoundError:
        raise InputError(f"{uri}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {uri}: {exc}") from None



def spec_record(obj) -> dict | None:
    """A spec's record (``GeneratorSpec``, ``ModelSpec``: an instance with a ``record()`` method) as
    runs write and fingerprint it; None for anything else."""
    record = getattr(obj, "record", None)
    return record() if callable(record) and not isinstance(obj, type) else None


def clean_json(obj):
    """``obj`` with NaN / inf floats and pandas' missing values as None and numpy scalars as Python
    ones: strict JSON (metrics.json and every other JSON a run writes)."""
    if isinstance(obj, dict):
        return {str(k): clean_json(v) for k, v in obj.items()}
    if (record := spec_record(obj)) is not None:
        return clean_json(record)
    if isinstance(obj, (list, tuple)):
        return [clean_json(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return None if not math.isfinite(float(obj)) else float(obj)
    if obj is pd.NA or obj is pd.NaT:
        return None
    return obj

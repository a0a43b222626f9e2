"""Reading LAION metadata from anywhere pyarrow/fsspec reaches, and writing results there.

Input validation happens on the driver before any data is read: every file's parquet footer is
read (metadata only), so a missing caption column or an unreadable file fails at once with a
message naming the file and the column.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import posixpath
import re
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import fsspec
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipelines.engine.datasets import match_name


class InputError(ValueError):
    """Bad input detected before the run starts: the message names the file and the column."""


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def plain(text: str) -> str:
    """``text`` without terminal colour codes (Ray colours the tracebacks of failed tasks)."""
    return _ANSI.sub("", text)


@dataclass
class ParquetInput:
    files: list[str]            # paths within ``filesystem``
    filesystem: pafs.FileSystem
    protocol: str
    schemas: list[pa.Schema]    # one per file, read from the footers
    num_rows: int               # total rows of all files, from the footers
    row_counts: list[int] | None = None  # rows per file
    identities: list[str] | None = None  # per file, what identifies its data (see ``file_identity``)
    row_groups: list[list[int]] | None = None  # per file, the rows of each row group (from the footers)
    checksums: list[bool | None] | None = None  # per file, whether its pages carry CRCs (``page_checksummed``)

    def subset(self, files: list[str]) -> "ParquetInput":
        """The same input restricted to ``files`` (a shard)."""
        idx = [self.files.index(f) for f in files]
        counts = [self.row_counts[i] for i in idx] if self.row_counts else None
        idents = [self.identities[i] for i in idx] if self.identities else None
        groups = [self.row_groups[i] for i in idx] if self.row_groups else None
        sums = [self.checksums[i] for i in idx] if self.checksums else None
        return ParquetInput(list(files), self.filesystem, self.protocol, [self.schemas[i] for i in idx],
                            sum(counts) if counts else 0, counts, idents, groups, sums)

    def checksum_record(self) -> dict:
        """How many files a read can verify page by page (their pages carry CRCs), how many it
        cannot (written without them: a flipped bit there reads as other data), and how many hold
        no page to tell by; the first few unverifiable files by name."""
        sums = self.checksums or [None] * len(self.files)
        without = [self.display(f) for f, c in zip(self.files, sums) if c is False]
        return {"files": len(self.files), "verified": sum(c is True for c in sums), "without_checksums": len(without),
                "no_pages": sum(c is None for c in sums), "without_checksums_examples": without[:5]}

    def data_identity(self) -> dict[str, str]:
        """{file as the user writes it: its identity}: a run's fingerprint includes it, so a file
        rewritten in place (same name, same row count) never resumes a run made from the old data."""
        return {self.display(f): i for f, i in zip(self.files, self.identities or [])}

    def display(self, path: str) -> str:
        return _display(self.protocol, path)

    def groups_by_type(self, columns: list[str]) -> list[list[str]]:
        """Files grouped by the Arrow types of ``columns``: Ray cannot read files whose types
        disagree (a caption column that is text in one file and numbers in another) as one
        dataset, so each group is read on its own."""
        groups: dict[tuple, list[str]] = {}
        for path, schema in zip(self.files, self.schemas):
            key = tuple(str(schema.field(c).type) for c in columns)
            groups.setdefault(key, []).append(path)
        return list(groups.values())


def _list_input(fs, path: str, spec: str) -> list[str]:
    if fsspec.core.has_magic(path):
        matched = sorted(fs.glob(path))
        if not matched:
            raise InputError(f"no files match {spec!r}")
        return [f for m in matched for f in _expand(fs, m)]
    if fs.isdir(path):
        found = _expand(fs, path)
        if not found:
            raise InputError(f"no .parquet files under directory {spec!r}")
        return found
    if fs.exists(path):
        return [path]
    raise InputError(f"input {spec!r} does not exist")


def listing_error(spec: str, exc: BaseException, what: str = "") -> str:
    """One line for a failure to list or open ``spec`` (a ``what``, e.g. "parquet file ") on its filesystem."""
    first = (plain(str(exc)).strip().splitlines() or [""])[0]
    text = f"{type(exc).__name__} {first}"
    hint = ""
    if spec.startswith("hf://") and any(k in text for k in ("Gated", "401", "403", "Unauthorized", "gated")):
        hint = (" (a gated or private Hub dataset: accept its terms on its Hub page with the account whose token "
                "is in HF_TOKEN, or run `hf auth login`)")
    return f"cannot read {what}{spec}: {type(exc).__name__}: {first}{hint}"


def _protocol(fs: fsspec.AbstractFileSystem) -> str:
    return fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]


def _display(protocol: str, path: str) -> str:
    """A path as the user would write it: bare for local files, with its scheme otherwise."""
    return path if protocol in ("file", "local") else f"{protocol}://{path}"


def _to_pyarrow_fs(fs: fsspec.AbstractFileSystem) -> pafs.FileSystem:
    if _protocol(fs) in ("file", "local"):
        return pafs.LocalFileSystem()
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs))


IDENTITIES = ("footer", "full")


def resolve_parquet_inputs(paths: list[str] | str, identity: str = "footer") -> ParquetInput:
    """Expand files, directories (recursively, ``*.parquet``) and globs on one filesystem.

    ``identity``: how each file's data is identified (``file_identity``): "footer" (the default:
    size, ETag/version or modification time, and a hash of the parquet footer, read anyway) or
    "full" (also a SHA-256 of the file's every byte, read once, in parallel: a rewrite that kept
    size, footer and time is caught too)."""
    if identity not in IDENTITIES:
        raise InputError(f"--input-identity {identity!r}: expected one of {', '.join(IDENTITIES)}")
    if isinstance(paths, str):
        paths = [paths]
    files: list[str] = []
    fs0 = None
    for spec in paths:
        fs, path = _url_to_fs(spec)
        if fs0 is None:
            fs0 = fs
            fs.invalidate_cache()  # a listing cached earlier in this process may predate a rewrite
        elif type(fs) is not type(fs0):
            raise InputError(f"all inputs must be on one filesystem; {spec!r} is not on {fs0.protocol}")
        try:
            files += _list_input(fs, path, spec)
        except InputError:
            raise
        except Exception as exc:  # noqa: BLE001 -- a store's own error (permissions, a gated Hub dataset)
            raise InputError(listing_error(spec, exc)) from None
    protocol = _protocol(fs0)
    pyfs = _to_pyarrow_fs(fs0)
    metas = _read_footers(pyfs, files, protocol)
    with ThreadPoolExecutor(max_workers=16) as pool:
        idents = list(pool.map(lambda fm: file_identity(fs0, fm[0], fm[1], protocol, full=identity == "full"),
                               zip(files, metas)))
        sums = list(pool.map(lambda fm: _checksummed(pyfs, fm[0], fm[1], protocol), zip(files, metas)))
    return ParquetInput(files, pyfs, protocol, [m.schema.to_arrow_schema() for m in metas],
                        sum(m.num_rows for m in metas), [m.num_rows for m in metas], idents,
                        [[m.row_group(i).num_rows for i in range(m.num_row_groups)] for m in metas], sums)


def _checksummed(fs: pafs.FileSystem, path: str, meta: pq.FileMetaData, protocol: str) -> bool | None:
    try:
        with fs.open_input_file(path) as fh:
            return page_checksummed(fh, meta)
    except Exception as exc:  # noqa: BLE001 -- the file could be listed and its footer read a moment ago
        raise InputError(listing_error(_display(protocol, path), exc, "parquet file ")) from None


def page_checksummed(fh, meta: pq.FileMetaData) -> bool | None:
    """Whether the pages of a parquet file carry CRC checksums (which ``READ_OPTIONS`` verifies),
    judged by the header of its first page: True, False, or None for a file with no page (no rows
    or no columns). A writer sets the option for the whole file.

    pyarrow does not expose page headers, so the first one (Thrift compact protocol, the fields in
    order of their ids) is read here: ``crc`` is field 4, after the page type and the two sizes;
    the next field header says whether it is there."""
    if meta.num_row_groups == 0 or meta.num_columns == 0:
        return None
    chunk = meta.row_group(0).column(0)
    offset = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    if offset is None or chunk.total_compressed_size == 0:
        return None
    fh.seek(int(offset))
    data, at, field = fh.read(64), 0, 0

    def varint() -> int:
        nonlocal at
        value, shift = 0, 0
        while True:
            byte = data[at]
            at += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value

    try:
        while True:
            head = data[at]
            at += 1
            if head == 0:                      # the end of the struct: no crc
                return False
            delta, kind = head >> 4, head & 0x0F
            field = field + delta if delta else varint()
            if field == 4:
                return True
            if field > 4 or kind != 5:         # past the crc, or not one of the three i32 fields before it
                return False
            varint()
    except IndexError:                         # not a page header we can read: say we cannot tell
        return None


# What identifies a file's data without reading it. An object store's ETag (or version) changes
# with every upload and stays when the object is only listed or copied within the store; other
# filesystems give size and modification time. A hash of the parquet footer (row-group sizes and
# min/max statistics, already read) is added: it catches a rewrite that kept size and time.
_ETAG_KEYS = ("ETag", "etag", "md5Hash", "content_md5")
_VERSION_KEYS = ("VersionId", "generation", "version_id")
_MTIME_KEYS = ("mtime", "LastModified", "last_modified", "updated", "modified", "created")


def file_identity(fs: fsspec.AbstractFileSystem, path: str, meta: pq.FileMetaData, protocol: str = "file",
                  full: bool = False) -> str:
    try:
        info = fs.info(path)
    except Exception as exc:  # noqa: BLE001 -- one line, with the gated-dataset hint on hf://
        raise InputError(listing_error(_display(protocol, path), exc, "parquet file ")) from None
    parts = [f"size={info.get('size')}"]
    etag = next((info[k] for k in _ETAG_KEYS if info.get(k)), None)
    version = next((info[k] for k in _VERSION_KEYS if info.get(k)), None)
    if etag:
        parts.append(f"etag={str(etag).strip(chr(34))}")
    if version:
        parts.append(f"version={version}")
    if not etag and not version:
        parts.append(f"modified={next((info[k] for k in _MTIME_KEYS if info.get(k)), None)}")
    footer = pa.BufferOutputStream()
    meta.write_metadata_file(footer)
    parts.append(f"footer={hashlib.sha256(footer.getvalue().to_pybytes()).hexdigest()[:16]}")
    if full:
        parts.append(f"sha256={content_sha256(fs, path, protocol)}")
    return " ".join(parts)


def content_sha256(fs: fsspec.AbstractFileSystem, path: str, protocol: str = "file", chunk: int = 8 << 20) -> str:
    """SHA-256 of every byte of ``path``, streamed in ``chunk``-byte reads."""
    digest = hashlib.sha256()
    try:
        with fs.open(path, "rb") as fh:
            while block := fh.read(chunk):
                digest.update(block)
    except OSError as exc:
        raise InputError(f"cannot read {_display(protocol, path)}: {exc}") from exc
    return digest.hexdigest()


def choose_input_columns(inp: ParquetInput, caption_flag: str | None, url_flag: str | None,
                         dataset_name: str | None = None, url: bool = True, paths: list[str] | None = None):
    """The caption and URL columns of ``inp`` and the dataset it is (``pipelines.engine.datasets``),
    from the footers' schemas; a one-line InputError when they cannot be chosen."""
    from pipelines.engine.datasets import ColumnError, choose_columns

    try:
        return choose_columns([(inp.display(f), s.names) for f, s in zip(inp.files, inp.schemas)], caption_flag,
                              url_flag, dataset_name, url=url, paths=[str(p) for p in paths or []])
    except ColumnError as exc:
        raise InputError(str(exc)) from None


# Hugging Face Hub datasets (hf://datasets/ORG/NAME/PATH) are read through huggingface_hub's fsspec
# filesystem; the token comes from HF_TOKEN (or the login cache `hf auth login` writes): gated
# datasets (Re-LAION, ...) need one whose account accepted the dataset's terms.
HF_TOKEN_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


def storage_options(uri: str) -> dict:
    """What a filesystem needs beyond the URI: for hf:// the Hub token of the environment."""
    import os

    if uri.startswith("hf://"):
        token = next((os.environ[v] for v in HF_TOKEN_VARS if os.environ.get(v)), None)
        return {"token": token} if token else {}
    return {}


def _url_to_fs(uri: str):
    try:
        return fsspec.core.url_to_fs(uri, **storage_options(uri))
    except ImportError as exc:  # e.g. s3:// without s3fs
        raise InputError(
            f"cannot open {uri!r}: {exc}. Install the filesystem driver, e.g. pip install -e '.[cloud]' "
            f"for s3:// and gs://"
        ) from exc


def _expand(fs, path: str) -> list[str]:
    if fs.isdir(path):
        return sorted(p for p in fs.find(path) if p.endswith(".parquet") and not posixpath.basename(p).startswith((".", "_")))
    return [path]


def _read_footers(fs: pafs.FileSystem, files: list[str], protocol: str) -> list[pq.FileMetaData]:
    def one(path: str) -> pq.FileMetaData:
        try:
            with fs.open_input_file(path) as fh:
                return pq.read_metadata(fh)
        except Exception as exc:  # ArrowInvalid (not parquet), OSError (permissions), a gated Hub dataset ...
            raise InputError(listing_error(_display(protocol, path), exc, "parquet file ")) from None

    with ThreadPoolExecutor(max_workers=16) as pool:
        return list(pool.map(one, files))


def unreadable_input(exc: BaseException, inp: ParquetInput, columns: list[str]) -> InputError | None:
    """When ``exc`` (what a stream over ``inp`` raised) comes from reading a parquet file, the
    InputError naming the file and the cause; None for anything else.

    A file whose footer is intact but whose data pages are corrupt passes the footer check and
    fails inside a Ray read task, which reports neither the file nor, in its first line, the cause
    (and Ray's wrapper reads like a crashed worker). The driver reads the failed files' ``columns``
    again, one row group at a time, to find the file; a failure it cannot reproduce (a transient
    network error) is left as it was."""
    chain, e = [], exc
    while e is not None and e not in chain:
        chain.append(e)
        e = getattr(e, "cause", None) or e.__cause__
    said = plain("\n".join(str(e) for e in chain))
    # a read error of Ray's own reader keeps its type in the chain; one raised in a task's code
    # (the fused caption scan) reaches the driver as text, naming the file it was reading
    named = any(f"while reading parquet file {f}" in said for f in inp.files)
    if isinstance(exc, InputError) or not (named or any(isinstance(e, (pa.ArrowException, OSError)) for e in chain)):
        return None
    for path in sorted(inp.files, key=lambda f: f not in said):  # a file the error names first
        try:
            with inp.filesystem.open_input_file(path) as fh:
                pf = pq.ParquetFile(fh, **READ_OPTIONS)
                for i in range(pf.num_row_groups):
                    pf.read_row_group(i, columns=columns)
        except Exception as err:  # noqa: BLE001 (any failure to decode the data names the file)
            cause = plain(str(err)).strip().splitlines()
            return InputError(
                f"cannot read parquet file {inp.display(path)}: {type(err).__name__}: {cause[0] if cause else ''} "
                f"(its footer is readable but its data is not: the file is corrupt or truncated; replace it, "
                f"or leave it out of --captions)")
    return None


def resolve_column(inp: ParquetInput, wanted: str, role: str, required: bool = True,
                   flag: str | None = None) -> str | None:
    """The column to read for ``wanted``: exact name, else a case-insensitive match (TEXT/text).

    Every file must have it; the first file lacking it is named in the error (with ``flag``, the
    option that names it; default ``--<role>-column``).
    """
    chosen = None
    for path, schema in zip(inp.files, inp.schemas):
        names = schema.names
        name = match_name(names, wanted)
        if name is None:
            if not required:
                return None
            raise InputError(
                f"{inp.display(path)} has no {role} column {wanted!r} (columns: {', '.join(names)}); "
                f"choose it with {flag or f'--{role}-column'}"
            )
        if chosen is not None and name != chosen:
            raise InputError(f"{inp.display(path)} names the {role} column {name!r}, other files {chosen!r}")
        chosen = name
    return chosen


def output_fs(uri: str) -> tuple[pafs.FileSystem, str]:
    """(pyarrow filesystem, path) for an output location: a local path or any fsspec URI."""
    fs, path = _url_to_fs(uri)
    return _to_pyarrow_fs(fs), path.rstrip("/")


# Every parquet file the project writes carries a CRC-32 per data page, and every read of one (and
# of an input file that has them) verifies it: a bit flipped on disk or in transit is an error
# naming the file, never a changed number. Files without checksums read as before.
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
    if isinstance(fs, pafs.PyFileSystem) and inner is not None and _protocol(inner) in OBJECT_STORES:
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
    def one(path: str) -> pa.Table:
        with fs.open_input_file(path) as fh:
            return read_parquet(fh, schema=schema)

    with ThreadPoolExecutor(max_workers=8) as pool:
        tables = list(pool.map(one, files))
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
    return sum(m.num_rows for m in _read_footers(fs, files, "file"))


def exists(fs: pafs.FileSystem, path: str) -> bool:
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def read_text(uri: str) -> str:
    """The text of a local file or fsspec URI; InputError when it cannot be read."""
    fs, path = _url_to_fs(uri)
    try:
        with fs.open(path, "rb") as fh:
            return fh.read().decode("utf-8")
    except FileNotFoundError:
        raise InputError(f"{uri}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {uri}: {exc}") from None


def check_output(uri: str, flag: str = "--output") -> None:
    """Fail now, with one line, when ``uri`` cannot take the results: an existing file, a path
    under a file, or a place this process cannot create or write files in. Checked by writing
    and deleting a small probe file (permission bits alone say nothing for root or object stores),
    before any model loads or data is read."""
    try:
        fs, path = output_fs(uri)
    except Exception as exc:  # unknown protocol, missing driver, bad URI
        raise InputError(f"{flag} {uri}: {type(exc).__name__}: {exc}") from None
    try:
        _probe_output(fs, path, uri, flag)
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 -- a store's own error: no credentials, offline, unreachable
        raise InputError(output_error(uri, exc, flag)) from None


def output_error(uri: str, exc: BaseException, flag: str = "--output") -> str:
    """One line for a failure to reach the output ``uri`` that is not an OSError: botocore's
    NoCredentialsError, huggingface_hub's OfflineModeIsEnabled, a connection error."""
    first = (plain(str(exc)).strip().splitlines() or [""])[0]
    name = type(exc).__name__
    hint = ""
    if name in ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"):
        hint = (" (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, or run where an instance "
                "role gives credentials)")
    elif uri.startswith("hf://"):
        hint = (" (writing to the Hugging Face Hub needs the network and a token with write access in HF_TOKEN; "
                "or write locally and upload the run directory)")
    return f"{flag} {uri} cannot be reached: {name}: {first}{hint}"


def _probe_output(fs: pafs.FileSystem, path: str, uri: str, flag: str) -> None:
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.File:
        raise InputError(f"{flag} {uri} is an existing file; it must be a directory (it is created if missing)")
    probe = f"{path}/.t2i-write-probe-{uuid.uuid4().hex[:12]}"
    created, parent = [], path  # directories this check makes, removed again: it leaves nothing behind
    while parent and fs.get_file_info(parent).type == pafs.FileType.NotFound:
        created.append(parent)
        up = posixpath.dirname(parent)
        parent = up if up != parent else ""
    try:
        if parent and fs.get_file_info(parent).type == pafs.FileType.File:
            raise NotADirectoryError(f"{parent} is a file")
        fs.create_dir(path, recursive=True)
        with fs.open_output_stream(probe) as fh:
            fh.write(b"")
        fs.delete_file(probe)
    except (OSError, ValueError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"{flag} {uri} is not a writable directory ({reason})") from None
    for d in created:  # best effort: on object stores the "directory" went with the probe
        try:
            if fs.get_file_info(d).type == pafs.FileType.Directory:
                fs.delete_dir(d)
        except (OSError, ValueError):
            pass


def spec_record(obj) -> dict | None:
    """A spec's record (``GeneratorSpec``, ``ModelSpec``: an instance with a ``record()`` method) as
    runs write and fingerprint it; None for anything else."""
    record = getattr(obj, "record", None)
    return record() if callable(record) and not isinstance(obj, type) else None


def clean_json(obj):
    """``obj`` with NaN / inf floats and pandas' missing values as None and numpy scalars as Python
    ones: strict JSON (metrics.json and every other JSON a run writes)."""
    import math

    import numpy as np
    import pandas as pd

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

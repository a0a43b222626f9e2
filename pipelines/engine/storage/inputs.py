"""The parquet input files of a run: listing, footers, columns and unreadable data.

Input validation happens on the driver before any data is read: every file's parquet footer is
read (metadata only), so a missing caption column or an unreadable file fails at once with a
message naming the file and the column. ``input_integrity`` says what identifies each file's data
and whether its pages carry checksums.
"""

from __future__ import annotations

import posixpath
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import fsspec
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipelines.engine.storage.datasets import ColumnError, choose_columns, match_name
from pipelines.engine.storage.input_integrity import file_checksummed, file_identity
from pipelines.engine.storage.io import (
    READ_OPTIONS,
    InputError,
    display_path,
    fs_protocol,
    listing_error,
    plain,
    read_footers,
    to_pyarrow_fs,
    url_to_fs,
)


@dataclass
class ParquetInput:
    """The parquet files of a run's input on one filesystem, with what their footers say."""

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
        return display_path(self.protocol, path)

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


def _expand(fs, path: str) -> list[str]:
    if fs.isdir(path):
        return sorted(p for p in fs.find(path) if p.endswith(".parquet") and not posixpath.basename(p).startswith((".", "_")))
    return [path]


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
        fs, path = url_to_fs(spec)
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
    protocol = fs_protocol(fs0)
    pyfs = to_pyarrow_fs(fs0)
    metas = read_footers(pyfs, files, protocol)
    with ThreadPoolExecutor(max_workers=16) as pool:
        idents = list(pool.map(lambda fm: file_identity(fs0, fm[0], fm[1], protocol, full=identity == "full"),
                               zip(files, metas)))
        sums = list(pool.map(lambda fm: file_checksummed(pyfs, fm[0], fm[1], protocol), zip(files, metas)))
    return ParquetInput(files, pyfs, protocol, [m.schema.to_arrow_schema() for m in metas],
                        sum(m.num_rows for m in metas), [m.num_rows for m in metas], idents,
                        [[m.row_group(i).num_rows for i in range(m.num_row_groups)] for m in metas], sums)


def choose_input_columns(inp: ParquetInput, caption_flag: str | None, url_flag: str | None,
                         dataset_name: str | None = None, url: bool = True, paths: list[str] | None = None):
    """The caption and URL columns of ``inp`` and the dataset it is (``pipelines.engine.storage.datasets``),
    from the footers' schemas; a one-line InputError when they cannot be chosen."""
    try:
        return choose_columns([(inp.display(f), s.names) for f, s in zip(inp.files, inp.schemas)], caption_flag,
                              url_flag, dataset_name, url=url, paths=[str(p) for p in paths or []])
    except ColumnError as exc:
        raise InputError(str(exc)) from None


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

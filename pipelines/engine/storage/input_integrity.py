"""What identifies an input parquet file's data, and whether its pages carry checksums.

A run's fingerprint includes every input file's identity (``file_identity``), so a file rewritten
in place never resumes a run made from the old data; ``page_checksummed`` tells which files a read
can verify page by page.
"""

from __future__ import annotations

import hashlib

import fsspec
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipelines.engine.storage.io import InputError, display_path, listing_error


def file_checksummed(fs: pafs.FileSystem, path: str, meta: pq.FileMetaData, protocol: str) -> bool | None:
    """``page_checksummed`` of the file at ``path``; an InputError naming it when it cannot be opened."""
    try:
        with fs.open_input_file(path) as fh:
            return page_checksummed(fh, meta)
    except Exception as exc:  # noqa: BLE001 -- the file could be listed and its footer read a moment ago
        raise InputError(listing_error(display_path(protocol, path), exc, "parquet file ")) from None


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
    """What identifies the data of the parquet file at ``path`` (``meta``: its footer), as one line
    of ``key=value`` parts; with ``full``, also the SHA-256 of its every byte."""
    try:
        info = fs.info(path)
    except Exception as exc:  # noqa: BLE001 -- one line, with the gated-dataset hint on hf://
        raise InputError(listing_error(display_path(protocol, path), exc, "parquet file ")) from None
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
        raise InputError(f"cannot read {display_path(protocol, path)}: {exc}") from exc
    return digest.hexdigest()

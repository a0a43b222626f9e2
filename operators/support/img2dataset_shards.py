"""Reading img2dataset's output folders: the three formats, their metadata, one sample's image.

img2dataset (``--output_format``) writes, per shard ``NNNNN``:

- ``webdataset``: ``NNNNN.tar`` with members ``<key>.jpg`` (or png/webp), ``<key>.txt``,
  ``<key>.json``; and ``NNNNN.parquet``, the metadata of every input row of the shard;
- ``parquet``: ``NNNNN.parquet``, the metadata plus the image bytes in a column named by the
  encode format (``jpg``...), null where the download failed;
- ``files``: a folder ``NNNNN/`` with ``<key>.jpg``, ``.txt``, ``.json``; and ``NNNNN.parquet``.

and ``NNNNN_stats.json``. Every path here is an fsspec path or URI (local, s3://, hf://...).

A damaged ``.tar`` shard is named, never read short in silence: Python's ``tarfile``
takes a bad header in mid-archive (a failed checksum, a zeroed block) for the end of the archive
and stops without an error, so when the wanted keys were not all found, ``read_shard`` looks at
where the reading stopped: tar's end-of-archive blocks with nothing but zeros after them is a
whole archive; anything else (a header tarfile refuses, data after a zero block, a file that ends
inside a member or without the end-of-archive blocks) is a :class:`Corrupt` shard, with the byte
where it stops and the cause. The samples it could not deliver say so in their status detail
(:func:`corrupt_detail`, read back by :func:`parse_corrupt_detail`).
"""

from __future__ import annotations

import posixpath
import re
import tarfile
from dataclasses import dataclass

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from schemas.datasets import I2D_IMAGE_EXTENSIONS, I2D_KEY


def filesystem(uri: str):
    """(fsspec filesystem, path) of ``uri``."""
    return fsspec.core.url_to_fs(uri)


def image_column(schema: pa.Schema) -> str | None:
    """The image-bytes column of a parquet shard (named by img2dataset's encode format), or None."""
    for ext in I2D_IMAGE_EXTENSIONS:
        if ext in schema.names:
            kind = schema.field(ext).type
            if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
                return ext
    return None


def read_metadata(fs, path: str, columns: list[str]) -> pa.Table:
    """The ``columns`` (those present) of a shard's metadata parquet."""
    with fs.open(path, "rb") as fh:
        pf = pq.ParquetFile(fh, page_checksum_verification=True)
        have = [c for c in columns if c in pf.schema_arrow.names]
        return pf.read(columns=have)


@dataclass(frozen=True)
class Corrupt:
    """Where a shard stops being readable (``at_byte``: the byte offset in its file) and why."""

    at_byte: int
    cause: str


_CORRUPT_DETAIL = re.compile(r"^shard (?P<shard>.+) is corrupt at byte (?P<at>\d+): (?P<cause>.*)$", re.S)


def corrupt_detail(shard: str, corrupt: Corrupt) -> str:
    """The status detail of a sample a corrupt ``shard`` could not deliver."""
    return f"shard {shard} is corrupt at byte {corrupt.at_byte}: {corrupt.cause}"


def parse_corrupt_detail(detail: str | None) -> tuple[str, Corrupt] | None:
    """(shard, Corrupt) of a :func:`corrupt_detail` text, None for any other detail."""
    m = _CORRUPT_DETAIL.match(detail or "")
    return (m.group("shard"), Corrupt(int(m.group("at")), m.group("cause"))) if m else None


def read_shard(fs, shard: str, fmt: str, keys: list[str]) -> tuple[dict[str, bytes], Corrupt | None]:
    """({key: encoded image bytes} of ``keys`` in one shard, a key whose image is absent left out;
    the shard's :class:`Corrupt` when it is damaged where it was read, else None)."""
    wanted = set(keys)
    if fmt == "parquet":
        with fs.open(shard, "rb") as fh:
            pf = pq.ParquetFile(fh, page_checksum_verification=True)
            col = image_column(pf.schema_arrow)
            out = {}
            for batch in pf.iter_batches(columns=[I2D_KEY, col], batch_size=1024):
                for k, data in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist()):
                    if k in wanted and data is not None and k not in out:
                        out[k] = data
            return out, None
    if fmt == "files":
        out = {}
        for k in keys:
            for ext in I2D_IMAGE_EXTENSIONS:
                p = posixpath.join(shard, f"{k}.{ext}")
                if fs.exists(p):
                    with fs.open(p, "rb") as fh:
                        out[k] = fh.read()
                    break
        return out, None
    if fmt == "webdataset":
        with fs.open(shard, "rb") as fh:
            return _read_tar(fh, wanted)
    raise ValueError(f"unknown img2dataset output format {fmt!r}")


def _file_size(fh) -> int:
    here = fh.tell()
    fh.seek(0, 2)
    size = fh.tell()
    fh.seek(here)
    return size


def _read_tar(fh, wanted: set[str]) -> tuple[dict[str, bytes], Corrupt | None]:
    """The wanted images of a webdataset tar, and where the archive is damaged (if the reading
    ended before every wanted key was found)."""
    out: dict[str, bytes] = {}
    size = _file_size(fh)
    try:
        tar = tarfile.open(fileobj=fh, mode="r:")
    except tarfile.TarError as exc:   # the first header already: not a tar archive at all
        return out, Corrupt(0, f"no tar archive ({exc}; the file has {size:,} bytes)")
    member = None
    with tar:
        try:
            for member in tar:   # headers in order; the data of members not wanted is skipped
                stem, _, ext = member.name.rpartition(".")
                key = posixpath.basename(stem)
                if key in wanted and ext.lower() in I2D_IMAGE_EXTENSIONS and key not in out:
                    out[key] = tar.extractfile(member).read()
                    if len(out) == len(wanted):
                        return out, None
        except (tarfile.TarError, EOFError) as exc:
            # the file ends inside a member (extractfile's read, or the next header's seek past it)
            if member is not None and member.offset_data + member.size > size:
                return out, Corrupt(member.offset_data, f"truncated: the file ends inside {member.name} (its data "
                                                        f"needs bytes {member.offset_data:,} to "
                                                        f"{member.offset_data + member.size:,}, the file has "
                                                        f"{size:,})")
            return out, Corrupt(tar.offset, f"unreadable tar data ({type(exc).__name__}: {exc}; the file has "
                                            f"{size:,} bytes)")
        return out, _stop_reason(fh, tar.offset, size)


def _stop_reason(fh, offset: int, size: int) -> Corrupt | None:
    """Why tarfile's iteration stopped at ``offset``: None for tar's end-of-archive blocks followed
    by nothing but zeros (a whole archive), else the damage it stopped at."""
    fh.seek(offset)
    block = fh.read(tarfile.BLOCKSIZE)
    if not block:
        return Corrupt(offset, f"truncated: the file ends at byte {size:,} without tar's end-of-archive blocks")
    if len(block) < tarfile.BLOCKSIZE:
        return Corrupt(offset, f"truncated: the file ends inside a tar header ({len(block)} of "
                               f"{tarfile.BLOCKSIZE} bytes)")
    if block.count(0) != len(block):
        try:
            tarfile.TarInfo.frombuf(block, tarfile.ENCODING, "surrogateescape")
            why = "a tar header tarfile cannot use"
        except tarfile.HeaderError as exc:
            why = str(exc)
        return Corrupt(offset, f"damaged tar header ({why}); tarfile stops reading there as if at the end of the "
                               f"archive, {size - offset:,} bytes before the end of the file")
    data = _first_nonzero(fh, offset + len(block))
    if data is not None:
        return Corrupt(offset, f"damaged tar header (a block of zeros, which tarfile reads as the end of the "
                               f"archive, but data follows at byte {data:,} of {size:,})")
    return None


def _first_nonzero(fh, start: int, chunk: int = 1 << 20) -> int | None:
    """The offset of the first byte that is not zero at or after ``start``, or None."""
    fh.seek(start)
    at = start
    while True:
        data = fh.read(chunk)
        if not data:
            return None
        stripped = data.lstrip(b"\0")
        if stripped:
            return at + len(data) - len(stripped)
        at += len(data)

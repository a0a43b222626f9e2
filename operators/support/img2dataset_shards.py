"""Reading img2dataset's output folders: the three formats, their metadata, one sample's image.

img2dataset (``--output_format``) writes, per shard ``NNNNN``:

- ``webdataset``: ``NNNNN.tar`` with members ``<key>.jpg`` (or png/webp), ``<key>.txt``,
  ``<key>.json``; and ``NNNNN.parquet``, the metadata of every input row of the shard;
- ``parquet``: ``NNNNN.parquet``, the metadata plus the image bytes in a column named by the
  encode format (``jpg``...), null where the download failed;
- ``files``: a folder ``NNNNN/`` with ``<key>.jpg``, ``.txt``, ``.json``; and ``NNNNN.parquet``.

and ``NNNNN_stats.json``. Every path here is an fsspec path or URI (local, s3://, hf://...).
"""

from __future__ import annotations

import posixpath
import tarfile

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


def read_images(fs, shard: str, fmt: str, keys: list[str]) -> dict[str, bytes]:
    """{key: encoded image bytes} of ``keys`` in one shard (a key whose image is absent is left out)."""
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
            return out
    if fmt == "files":
        out = {}
        for k in keys:
            for ext in I2D_IMAGE_EXTENSIONS:
                p = posixpath.join(shard, f"{k}.{ext}")
                if fs.exists(p):
                    with fs.open(p, "rb") as fh:
                        out[k] = fh.read()
                    break
        return out
    if fmt == "webdataset":
        out = {}
        with fs.open(shard, "rb") as fh, tarfile.open(fileobj=fh, mode="r:") as tar:
            for member in tar:   # headers in order; the data of members not wanted is skipped
                stem, _, ext = member.name.rpartition(".")
                key = posixpath.basename(stem)
                if key in wanted and ext.lower() in I2D_IMAGE_EXTENSIONS and key not in out:
                    out[key] = tar.extractfile(member).read()
                    if len(out) == len(wanted):
                        break
        return out
    raise ValueError(f"unknown img2dataset output format {fmt!r}")

"""Save images as they stream past: one parquet file per batch (provenance keys + encoded image, as
``datasets``' Image storage ``{bytes, path}`` with its features in the schema metadata, so
``datasets.load_dataset("parquet", data_files=".../*.parquet")`` loads the column as images),
or, with ``name_column``, one image file per row named by that column (for people to look at:
annotators of paper 001's attributes open ``<image id>.png``).

Fetched training images are saved as img2dataset's resizer wrote them (JPEG by default);
generated images, which travel as raw RGB8, are encoded as PNG (lossless). The batch passes on
unchanged, so saving never changes what is measured. Rows without an image (failed fetches,
blocked generations) are not written; their statuses are in the per-image table.

This runs inside Ray tasks that may be killed and retried, so every file is written atomically
(``_put``) and a part is named by its rows' keys: a batch written again by a retried task
replaces its own part instead of adding a second one, and no reader sees a truncated file.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import posixpath
import uuid

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from PIL import Image

from operators.base import Resources
from operators.support.codec import decode_rgb
from operators.support.hf_features import IMAGE_STORAGE, with_features
from schemas.images import IMAGE, IMAGE_ENCODING, IMAGE_HEIGHT, IMAGE_WIDTH, RGB8

STAGE_SAVE_IMAGES = "save_images"


class ImageSink:
    stage_name = STAGE_SAVE_IMAGES
    resources = Resources(num_cpus=1, batch_size=256)

    def __init__(self, uri: str, keys: list[str], name_column: str | None = None):
        self.fs, self.root = fsspec.core.url_to_fs(uri)
        self.uri = uri
        self.keys = list(keys)
        self.name_column = name_column
        self.fs.makedirs(self.root, exist_ok=True)

    def __call__(self, batch: pa.Table) -> pa.Table:
        if IMAGE not in batch.column_names or batch.num_rows == 0:
            return batch
        has = np.asarray(pc.is_valid(batch.column(IMAGE)))
        if not has.any():
            return batch
        rows = np.flatnonzero(has)
        part = batch.take(pa.array(rows, pa.int64()))
        enc = part.column(IMAGE_ENCODING).to_pylist() if IMAGE_ENCODING in part.column_names else [None] * len(rows)
        data = part.column(IMAGE).to_pylist()
        h = part.column(IMAGE_HEIGHT).to_pylist() if IMAGE_HEIGHT in part.column_names else [None] * len(rows)
        w = part.column(IMAGE_WIDTH).to_pylist() if IMAGE_WIDTH in part.column_names else [None] * len(rows)
        out = []
        for i in range(len(rows)):
            if enc[i] == RGB8:
                rgb = decode_rgb(data[i], RGB8, h[i], w[i])
                buf = io.BytesIO()
                Image.fromarray(rgb).save(buf, "PNG")
                out.append(buf.getvalue())
            else:
                out.append(data[i])
        if self.name_column:
            for name, data, encoding in zip(part.column(self.name_column).to_pylist(), out, enc):
                ext = "png" if encoding == RGB8 else extension(data)
                _put(self.fs, posixpath.join(self.root, f"{file_stem(str(name))}.{ext}"), data)
            return batch
        keys = part.select([k for k in self.keys if k in part.column_names])
        # the image as ``datasets``' Image storage ({bytes, path}) with its features in the schema
        # metadata: load_dataset("parquet", data_files=...) gives the column as images
        image = pa.StructArray.from_arrays([pa.array(out, pa.binary()), pa.nulls(len(out), pa.string())],
                                           fields=list(IMAGE_STORAGE))
        table = keys.append_column(IMAGE, image)
        table = table.replace_schema_metadata(with_features(table.schema, (IMAGE,)).metadata)
        name = hashlib.sha256(json.dumps(keys.to_pylist(), default=str).encode()).hexdigest()[:32] \
            if keys.num_columns else uuid.uuid4().hex
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, write_page_checksum=True)   # verified when read back
        _put(self.fs, posixpath.join(self.root, f"part-{name}.parquet"), sink.getvalue().to_pybytes())
        return batch


def _put(fs, path: str, data: bytes) -> None:
    """``data`` at ``path``, atomically: on local disk a hidden temporary name in the same directory,
    then a rename; elsewhere one upload of the whole object (an object store publishes it only
    once complete)."""
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    if not {"file", "local"} & set(protocols):
        fs.pipe_file(path, data)
        return
    tmp = posixpath.join(posixpath.dirname(path), f".{posixpath.basename(path)}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def file_stem(name: str) -> str:
    """A file name from a key value: path separators and other odd characters become "_"."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name).strip(".") or "_"


def extension(data: bytes) -> str:
    """The file extension of encoded image bytes, from their signature ("img" when unknown)."""
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return "jpg" if data[:3] == b"\xff\xd8\xff" else "img"

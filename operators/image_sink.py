"""Save images as they stream past: one parquet file per batch (provenance keys + encoded image),
or, with ``name_column``, one image file per row named by that column (for people to look at:
annotators of paper 001's attributes open ``<image id>.png``).

Fetched training images are saved as img2dataset's resizer wrote them (JPEG by default);
generated images, which travel as raw RGB8, are encoded as PNG (lossless). The batch passes on
unchanged, so saving never changes what is measured. Rows without an image (failed fetches,
blocked generations) are not written; their statuses are in the per-image table.
"""

from __future__ import annotations

import io
import posixpath
import uuid

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from PIL import Image

from operators.base import Resources
from operators.image_codec import decode_rgb
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
                ext = "png" if encoding == RGB8 else _extension(data)
                with self.fs.open(posixpath.join(self.root, f"{_safe_name(str(name))}.{ext}"), "wb") as fh:
                    fh.write(data)
            return batch
        table = part.select([k for k in self.keys if k in part.column_names]).append_column(
            IMAGE, pa.array(out, pa.binary()))
        path = posixpath.join(self.root, f"part-{uuid.uuid4().hex}.parquet")
        with self.fs.open(path, "wb") as fh:
            pq.write_table(table, fh)
        return batch


def _safe_name(name: str) -> str:
    """A file name from a key value: path separators and other odd characters become "_"."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name).strip(".") or "_"


def _extension(data: bytes) -> str:
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return "jpg" if data[:3] == b"\xff\xd8\xff" else "img"

"""Training images already downloaded: the image bytes of chosen samples of img2dataset's shards.

The second shard stage of ``--training-images``: rows from ``ShardIndex`` (one chosen
occurrence per wanted URL, grouped by shard), out the same rows with the fetch payload the face
filter and CLIP read (``image``, ``image_encoding``...), ``fetch_status`` ok and
``image_origin`` "shards". The bytes are the ones img2dataset stored (its resize and encoding; no
second resize). A sample the metadata calls stored but whose image is not in the shard gets
``shard_failed`` with the reason; nothing is dropped. A damaged shard (a ``.tar`` whose header is
broken in mid-archive, or that is cut short) gives the samples it could not deliver the shard's
path, the byte where it breaks and the cause as their reason
(``img2dataset_shards.corrupt_detail``), instead of "no image for its key".
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from operators.base import Resources
from operators.support import img2dataset_shards as shards
from schemas.datasets import SHARD, SHARD_FORMAT, SHARD_KEY
from schemas.images import (ENCODED, FETCH_ERROR, FETCH_STATUS, IMAGE, IMAGE_ENCODING, IMAGE_ORIGIN, FetchStatus,
                            ImageOrigin)

STAGE_SHARD_READ = "shard_read"
NO_IMAGE = "the metadata lists the sample, the shard has no image for its key"


class ShardImageReader:
    """Adds ``image``, ``image_encoding`` and ``image_origin``; ``fetch_status`` shard_failed where the
    shard lacks the image."""

    stage_name = STAGE_SHARD_READ
    resources = Resources(num_cpus=1, batch_size=256)

    def __call__(self, batch: pa.Table) -> pa.Table:
        images: list = [None] * batch.num_rows
        errors: list = [NO_IMAGE] * batch.num_rows   # why a sample the metadata lists has no image
        rows = batch.select([SHARD, SHARD_FORMAT, SHARD_KEY]).to_pylist()
        by_shard: dict[tuple[str, str], list[int]] = {}
        for i, r in enumerate(rows):
            if r[SHARD] is not None and r[SHARD_KEY] is not None:
                by_shard.setdefault((r[SHARD], r[SHARD_FORMAT]), []).append(i)
        for (shard, fmt), idx in by_shard.items():
            fs, path = shards.filesystem(shard)
            try:
                got, corrupt = shards.read_shard(fs, path, fmt, [rows[i][SHARD_KEY] for i in idx])
            except Exception as exc:  # noqa: BLE001 -- the shard and the cause in one line
                raise RuntimeError(f"cannot read img2dataset shard {shard}: {type(exc).__name__}: {exc}") from None
            for i in idx:
                images[i] = got.get(rows[i][SHARD_KEY])
                if images[i] is None and corrupt is not None:
                    errors[i] = shards.corrupt_detail(shard, corrupt)
        data = pa.array(images, pa.binary())
        status = batch.column(FETCH_STATUS)
        missing = pc.and_(pc.equal(status, FetchStatus.OK), pc.is_null(data))
        out = batch
        for name, values in (
                (FETCH_STATUS, pc.if_else(missing, FetchStatus.SHARD_FAILED, status)),
                (FETCH_ERROR, pc.if_else(missing, pa.array(errors, pa.string()), batch.column(FETCH_ERROR))),
                (IMAGE, pc.if_else(pc.equal(status, FetchStatus.OK), data, pa.scalar(None, pa.binary()))),
                (IMAGE_ENCODING, pc.if_else(pc.is_null(data), pa.scalar(None, pa.string()), ENCODED)),
                (IMAGE_ORIGIN, pa.array([ImageOrigin.SHARDS] * batch.num_rows, pa.string()))):
            if name in out.column_names:
                out = out.set_column(out.schema.get_field_index(name), name, values)
            else:
                out = out.append_column(name, values)
        return out

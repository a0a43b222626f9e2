"""Training images already downloaded: where each wanted URL is in img2dataset's shards.

The first of the two shard stages of ``--training-images``. Each input row is one shard (its
path, format, metadata file and position in the listing); the stage reads the shard's metadata
(img2dataset's ``<shard>.parquet``: URL, key, status and sizes of every input row, no image
bytes) and returns one row per occurrence of a wanted join value: the shard and key to read its
image from when img2dataset stored it (``fetch_status`` ok), or ``shard_failed`` with
img2dataset's own error message when its download or resize failed. The join is by URL, or with
``key_column`` (``--shard-key``) by a column of the caption files img2dataset saved into its
metadata (``--save_additional_columns``, e.g. DataComp's ``uid``), compared as text. A value in
no shard gets no row here: the pipeline gives its caption ``not_in_shards``. Rows are chosen,
never dropped silently: every occurrence of a wanted value is returned, and the pipeline keeps
the first per caption URL in (shard, key) order.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from operators.base import Resources
from operators.support import img2dataset_shards as shards
from schemas.captions import JOIN_KEY
from schemas.datasets import (I2D_ERROR, I2D_HEIGHT, I2D_KEY, I2D_ORIGINAL_HEIGHT, I2D_ORIGINAL_WIDTH, I2D_STATUS,
                              I2D_SUCCESS, I2D_URL, I2D_WIDTH, SHARD, SHARD_FORMAT, SHARD_KEY, SHARD_META, SHARD_ORDER,
                              SHARD_URL)
from schemas.images import (FETCH_ERROR, FETCH_STATUS, IMAGE_HEIGHT, IMAGE_WIDTH, ORIGINAL_HEIGHT, ORIGINAL_WIDTH,
                            FetchStatus)

STAGE_SHARD_INDEX = "shard_index"

INDEX_SCHEMA = pa.schema([
    pa.field(JOIN_KEY, pa.string()), pa.field(SHARD_URL, pa.string()), pa.field(SHARD, pa.string()), pa.field(SHARD_FORMAT, pa.string()),
    pa.field(SHARD_ORDER, pa.int64()), pa.field(SHARD_KEY, pa.string()),
    pa.field(FETCH_STATUS, pa.string()), pa.field(FETCH_ERROR, pa.string()),
    pa.field(IMAGE_WIDTH, pa.int32()), pa.field(IMAGE_HEIGHT, pa.int32()),
    pa.field(ORIGINAL_WIDTH, pa.int32()), pa.field(ORIGINAL_HEIGHT, pa.int32()),
])
_META_COLUMNS = [I2D_URL, I2D_KEY, I2D_STATUS, I2D_ERROR, I2D_WIDTH, I2D_HEIGHT, I2D_ORIGINAL_WIDTH,
                 I2D_ORIGINAL_HEIGHT]


class ShardIndex:
    """Shard rows in, occurrences of the ``wanted`` values of the join column out (``INDEX_SCHEMA``:
    ``join_key`` the value as text, ``_shard_url`` the URL the metadata holds)."""

    stage_name = STAGE_SHARD_INDEX
    resources = Resources(num_cpus=1, batch_size=1)

    def __init__(self, wanted: list[str], key_column: str | None = None):
        self.wanted = pa.array(sorted(set(wanted)), pa.string())
        self.key_column = key_column or I2D_URL

    def __call__(self, batch: pa.Table) -> pa.Table:
        parts = [INDEX_SCHEMA.empty_table()]
        for row in batch.select([SHARD, SHARD_FORMAT, SHARD_META, SHARD_ORDER]).to_pylist():
            parts.append(self.one(row[SHARD], row[SHARD_FORMAT], row[SHARD_META], row[SHARD_ORDER]))
        return pa.concat_tables(parts)

    def one(self, shard: str, fmt: str, meta: str, order: int) -> pa.Table:
        fs, _ = shards.filesystem(meta)
        try:
            table = shards.read_metadata(fs, fs._strip_protocol(meta), list(dict.fromkeys(
                _META_COLUMNS + [self.key_column])))
        except Exception as exc:  # noqa: BLE001 -- the path and the cause in one line, not a worker traceback
            raise RuntimeError(f"cannot read img2dataset metadata {meta}: {type(exc).__name__}: {exc}") from None
        if I2D_URL not in table.column_names or I2D_KEY not in table.column_names:
            raise RuntimeError(f"{meta} is not img2dataset metadata: it lacks {I2D_URL!r} or {I2D_KEY!r} "
                               f"(columns: {', '.join(table.column_names)})")
        if self.key_column not in table.column_names:
            raise RuntimeError(f"{meta} has no column {self.key_column!r} to join by (--shard-key): img2dataset "
                               f"saves it with --save_additional_columns '[\"{self.key_column}\"]'")
        value = table.column(self.key_column).cast(pa.string())
        keep = pc.fill_null(pc.is_in(value, self.wanted), False)
        table, value = table.filter(keep), value.filter(keep)
        n = table.num_rows
        col = lambda c, t: table.column(c).cast(t) if c in table.column_names else pa.nulls(n, t)  # noqa: E731
        ok = pc.equal(pc.fill_null(col(I2D_STATUS, pa.string()), ""), I2D_SUCCESS)
        error = pc.if_else(ok, pa.scalar(None, pa.string()),
                           pc.binary_join_element_wise(pa.scalar("img2dataset:"),
                                                       pc.fill_null(col(I2D_STATUS, pa.string()), "no status"),
                                                       pc.fill_null(col(I2D_ERROR, pa.string()), ""), " "))
        return pa.table({
            JOIN_KEY: value, SHARD_URL: col(I2D_URL, pa.string()), SHARD: pa.array([shard] * n, pa.string()),
            SHARD_FORMAT: pa.array([fmt] * n, pa.string()), SHARD_ORDER: pa.array([order] * n, pa.int64()),
            SHARD_KEY: col(I2D_KEY, pa.string()),
            FETCH_STATUS: pc.if_else(ok, FetchStatus.OK, FetchStatus.SHARD_FAILED),
            FETCH_ERROR: pc.utf8_trim_whitespace(error),
            IMAGE_WIDTH: col(I2D_WIDTH, pa.int32()), IMAGE_HEIGHT: col(I2D_HEIGHT, pa.int32()),
            ORIGINAL_WIDTH: col(I2D_ORIGINAL_WIDTH, pa.int32()), ORIGINAL_HEIGHT: col(I2D_ORIGINAL_HEIGHT, pa.int32()),
        }, schema=INDEX_SCHEMA)

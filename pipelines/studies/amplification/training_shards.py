"""Training images from img2dataset's output instead of a live fetch (``--training-images``).

Researchers today often hold the images of Re-LAION, COYO or DataComp already downloaded by
img2dataset. ``--training-images DIR_OR_URI`` reads that folder (any of img2dataset's three
output formats, local or on any fsspec store) in two Ray Data passes, both over the shards, never
the whole folder on the driver:

1. **index** (``operators.image_shard_index``): each shard's metadata (URL, key, status; no image
   bytes) filtered to the URLs the run needs, or with ``--shard-key COL`` to the values of that
   column of the selected captions (img2dataset copies it into its metadata with
   ``--save_additional_columns``: DataComp's ``uid``, COYO's ``id``), so a caption finds its
   image even where the stored URL differs (a rewritten or re-hosted link). Per caption URL the
   first stored occurrence in (shard, key) order is chosen, else the first failed one
   (img2dataset's ``failed_to_download`` / ``failed_to_resize``: status ``shard_failed``, its
   error message kept); a URL (or key) in no shard is ``not_in_shards``.
2. **read** (``operators.image_shard_reader``): the chosen samples' image bytes, only from the
   shards that hold one, then the same face filter and CLIP stages as fetched images.

A damaged shard (a ``.tar`` with a broken header in mid-archive, or cut short) is named: the
samples it could not deliver are ``shard_failed`` with "shard PATH is corrupt at byte N: cause",
and the run records each corrupt shard, its cause and its lost samples (``corrupt_shards``:
metrics.json's ``images.training_shards``, and a line on the console).

With ``--fetch-missing`` the URLs the shards lack (``not_in_shards`` and ``shard_failed``) are
fetched live instead, through the ordinary fetch stream. Images come as img2dataset stored them
(its resize and JPEG encoding, not resized again): with img2dataset's defaults of this project's
fetch (``--image_size 512 --resize_mode keep_ratio --resize_only_if_bigger True``, JPEG quality 95)
the bytes, and so T, equal a live fetch's.
"""

from __future__ import annotations

import hashlib
import posixpath
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from operators.image_shard_index import INDEX_SCHEMA, ShardIndex
from operators.support import img2dataset_shards as shard_io
from operators.base import Stage
from pipelines.engine.storage import io
from pipelines.engine.stream import runtime, stages
from schemas import images as I
from schemas.captions import JOIN_KEY, URL
from schemas.datasets import I2D_FORMATS, I2D_IMAGE_EXTENSIONS, SHARD, SHARD_FORMAT, SHARD_KEY, SHARD_META, SHARD_ORDER


@dataclass(frozen=True)
class ShardSource:
    """An img2dataset output folder: its format and shards (each with its metadata file)."""

    uri: str
    format: str
    shards: tuple[str, ...]     # URIs of the .tar files, parquet files or sample folders
    metas: tuple[str, ...]      # URIs of their metadata parquet files
    listing: str                # SHA-256 of the shards' names and sizes (the run's fingerprint holds it)
    key: str | None = None      # --shard-key: the column joined on (None: the URL)

    def record(self) -> dict:
        return {"uri": self.uri, "format": self.format, "shards": len(self.shards), "listing_sha256": self.listing,
                "joined_by": self.key or "url"}

    def table(self) -> pa.Table:
        n = len(self.shards)
        return pa.table({SHARD: pa.array(self.shards, pa.string()), SHARD_FORMAT: pa.array([self.format] * n),
                         SHARD_META: pa.array(self.metas, pa.string()),
                         SHARD_ORDER: pa.array(np.arange(n), pa.int64())})


def discover(uri: str, key: str | None = None) -> ShardSource:
    """The img2dataset output under ``uri``: webdataset (``*.tar``), parquet shards with an image
    column, or sample folders (``NNNNN/``); each shard's ``NNNNN.parquet`` metadata is required
    (img2dataset always writes it), and with ``key`` (``--shard-key``) the first one must hold that
    column. A one-line InputError for anything else."""
    try:
        fs, root = io.url_to_fs(uri)
        if not fs.isdir(root):
            raise io.InputError(f"--training-images {uri}: not a folder (give img2dataset's --output_folder)")
        entries = fs.ls(root, detail=True)
    except io.InputError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise io.InputError(io.listing_error(uri, exc)) from None
    proto = io.fs_protocol(fs)
    full = lambda p: io.display_path(proto, p)   # noqa: E731
    names = {posixpath.basename(e["name"].rstrip("/")): e for e in entries}
    stem_meta = {n[:-8]: e["name"] for n, e in names.items() if n.endswith(".parquet") and not n.startswith((".", "_"))}
    tars = sorted(e["name"] for n, e in names.items() if n.endswith(".tar"))
    dirs = sorted(e["name"] for n, e in names.items() if e["type"] == "directory" and n in stem_meta)
    if tars:
        fmt, shards = "webdataset", tars
        metas = [stem_meta.get(posixpath.basename(t)[:-4]) for t in tars]
    elif dirs:
        fmt, shards = "files", dirs
        metas = [stem_meta[posixpath.basename(d.rstrip("/"))] for d in dirs]
    elif stem_meta:
        fmt, shards = "parquet", sorted(stem_meta.values())
        with fs.open(shards[0], "rb") as fh:
            if shard_io.image_column(pq.ParquetFile(fh).schema_arrow) is None:
                raise io.InputError(f"--training-images {uri}: the parquet files hold no image column "
                                    f"({', '.join(I2D_IMAGE_EXTENSIONS)}) "
                                    f"and there are no .tar shards or sample folders: is it img2dataset's output?")
        metas = list(shards)
    else:
        raise io.InputError(f"--training-images {uri}: no img2dataset output (expected .tar shards, parquet shards with an "
                            f"image column, or numbered sample folders, each with its NNNNN.parquet metadata)")
    lacking = [posixpath.basename(s) for s, m in zip(shards, metas) if m is None]
    if lacking:
        raise io.InputError(f"--training-images {uri}: {len(lacking)} shard(s) without img2dataset's metadata file "
                            f"(e.g. {lacking[0]}: NNNNN.parquet beside NNNNN.tar); the metadata says which URL each "
                            f"sample holds")
    listing = hashlib.sha256("\n".join(f"{posixpath.basename(s.rstrip('/'))}:{names[posixpath.basename(s.rstrip('/'))].get('size')}"
                                       for s in shards).encode()).hexdigest()
    assert fmt in I2D_FORMATS
    if key:
        with fs.open(metas[0], "rb") as fh:
            names = pq.ParquetFile(fh).schema_arrow.names
        if key not in names:
            raise io.InputError(f"--shard-key {key}: img2dataset's metadata ({posixpath.basename(metas[0])}) has no "
                                f"column {key!r} (columns: {', '.join(names)}); img2dataset saves it with "
                                f"--save_additional_columns '[\"{key}\"]', or join by URL (leave --shard-key out)")
    return ShardSource(uri, fmt, tuple(full(s) for s in shards), tuple(full(m) for m in metas), listing, key)


def wanted_pairs(rows: pa.Table, urls: pa.Array, key: str | None) -> pa.Table:
    """The distinct (URL, join_key) pairs of the selected caption ``rows`` whose URL is in ``urls``:
    join_key is the row's --shard-key value (``key``), or the URL itself when joined by URL. Rows
    without a value are left out (their URL is then not_in_shards)."""
    rows = rows.filter(pc.is_in(rows.column(URL), urls))
    value = rows.column(JOIN_KEY) if key else rows.column(URL)
    pairs = pa.table({URL: rows.column(URL).cast(pa.string()), JOIN_KEY: value.cast(pa.string())})
    pairs = pairs.filter(pc.and_(pc.is_valid(pairs.column(URL)), pc.is_valid(pairs.column(JOIN_KEY))))
    return pairs.group_by([URL, JOIN_KEY], use_threads=False).aggregate([])


def index(ray, source: ShardSource, pairs: pa.Table) -> pa.Table:
    """One row per wanted caption URL found in the shards (``pairs``: ``wanted_pairs``): the chosen
    occurrence (``INDEX_SCHEMA`` plus ``url``)."""
    ds = runtime.from_table(ray, source.table(), 1)
    ds = stages.run(ds, [Stage(ShardIndex, {"wanted": pc.unique(pairs.column(JOIN_KEY)).to_pylist(),
                                            "key_column": source.key})])
    parts = [t for t in ray.get(ds.to_arrow_refs()) if t.num_rows]
    return choose(pa.concat_tables([INDEX_SCHEMA.empty_table()] + [t.select(INDEX_SCHEMA.names).cast(INDEX_SCHEMA)
                                                                  for t in parts]), pairs)


def choose(found: pa.Table, pairs: pa.Table) -> pa.Table:
    """The occurrences ``ShardIndex`` found (``INDEX_SCHEMA``) given their captions' URLs through
    ``pairs`` (URL, join_key), then one per URL: the first stored one in (shard, key) order, else
    the first failed one."""
    found = found.join(pairs, keys=JOIN_KEY, join_type="inner", use_threads=False)
    ok_first = pc.not_equal(found.column(I.FETCH_STATUS), I.FetchStatus.OK)   # False (stored) sorts first
    found = found.append_column("_failed", ok_first).sort_by(
        [(URL, "ascending"), ("_failed", "ascending"), (SHARD_ORDER, "ascending"), (SHARD_KEY, "ascending")])
    first = np.ones(found.num_rows, bool)
    if found.num_rows > 1:
        u = found.column(URL).to_numpy(zero_copy_only=False)
        first[1:] = u[1:] != u[:-1]
    return found.filter(pa.array(first)).drop_columns(["_failed"])


def absent_rows(urls: pa.Array, found: pa.Table, key: str | None = None) -> pa.Table:
    """``not_in_shards`` results for the ``urls`` no shard holds (URL, status, error)."""
    missing = urls.filter(pc.invert(pc.is_in(urls, found.column(URL))))
    n = len(missing)
    why = f"its {key} in no shard's metadata (or no {key} in the caption row)" if key else "in no shard's metadata"
    return pa.table({URL: missing, I.FETCH_STATUS: pa.array([I.FetchStatus.NOT_IN_SHARDS] * n, pa.string()),
                     I.FETCH_ERROR: pa.array([why] * n, pa.string())})


def corrupt_shards(results: pa.Table) -> list[dict]:
    """The corrupt shards named in the status details of ``results`` (rows with ``fetch_status``
    and ``fetch_error``: the training URLs' results): one record per shard, in path order, with
    the byte where it breaks, the cause and how many samples it could not deliver."""
    failed = results.filter(pc.equal(results.column(I.FETCH_STATUS), I.FetchStatus.SHARD_FAILED))
    found: dict[str, dict] = {}
    for detail in failed.column(I.FETCH_ERROR).to_pylist():
        parsed = shard_io.parse_corrupt_detail(detail)
        if parsed is None:
            continue
        shard, corrupt = parsed
        rec = found.setdefault(shard, {"shard": shard, "at_byte": corrupt.at_byte, "cause": corrupt.cause,
                                       "samples_lost": 0})
        rec["samples_lost"] += 1
    return [found[k] for k in sorted(found)]


def shard_statistics(source: ShardSource, results: pa.Table) -> dict:
    """What the run read from the shards (metrics.json's ``images.training_shards``): shards
    listed, corrupt shards (``corrupt_shards``) and the samples they lost."""
    corrupt = corrupt_shards(results)
    return {"shards": len(source.shards), "corrupt": len(corrupt),
            "samples_lost_to_corrupt_shards": sum(c["samples_lost"] for c in corrupt), "corrupt_shards": corrupt}


def corrupt_note(corrupt: list[dict]) -> str | None:
    """One console line naming the corrupt shards (None when there are none)."""
    if not corrupt:
        return None
    named = "; ".join(f"{c['shard']} at byte {c['at_byte']:,}: {c['cause']}" for c in corrupt[:3])
    more = f"; and {len(corrupt) - 3} more (metrics.json: images.training_shards)" if len(corrupt) > 3 else ""
    lost = sum(c["samples_lost"] for c in corrupt)
    return (f"  {len(corrupt)} corrupt img2dataset shard(s), {lost:,} sample(s) they could not deliver counted "
            f"shard_failed: {named}{more}")

"""The inputs of the alignment study (paper 000, App. D): the captions it generates from and the reference images FID compares with, read from files, folders or the bundled sample, and paired with their captions."""

from __future__ import annotations

import functools
import glob as _glob
import posixpath
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from operators.support.seeds import image_seeds
from pipelines.engine.storage import io
from pipelines.engine.cli import config as study_config
from pipelines.engine.storage.io import InputError
from schemas import alignment as A
from schemas.images import IMAGE_ID
from schemas.images import ENCODED, IMAGE, IMAGE_ENCODING, IMAGE_HEIGHT, IMAGE_INDEX, IMAGE_WIDTH, SEED
from schemas.subsets import PROMPT
from pipelines.engine.storage.datasets import ColumnError, choose_columns


SAMPLE_CAPTIONS = "dalleval_sample_captions.txt"
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff")


# ------------------------------------------------------------------------------------ inputs
def read_captions(cap: dict) -> tuple[pa.Table, dict]:
    """(caption_id, prompt) of the configured captions, and the counts: read, null or blank
    dropped, kept after one-per-group and the sample."""
    path = cap.get("input")
    if path is None:
        path = study_config.default_config_path(SAMPLE_CAPTIONS)
    path = str(path)
    group = None
    try:
        if path.endswith(".txt"):
            texts = io.read_text(path).splitlines()
            ids = [str(i) for i in range(len(texts))]
        else:
            if path.endswith(".csv"):
                frame = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[""])
            else:
                frame = io.read_parquet(path).to_pandas()   # page checksums verified where present
            col = cap.get("column")
            if not col:   # recognised from the columns (pipelines/engine/storage/datasets.py)

                try:
                    choice = choose_columns([(path, [str(c) for c in frame.columns])], None, None,
                                            cap.get("dataset_name"), url=False, paths=[path])
                except ColumnError as exc:
                    raise InputError(f"captions {path}: {exc}; set captions.column / --caption-column") from None
                col = choice.caption
                print(f"  captions: {choice.line()}")
            if col not in frame.columns:
                raise InputError(f"captions {path}: no column {col!r} (columns: {list(frame.columns)}); "
                                 f"set captions.column / --caption-column")
            texts = frame[col].tolist()
            idc = cap.get("id_column")
            if idc and idc not in frame.columns:
                raise InputError(f"captions {path}: no id column {idc!r}")
            ids = [str(v) for v in (frame[idc] if idc else range(len(frame)))]
            gc = cap.get("group_column")
            if gc:
                if gc not in frame.columns:
                    raise InputError(f"captions {path}: no group column {gc!r}")
                group = [str(v) for v in frame[gc]]
    except (OSError, ValueError) as exc:
        if isinstance(exc, InputError):
            raise
        raise InputError(f"cannot read captions {path}: {type(exc).__name__}: {exc}") from exc
    read = len(texts)
    ok = [i for i, t in enumerate(texts) if isinstance(t, str) and t.strip()]
    counts = {"read": read, "null_or_blank": read - len(ok)}
    rng = np.random.default_rng(int(cap.get("seed") or 0))
    if group is not None:  # one caption per group (COCO: five per image), drawn
        by: dict[str, list[int]] = {}
        for i in ok:
            by.setdefault(group[i], []).append(i)
        ok = sorted(v[int(rng.integers(len(v)))] for v in by.values())
        counts["one_per_group"] = len(ok)
    n = cap.get("sample")
    if n is not None and len(ok) > int(n):
        ok = sorted(rng.choice(ok, size=int(n), replace=False).tolist())
    counts["kept"] = len(ok)
    if not ok:
        raise InputError(f"captions {path}: no usable caption")
    table = pa.table({A.CAPTION_ID: pa.array([ids[i] for i in ok], pa.string()),
                      PROMPT: pa.array([" ".join(texts[i].split()) for i in ok], pa.string()),
                      A.CAPTION_GROUP: pa.array([group[i] for i in ok] if group is not None else [None] * len(ok),
                                                pa.string())})
    return table, counts


def requests_of(captions: pa.Table, seed: int) -> pa.Table:
    """One image per caption (ALIGNMENT_REQUESTS); its seed from (base seed, caption, row)."""
    n = captions.num_rows
    index = list(range(n))
    return pa.Table.from_pydict({
        IMAGE_ID: [f"caption-{k:06d}" for k in index], A.CAPTION_ID: captions.column(A.CAPTION_ID),
        PROMPT: captions.column(PROMPT), IMAGE_INDEX: [0] * n,
        SEED: image_seeds(seed, captions.column(PROMPT).to_pylist(), index).tolist()}, schema=A.ALIGNMENT_REQUESTS)


def reference_kind(ref: dict) -> str:
    """"statistics", "bundled", "parquet" or "files", without listing the files."""
    if ref.get("statistics"):
        return "statistics"
    spec = ref.get("images")
    if spec is None:
        return "bundled"
    spec = str(spec)
    return "parquet" if spec.endswith(".parquet") or (Path(spec).is_dir() and any(Path(spec).glob("*.parquet"))) \
        else "files"


def reference_sources(ref: dict) -> tuple[str, list[str] | None]:
    """("files", paths) for a directory or glob of images, ("parquet", [path]), ("statistics",
    [npz]) for precomputed FID statistics, or ("bundled", None)."""
    kind = reference_kind(ref)
    if kind == "statistics":
        path = str(ref["statistics"])
        if not io.exists(*io.output_fs(path)):
            raise InputError(f"reference statistics {path}: no such file")
        return "statistics", [path]
    if kind == "bundled":
        return "bundled", None
    spec = str(ref["images"])
    if kind == "parquet":
        return "parquet", [spec]
    pattern = str(Path(spec) / "**" / "*") if Path(spec).is_dir() else spec
    paths = sorted(p for p in _glob.glob(pattern, recursive=True) if p.lower().endswith(IMAGE_SUFFIXES))
    if not paths:
        raise InputError(f"reference images {spec}: no image file ({', '.join(IMAGE_SUFFIXES)}) found")
    if ref.get("max_images") and ref.get("pairing", "all") != "captions":   # pairing: truncated after the match
        paths = paths[:int(ref["max_images"])]
    return "files", paths


@functools.cache
def bundled_reference() -> pa.Table:
    """scikit-image's bundled colour photos as encoded PNGs (the smoke run's stand-in reference).
    Encoded once per process (about 0.6 CPU-s): the table is immutable and always the same, so a
    driver that runs several alignment runs (the test suite, a notebook) shares it."""
    import io as _io

    from PIL import Image
    from skimage import data

    names = ("astronaut", "coffee", "chelsea", "rocket", "retina", "immunohistochemistry", "camera", "cat")
    blobs, ids = [], []
    for name in names:
        img = np.asarray(getattr(data, name)())
        if img.ndim == 2:
            img = np.stack([img] * 3, axis=-1)
        buf = _io.BytesIO()
        Image.fromarray(img[..., :3].astype(np.uint8)).save(buf, format="PNG")
        blobs.append(buf.getvalue())
        ids.append(f"skimage:{name}")
    return _payload(ids, blobs)


def _payload(ids: list[str], blobs: list) -> pa.Table:
    n = len(ids)
    return pa.table({A.REFERENCE_ID: pa.array(ids, pa.string()), IMAGE: pa.array(blobs, pa.binary()),
                     IMAGE_ENCODING: pa.array([ENCODED] * n, pa.string()),
                     IMAGE_HEIGHT: pa.nulls(n, pa.int32()), IMAGE_WIDTH: pa.nulls(n, pa.int32())})


def read_files(batch: pa.Table) -> pa.Table:
    """Ray Data map: the bytes of each path of REFERENCE_ID (an unreadable file: null bytes)."""
    import fsspec

    blobs = []
    for path in batch.column(A.REFERENCE_ID).to_pylist():
        try:
            with fsspec.open(path, "rb") as fh:
                blobs.append(fh.read())
        except OSError:
            blobs.append(None)
    return _payload(batch.column(A.REFERENCE_ID).to_pylist(), blobs)


def image_key(value) -> str:
    """The key that pairs a reference image with a drawn caption's image id: the trailing digits of
    a file name's stem as an integer (COCO_val2014_000000391895.jpg -> "391895"), else the stem."""
    stem = posixpath.splitext(posixpath.basename(str(value)))[0]
    m = re.search(r"(\d+)$", stem)
    return str(int(m.group(1))) if m else stem


def effective_pairing(ref: dict) -> str:
    """The reference pairing that applies: "n/a" for the bundled stand-in photos and for
    precomputed statistics (no images to pair), else the configured one."""
    kind = reference_kind(ref)
    return "n/a" if kind in ("bundled", "statistics") else ref.get("pairing", "all")


def reference_captions(ref: dict, caption_groups: dict | None) -> dict[str, str] | None:
    """image key -> drawn caption, for pairing "captions" (None otherwise); ``caption_groups``:
    image id -> the drawn caption."""
    if effective_pairing(ref) != "captions":
        return None
    groups = caption_groups or {}
    if not groups:
        raise InputError("reference.pairing: captions (App. D.2: the drawn captions' own images, the preset's "
                         "default) needs the captions' image ids: --caption-group-column (e.g. COCO's image_id); "
                         "--reference-pairing all compares with every given reference image instead")
    if reference_kind(ref) == "parquet" and not ref.get("id_column"):
        raise InputError("reference.pairing: captions with a parquet reference needs reference.id_column (the image "
                         "id the captions' group column names); --reference-pairing all uses every image instead")
    return {image_key(g): text for g, text in groups.items()}


def paired_paths(paths: list[str], captions: dict[str, str], max_images=None) -> list[str]:
    """The reference files of the drawn captions' images: one per image id (the first in path
    order, when a folder holds the same id twice, e.g. COCO's train2014 and val2014 copies), then
    at most ``max_images`` of them."""
    first: dict[str, str] = {}
    for p in sorted(paths):
        if image_key(p) in captions:
            first.setdefault(image_key(p), p)
    out = sorted(first.values())
    return out[:int(max_images)] if max_images else out


def _attach(b: pa.Table, captions: dict | None, caption_col: str | None) -> pa.Table:
    """The payload with PROMPT: the drawn caption of its image id (pairing "captions"; images of
    no drawn caption are left out here and counted by the caller), or the parquet caption column."""
    if captions is not None:   # the drawn caption (the one R-precision pairs with) wins over a caption column
        keys = [image_key(v) for v in b.column(A.REFERENCE_ID).to_pylist()]
        texts = [captions.get(k) for k in keys]
        if PROMPT in b.column_names:
            b = b.drop_columns([PROMPT])
        b = b.append_column(PROMPT, pa.array(texts, pa.string()))
        return b.filter(pc.is_valid(b.column(PROMPT)))
    if caption_col:
        return b
    return b.append_column(PROMPT, pa.nulls(b.num_rows, pa.string()))


def _read_parquet(fs, path: str) -> pa.Table:
    with fs.open_input_file(path) as fh:
        return io.read_parquet(fh)

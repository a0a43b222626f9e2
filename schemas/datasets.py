"""The column layouts of the image-text datasets people audit today.

This module is the only place their column names are spelled out. A caption file is recognised
by the columns it has (``pipelines/engine/storage/datasets.py``): a layout matches when every one of its
``signature`` columns is present, exactly as spelled here (LAION's upper-case ``TEXT`` / ``URL``
against Re-LAION's ``caption`` / ``url``); the path names the variant where columns cannot
(``relaion2B-en-research`` against ``relaion2B-en-research-safe``, LAION-2B-en against
LAION-400M). ``extras`` are the other columns of use that a run records (and that
``--keep-columns`` may carry): ids, sizes, similarity and safety scores.

Sources of the lists are in ``docs/method.md`` ("Training data: dataset layouts").
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DatasetLayout:
    key: str                        # --dataset-name value
    title: str                      # as the dataset's card names it
    caption: str                    # the caption column
    url: str                        # the image URL column
    signature: tuple[str, ...]      # columns whose presence identifies the layout
    extras: tuple[str, ...] = ()    # other columns of use
    variants: tuple[tuple[str, str], ...] = ()   # (substring of the path, variant title), most specific first; "_" and "-" alike
    id_column: str | None = None    # the dataset's own row id, where it has one
    note: str = ""                  # what a reader of the record should know


LAION = DatasetLayout(
    key="laion", title="LAION-5B / LAION-2B-en / LAION-400M", caption="TEXT", url="URL",
    signature=("URL", "TEXT"),
    extras=("SAMPLE_ID", "WIDTH", "HEIGHT", "LICENSE", "NSFW", "similarity", "hash", "punsafe", "pwatermark"),
    variants=(("laion2b-en-joined", "LAION-2B-en-joined"), ("laion2b-en", "LAION-2B-en"), ("laion400m", "LAION-400M"),
              ("laion2b-multi", "LAION-2B-multi"), ("laion1b-nolang", "LAION-1B-nolang")),
    id_column="SAMPLE_ID",
    note="withdrawn by LAION in December 2023; Re-LAION-5B is its successor")

RELAION = DatasetLayout(
    key="relaion", title="Re-LAION-5B", caption="caption", url="url", signature=("url", "caption"),
    extras=("key", "similarity", "hash", "pwatermark", "punsafe", "status", "error_message", "width", "height",
            "original_width", "original_height", "exif", "md5"),
    variants=(("relaion2b-en-research-safe", "Re-LAION-2B-en research-safe"),
              ("relaion2b-en-research", "Re-LAION-2B-en research"),
              ("relaion2b-multi-research-safe", "Re-LAION-2B-multi research-safe"),
              ("relaion2b-multi-research", "Re-LAION-2B-multi research"),
              ("relaion1b-nolang-research-safe", "Re-LAION-1B-nolang research-safe"),
              ("relaion1b-nolang-research", "Re-LAION-1B-nolang research")),
    note="both: 2,236 links matched to IWF/C3P/Stanford CSAM hash lists and 399 privacy links removed; research: "
         "also p_unsafe > 0.95 flagged by keyword filters (1.1%); research-safe: also p_unsafe > 0.45 (3.0%)")

COYO = DatasetLayout(
    key="coyo", title="COYO-700M", caption="text", url="url", signature=("id", "url", "text"),
    extras=("width", "height", "image_phash", "text_length", "word_count", "num_tokens_bert", "num_tokens_gpt",
            "num_faces", "clip_similarity_vitb32", "clip_similarity_vitl14", "nsfw_score_opennsfw2",
            "nsfw_score_gantman", "watermark_score", "aesthetic_score_laion_v2"),
    variants=(("coyo-700m", "COYO-700M"), ("coyo700m", "COYO-700M"), ("coyo-labeled-300m", "COYO-Labeled-300M")),
    id_column="id")

DATACOMP = DatasetLayout(
    key="datacomp", title="DataComp CommonPool", caption="text", url="url", signature=("uid", "url", "text"),
    extras=("original_width", "original_height", "clip_b32_similarity_score", "clip_l14_similarity_score",
            "face_bboxes", "sha256"),
    variants=(("datacomp-1b", "DataComp-1B"), ("datacomp-xlarge", "DataComp CommonPool xlarge"),
              ("datacomp-large", "DataComp CommonPool large"), ("datacomp-medium", "DataComp CommonPool medium"),
              ("datacomp-small", "DataComp CommonPool small"), ("commonpool", "DataComp CommonPool")),
    id_column="uid",
    note="DataComp's downloader blurs the faces of face_bboxes: feed unblurred images to the face filter and CLIP")

LAYOUTS: tuple[DatasetLayout, ...] = (LAION, RELAION, COYO, DATACOMP)
BY_KEY = {layout.key: layout for layout in LAYOUTS}

# Column names that hold a caption or an image URL in some dataset (matched case-insensitively
# when no layout matches): two of them in one file make the choice ambiguous.
CAPTION_NAMES = ("TEXT", "caption", "text", "alt", "alt_text", "sentence")
URL_NAMES = ("URL", "url", "image_url", "img_url")

# --- img2dataset's output (--training-images) ----------------------------------------------------
# Each shard of an img2dataset output folder has a metadata table ``<shard>.parquet`` (every input
# row: its URL, key, status and sizes), written beside the shard in the webdataset and files
# formats and as the shard itself (plus the image column) in the parquet format.
I2D_URL = "url"
I2D_KEY = "key"
I2D_STATUS = "status"                 # "success", "failed_to_download", "failed_to_resize"
I2D_ERROR = "error_message"
I2D_WIDTH = "width"                   # the stored (resized) image
I2D_HEIGHT = "height"
I2D_ORIGINAL_WIDTH = "original_width"
I2D_ORIGINAL_HEIGHT = "original_height"
I2D_SUCCESS = "success"
I2D_IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")   # the image column (parquet) or member suffix
I2D_FORMATS = ("webdataset", "parquet", "files")

# transient columns of the shard stages
SHARD = "_shard"                      # the shard's path (a .tar, a .parquet or a folder)
SHARD_FORMAT = "_shard_format"
SHARD_KEYS = "_shard_keys"            # list<string>: the keys to read from the shard
SHARD_META = "_shard_meta"            # the shard's metadata parquet (null: none)
SHARD_ORDER = "_shard_order"          # int64: the shard's position in the sorted listing
SHARD_KEY = "_shard_key"              # img2dataset's key of one sample in its shard
SHARD_URL = "_shard_url"              # the URL img2dataset's metadata holds for the sample (the caption's
                                      # own URL when joined by URL; maybe another with --shard-key)

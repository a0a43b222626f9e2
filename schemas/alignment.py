"""Column names and schemas of DALL-Eval's image-text alignment and image quality part (paper 000,
App. D: CLIP R-precision, FID; CLIPScore as the widely used modern alternative).

One row per generated image (``ALIGNMENT_IMAGES``): the caption it was generated from, its seed
and generation status, and, computed on the generator's device while the image is there, the CLIP
image and caption embeddings (L2-normalised) with their cosine, and the FID feature vector of the
image (Inception v3 pool3, 2048-d, or the configured extractor's). Reference images for FID get
one row each (``REFERENCE_FEATURES``). The measures (R-precision, CLIPScore, FID) are computed on
the driver from these stored vectors, so a new negative sample or reference set needs no new images.
"""

from __future__ import annotations

import pyarrow as pa

from schemas.fields import typed
from schemas.images import IMAGE_ID, generated_images, prompt_index_seed
from schemas.subsets import PROMPT

# reference.pairing (App. D.2): which reference images FID compares with. captions: the drawn captions'
# own images, found by image id (the paper's words); all: every given reference image. The default is
# configs/dalleval_alignment.yaml's, which the settings fall back to and the --reference-pairing help names.
REFERENCE_PAIRINGS = ("captions", "all")
DEFAULT_REFERENCE_PAIRING = "captions"

CAPTION_ID = "caption_id"              # the user's id of the caption (or its row number in the input)
CLIP_IMAGE_EMBEDDING = "clip_image_embedding"  # list<float32>, unit L2 norm
CLIP_TEXT_EMBEDDING = "clip_text_embedding"    # list<float32>, unit L2 norm, of the prompt (the caption)
CLIP_COSINE = "clip_cosine"            # float32: cosine of the two
# float32: the L2 norms of the two embeddings before normalising (unit vector x norm = CLIP's raw
# feature), for the released DALL-Eval code's R-precision, which ranks raw dot products
CLIP_IMAGE_NORM = "clip_image_norm"
CLIP_TEXT_NORM = "clip_text_norm"
FID_FEATURES = "fid_features"          # list<float32>: the FID extractor's feature vector of the image
REFERENCE_ID = "reference_id"          # the reference image's path (or id column)
CAPTION_GROUP = "caption_group"        # the drawn caption's group (captions.group_column, e.g. COCO's image_id)
REFERENCE_STATUS = "reference_status"  # "ok" / "decode_error"


class ReferenceStatus:
    OK = "ok"
    DECODE_ERROR = "decode_error"
    ALL = (OK, DECODE_ERROR)


ALIGNMENT_REQUESTS = pa.schema([*typed(pa.string(), IMAGE_ID, CAPTION_ID), *prompt_index_seed()])

CLIP_ALIGNMENT_COLUMNS = pa.schema([
    *typed(pa.list_(pa.float32()), CLIP_IMAGE_EMBEDDING, CLIP_TEXT_EMBEDDING),
    *typed(pa.float32(), CLIP_COSINE, CLIP_IMAGE_NORM, CLIP_TEXT_NORM),
])

FID_COLUMNS = pa.schema([pa.field(FID_FEATURES, pa.list_(pa.float32()))])

ALIGNMENT_IMAGES = generated_images(ALIGNMENT_REQUESTS, *CLIP_ALIGNMENT_COLUMNS, *FID_COLUMNS)

REFERENCE_FEATURES = pa.schema([
    *typed(pa.string(), REFERENCE_ID, REFERENCE_STATUS),
    *FID_COLUMNS,
    # with captions for the reference images (pairing "captions", or a parquet caption column): the
    # caption and the CLIP columns, for Table 19's real-image R-precision row; null otherwise
    pa.field(PROMPT, pa.string()),
    *CLIP_ALIGNMENT_COLUMNS,
])

"""Column names and pyarrow schemas of the image side (paper 002, sections 2.2, 3, 6).

Training images (fetched from LAION URLs) and generated images (Stable Diffusion) flow through
the same operators: fetch or generate -> face filter -> CLIP gender. No operator drops a row:
each writes a status column, and a row's image counts towards a percentage only when every
status on its way is ok (``counted``). A null status means the row never reached that stage
(for example no face filter on an image that could not be fetched).
"""

from __future__ import annotations

import pyarrow as pa

from schemas.captions import CAPTION, CAPTION_GENDER, CAPTION_ID, OCCUPATION, URL
from schemas.subsets import PROMPT, PROMPT_ID, SUBSET

# --- where an image came from --------------------------------------------------------------------
SOURCE = "source"


class Source:
    TRAINING = "training"            # LAION image of a caption in a training subset (T)
    GENERATED = "generated"          # generated from a Table 1 prompt (G)
    CAPTION_PROMPT = "caption_prompt"  # generated from a training caption used as the prompt (section 6)
    PARAPHRASE_PROMPT = "paraphrase_prompt"  # generated from an LLM paraphrase of such a caption (App. A.6)
    ALL = (TRAINING, GENERATED, CAPTION_PROMPT, PARAPHRASE_PROMPT)


MODEL = "model"              # generator model id / directory (null for training images)
IMAGE_ID = "image_id"  # the stable id of one generated image (each study builds it: GEP from setting, gender, attribute, context, index; Exposed "<unit id>-<variant>")
SEED = "seed"                # int64 seed of the generator's initial noise: regenerates the image exactly
IMAGE_INDEX = "image_index"  # 0-based index of the image among those of its prompt
SAFETY_CHECKER = "safety_checker"  # the run's safety policy for this image: check-all, model-default or off

# --- image payload (transient: never written to the per-image table) ------------------------------
IMAGE = "image"                    # binary: encoded image (jpeg/png/webp) or raw RGB8 pixels
IMAGE_ENCODING = "image_encoding"  # "encoded" (any format PIL/OpenCV reads) or "rgb8" (raw, row-major HWC)
IMAGE_HEIGHT = "image_height"      # int32 pixels of the payload (required for rgb8)
IMAGE_WIDTH = "image_width"
ENCODED = "encoded"
RGB8 = "rgb8"

# --- fetch (img2dataset) ------------------------------------------------------------------------------
FETCH_STATUS = "fetch_status"
FETCH_ERROR = "fetch_error"        # human-readable detail for non-ok statuses
HTTP_STATUS = "http_status"        # int32 HTTP status code when a response arrived
ORIGINAL_HEIGHT = "original_height"
ORIGINAL_WIDTH = "original_width"
IMAGE_ORIGIN = "image_origin"      # training images: "fetched" (live) or "shards" (--training-images); null: none


class ImageOrigin:
    FETCHED = "fetched"
    SHARDS = "shards"


class FetchStatus:
    OK = "ok"
    HTTP_ERROR = "http_error"          # 4xx / 5xx
    TIMEOUT = "timeout"
    NOT_IMAGE = "not_image"            # bytes arrived but do not decode as an image
    TOO_LARGE = "too_large"            # over the byte limit or the pixel-area limit
    REFUSED = "refused"                # resolves to a loopback/private/link-local/metadata address
    NETWORK_ERROR = "network_error"    # DNS failure, connection refused/reset, TLS error
    INVALID_URL = "invalid_url"        # null, not http(s), no host
    DISALLOWED = "disallowed"          # the site opted out (X-Robots-Tag noai/noimageai/...), as img2dataset honours
    # --training-images (img2dataset's shards instead of a live fetch)
    NOT_IN_SHARDS = "not_in_shards"    # the URL is in no shard's metadata
    SHARD_FAILED = "shard_failed"      # img2dataset recorded a failed download or resize (its error kept)
    ALL = (OK, HTTP_ERROR, TIMEOUT, NOT_IMAGE, TOO_LARGE, REFUSED, NETWORK_ERROR, INVALID_URL, DISALLOWED,
           NOT_IN_SHARDS, SHARD_FAILED)
    SHARDS = (NOT_IN_SHARDS, SHARD_FAILED)
    # what the download error budget counts (an opt-out is the site's choice, not a failure)
    FAILURES = (HTTP_ERROR, TIMEOUT, NOT_IMAGE, TOO_LARGE, REFUSED, NETWORK_ERROR, INVALID_URL)


# --- generation ---------------------------------------------------------------------------------------
GENERATION_STATUS = "generation_status"
GENERATION_DETAIL = "generation_detail"  # human-readable detail for non-ok statuses (the error message)
# bool: the run's safety check flagged the image (policy check-all: the NSFW check head, the same on
# every model's images; model-default: the model's own checker, which blanked it); null: no check ran
NSFW = "nsfw"


class GenerationStatus:
    OK = "ok"
    NSFW_BLOCKED = "nsfw_blocked"      # blanked by the safety checker: no usable image
    INVALID_PROMPT = "invalid_prompt"  # null or blank prompt: nothing generated
    ERROR = "generation_error"         # generation failed (out of memory even alone): nothing generated
    INVALID_IMAGE = "invalid_image"    # NaN/inf values or all black (a float16 overflow): no usable image
    # flagged by the run's NSFW check with generation.nsfw_check.exclude on: kept as generated, not measured
    NSFW_EXCLUDED = "nsfw_excluded"
    ALL = (OK, NSFW_BLOCKED, INVALID_PROMPT, ERROR, INVALID_IMAGE, NSFW_EXCLUDED)
    NOT_STORED = (INVALID_IMAGE, NSFW_EXCLUDED)       # generated, but no payload: the seed regenerates it
    FAILURES = (INVALID_PROMPT, ERROR, INVALID_IMAGE)  # counted by the error budget (a blocked image is a measurement)


# --- face filter (section 2.2) ------------------------------------------------------------------------
FACE_STATUS = "face_status"
FACE_COUNT = "face_count"          # int32 detections at or above the confidence threshold
FACE_SCORE = "face_score"          # float32 confidence of the best detection
FACE_BOX_WIDTH = "face_box_width"  # float32 relative width of the best detection's box
FACE_BOX_HEIGHT = "face_box_height"


class FaceStatus:
    OK = "ok"                  # exactly one face, relative box height and width >= 0.1
    NO_FACE = "no_face"
    MANY_FACES = "many_faces"
    SMALL_FACE = "small_face"
    DECODE_ERROR = "decode_error"
    ALL = (OK, NO_FACE, MANY_FACES, SMALL_FACE, DECODE_ERROR)


# --- CLIP zero-shot gender (section 2.2, App. A.4) -------------------------------------------------
GENDER = "gender"                  # perceived gender: male / female / ambiguous (p < threshold) / decode_error
P_MALE = "p_male"                  # float32 softmax probability of "A photo of a man"
P_FEMALE = "p_female"              # float32 softmax probability of "A photo of a woman"
# the CLIP image embedding (L2-normalised, float16) of an image the gender classifier ran on: kept in
# the image checkpoints for section 5.2's training-generated image similarity, not in images.parquet
CLIP_EMBEDDING = "clip_embedding"


class Gender:
    MALE = "male"
    FEMALE = "female"
    AMBIGUOUS = "ambiguous"
    DECODE_ERROR = "decode_error"
    ALL = (MALE, FEMALE, AMBIGUOUS, DECODE_ERROR)
    DECIDED = (MALE, FEMALE)


COUNTED = "counted"                # bool: the image enters % female (all statuses ok, gender decided)

# --- the per-image table of a run ---------------------------------------------------------------------
IMAGE_RESULTS = pa.schema(
    [
        pa.field(SOURCE, pa.string(), nullable=False),
        pa.field(OCCUPATION, pa.string(), nullable=False),
        pa.field(SUBSET, pa.string()),           # training images: the training subset
        pa.field(PROMPT_ID, pa.int32()),         # generated: Table 1 prompt; training NN subsets: its prompt
        pa.field(PROMPT, pa.string()),           # the text the generator was given (or the NN prompt)
        pa.field(CAPTION_ID, pa.int64()),
        pa.field(CAPTION, pa.string()),
        pa.field(CAPTION_GENDER, pa.string()),
        pa.field(URL, pa.string()),
        pa.field(MODEL, pa.string()),
        pa.field(SEED, pa.int64()),
        pa.field(IMAGE_INDEX, pa.int32()),
        pa.field(SAFETY_CHECKER, pa.string()),
        pa.field(FETCH_STATUS, pa.string()),
        pa.field(FETCH_ERROR, pa.string()),
        pa.field(HTTP_STATUS, pa.int32()),
        pa.field(IMAGE_ORIGIN, pa.string()),
        pa.field(ORIGINAL_HEIGHT, pa.int32()),
        pa.field(ORIGINAL_WIDTH, pa.int32()),
        pa.field(GENERATION_STATUS, pa.string()),
        pa.field(GENERATION_DETAIL, pa.string()),
        pa.field(NSFW, pa.bool_()),
        pa.field(FACE_STATUS, pa.string()),
        pa.field(FACE_COUNT, pa.int32()),
        pa.field(FACE_SCORE, pa.float32()),
        pa.field(FACE_BOX_WIDTH, pa.float32()),
        pa.field(FACE_BOX_HEIGHT, pa.float32()),
        pa.field(GENDER, pa.string()),
        pa.field(P_MALE, pa.float32()),
        pa.field(P_FEMALE, pa.float32()),
        pa.field(COUNTED, pa.bool_(), nullable=False),
    ]
)

# Columns each operator adds (what it writes; the pipeline conforms the rest).
FETCH_COLUMNS = pa.schema([
    pa.field(IMAGE, pa.binary()), pa.field(IMAGE_ENCODING, pa.string()),
    pa.field(IMAGE_HEIGHT, pa.int32()), pa.field(IMAGE_WIDTH, pa.int32()),
    IMAGE_RESULTS.field(FETCH_STATUS), IMAGE_RESULTS.field(FETCH_ERROR), IMAGE_RESULTS.field(HTTP_STATUS),
    IMAGE_RESULTS.field(ORIGINAL_HEIGHT), IMAGE_RESULTS.field(ORIGINAL_WIDTH),
])
FACE_COLUMNS = pa.schema([IMAGE_RESULTS.field(n) for n in (FACE_STATUS, FACE_COUNT, FACE_SCORE, FACE_BOX_WIDTH, FACE_BOX_HEIGHT)])
GENDER_COLUMNS = pa.schema([IMAGE_RESULTS.field(n) for n in (GENDER, P_MALE, P_FEMALE)])
EMBEDDING_COLUMNS = pa.schema([pa.field(CLIP_EMBEDDING, pa.list_(pa.float16()))])
GENERATION_COLUMNS = pa.schema([
    pa.field(IMAGE, pa.binary()), pa.field(IMAGE_ENCODING, pa.string()),
    pa.field(IMAGE_HEIGHT, pa.int32()), pa.field(IMAGE_WIDTH, pa.int32()),
    IMAGE_RESULTS.field(GENERATION_STATUS), IMAGE_RESULTS.field(GENERATION_DETAIL), IMAGE_RESULTS.field(NSFW),
    IMAGE_RESULTS.field(SAFETY_CHECKER),
    IMAGE_RESULTS.field(MODEL),
])

# --- summary tables ----------------------------------------------------------------------------------------
GROUP = "group"                    # "training" or a prompt id, in the summarize CSV
PERCENT_FEMALE = "percent_female"
TRAINING_GROUP = "training"

# the image bytes and their shape: dropped from a stream once its stages are done with them
PAYLOAD = [IMAGE, IMAGE_ENCODING, IMAGE_HEIGHT, IMAGE_WIDTH]

# --- the per-generated-image tables of the other studies -------------------------------------------------
# what the generator says about each image it was asked for
GENERATION_OUTCOME = (
    pa.field(GENERATION_STATUS, pa.string()),
    pa.field(GENERATION_DETAIL, pa.string()),
    pa.field(NSFW, pa.bool_()),
    pa.field(SAFETY_CHECKER, pa.string()),
)


def prompt_index_seed(nullable: bool = True) -> list[pa.Field]:
    """The last columns of a study's generation requests: the prompt, the image's index among
    those of its prompt, and its seed."""
    return [pa.field(PROMPT, pa.string(), nullable), pa.field(IMAGE_INDEX, pa.int32(), nullable),
            pa.field(SEED, pa.int64(), nullable)]


def generated_images(requests: pa.Schema, *columns: pa.Field) -> pa.Schema:
    """A study's per-generated-image table: its ``requests`` columns, the generator MODEL and the
    GENERATION_OUTCOME, then the study's own ``columns``."""
    return pa.schema([*requests, pa.field(MODEL, pa.string()), *GENERATION_OUTCOME, *columns])

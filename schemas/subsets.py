"""The training-subset table: which captions stand for each occupation in each approach.

Keyed by (occupation, subset, prompt_id). The image side fetches the URLs of these rows,
classifies their images, and computes T[occupation, subset] (paper 002, sections 4 and 5).
"""

from __future__ import annotations

import pyarrow as pa

from schemas.captions import (
    ANNOTATED_CAPTIONS,
    CAPTION,
    CAPTION_GENDER,
    CAPTION_ID,
    JOIN_KEY,
    OCCUPATION,
    PROMPT_SIMILARITY,
    SAMPLE_KEY,
    URL,
)

SUBSET = "subset"
PROMPT_ID = "prompt_id"      # 1-based index into the prompt list (Table 1); null for prompt-free subsets
PROMPT = "prompt"            # the prompt text for this occupation; null for prompt-free subsets
RANK = "rank"                # 1-based rank inside (occupation, subset, prompt_id)
SIMILARITY = "similarity"    # SBERT cosine(caption, prompt); for prompt-free subsets the mean over prompts


class Subset:
    """The four training-data approaches of Table 3."""

    NAIVE = "naive"                          # section 4: random sample of n captions
    NO_INDICATORS = "no_indicators"          # section 5.1: ... without explicit gender indicators
    NN = "nn"                                # section 5.2: top-k SBERT neighbours of each prompt
    NN_NO_INDICATORS = "nn_no_indicators"    # section 5.3: NN + no indicators
    ALL = (NAIVE, NO_INDICATORS, NN, NN_NO_INDICATORS)
    PER_PROMPT = (NN, NN_NO_INDICATORS)


TRAINING_SUBSETS = pa.schema(
    [
        pa.field(OCCUPATION, pa.string(), nullable=False),
        pa.field(SUBSET, pa.string(), nullable=False),
        pa.field(PROMPT_ID, pa.int32()),
        pa.field(PROMPT, pa.string()),
        pa.field(RANK, pa.int32(), nullable=False),
        pa.field(CAPTION_ID, pa.int64(), nullable=False),
        pa.field(URL, pa.string()),
        pa.field(CAPTION, pa.string(), nullable=False),
        pa.field(CAPTION_GENDER, pa.string(), nullable=False),
        pa.field(SIMILARITY, pa.float32()),
        pa.field(SAMPLE_KEY, pa.float64(), nullable=False),
        pa.field(JOIN_KEY, pa.string()),    # --shard-key's value (null without it)
    ]
)

MATCHED_CAPTIONS = "matched_captions"   # captions naming the occupation (0: none in the input)

# Per-occupation text similarity report (section 5.2: 0.385 random vs 0.704 NN on LAION).
SIMILARITY_SUMMARY = pa.schema(
    [
        pa.field(OCCUPATION, pa.string(), nullable=False),
        pa.field(MATCHED_CAPTIONS, pa.int64(), nullable=False),
        pa.field("random_sample_size", pa.int64(), nullable=False),
        pa.field("random_mean_cosine", pa.float64()),
        pa.field("nn_selected", pa.int64(), nullable=False),
        pa.field("nn_mean_cosine", pa.float64()),
        pa.field("female_indicator_share", pa.float64()),
        pa.field("male_indicator_share", pa.float64()),
        pa.field("any_indicator_share", pa.float64()),
    ]
)

# --- working schemas of the selection (pipelines/studies/amplification/selection.py) -------------------------------
ORDER_KEY = "_order_key"      # ascending order within a selection group
SOURCE_ROW = "_source_row"    # index of a candidate's row in the batch it came from

# The annotated-caption columns selection reads and passes on between reduction levels.
SELECTION_INPUT = pa.schema(
    [ANNOTATED_CAPTIONS.field(n) for n in (CAPTION_ID, URL, CAPTION, OCCUPATION, CAPTION_GENDER, PROMPT_SIMILARITY, SAMPLE_KEY)]
    + [pa.field(JOIN_KEY, pa.string())]   # only with --shard-key (select_pool names it); else null
)

# One row per (selection group, caption): keys only; the payload is attached when finalising.
SELECTION_CANDIDATES = pa.schema(
    [
        pa.field(OCCUPATION, pa.string()),
        pa.field(SUBSET, pa.string()),
        pa.field(PROMPT_ID, pa.int32()),  # 0 for prompt-free subsets while selecting
        pa.field(ORDER_KEY, pa.float64()),
        pa.field(CAPTION_ID, pa.int64()),
        pa.field(URL, pa.string()),       # one row per URL and group (selection.DUPLICATES "fold")
        pa.field(SIMILARITY, pa.float32()),
        pa.field(SOURCE_ROW, pa.int64()),
    ]
)

# What the selection folds (selection.DUPLICATES): the run summary's outcomes of the selection.
DUPLICATE_ROW = "duplicate_row"   # the same URL and caption as a selected row (the same caption_id)
DUPLICATE_URL = "duplicate_url"   # the URL of a selected row with another caption (same occupation)

# Caption and indicator counts per occupation (feeds SIMILARITY_SUMMARY).
OCCUPATION_STATS = pa.schema(
    [
        pa.field(OCCUPATION, pa.string()),
        pa.field(MATCHED_CAPTIONS, pa.int64()),
        pa.field("female_indicator_captions", pa.int64()),
        pa.field("male_indicator_captions", pa.int64()),
        pa.field("any_indicator_captions", pa.int64()),
    ]
)

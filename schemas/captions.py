"""Column names and pyarrow schemas of the caption side (paper 002).

This module is the only place where caption-side column names are spelled out. Operators and
pipelines import the constants; tests compare written tables against the schemas.
"""

from __future__ import annotations

import pyarrow as pa

# --- LAION metadata input -------------------------------------------------------------------
# Default column names of LAION-2B-en metadata parquet. Lower-case variants are accepted, and
# both are configurable on the command line.
LAION_TEXT = "TEXT"
LAION_URL = "URL"

# --- caption stream ---------------------------------------------------------------------------
CAPTION_ID = "caption_id"          # int64, stable hash of (url, caption): same id in every run
URL = "url"
CAPTION = "caption"
OCCUPATIONS = "occupations"        # list<string>: every occupation a caption names (before explode)
OCCUPATION = "occupation"          # one occupation per row (after explode)
MALE_INDICATORS = "male_indicators"      # list<string>, entries "word:man", "pronoun:his", "name:John"
FEMALE_INDICATORS = "female_indicators"  # list<string>, same format
PERSON_NAMES = "person_names"      # list<string>: every PERSON span spaCy found (gendered or not)
CAPTION_GENDER = "caption_gender"  # one of CaptionGender
PROMPT_SIMILARITY = "prompt_similarity"  # list<float32>: SBERT cosine to each prompt of the occupation
SAMPLE_KEY = "sample_key"          # float64 in [0, 1): seeded hash of (caption_id, occupation)
JOIN_KEY = "join_key"              # string: the row's --shard-key value as text (null without --shard-key);
                                   # joins a selected caption to its image in img2dataset's shards

# Evidence kinds used as prefixes in the indicator lists.
EVIDENCE_WORD = "word"
EVIDENCE_PRONOUN = "pronoun"
EVIDENCE_NAME = "name"


class CaptionGender:
    MALE = "male"
    FEMALE = "female"
    BOTH = "both"
    NONE = "none"
    ALL = (MALE, FEMALE, BOTH, NONE)


# --- row accounting -----------------------------------------------------------------------------
# A filtering stage turns the rows it drops into tally rows: one row per (stage, outcome) per
# batch, carrying a count and no data. Tally rows travel with the stream (so they are produced
# exactly once, even when Ray retries a task) and are split off at the end into the run summary.
TALLY_STAGE = "_tally_stage"
TALLY_OUTCOME = "_tally_outcome"
TALLY_COUNT = "_tally_count"
OUTCOME_KEPT = "kept"

# Status columns written by the filtering stages (transient: the stream keeps only kept rows).
CAPTION_STATUS = "caption_status"
OCCUPATION_STATUS = "occupation_status"

# Outcomes of the stage that validates captions.
STAGE_CAPTIONS = "read_captions"
DROP_NULL = "null_caption"
DROP_EMPTY = "empty_caption"
DROP_NON_TEXT = "non_text_caption"
# Control and invisible characters made spaces or removed (a rewrite, not a filter: it counts them).
STAGE_NORMALISE = "normalise_captions"
# Outcomes of occupation matching.
STAGE_OCCUPATIONS = "occupation_match"
DROP_NO_OCCUPATION = "no_occupation"
# Explode: one input caption becomes one row per matched occupation (an expansion, not a filter).
STAGE_EXPLODE = "explode_occupations"
# Stages that filter nothing tally the rows they received and passed on.
OUTCOME_ROWS_IN = "rows_in"
OUTCOME_ROWS_OUT = "rows_out"

# The caption sink reports every part file it committed as one tally row of this stage (outcome:
# the file name, count: its rows); the driver keeps exactly the parts it received (a part written by
# an attempt Ray retried is never received) and lists them in the shard's done marker.
STAGE_WRITTEN_PARTS = "_written_parts"

TALLY_FIELDS = [
    pa.field(TALLY_STAGE, pa.string()),
    pa.field(TALLY_OUTCOME, pa.string()),
    pa.field(TALLY_COUNT, pa.int64()),
]

STAGE_COUNTS = pa.schema(
    [
        pa.field("stage", pa.string(), nullable=False),
        pa.field("outcome", pa.string(), nullable=False),
        pa.field("rows", pa.int64(), nullable=False),
    ]
)

# --- tables ----------------------------------------------------------------------------------------
_STRING_LIST = pa.list_(pa.string())

ANNOTATED_CAPTIONS = pa.schema(
    [
        pa.field(CAPTION_ID, pa.int64()),
        pa.field(URL, pa.string()),
        pa.field(CAPTION, pa.string()),
        pa.field(OCCUPATION, pa.string()),
        pa.field(CAPTION_GENDER, pa.string()),
        pa.field(MALE_INDICATORS, _STRING_LIST),
        pa.field(FEMALE_INDICATORS, _STRING_LIST),
        pa.field(PERSON_NAMES, _STRING_LIST),
        pa.field(PROMPT_SIMILARITY, pa.list_(pa.float32())),
        pa.field(SAMPLE_KEY, pa.float64()),
    ]
)
"""One row per (caption, matched occupation). Extra input columns the user asks to keep follow."""


def stream_schema(extra_fields: list[pa.Field] | tuple = ()) -> pa.Schema:
    """The one schema every block of the caption stream conforms to (data rows and tally rows)."""
    fields = list(ANNOTATED_CAPTIONS) + [pa.field(OCCUPATIONS, _STRING_LIST)]
    fields += [f.with_nullable(True) for f in extra_fields]
    return pa.schema(fields + TALLY_FIELDS)


def annotated_schema(extra_fields: list[pa.Field] | tuple = ()) -> pa.Schema:
    return pa.schema(list(ANNOTATED_CAPTIONS) + [f.with_nullable(True) for f in extra_fields])

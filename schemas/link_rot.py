"""Column names and the pyarrow schema of the link-rot table: per occupation, training
subset and cause, the captions whose image could not be obtained and the test of whether their
gender indicators differ from the kept ones' (``pipelines/studies/amplification/link_rot.py``)."""

from __future__ import annotations

import pyarrow as pa

from schemas.captions import OCCUPATION, CaptionGender
from schemas.fields import typed
from schemas.images import FetchStatus
from schemas.subsets import SUBSET

# --- columns of the link-rot table -----------------------------------------------------------------
CAUSE = "cause"
CAPTIONS = "captions"        # distinct captions walked in (occupation, subset)
LOST = "lost"                # of them, lost to this cause
KEPT = "kept"                # of them, with an image (fetch status ok)
LOST_SHARE = "lost_share"    # lost / captions
STATISTIC = "statistic"      # Pearson's chi-squared of the 2 x K table (null: no test)
P_VALUE = "p_value"
METHOD = "method"            # which test ran, or "not applicable: <reason>"
Q_VALUE = "q_value"          # Benjamini-Hochberg across occupations within (subset, cause)
DIFFERS = "differs"          # q_value < alpha (null: no test)

CLASSES = CaptionGender.ALL  # male, female, both, none
LOST_CLASS = {c: f"lost_{c}" for c in CLASSES}
KEPT_CLASS = {c: f"kept_{c}" for c in CLASSES}


class Cause:
    LINK = "link"                    # the URL did not give an image (or there was none)
    NOT_IN_SHARDS = "not_in_shards"  # the image was not in (or could not be read from) the shards
    ALL = (LINK, NOT_IN_SHARDS)


SHARD_STATUSES = FetchStatus.SHARDS

_COUNT_COLUMNS = [LOST_CLASS[c] for c in CLASSES] + [KEPT_CLASS[c] for c in CLASSES]
LINK_ROT_COLUMNS = [OCCUPATION, SUBSET, CAUSE, CAPTIONS, LOST, KEPT, LOST_SHARE, *_COUNT_COLUMNS,
                    STATISTIC, P_VALUE, METHOD, Q_VALUE, DIFFERS]
LINK_ROT_SCHEMA = pa.schema(
    [
        pa.field(OCCUPATION, pa.string()),
        pa.field(SUBSET, pa.string()),
        pa.field(CAUSE, pa.string(), nullable=False),
        *typed(pa.int64(), CAPTIONS, LOST, KEPT, nullable=False),
        pa.field(LOST_SHARE, pa.float64(), nullable=False),
        *typed(pa.int64(), *_COUNT_COLUMNS, nullable=False),
        pa.field(STATISTIC, pa.float64()),
        pa.field(P_VALUE, pa.float64()),
        pa.field(METHOD, pa.string(), nullable=False),
        pa.field(Q_VALUE, pa.float64()),
        pa.field(DIFFERS, pa.bool_()),
    ]
)
assert LINK_ROT_SCHEMA.names == LINK_ROT_COLUMNS

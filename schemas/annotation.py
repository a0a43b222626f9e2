"""Column names of human labelling (``t2i annotate``): a task set's items, the people's answers, and
what agreement computes from them.

A task set (``TASKS_DIR``) is drawn from one finished run: one row per item (``items.parquet``), an
item being one question about one stored image (paper 002 A.4: the image's gender; GEP: "Do you
see a person in a dress?" for one (image, attribute) pair; SD Exposed: one prompt noun of one
image). The answers are one long table, ``item_id, annotator, answer``: the one interchange format
every import (the labelling page, Label Studio, a crowd CSV) becomes.
"""

from __future__ import annotations

import pyarrow as pa

# -- items (items.parquet) ----------------------------------------------------------------------------
ITEM_ID = "item_id"              # stable id of one question about one image: a hash of the run id, image id, subject
IMAGE_ID = "image_id"            # the run's own id of the image (its images table's IMAGE_ID, or a training row's)
IMAGE_FILE = "image_file"        # the image's file inside the task set ("images/<sha256[:20]>.png")
IMAGE_SHA256 = "image_sha256"    # sha256 of the image file's bytes: labels are tied to what was shown
SUBJECT = "subject"              # what the question names (an attribute, a noun, a skill's object); null: none
QUESTION = "question"            # the item's question as shown ("Do you see a person in a dress?")
PREDICTION = "prediction"        # the run's classifier's answer in the protocol's choices (null: none)
STRATUM = "stratum"              # the stratum the item was drawn in ("model=sd | source=generated")
KNOWN_ANSWER = "known_answer"    # the expected answer of a known-answer (attention check) item; null otherwise

# -- answers (the long table) ---------------------------------------------------------------------------
ANNOTATOR = "annotator"
ANSWER = "answer"
ANSWERED_AT = "answered_at"      # ISO 8601 UTC time the answer was committed (null for imports without one)
ORIGIN = "origin"                # where the answer came from: page, label-studio, crowd-csv, table, simulated

LABEL_COLUMNS = (ITEM_ID, ANNOTATOR, ANSWER)


class Origin:
    PAGE = "page"
    LABEL_STUDIO = "label-studio"
    CROWD_CSV = "crowd-csv"
    TABLE = "table"
    SIMULATED = "simulated"      # a simulated annotator (answers drawn from a known truth): never a person
    ALL = (PAGE, LABEL_STUDIO, CROWD_CSV, TABLE, SIMULATED)


LABELS = pa.schema([(ITEM_ID, pa.string()), (ANNOTATOR, pa.string()), (ANSWER, pa.string()),
                    (ANSWERED_AT, pa.string()), (ORIGIN, pa.string())])

# -- per-item results of agreement ----------------------------------------------------------------------
MAJORITY = "majority"            # the majority answer; null unless MAJORITY_STATUS is "majority"
MAJORITY_STATUS = "majority_status"
N_ANSWERS = "n_answers"
VOTES = "votes"                  # "female 2, male 1": every answer's count


class MajorityStatus:
    MAJORITY = "majority"        # one answer (not "unsure") has more votes than any other
    TIE = "tie"                  # two or more answers share the most votes
    UNSURE = "unsure"            # "unsure" has more votes than any answer
    NONE = "no answers"
    ALL = (MAJORITY, TIE, UNSURE, NONE)

# -- corrected estimates (t2i annotate estimate): one row per stratum and correction ----------------------
SCORE = "score"                  # predictions table: the classifier's probability of the positive class (optional)
ITEMS = "items"                  # items of the stratum the classifier answered (the population)
NO_PREDICTION = "no_prediction"  # items of the stratum without a classifier answer: outside the population
LABELLED = "labelled"            # of ITEMS, those people answered (known-answer items never count)
DECIDED = "decided"              # of LABELLED, those with a majority answer that is not "unsure"
UNSURE_ITEMS = "unsure"          # of LABELLED, those whose majority is "unsure"
TIES = "ties"                    # of LABELLED, those whose most frequent answers tie
UNLABELLED = "unlabelled"
CLASSIFIER = "classifier"        # the classifier's share of the positive class over ITEMS (+ _low, _high)
CORRECTED = "corrected"          # the corrected share among the items people could decide (+ _low, _high)
CORRECTION = "correction"        # the estimator: ppi++ or rogan-gladen (pipelines.engine.stats.correction)
LAMBDA = "lambda"                # PPI++'s power-tuning parameter (0: the people alone, 1: plain PPI)
UNSURE_SHARE = "unsure_share"    # UNSURE_ITEMS / LABELLED (+ _low, _high)
FLAG = "flag"                    # why a value is missing or was clipped ("" when neither)

ESTIMATE_COLUMNS = (STRATUM, CORRECTION, ITEMS, NO_PREDICTION, LABELLED, DECIDED, UNSURE_ITEMS, TIES, UNLABELLED,
                    CLASSIFIER, CLASSIFIER + "_low", CLASSIFIER + "_high", CORRECTED, CORRECTED + "_low",
                    CORRECTED + "_high", LAMBDA, UNSURE_SHARE, UNSURE_SHARE + "_low", UNSURE_SHARE + "_high", FLAG)

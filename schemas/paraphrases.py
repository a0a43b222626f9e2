"""Paraphrased training captions (paper 002, App. A.6): the paraphrase table's columns and the
statuses of one paraphrase.

The prompt is the paper's, verbatim (App. A.6, lines 961-965 of the text copy), with its two
placeholders filled per caption: [OCCUPATION] with the occupation as the Table 1 prompts name it
(a project choice: the paper does not say which form), [CAPTION] with the training caption.
"""

from __future__ import annotations

import pyarrow as pa

from schemas.captions import CAPTION, CAPTION_GENDER, CAPTION_ID, OCCUPATION, URL

# App. A.6's prompt, verbatim; [OCCUPATION] and [CAPTION] are filled per caption
PAPER_PROMPT = ("Please paraphrase the phrase/sentence below. You can change words without changing the original "
                "meaning or intent. You must include the word [OCCUPATION].\nPhrase/Sentence: [CAPTION]")
PAPER_MODEL = "gpt-3.5-turbo"
PAPER_TEMPERATURE = 0.0
PAPER_ENDPOINT = "https://api.openai.com/v1"
OCCUPATION_SLOT, CAPTION_SLOT = "[OCCUPATION]", "[CAPTION]"

STAGE_PARAPHRASE = "paraphrase"                # the run summary's stage
STAGE_PARAPHRASE_SIMILARITY = "paraphrase_similarity"

# --- the paraphrase table (one row per (caption, occupation) of section 6's captions) -----------------
PARAPHRASE_KEY = "paraphrase_key"              # sha256 of (caption id, caption, occupation word, backend, model, prompt, temperature)
PARAPHRASE = "paraphrase"                      # the answer (kept for inspection whatever its status)
PARAPHRASE_STATUS = "paraphrase_status"        # one of ParaphraseStatus
PARAPHRASE_ERROR = "paraphrase_error"          # detail of a non-ok status
PARAPHRASE_ATTEMPTS = "paraphrase_attempts"    # requests sent for this row (retries included)
PARAPHRASE_RETRIED = "paraphrase_retried"      # asked again once because the answer lacked the occupation
PARAPHRASE_SBERT = "paraphrase_sbert_cosine"   # SBERT cosine(caption, paraphrase), ok rows


class ParaphraseStatus:
    """What came back for one request (every one is counted, none dropped silently)."""

    OK = "ok"
    EMPTY = "empty_answer"            # the model answered with nothing (or only whitespace)
    REFUSED = "refused"               # the endpoint's content filter or the model's own refusal
    TOO_LONG = "too_long"             # cut at the token limit (finish_reason "length")
    NO_OCCUPATION = "no_occupation"   # the answer lacks the occupation word (App. A.6: "You must include")
    HTTP_ERROR = "http_error"         # a 4xx, or a 429 / 5xx still failing after the retries
    TIMEOUT = "timeout"               # no answer within the timeout, after the retries
    NOT_IN_FILE = "not_in_file"       # --paraphrase-file has no row for this caption
    ALL = (OK, EMPTY, REFUSED, TOO_LONG, NO_OCCUPATION, HTTP_ERROR, TIMEOUT, NOT_IN_FILE)
    # answers a resumed run keeps; the transport failures are asked again
    FINAL = (OK, EMPTY, REFUSED, TOO_LONG, NO_OCCUPATION, NOT_IN_FILE)


REQUESTS = pa.schema([
    pa.field(CAPTION_ID, pa.int64()), pa.field(OCCUPATION, pa.string()), pa.field(CAPTION, pa.string()),
    pa.field(CAPTION_GENDER, pa.string()), pa.field(URL, pa.string()), pa.field(PARAPHRASE_KEY, pa.string()),
])
ANSWERS = [pa.field(PARAPHRASE, pa.string()), pa.field(PARAPHRASE_STATUS, pa.string()),
           pa.field(PARAPHRASE_ERROR, pa.string()), pa.field(PARAPHRASE_ATTEMPTS, pa.int32()),
           pa.field(PARAPHRASE_RETRIED, pa.bool_())]
PARAPHRASES = pa.schema(list(REQUESTS) + ANSWERS + [pa.field(PARAPHRASE_SBERT, pa.float32())])

"""Paraphrased training captions (paper 002, App. A.6): statuses of one paraphrase request.

The prompt is the paper's, verbatim (App. A.6, lines 961-965 of the text copy), with its two
placeholders filled per caption.
"""

from __future__ import annotations

# App. A.6's prompt, verbatim; [OCCUPATION] and [CAPTION] are filled per caption
PAPER_PROMPT = ("Please paraphrase the phrase/sentence below. You can change words without changing the original "
                "meaning or intent. You must include the word [OCCUPATION].\nPhrase/Sentence: [CAPTION]")
PAPER_MODEL = "gpt-3.5-turbo"
PAPER_TEMPERATURE = 0.0


class ParaphraseStatus:
    """What came back for one request (every one is counted, none dropped silently)."""

    OK = "ok"
    EMPTY = "empty_answer"            # the model answered with nothing (or only whitespace)
    REFUSED = "refused"               # the endpoint's content filter or the model's own refusal
    TOO_LONG = "too_long"             # cut at the token limit (finish_reason "length")
    NO_OCCUPATION = "no_occupation"   # the answer lacks the occupation word (App. A.6: "You must include")
    HTTP_ERROR = "http_error"         # a 4xx, or a 429 / 5xx still failing after the retries
    TIMEOUT = "timeout"               # no answer within the timeout, after the retries
    ALL = (OK, EMPTY, REFUSED, TOO_LONG, NO_OCCUPATION, HTTP_ERROR, TIMEOUT)

"""Second stage of the caption scan: make invisible characters visible to the word stages.

A caption scraped from the web can hold control characters (NUL, escape, C1 codes from mis-decoded
text) and invisible format characters (zero-width space, soft hyphen, byte-order mark, direction
marks). The word stages see them differently: a regular-expression word boundary splits at a NUL
while spaCy's tokenizer does not, so "Doctor\\x00Susan Wilson" gave the occupation match "doctor"
but the name "Wilson"'s gender. Here every control character (Unicode category Cc other than tab,
line feed and carriage return) and the zero-width space become a space, and the invisible marks
inside words (soft hyphen, word joiner, byte-order mark, direction marks) are removed, so that every
later stage reads the caption a reader sees. Rows are never dropped; the summary counts the
captions that held either kind (``control_characters``, ``invisible_characters``). A project
choice, in docs/method.md.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from operators.base import Resources, with_column
from schemas.captions import CAPTION, STAGE_NORMALISE

# Cc without \t \n \r (whitespace to every later stage), and U+200B ZERO WIDTH SPACE: a word break
CONTROL = r"[\x{00}-\x{08}\x{0B}\x{0C}\x{0E}-\x{1F}\x{7F}-\x{9F}]"
ZERO_WIDTH_SPACE = r"\x{200B}"
# inside words: SOFT HYPHEN, WORD JOINER, BYTE ORDER MARK / ZWNBSP, LRM, RLM, bidi embeddings and isolates
INVISIBLE = r"[\x{00AD}\x{2060}\x{FEFF}\x{200E}\x{200F}\x{202A}-\x{202E}\x{2066}-\x{2069}]"

CONTROL_CHARACTERS = "control_characters"      # captions that held a control character (made spaces)
INVISIBLE_CHARACTERS = "invisible_characters"  # captions that held an invisible format character


def _count(text: pa.Array, pattern: str) -> int:
    return int(pc.sum(pc.match_substring_regex(text, pattern)).as_py() or 0)


def normalise(text: pa.Array) -> tuple[pa.Array, int, int]:
    """(``text`` with control characters and zero-width spaces as spaces and invisible marks
    removed, captions with a control character or zero-width space, captions with an invisible
    mark). Nulls stay null; a batch without either is returned as it is."""
    breaks = f"{CONTROL}|{ZERO_WIDTH_SPACE}"
    if not _count(text, f"{breaks}|{INVISIBLE}"):   # almost every batch: one pass, nothing rewritten
        return text, 0, 0
    n_control, n_invisible = _count(text, breaks), _count(text, INVISIBLE)
    if n_control:
        text = pc.replace_substring_regex(text, breaks, " ")
    if n_invisible:
        text = pc.replace_substring_regex(text, INVISIBLE, "")
    return text, n_control, n_invisible


class CaptionNormaliser:
    """Rewrites ``caption`` so that control and invisible characters cannot change a match; counts
    the captions it changed (``tally``)."""

    stage_name = STAGE_NORMALISE
    resources = Resources(num_cpus=1, batch_size=262144)

    def __init__(self):
        self._changed = {CONTROL_CHARACTERS: 0, INVISIBLE_CHARACTERS: 0}

    def __call__(self, batch: pa.Table) -> pa.Table:
        text, n_control, n_invisible = normalise(batch.column(CAPTION).combine_chunks())
        self._changed = {CONTROL_CHARACTERS: n_control, INVISIBLE_CHARACTERS: n_invisible}
        return with_column(batch, CAPTION, text) if n_control or n_invisible else batch

    def tally(self, out: pa.Table) -> dict[str, int]:
        """Extra counts for the run summary: captions of the last batch that held each kind."""
        return dict(self._changed)

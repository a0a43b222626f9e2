"""Vectorised word tokenisation shared by the text operators.

A word is a maximal run of ASCII letters and digits (case-folded). Everything else -- spaces,
punctuation, apostrophes, hyphens, underscores, non-ASCII characters -- separates words, so
"Shepherd's" is ("shepherd", "s"), "prime-minister" is ("prime", "minister") and
"fashion_designer" is ("fashion", "designer"). This is RE2's ``\b`` word boundary with ``_`` as one
more separator, which is what the occupation prefilter regex uses, so the regex pass and the
word lookup agree exactly. Occupation terms and indicator words are ASCII; person names, which
may not be, go through spaCy instead.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

WORD_SEPARATORS = r"[^a-z0-9]+"  # the same definition as a regex, for RE2 patterns

_IS_WORD_BYTE = np.zeros(256, bool)  # after ASCII lower-casing
for _lo, _hi in ((b"a", b"z"), (b"0", b"9")):
    _IS_WORD_BYTE[_lo[0] : _hi[0] + 1] = True


def words(text: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """Lower-cased words of every string in ``text``, flattened.

    Returns ``(tokens, parent)`` where ``parent[i]`` is the row of ``text`` that ``tokens[i]``
    came from. Null strings yield no words. Works on the Arrow buffers with numpy (a few passes
    over the bytes, no regex), so the cost is a few nanoseconds per byte.
    """
    if isinstance(text, pa.ChunkedArray):
        text = text.combine_chunks()
    text = pc.ascii_lower(pc.fill_null(text.cast(pa.large_string()), ""))
    n = len(text)
    bufs = text.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int64)[text.offset : text.offset + n + 1]
    if n == 0 or offsets[-1] == offsets[0]:
        return pa.array([], pa.string()), np.empty(0, np.int64)
    data = np.frombuffer(bufs[2], dtype=np.uint8)[offsets[0] : offsets[-1]]
    rel = offsets - offsets[0]
    tokens, _, parent = word_runs(data, _IS_WORD_BYTE[data], rel, large=False)
    return tokens, parent.astype(np.int64, copy=False)


def word_runs(data: np.ndarray, is_word: np.ndarray, row_offsets: np.ndarray,
              large: bool = True) -> tuple[pa.Array, np.ndarray, np.ndarray]:
    """Split concatenated rows into words: the maximal runs of bytes of ``data`` where ``is_word``
    holds, a run never continuing across a row boundary. ``row_offsets``: the start byte of each
    row, then the end of the last (relative to ``data``). Returns (the words as strings, Arrow
    ``large_string`` when ``large`` else ``string``; their start byte; their row), in text order."""
    row_start = np.zeros(len(is_word) + 1, bool)
    row_start[row_offsets] = True
    prev_word = np.empty_like(is_word)
    prev_word[0] = False
    prev_word[1:] = is_word[:-1]
    prev_word &= ~row_start[:-1]
    next_word = np.empty_like(is_word)
    next_word[-1] = False
    next_word[:-1] = is_word[1:]
    next_word &= ~row_start[1:]
    starts = np.flatnonzero(is_word & ~prev_word)
    ends = np.flatnonzero(is_word & ~next_word) + 1
    rows = np.searchsorted(row_offsets, starts, side="right") - 1
    tok_offsets = np.zeros(len(starts) + 1, np.int64 if large else np.int32)
    np.cumsum(ends - starts, out=tok_offsets[1:])
    string_array = pa.LargeStringArray if large else pa.StringArray
    tokens = string_array.from_buffers(len(starts), pa.py_buffer(tok_offsets), pa.py_buffer(data[is_word]))
    return tokens, starts, rows


def ngrams(tokens: pa.Array, parent: np.ndarray, n: int, first_words: pa.Array | None = None) -> tuple[pa.Array, np.ndarray]:
    """Space-joined runs of ``n`` consecutive tokens of the same row, with their parent rows.

    With ``first_words``, only runs whose first token is one of them are built (the only ones
    that can match a known multi-word term), which skips most of the joining work.
    """
    if n == 1:
        return tokens, parent
    m = len(tokens) - n + 1
    if m <= 0:
        return pa.array([], pa.string()), np.empty(0, np.int64)
    keep = parent[:m] == parent[n - 1 :]
    if first_words is not None:
        keep &= pc.is_in(tokens.slice(0, m), value_set=first_words).to_numpy(zero_copy_only=False)
    idx = np.flatnonzero(keep)
    parts = [tokens.take(pa.array(idx + k)) for k in range(n)]
    joined = pc.binary_join_element_wise(*parts, " ")
    return joined, parent[idx]


def lists_from_pairs(num_rows: int, rows: np.ndarray, values: pa.Array, value_type=pa.string()) -> pa.ListArray:
    """Build a list column of ``num_rows`` rows from (row, value) pairs sorted by row."""
    counts = np.bincount(rows, minlength=num_rows) if len(rows) else np.zeros(num_rows, np.int64)
    offsets = np.zeros(num_rows + 1, np.int32)
    np.cumsum(counts, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values.cast(value_type))


def regex_escape(term: str) -> str:
    """Escape RE2 metacharacters in a literal term."""
    return "".join("\\" + ch if ch in r".^$*+?()[]{}|\/" else ch for ch in term)

"""Vectorised word tokenisation shared by the text operators.

A word is a maximal run of Unicode letters and digits. Everything else (spaces, punctuation,
apostrophes, hyphens, underscores) separates words, so "Shepherd's" is ("shepherd", "s"),
"prime-minister" is ("prime", "minister") and "fashion_designer" is ("fashion", "designer").
The occupation prefilter regex uses the same definition of a word boundary.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

NON_WORD = r"[^\p{L}\p{N}]"
WORD_SEPARATORS = NON_WORD + "+"


def words(text: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """Lower-cased words of every string in ``text``, flattened.

    Returns ``(tokens, parent)`` where ``parent[i]`` is the row of ``text`` that ``tokens[i]``
    came from. Null strings yield no words. Empty strings between separators are kept (they
    match nothing) so that adjacent-token n-grams never jump over a separator run.
    """
    if isinstance(text, pa.ChunkedArray):
        text = text.combine_chunks()
    lists = pc.split_pattern_regex(pc.utf8_lower(text), WORD_SEPARATORS)
    tokens = pc.list_flatten(lists)
    parent = pc.list_parent_indices(lists).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return tokens, parent


def ngrams(tokens: pa.Array, parent: np.ndarray, n: int) -> tuple[pa.Array, np.ndarray]:
    """Space-joined runs of ``n`` consecutive tokens of the same row, with their parent rows."""
    if n == 1:
        return tokens, parent
    m = len(tokens) - n + 1
    if m <= 0:
        return pa.array([], pa.string()), np.empty(0, np.int64)
    same_row = parent[: m] == parent[n - 1 :]
    idx = np.flatnonzero(same_row)
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

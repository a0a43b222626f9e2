"""First stage of the caption scan: normalise column names and sort out unusable captions.

Reads the configured text and URL columns of LAION metadata and writes ``caption`` / ``url``
plus ``caption_status`` in {kept, null_caption, empty_caption, non_text_caption}. A caption column
of a non-text type (numbers, nested values) or bytes that are not UTF-8 make non-text captions.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from operators.base import Resources, status_array, with_column
from schemas.captions import (
    CAPTION,
    CAPTION_STATUS,
    DROP_EMPTY,
    DROP_NON_TEXT,
    DROP_NULL,
    OUTCOME_KEPT,
    STAGE_CAPTIONS,
    URL,
)


def holds_text(t: pa.DataType) -> bool:
    """Whether a caption column of type ``t`` can hold text (``_as_text`` makes every non-null
    value of any other type a non-text caption, and a null-typed column is all null captions)."""
    if pa.types.is_dictionary(t):
        return holds_text(t.value_type)
    return any(is_(t) for is_ in (pa.types.is_string, pa.types.is_large_string, pa.types.is_string_view,
                                  pa.types.is_binary, pa.types.is_large_binary, pa.types.is_fixed_size_binary))


def _as_text(col: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """(string array, non-text mask) for a caption column of any Arrow type."""
    n = len(col)
    t = col.type
    if pa.types.is_dictionary(t):
        return _as_text(col.dictionary_decode())
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return col.cast(pa.string()), np.zeros(n, bool)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        try:
            return col.cast(pa.string()), np.zeros(n, bool)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            values, bad = [], np.zeros(n, bool)
            for i, b in enumerate(col.to_pylist()):
                try:
                    values.append(None if b is None else b.decode("utf-8"))
                except UnicodeDecodeError:
                    values.append(None)
                    bad[i] = True
            return pa.array(values, pa.string()), bad
    if pa.types.is_null(t):
        return pa.nulls(n, pa.string()), np.zeros(n, bool)
    # numbers, booleans, timestamps, lists, structs: present but not text
    return pa.nulls(n, pa.string()), pc.is_valid(col).to_numpy(zero_copy_only=False)


class CaptionValidator:
    """Renames the input columns to ``caption`` / ``url`` and adds ``caption_status``."""

    stage_name = STAGE_CAPTIONS
    status_column = CAPTION_STATUS
    outcomes = (OUTCOME_KEPT, DROP_NULL, DROP_EMPTY, DROP_NON_TEXT)
    resources = Resources(num_cpus=1, batch_size=262144)

    def __init__(self, text_column: str, url_column: str | None):
        self.text_column = text_column
        self.url_column = url_column

    def __call__(self, batch: pa.Table) -> pa.Table:
        raw = batch.column(self.text_column).combine_chunks()
        text, non_text = _as_text(raw)
        is_null = pc.is_null(text).to_numpy(zero_copy_only=False) & ~non_text
        blank = pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(text)), 0)
        is_empty = pc.fill_null(blank, False).to_numpy(zero_copy_only=False)
        # codes index self.outcomes = (kept, null, empty, non_text)
        codes = np.where(non_text, 3, np.where(is_null, 1, np.where(is_empty, 2, 0)))
        status = status_array(codes, self.outcomes)
        if self.url_column is not None:
            url_raw = batch.column(self.url_column).combine_chunks()
            url, _ = _as_text(url_raw)
        else:
            url = pa.nulls(batch.num_rows, pa.string())
        rest = batch.drop_columns([c for c in {self.text_column, self.url_column} if c is not None])
        rest = with_column(rest, CAPTION, text)
        rest = with_column(rest, URL, url)
        return with_column(rest, CAPTION_STATUS, status)

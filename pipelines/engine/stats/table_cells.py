"""Numbers from the cells of a table someone wrote by hand (the ``summarize`` CSVs of the three studies).

A bad cell is reported as written ("12%", "abc", "inf", "2.5"), with its column and row, never as the
``nan`` that ``pd.to_numeric(errors="coerce")`` would turn it into; the callers read such files as
text (``pd.read_csv(dtype=str, keep_default_na=False, na_values=[""])``) so nothing is lost before this.
"""

from __future__ import annotations

import io as _io
import math

import numpy as np
import pandas as pd

from pipelines.engine.storage import io

SHOWN = 5  # rows listed per kind of problem


def numbers(values: pd.Series, column: str, what: str, *, low: float | None = None, high: float | None = None,
            integer: bool = False) -> pd.Series:
    """``values`` (text cells, or numbers) as float64, or int64 when ``integer``.

    ValueError naming ``column`` and ``what`` it must hold, then, per kind, the rows (index labels; a
    freshly read CSV counts data rows from 0) and cells that are blank, not a number, not finite (inf,
    nan), fractional (``integer``: counts are whole numbers), or outside [``low``, ``high``].
    """
    if pd.api.types.is_numeric_dtype(values.dtype) and not pd.api.types.is_bool_dtype(values.dtype):
        nums = values.astype(np.float64)
        blank = nums.isna()                   # a missing value (a numeric frame cannot say "nan" was written)
        not_number = pd.Series(False, index=values.index)
    else:
        cells = [_number(v) for v in values]
        blank = pd.Series([c == "blank" for c in cells], index=values.index)
        not_number = pd.Series([c is None for c in cells], index=values.index)
        nums = pd.Series([c if isinstance(c, float) else np.nan for c in cells], index=values.index, dtype=np.float64)
    written = ~blank & ~not_number
    finite = pd.Series(np.isfinite(nums.to_numpy()), index=values.index)
    kinds = [("missing (blank)", blank), ("not a number", not_number), ("not a finite number", written & ~finite)]
    if integer:
        kinds.append(("fractional (counts are whole numbers)", finite & (nums != np.floor(nums))))
    if low is not None or high is not None:
        outside = finite & (((nums < low) if low is not None else False) | ((nums > high) if high is not None else False))
        bounds = "negative" if high is None and low == 0 else f"outside [{_g(low, '-inf')}, {_g(high, 'inf')}]"
        kinds.append((bounds, outside))
    problems = [_listed(label, mask, values) for label, mask in kinds if mask.any()]
    if problems:
        raise ValueError(f"column {column!r} must hold {what}: " + "; ".join(problems))
    return nums.astype(np.int64) if integer else nums


def _number(v) -> float | str | None:
    """A cell as a float, "blank", or None when it is not a number. Python's float() syntax, less the
    digit separators ("1_000") no spreadsheet writes."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "blank"
    if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool):
        return float(v)
    text = str(v).strip()
    if not text:
        return "blank"
    if "_" in text:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _g(x, default: str) -> str:
    return default if x is None else f"{x:g}"


def _listed(label: str, mask: pd.Series, values: pd.Series) -> str:
    at = np.flatnonzero(mask.to_numpy())
    rows = [r.item() if isinstance(r, np.generic) else r for r in values.index[at]]
    cells = ", ".join(repr(v) if isinstance(v, str) else str(v) for v in values.to_numpy()[at[:SHOWN]])
    more = f" (and {len(rows) - SHOWN} more)" if len(rows) > SHOWN else ""
    return f"{label} in row(s) {rows[:SHOWN]}{more}" + (f": {cells}" if "blank" not in label else "")


def read_cells(uri: str) -> pd.DataFrame:
    """A hand-written CSV (local path or fsspec URI) with every cell as written: text, only an empty
    cell missing, so an error can show "12%" or "nan". InputError when it is not a readable CSV."""
    text = io.read_text(uri)
    try:
        return pd.read_csv(_io.StringIO(text), dtype=str, keep_default_na=False, na_values=[""])
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise io.InputError(f"{uri}: not a readable CSV ({exc})") from None

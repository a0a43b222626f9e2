"""The run summary: rows in, kept, and dropped per reason, per stage, from the tally rows."""

from __future__ import annotations

from collections import OrderedDict

import pyarrow as pa
import pyarrow.compute as pc

from schemas.captions import (
    OUTCOME_KEPT,
    STAGE_COUNTS,
    TALLY_COUNT,
    TALLY_OUTCOME,
    TALLY_STAGE,
)
from schemas.captions import (
    OUTCOME_ROWS_IN as ROWS_IN,
)
from schemas.captions import (
    OUTCOME_ROWS_OUT as ROWS_OUT,
)


class CountMismatch(AssertionError):
    """The counts of consecutive stages do not add up: a row was lost or invented."""


def stage_counts(tallies: pa.Table) -> pa.Table:
    """Sum tally rows into one row per (stage, outcome) (the STAGE_COUNTS table)."""
    if tallies.num_rows == 0:
        return STAGE_COUNTS.empty_table()
    grouped = tallies.group_by([TALLY_STAGE, TALLY_OUTCOME], use_threads=False).aggregate([(TALLY_COUNT, "sum")])
    return pa.table(
        {
            "stage": grouped.column(TALLY_STAGE),
            "outcome": grouped.column(TALLY_OUTCOME),
            "rows": pc.cast(grouped.column(f"{TALLY_COUNT}_sum"), pa.int64()),
        },
        schema=STAGE_COUNTS,
    )


def summarize(counts: pa.Table, order: list[str]) -> "OrderedDict[str, dict]":
    """Per stage in pipeline order: rows_in, rows_out (kept), dropped {reason: rows}.

    Filter stages tally ``kept`` and one outcome per drop reason; the other stages tally
    ``rows_in`` and ``rows_out``.
    """
    by_stage: dict[str, dict[str, int]] = {}
    for s, o, n in zip(*(counts.column(c).to_pylist() for c in ("stage", "outcome", "rows"))):
        by_stage.setdefault(s, {})[o] = n
    out: "OrderedDict[str, dict]" = OrderedDict()
    for s in order + sorted(set(by_stage) - set(order)):
        c = by_stage.get(s, {})
        if ROWS_IN in c:
            out[s] = {"rows_in": c[ROWS_IN], "rows_out": c.get(ROWS_OUT, 0), "dropped": {}}
        else:
            dropped = {o: n for o, n in sorted(c.items()) if o != OUTCOME_KEPT}
            kept = c.get(OUTCOME_KEPT, 0)
            out[s] = {"rows_in": kept + sum(dropped.values()), "rows_out": kept, "dropped": dropped}
    return out


def check_chain(summary: "OrderedDict[str, dict]", final_rows: int | None = None,
                expansions: tuple[str, ...] = ()) -> None:
    """Each stage's rows_in equals the previous stage's rows_out (``expansions`` may change the
    row count, filters only drop what they count); the last stage's rows_out equals ``final_rows``."""
    prev_name, prev_out = None, None
    for name, c in summary.items():
        if c["rows_in"] != c["rows_out"] + sum(c["dropped"].values()) and name not in expansions:
            raise CountMismatch(f"stage {name}: {c['rows_in']} in != {c['rows_out']} out + drops {c['dropped']}")
        if prev_out is not None and c["rows_in"] != prev_out:
            raise CountMismatch(f"stage {name} received {c['rows_in']} rows but {prev_name} passed on {prev_out}")
        prev_name, prev_out = name, c["rows_out"]
    if final_rows is not None and prev_out is not None and final_rows != prev_out:
        raise CountMismatch(f"{final_rows} rows written but the last stage {prev_name} passed on {prev_out}")


def format_summary(summary: "OrderedDict[str, dict]") -> str:
    lines = [f"{'stage':<22} {'rows in':>12} {'kept':>12} {'dropped':>12}  reasons"]
    for name, c in summary.items():
        dropped = sum(c["dropped"].values())
        reasons = ", ".join(f"{k}={v}" for k, v in c["dropped"].items() if v) or "-"
        note = "" if c["rows_in"] == c["rows_out"] + dropped else "  (expands one row per occupation)"
        lines.append(f"{name:<22} {c['rows_in']:>12,} {c['rows_out']:>12,} {dropped:>12,}  {reasons}{note}")
    return "\n".join(lines)

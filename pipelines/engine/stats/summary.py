"""The run summary: rows in, kept, and dropped per reason, per stage, from the tally rows."""

from __future__ import annotations

import csv
import io as _io
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
from schemas.images import Gender


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


def outcomes_by_stage(counts: pa.Table) -> dict[str, dict[str, int]]:
    """``stage_counts``' table as {stage: {outcome: rows}}."""
    by_stage: dict[str, dict[str, int]] = {}
    for s, o, n in zip(*(counts.column(c).to_pylist() for c in ("stage", "outcome", "rows"))):
        by_stage.setdefault(s, {})[o] = n
    return by_stage


def summarize(counts: pa.Table, order: list[str]) -> "OrderedDict[str, dict]":
    """Per stage in pipeline order: rows_in, rows_out (kept), dropped {reason: rows}.

    Filter stages tally ``kept`` and one outcome per drop reason; the other stages tally
    ``rows_in`` and ``rows_out``.
    """
    by_stage = outcomes_by_stage(counts)
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


# ------------------------------------------------------------------------------ run summary
def summary_rows_captions(summary: "OrderedDict[str, dict]", phase, attempt: "OrderedDict[str, dict] | None" = None) -> list[dict]:
    """Run-summary rows of the caption stages. The stages of the scan stream concurrently, so
    the throughput of each is its rows in during this attempt over the scan's wall time."""
    rows = []
    for name, c in summary.items():
        now = (attempt or {}).get(name, {}).get("rows_in", 0)
        rows.append(stage_row(phase, "captions", name, c["rows_in"], c["rows_out"], c["dropped"], now))
    return rows


def summary_rows_images(counts: list[dict], phases: dict) -> list[dict]:
    """Run-summary rows of the image stages from ``image_stage_counts`` rows; ``phases`` maps a
    branch to the Phase that produced it (training images, or one generator)."""
    out, seen = [], {}
    for r in counts:
        key = (r["branch"], r["stage"])
        if key not in seen:
            seen[key] = {"rows_in": r["rows_in"], "outcomes": {}}
        seen[key]["outcomes"][r["outcome"]] = r["count"]
    for (branch, stage), c in seen.items():
        phase = phases.get(branch)
        passed = set(Gender.DECIDED) if stage == "clip_gender" else {"ok"}  # the classifier keeps decided images
        kept = sum(n for o, n in c["outcomes"].items() if o in passed)
        dropped = {o: n for o, n in c["outcomes"].items() if n and o not in passed}
        share = (phase.processed / phase.total) if phase is not None and phase.total else 0.0
        out.append(stage_row(phase, branch, stage, c["rows_in"], kept, dropped, round(c["rows_in"] * share)))
    return out


def stage_row(phase, branch: str, stage: str, rows_in: int, kept: int, dropped: dict, rows_now: int) -> dict:
    seconds = round(phase.seconds, 3) if phase is not None else None
    return {
        "phase": phase.name if phase is not None else None, "branch": branch, "stage": stage,
        "rows_in": int(rows_in), "kept": int(kept), "dropped": int(sum(dropped.values())),
        "dropped_by_reason": {k: int(v) for k, v in dropped.items() if v},
        "rows_this_attempt": int(rows_now), "rows_reused": int(rows_in - rows_now),
        "phase_seconds": seconds,
        "rows_per_s": round(rows_now / phase.seconds, 2) if phase is not None and phase.seconds > 0 and rows_now else None,
    }


def format_run_summary(rows: list[dict]) -> str:
    # branches and stages shown whole (two generators' branches must stay apart), at least 34 and 20 characters wide
    wb = max([34] + [len(r["branch"]) for r in rows])
    ws = max([20] + [len(r["stage"]) for r in rows])
    lines = ["run summary: rows in, kept, dropped per reason, and throughput per stage (this attempt; "
             "the stages of one phase stream concurrently)",
             f"{'branch':<{wb}} {'stage':<{ws}} {'rows in':>10} {'kept':>10} {'dropped':>9}  {'rows/s':>9} "
             f"{'reused':>9}  reasons"]
    for r in rows:
        rate = "-" if r["rows_per_s"] is None else f"{r['rows_per_s']:,.1f}"
        reasons = ", ".join(f"{k}={v:,}" for k, v in r["dropped_by_reason"].items()) or "-"
        lines.append(f"{r['branch']:<{wb}} {r['stage']:<{ws}} {r['rows_in']:>10,} {r['kept']:>10,} "
                     f"{r['dropped']:>9,}  {rate:>9} {r['rows_reused']:>9,}  {reasons}")
    return "\n".join(lines)


def format_branch_summary(rows: list[dict]) -> str:
    """The run summary as printed at the end of a run: one line per branch with its first stage's
    rows in, its phase's time and what its stages dropped, by stage and reason (a branch's stages
    may be a chain or parallel measurements of the same rows, so their drops are not summed). The
    per-stage rows, with what each kept and its throughput, are in run_summary.csv and the report."""
    branches: "OrderedDict[str, list[dict]]" = OrderedDict()
    for r in rows:
        branches.setdefault(r["branch"], []).append(r)
    wb = max([8] + [len(b) for b in branches])
    lines = ["run summary: rows in per branch and what each stage dropped (per stage, with rows kept and rows/s: "
             "run_summary.csv)",
             f"{'branch':<{wb}} {'rows in':>10} {'seconds':>8}  dropped"]
    for branch, stages in branches.items():
        seconds = sorted({r["phase_seconds"] for r in stages if r["phase_seconds"] is not None})
        secs = f"{sum(seconds):,.0f}" if seconds else "-"
        drops = "; ".join(f"{r['stage']}: " + ", ".join(f"{k}={v:,}" for k, v in r["dropped_by_reason"].items())
                          for r in stages if r["dropped_by_reason"]) or "-"
        lines.append(f"{branch:<{wb}} {stages[0]['rows_in']:>10,} {secs:>8}  {drops}")
    return "\n".join(lines)


def run_summary_csv(rows: list[dict]) -> str:
    buf = _io.StringIO()
    cols = ["phase", "branch", "stage", "rows_in", "kept", "dropped", "dropped_by_reason", "rows_this_attempt",
            "rows_reused", "phase_seconds", "rows_per_s"]
    w = csv.DictWriter(buf, fieldnames=cols)
    w.writeheader()
    for r in rows:
        w.writerow(r | {"dropped_by_reason": ";".join(f"{k}={v}" for k, v in r["dropped_by_reason"].items())})
    return buf.getvalue()

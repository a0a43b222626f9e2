import pyarrow as pa
import pytest

from pipelines.engine.summary import (
    CountMismatch,
    check_chain,
    format_summary,
    stage_counts,
    summarize,
)


def tallies(rows):
    return pa.table({"_tally_stage": [r[0] for r in rows], "_tally_outcome": [r[1] for r in rows],
                     "_tally_count": pa.array([r[2] for r in rows], pa.int64())})


ROWS = [("read", "kept", 90), ("read", "null_caption", 10), ("read", "kept", 0),
        ("match", "kept", 30), ("match", "no_occupation", 60),
        ("explode", "rows_in", 30), ("explode", "rows_out", 33)]


def test_summary_adds_up():
    s = summarize(stage_counts(tallies(ROWS)), ["read", "match", "explode"])
    assert s["read"] == {"rows_in": 100, "rows_out": 90, "dropped": {"null_caption": 10}}
    assert s["explode"] == {"rows_in": 30, "rows_out": 33, "dropped": {}}
    check_chain(s, final_rows=33, expansions=("explode",))
    assert "no_occupation=60" in format_summary(s)


def test_lost_rows_are_detected():
    s = summarize(stage_counts(tallies(ROWS)), ["read", "match", "explode"])
    with pytest.raises(CountMismatch, match="33"):
        check_chain(s, final_rows=32, expansions=("explode",))
    lost = summarize(stage_counts(tallies(ROWS[:3] + [("match", "kept", 30), ("match", "no_occupation", 59)])), ["read", "match"])
    with pytest.raises(CountMismatch, match="match received 89"):
        check_chain(lost)

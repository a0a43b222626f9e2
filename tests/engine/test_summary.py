import pyarrow as pa
import pytest

from pipelines.engine.stats.summary import (
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


def test_run_summary_rows_count_kept_dropped_reused_and_throughput():
    from pipelines.engine.stream.progress import Phase
    from pipelines.engine.stats.summary import (
        format_run_summary,
        run_summary_csv,
        summary_rows_images,
    )

    phase = Phase("training images", "URLs", total=10, reused=4, processed=6, seconds=2.0)
    counts = [{"branch": "b", "stage": "fetch", "rows_in": 10, "outcome": o, "count": n}
              for o, n in (("ok", 7), ("timeout", 3), ("http_error", 0))]
    counts += [{"branch": "b", "stage": "clip_gender", "rows_in": 7, "outcome": o, "count": n}
               for o, n in (("male", 3), ("female", 2), ("ambiguous", 2))]
    fetch, clip = summary_rows_images(counts, {"b": phase})
    assert (fetch["rows_in"], fetch["kept"], fetch["dropped"], fetch["dropped_by_reason"]) == (10, 7, 3, {"timeout": 3})
    assert (fetch["rows_this_attempt"], fetch["rows_reused"], fetch["rows_per_s"]) == (6, 4, 3.0)
    assert (clip["kept"], clip["dropped_by_reason"]) == (5, {"ambiguous": 2})
    text = format_run_summary([fetch, clip])
    assert "timeout=3" in text and "ambiguous=2" in text
    # long branches (two generators' stand-ins) are printed whole, so they stay apart
    long = [dict(fetch, branch=f"caption_prompt: stable-diffusion-v1-{v}-standin") for v in (4, 5)]
    lines = format_run_summary(long).splitlines()[2:]
    assert "stable-diffusion-v1-4-standin" in lines[0] and "stable-diffusion-v1-5-standin" in lines[1]
    assert len({len(line.split("  ")[0]) for line in lines}) == 1   # one column width
    assert "dropped_by_reason" in run_summary_csv([fetch]).splitlines()[0] and "timeout=3" in run_summary_csv([fetch])


def test_the_printed_summary_is_one_line_per_branch_with_every_drop():
    from pipelines.engine.stream.progress import Phase
    from pipelines.engine.stats.summary import format_branch_summary, summary_rows_images

    phase = Phase("generate x", "images", total=10, reused=0, processed=10, seconds=4.0)
    counts = [{"branch": "generated: x", "stage": "fetch", "rows_in": 10, "outcome": o, "count": n}
              for o, n in (("ok", 7), ("timeout", 3))]
    counts += [{"branch": "generated: x", "stage": "clip_gender", "rows_in": 7, "outcome": o, "count": n}
               for o, n in (("male", 3), ("female", 2), ("ambiguous", 2))]
    counts += [{"branch": "generated: y", "stage": "fetch", "rows_in": 5, "outcome": "ok", "count": 5}]
    rows = summary_rows_images(counts, {"generated: x": phase})
    lines = format_branch_summary(rows).splitlines()
    assert len(lines) == 2 + 2          # title, header, one line per branch
    x = next(ln for ln in lines if ln.startswith("generated: x"))
    assert x.split()[2:4] == ["10", "4"] and x.endswith("fetch: timeout=3; clip_gender: ambiguous=2")
    y = next(ln for ln in lines if ln.startswith("generated: y"))
    assert y.split()[2:5] == ["5", "-", "-"]

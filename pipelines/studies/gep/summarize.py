"""`gep.py summarize`: GEP vectors and scores (paper 001, Eq. 2) from known attribute frequencies."""

from __future__ import annotations

from pipelines.engine import io
from pipelines.engine.arguments import interval_settings
from pipelines.engine.summary_files import write_summary_files, wrote_line
from pipelines.engine.table_cells import read_cells
from pipelines.studies.gep import report as gep_report
from pipelines.studies.gep.headline import summary_intervals
from pipelines.studies.gep.metrics import format_summary, summarize_frequencies


def run(args) -> dict:
    """`gep.py summarize`: GEP scores from a CSV of attribute frequencies, each with its interval over
    the attributes (the published per-attribute differences are the units)."""
    df = read_cells(args.frequencies)
    try:
        result = summarize_frequencies(df, args.first, args.second)
    except ValueError as exc:
        raise io.InputError(f"{args.frequencies}: {exc}") from None
    result = summary_intervals(result, interval_settings(args))
    print(format_summary(result))
    if args.output:
        out_fs, out = io.output_fs(args.output)
        names = write_summary_files(out_fs, out, "gep_summary", {"input": args.frequencies, **result},
                                    gep_report.summary_table(result),
                                    lambda figs: gep_report.summary_html(args.frequencies, result, figures=figs))
        print(wrote_line(args.output, names))
    return result

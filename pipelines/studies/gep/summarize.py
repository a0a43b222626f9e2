"""`gep.py summarize`: GEP vectors and scores (paper 001, Eq. 2) from known attribute frequencies."""

from __future__ import annotations

from pipelines.engine.cli.arguments import interval_settings
from pipelines.engine.cli.entry import input_errors, write_summary
from pipelines.engine.stats.table_cells import read_cells
from pipelines.studies.gep import report as gep_report
from pipelines.studies.gep.headline import summary_intervals
from pipelines.studies.gep.metrics import format_summary, summarize_frequencies


def run(args) -> dict:
    """`gep.py summarize`: GEP scores from a CSV of attribute frequencies, each with its interval over
    the attributes (the published per-attribute differences are the units)."""
    df = read_cells(args.frequencies)
    with input_errors(args.frequencies):
        result = summarize_frequencies(df, args.first, args.second)
    result = summary_intervals(result, interval_settings(args))
    print(format_summary(result))
    if args.output:
        write_summary(args.output, "gep_summary", {"input": args.frequencies, **result},
                      gep_report.summary_table(result),
                      lambda figs: gep_report.summary_html(args.frequencies, result, figures=figs))
    return result

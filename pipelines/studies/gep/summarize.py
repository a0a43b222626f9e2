"""`gep.py summarize`: GEP vectors and scores (paper 001, Eq. 2) from known attribute frequencies."""

from __future__ import annotations

import json

from pipelines.engine import figures, io
from pipelines.engine.table_cells import read_cells
from pipelines.studies.gep import report as gep_report
from pipelines.studies.gep.metrics import format_summary, summarize_frequencies


def run(args) -> dict:
    """`gep.py summarize`: GEP scores from a CSV of attribute frequencies."""
    df = read_cells(args.frequencies)
    try:
        result = summarize_frequencies(df, args.first, args.second)
    except ValueError as exc:
        raise io.InputError(f"{args.frequencies}: {exc}") from None
    print(format_summary(result))
    if args.output:
        out_fs, out = io.output_fs(args.output)
        io.write_text(json.dumps({"input": args.frequencies, **result}, indent=2), out_fs, f"{out}/gep_summary.json")
        io.write_text(gep_report.summary_html(args.frequencies, result, figures=figures.FigureDir(out_fs, out)),
                      out_fs, f"{out}/gep_summary.html")
        print(f"wrote {args.output}/gep_summary.json and gep_summary.html")
    return result

"""`amplification.py summarize`: bias amplification (paper 002, section 3.3) from known percentages.

Every E[A] it recomputes (per prompt, and the average over prompts) gets a bootstrap interval over
occupations: the published per-occupation T and G (Tables 6 and 7) are the units."""

from __future__ import annotations

import pandas as pd

from pipelines.engine.cli import arguments
from pipelines.engine.storage import io
from pipelines.engine.report.summary_files import write_summary_files, wrote_line
from pipelines.engine.stats.table_cells import read_cells
from pipelines.studies.amplification import report
from pipelines.studies.amplification.metrics import format_results, summarize_percentages, summary_intervals


def run(args) -> dict:
    """`amplification.py summarize`: amplification from a CSV of known percentages."""
    df = read_cells(args.percentages)
    settings = arguments.interval_settings(args)
    try:
        result = summary_intervals(summarize_percentages(df, args.training_group), settings)
    except ValueError as exc:
        raise io.InputError(f"{args.percentages}: {exc}") from None
    for model, res in result.items():
        title = f"Bias amplification ({model}), {res['occupations']} occupations" if model != "all" \
            else f"Bias amplification, {res['occupations']} occupations"
        print(format_results(title, res["per_prompt"], res["average"], res["average_low"], res["average_high"],
                             level=settings.level))
    print(f"intervals: {int(round(settings.level * 100))}% bootstrap over occupations ({settings.method}, "
          f"{settings.resamples:,} resamples, seed {settings.seed})")
    if args.output:
        out_fs, out = io.output_fs(args.output)
        rows = pd.concat([pd.DataFrame(r["rows"]).assign(model=m) for m, r in result.items()], ignore_index=True)
        interval = settings.record() | {"unit": "occupation"}
        names = write_summary_files(out_fs, out, "amplification_summary",
                                    {"input": args.percentages, "interval": interval, "results": result}, rows,
                                    lambda figs: report.summary_html(args.percentages, result, figures=figs))
        print(wrote_line(args.output, names))
    return result

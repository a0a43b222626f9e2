"""`dalleval.py summarize`: the social-bias metrics of paper 000 (Tables 16 and 17) from known counts."""

from __future__ import annotations

from pipelines.engine.cli import arguments
from pipelines.engine.cli.entry import input_errors, write_summary
from pipelines.engine.storage import io
from pipelines.engine.stats.table_cells import read_cells
from pipelines.studies.dalleval import headlines as H
from pipelines.studies.dalleval import report, report_skills
from pipelines.studies.dalleval.metrics import format_summary, summarize_counts
from pipelines.studies.dalleval.skills import format_table2, table2


def run(args) -> dict:
    """`dalleval.py summarize`: Tables 16/17-shaped results from per-prompt counts, or Table 2
    from per-skill accuracies (--skills)."""
    if getattr(args, "skills", None):
        return run_skills(args)
    settings = arguments.interval_settings(args)     # a bad interval option: its own error, before any reading
    df = read_cells(args.counts)
    if args.group is not None and "group" not in df:
        raise io.InputError(f"--group {args.group}: {args.counts} has no group column")
    with input_errors(args.counts):
        result = summarize_counts(df, args.group, settings)
    print(format_summary(result))
    if args.output:
        write_summary(args.output, "dalleval_summary", {"input": args.counts, **result}, report.summary_table(result),
                      lambda figs: report.summary_html(args.counts, result, figures=figs))
    return result


def run_skills(args) -> dict:
    """Table 2 (paper 000, section 5.2) from a CSV of per-skill accuracies: model,skill,accuracy[,n]."""
    settings = arguments.interval_settings(args)
    df = read_cells(args.skills)
    with input_errors(args.skills):
        table = table2(df)
    extra = {}
    if "n" in df.columns and df["n"].notna().any():   # the images behind each accuracy: intervals over them
        lookup = H.summaries(H.complete_averages(H.skill_metrics(H.accuracy_units(df)), table), settings)
        table = H.table2_with_intervals(table, lookup)
        extra = {"interval": settings.record(), "interval_units": "images (accuracy x n / 100 correct, rounded)"}
    print(format_table2(table))
    result = {"input": args.skills, "table2": table.to_dict("records"), **extra}
    if args.output:
        write_summary(args.output, "dalleval_skills_summary", result, table,
                      lambda figs: report_skills.summary_html(args.skills, table, figures=figs))
    return result

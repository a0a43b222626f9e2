"""What every study's ``summarize --output DIR`` writes, the same set for each: ``<stem>.json`` (the
whole result, strict JSON), ``<stem>.csv`` (its main table), ``<stem>.html`` (a self-contained page:
the numbers and their figures, embedded as data URIs) and, beside them, each figure as PDF + PNG
under ``DIR/figures/`` (``figures.FigureDir``)."""

from __future__ import annotations

import json
from typing import Callable

import pandas as pd

from pipelines.engine.report import figures as _figures
from pipelines.engine.storage import io


def write_summary_files(out_fs, out: str, stem: str, result_json, table: pd.DataFrame,
                        html: str | Callable[[_figures.FigureDir], str]) -> list[str]:
    """Write ``<out>/<stem>.json`` (``result_json``; NaN / inf as null), ``<stem>.csv`` (``table``,
    no index; missing values empty) and ``<stem>.html`` on the pyarrow filesystem ``out_fs``, each
    atomically (``io.write_text``). ``html``: the page, or a function of a ``FigureDir`` on ``out``
    that returns it (its figures then land in ``<out>/figures/``). Returns the names written, in that
    order, with ``figures/`` last when the page saved any figure (what ``wrote_line`` prints)."""
    out = str(out).rstrip("/")
    figdir = _figures.FigureDir(out_fs, out)
    page = html(figdir) if callable(html) else html
    io.write_text(json.dumps(io.clean_json(result_json), indent=2, allow_nan=False, default=str) + "\n", out_fs,
                  f"{out}/{stem}.json")
    io.write_text(table.to_csv(index=False), out_fs, f"{out}/{stem}.csv")
    io.write_text(page, out_fs, f"{out}/{stem}.html")
    return [f"{stem}.json", f"{stem}.csv", f"{stem}.html"] + ([f"{figdir.subdir}/"] if figdir.saved else [])


def wrote_line(output: str, names: list[str]) -> str:
    """The one line a ``summarize`` prints after writing: ``wrote DIR/: a.json, a.csv, a.html, figures/``."""
    return f"wrote {str(output).rstrip('/')}/: {', '.join(names)}"

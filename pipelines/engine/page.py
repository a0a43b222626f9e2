"""What every study's report page shares: the page style (tables, warnings, figures, the model
table), the colour cycle of its charts, and the short name a page shows for a model path."""

from __future__ import annotations

from pipelines.engine import figures as _figures
from pipelines.engine import html as H

COLORS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C")

STYLE = ("<style>body{font-family:sans-serif;margin:2em;max-width:1300px}table{border-collapse:collapse;margin:.6em 0;"
         "font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}th{background:#f3f3f3}"
         ".warn{background:#fff3cd;border:1px solid #e0c060;padding:.6em}" + _figures.STYLE + H.STYLE + "</style>")


def model_name(model) -> str:
    """The last component of a model id or path ("-" for none): what tables and legends show."""
    return str(model).rstrip("/").split("/")[-1] if model is not None else "-"

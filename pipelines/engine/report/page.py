"""What every study's report page shares: the page style and skeleton, the colour cycle of its
charts, the short label a page shows for a model, the stand-in notice, and the pieces that make a
report read at a glance (the headline box first, long diagnostics collapsed at the end).

A report page is one self-contained file: figures and example images are embedded as data URIs
(``figures.py``), wide tables scroll inside their own box (``html.table``), and the page itself
never scrolls sideways.

Models are named by ``model_labels``: the last part of a hub id or directory
(``stable-diffusion-v1-5``), disambiguated when two models would share one; the full id and its
revision appear only in the models table (``html.model_table``).
"""

from __future__ import annotations

from typing import Iterable, Mapping

import pandas as pd

from pipelines.engine.report import figures as _figures
from pipelines.engine.report import html as H

COLORS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C")

CSS = ("body{font-family:sans-serif;margin:2em auto;padding:0 1.5em;max-width:1300px;color:#222;"
       "box-sizing:border-box}p,li{overflow-wrap:break-word}table{border-collapse:collapse;margin:.6em 0;"
       "font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}th{background:#f3f3f3;"
       "vertical-align:bottom}td.n{text-align:right}.warn{background:#fff3cd;border:1px solid #e0c060;padding:.6em}"
       ".standin{font-size:1.05em}"
       ".headline{border:2px solid #4C72B0;border-radius:6px;padding:.2em 1em .6em;margin:1em 0;background:#f7f9fc}"
       ".headline h2{margin:.4em 0}.headline .lead{font-size:1.15em}.behind{color:#333}"
       ".figs{display:flex;flex-wrap:wrap;gap:8px}.figs.two>figure.fig{max-width:calc(50% - 16px)}.legend span{display:inline-block;width:12px;height:12px;"
       "margin:0 4px 0 12px}details.more{margin:.8em 0;border:1px solid #ddd;border-radius:4px;padding:.3em .8em}"
       "details.more>summary{cursor:pointer;font-weight:bold}"
       "img{max-width:100%;height:auto}table.ex img{max-width:none}"
       # the first column names the row (a model label, an approach): kept on one line, the box scrolls
       ".tw>table:not(.models):not(.ex) td:first-child{white-space:nowrap}")
STYLE = "<style>" + CSS + _figures.STYLE + H.STYLE + "</style>"

STANDIN_NOTICE = "stand-in models with random weights: these numbers mean nothing"
STANDIN_CONSOLE = f"NOTE: {STANDIN_NOTICE}."


def model_name(model) -> str:
    """The last component of a model id or path ("-" for none)."""
    return str(model).rstrip("/").split("/")[-1] if model is not None else "-"


def model_labels(*groups: Iterable) -> dict[str, str]:
    """Model id or path -> the short label every table, heading, legend and printed line shows:
    the id's last path part (``runwayml/stable-diffusion-v1-5`` -> ``stable-diffusion-v1-5``; a
    stand-in directory by its name). Two ids with the same last part get the part before it as a
    suffix (``stable-diffusion-v1-5 (runwayml)``), and any label still shared a ``#2``, ``#3``...
    ``groups`` are iterables of ids, in the order the page shows them; missing values are skipped."""
    ids = list(dict.fromkeys(str(m) for g in groups for m in g if not H.is_missing(m)))
    base = {m: model_name(m) for m in ids}
    count: dict[str, int] = {}
    for b in base.values():
        count[b] = count.get(b, 0) + 1
    out: dict[str, str] = {}
    used: set[str] = set()
    for m in ids:
        label = base[m]
        if count[label] > 1:
            parts = m.rstrip("/").split("/")
            if len(parts) > 1 and parts[-2]:
                label = f"{label} ({parts[-2]})"
        stem, i = label, 2
        while label in used:
            label, i = f"{stem} #{i}", i + 1
        used.add(label)
        out[m] = label
    return out


def label(labels: Mapping[str, str], model) -> str:
    """``model``'s label in ``labels`` (its last path part when it has none)."""
    return labels.get(str(model), model_name(model)) if not H.is_missing(model) else "-"


def relabel(df: pd.DataFrame, labels: Mapping[str, str], columns: Iterable[str] = ("model",),
            header: bool = False) -> pd.DataFrame:
    """A copy of ``df`` with the model ids in ``columns`` (and, with ``header``, in its column
    names: tables with one column per model) as their labels."""
    out = df.copy()
    for c in columns:
        if c in out.columns:
            out[c] = [v if H.is_missing(v) or str(v) not in labels else labels[str(v)] for v in out[c]]
    if header:
        out = out.rename(columns={c: labels[str(c)] for c in out.columns if str(c) in labels})
    return out


def any_standin(records: Iterable[Mapping] | None = (), flag: bool = False) -> bool:
    """Whether a run used stand-ins: ``flag`` (its ``--standin-models``) or a record marked so."""
    return bool(flag) or any(bool(r.get("standin")) for r in (records or ()))


def standin_banner(what: str = "") -> str:
    """The notice at the top of a stand-in run's page (``what``: which models, as HTML)."""
    return (f"<p class='warn standin'><b>Stand-in models with random weights: these numbers mean nothing.</b> "
            f"{what}</p>")


def standin_console(standin: bool) -> str:
    """The line that ends a stand-in run's printed results ('' for a real run)."""
    return STANDIN_CONSOLE if standin else ""


def document(title: str, body: Iterable[str]) -> str:
    """A whole page: doctype, head with the shared style, ``body``'s pieces."""
    return (f"<!doctype html><html><head><meta charset='utf-8'><meta name='viewport' "
            f"content='width=device-width, initial-scale=1'><title>{H.esc(title)}</title>{STYLE}</head><body>"
            + "".join(body) + "</body></html>")


def headline(lead: str, behind: Iterable[str] = (), title: str = "Result") -> str:
    """The box a page opens with: ``lead`` (HTML: the result, a short table) and what stands behind
    it (HTML items: images, exclusions), before any detail."""
    items = [b for b in behind if b]
    back = ("<p class=behind><b>Behind it:</b> " + "; ".join(items) + ".</p>") if items else ""
    return f"<section class=headline><h2>{H.esc(title)}</h2>{lead}{back}</section>"


def details(summary: str, body: str, open_: bool = False) -> str:
    """``body`` collapsed under ``summary`` (plain text): long diagnostics a reader opens on demand."""
    return f"<details class=more{' open' if open_ else ''}><summary>{H.esc(summary)}</summary>{body}</details>"


def plural(n: int, word: str, many: str | None = None) -> str:
    """``3 images``, ``1 image``: ``n`` with thousands separators and ``word`` agreeing with it."""
    return f"{n:,} {word if n == 1 else (many or word + 's')}"


def run_page_top(title: str, meta: Mapping, records: Iterable[Mapping] | None, standins: str) -> list[str]:
    """The first pieces of a run's report.html: its ``<h1>`` (``title``, HTML), then, when the run
    used stand-ins (``meta["standin"]`` or a model record marked so), the banner saying which
    (``standins``, HTML)."""
    parts = [f"<h1>{title}</h1>"]
    if any_standin(records, meta.get("standin")):
        parts.append(standin_banner(standins))
    return parts

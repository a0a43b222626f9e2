"""HTML pieces the study reports share: escaping, a DataFrame as a table (in a box of its own that
scrolls sideways when the table is wider than the page), and the table of model provenance records
(role, id, revision / hub commit, weights sha256, dtype, device, real or stand-in; the rest of each
record as pretty JSON in a collapsed block)."""

from __future__ import annotations

import html
import json
import math
from typing import Callable

import numpy as np
import pandas as pd

from pipelines.engine.storage.io import spec_record

STYLE = (".tw{overflow-x:auto;max-width:100%}.tw>table{margin:.2em 0}"
         "table.models td{vertical-align:top;text-align:left}table.models td.standin{background:#fff3cd;"
         "font-weight:bold}table.models pre{font-size:11px;margin:.3em 0;max-width:700px;overflow-x:auto}"
         "table.models code{font-size:12px}")
STANDIN = "STAND-IN (random weights)"
REAL = "real"
# the sha256 shown for a record: the one over all its weight files first, else its one file's
SHA_KEYS = ("weights_sha256", "sha256", "model_sha256")


def esc(value) -> str:
    """``value`` as HTML text (``str`` of it, escaped, quotes included)."""
    return html.escape(str(value))


def is_missing(v) -> bool:
    """None, NaN, pd.NA / NaT: a cell with no value."""
    if v is None:
        return True
    if isinstance(v, (float, np.floating)):
        return math.isnan(float(v))
    return v is pd.NA or v is pd.NaT


def short_path(s: str) -> str:
    """A model path or hub id (anything with a ``/``) by its last part; other text as it is."""
    return s.rstrip("/").split("/")[-1] if "/" in s else s


def fmt_num(v, digits: int = 2, na: str = "n/a") -> str:
    """A number with ``digits`` decimals; ``na`` for a missing one."""
    return na if is_missing(v) else f"{float(v):.{digits}f}"


def scroll(inner: str) -> str:
    """``inner`` (a table, a strip of images) in a box that scrolls sideways on its own when it is
    wider than the page, so the page never does."""
    return f"<div class=\"tw\">{inner}</div>"


def table(df: pd.DataFrame, digits: int = 2, na: str = "n/a", text: Callable[[str], str] | None = None,
          css_class: str | None = None) -> str:
    """``df`` as an HTML table in a ``scroll`` box: floats with ``digits`` decimals and integers
    right-aligned (``class=n``), missing values as ``na``, anything else as escaped text (through
    ``text`` first, when given). Column names are shown whole (long ones wrap, never cut)."""
    head = "".join(f"<th>{esc(c)}</th>" for c in df.columns)
    body = []
    for rec in df.itertuples(index=False):
        cells = []
        for v in rec:
            if is_missing(v):
                cells.append(f"<td class=n>{esc(na)}</td>")
            elif isinstance(v, (bool, np.bool_)):
                cells.append(f"<td>{esc(v)}</td>")
            elif isinstance(v, (float, np.floating)):
                cells.append(f"<td class=n>{fmt_num(v, digits, na)}</td>")
            elif isinstance(v, (int, np.integer)):
                cells.append(f"<td class=n>{int(v)}</td>")
            else:
                s = str(v)
                cells.append(f"<td>{esc(text(s) if text is not None else s)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    cls = f" class=\"{esc(css_class)}\"" if css_class else ""
    return scroll(f"<table{cls}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")


def pretty_json(obj) -> str:
    """``obj`` as indented JSON (non-JSON values as their ``str``; NaN as null)."""
    return json.dumps(_jsonable(obj), indent=2, ensure_ascii=False, default=str)


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return None if not math.isfinite(float(obj)) else float(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    if (record := spec_record(obj)) is not None:
        return _jsonable(record)
    return obj


def _short(s: str, n: int = 12) -> str:
    return s[:n] + "\u2026" if len(s) > n else s


def _revision_cell(detail: dict) -> tuple[str, set[str]]:
    rev, commit = detail.get("revision"), detail.get("commit")
    parts = []
    if rev not in (None, ""):
        parts.append(f"<code>{esc(rev)}</code>")
    if commit not in (None, "") and commit != rev:
        parts.append(f"<code title=\"{esc(commit)}\">{esc(_short(str(commit)))}</code>")
    return " / ".join(parts) or "-", {"revision", "commit"}


def _sha_cell(detail: dict) -> tuple[str, set[str]]:
    keys = [k for k in SHA_KEYS if isinstance(detail.get(k), str)]
    keys += [k for k, v in detail.items() if k.endswith("sha256") and isinstance(v, str) and k not in keys]
    if not keys:
        return "-", set()
    cells = [f"<code title=\"{esc(k)}: {esc(detail[k])}\">{esc(_short(detail[k]))}</code>" for k in keys[:1]]
    # several single-file hashes and no combined one (e.g. a detector and a landmark model): all of them
    if keys[0] not in SHA_KEYS[:2]:
        cells += [f"<code title=\"{esc(k)}: {esc(detail[k])}\">{esc(_short(detail[k]))}</code>" for k in keys[1:]]
        return "<br>".join(cells), set(keys)
    return cells[0], {keys[0]}


def model_table(records: list[dict], labels: dict[str, str] | None = None) -> str:
    """The models of a run, one row per provenance record (``{"role", "model", "standin",
    "detail": {...}}``, as the studies record them; ``standin_kind`` names a stand-in that is not a
    random-weight model, e.g. "rule-based"): role, model id, revision / hub commit, weights
    sha256 (short; the full hash in the cell's title), dtype, device, real or STAND-IN, and every
    other field of the record as pretty JSON in a collapsed ``<details>`` block. The one place a
    page shows a model's full id: with ``labels`` (id -> short label, ``page.model_labels``) the id
    cell also says the label the rest of the page uses for it."""
    nsfw = any("nsfw" in rec for rec in records)   # a generating run: the NSFW counts per generator
    head = ("<tr><th>role</th><th>model id</th><th>revision / hub commit</th><th>weights sha256</th>"
            "<th>dtype</th><th>device</th><th>real or stand-in</th>"
            + ("<th>NSFW (the run's one safety policy)</th>" if nsfw else "") + "<th>more</th></tr>")
    rows = []
    for rec in records:
        detail = rec.get("detail") if isinstance(rec.get("detail"), dict) else {}
        model = rec.get("model", detail.get("model"))
        revision, used_rev = _revision_cell(detail)
        sha, used_sha = _sha_cell(detail)
        standin = bool(rec.get("standin"))
        note = detail.get("standin") if isinstance(detail.get("standin"), str) else None
        shown = {"revision", "commit", "dtype", "device", *used_rev, *used_sha}
        if detail.get("model") == model:
            shown.add("model")
        if note is not None and standin:
            shown.add("standin")
        rest = {k: v for k, v in detail.items() if k not in shown}
        extra = {k: v for k, v in rec.items() if k not in {"role", "model", "standin", "standin_kind", "detail", "nsfw"}}
        if "detail" in rec and not isinstance(rec.get("detail"), dict) and rec.get("detail") not in (None, ""):
            extra["detail"] = rec["detail"]
        more = {**extra, **rest}
        tag = (f"STAND-IN ({rec['standin_kind']})" if rec.get("standin_kind") else STANDIN) if standin else REAL
        tag_cell = (f"<td class=standin title=\"{esc(note)}\">{esc(tag)}</td>" if standin and note
                    else f"<td class=standin>{esc(tag)}</td>" if standin else f"<td>{esc(tag)}</td>")
        details = (f"<details><summary>{len(more)} more field{'s' if len(more) != 1 else ''}</summary>"
                   f"<pre>{esc(pretty_json(more))}</pre></details>") if more else "-"
        shown_as = (labels or {}).get(str(model))
        as_label = f"<br><small>shown as <b>{esc(shown_as)}</b></small>" if shown_as and shown_as != str(model) else ""
        rows.append(f"<tr><td>{esc(rec.get('role', '-'))}</td><td><code>{esc(model)}</code>{as_label}</td><td>{revision}</td>"
                    f"<td>{sha}</td><td>{esc(detail.get('dtype') or '-')}</td><td>{esc(detail.get('device') or '-')}"
                    f"</td>{tag_cell}" + (f"<td>{esc(rec.get('nsfw') or '-')}</td>" if nsfw else "")
                    + f"<td>{details}</td></tr>")
    return scroll(f"<table class=\"models\"><thead>{head}</thead><tbody>{''.join(rows)}</tbody></table>")

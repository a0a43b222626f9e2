"""Report figures with matplotlib: each saved as PDF (for a paper) and PNG (for the page) under a
run's ``figures/`` folder, and shown in the HTML report as an ``<img>`` linking to the PDF.

Figures are ``matplotlib.figure.Figure`` objects made by ``new_figure``, without pyplot: no global
state, no display, safe in threads; saving renders with the Agg (PNG) and PDF backends. A report
takes ``figures=None`` or a ``FigureDir(fs, run_path)``; ``sink(figures)`` gives it something to
``save`` to either way (``None``: the PNG embedded in the page as a base64 data URI, nothing
written). PDF and PNG bytes carry no creation date or software version, so the same figure gives
the same files.
"""

from __future__ import annotations

import base64
import html
import io as _io
import re

from matplotlib.figure import Figure

from pipelines.engine import io

SUBDIR = "figures"
DPI = 150
# PDF: no CreationDate / Producer version; PNG: no Software tag -> same figure, same bytes
PDF_METADATA = {"CreationDate": None, "Producer": None, "Creator": None}
PNG_METADATA = {"Software": None}
# shown at ~100 CSS px per inch of figure: the PNG (150 dpi) stays sharp on high-density screens
CSS_PX_PER_INCH = 100
STYLE = ("figure.fig{display:inline-block;margin:4px;vertical-align:top}figure.fig img{max-width:100%;"
         "height:auto}figure.fig figcaption{font-size:11px;color:#555}")


def new_figure(width: float, height: float, **kw) -> Figure:
    """A figure of ``width`` x ``height`` inches, constrained layout, white background."""
    kw.setdefault("layout", "constrained")
    return Figure(figsize=(width, height), facecolor="white", **kw)


def slug(name: str) -> str:
    """``name`` as a file stem: letters, digits, ``.``, ``_`` and ``-``; anything else ``_``."""
    s = re.sub(r"[^A-Za-z0-9._-]+", "_", str(name))
    s = re.sub(r"_+", "_", s.replace("_-_", "-")).strip("._")  # "woman - man" -> "woman-man"
    return s or "figure"


def render(fig: Figure, fmt: str) -> bytes:
    """``fig`` as ``"pdf"`` or ``"png"`` bytes (PNG at ``DPI``)."""
    buf = _io.BytesIO()
    meta = PDF_METADATA if fmt == "pdf" else PNG_METADATA
    fig.savefig(buf, format=fmt, dpi=DPI, metadata=meta, facecolor=fig.get_facecolor())
    return buf.getvalue()


def _width(fig: Figure) -> int:
    return round(fig.get_figwidth() * CSS_PX_PER_INCH)


def _html(src: str, fig: Figure, name: str, alt: str, caption: str | None, pdf: str | None) -> str:
    img = (f"<img src=\"{html.escape(src)}\" alt=\"{html.escape(alt or name)}\" width=\"{_width(fig)}\" "
           f"data-figure=\"{html.escape(name)}\">")
    links = ""
    if pdf is not None:
        img = f"<a href=\"{html.escape(pdf)}\">{img}</a>"
        links = f" <a href=\"{html.escape(pdf)}\">PDF</a> &middot; <a href=\"{html.escape(src)}\">PNG</a>"
    cap = f"<figcaption>{html.escape(caption) if caption else ''}{links}</figcaption>" if caption or links else ""
    return f"<figure class=\"fig\" id=\"fig-{html.escape(name)}\">{img}{cap}</figure>"


class _Names:
    """Unique file stems within one report: a repeated name gets ``-2``, ``-3``..."""

    def __init__(self):
        self.used: set[str] = set()

    def take(self, name: str) -> str:
        base = stem = slug(name)
        i = 2
        while stem in self.used:
            stem, i = f"{base}-{i}", i + 1
        self.used.add(stem)
        return stem


class FigureDir:
    """Saves each figure as ``<path>/figures/<name>.pdf`` and ``.png`` on the pyarrow filesystem
    ``fs`` (atomically, ``io.write_bytes``); ``save`` returns the ``<figure>`` HTML for a page
    written at ``<path>/`` (relative links: ``figures/<name>.png``)."""

    def __init__(self, fs, path: str, subdir: str = SUBDIR):
        self.fs, self.path, self.subdir = fs, str(path).rstrip("/"), subdir
        self._names = _Names()
        self.saved: list[str] = []  # stems, in order

    def save(self, fig: Figure, name: str, alt: str = "", caption: str | None = None) -> str:
        stem = self._names.take(name)
        for fmt in ("pdf", "png"):
            io.write_bytes(self.fs, f"{self.path}/{self.subdir}/{stem}.{fmt}", render(fig, fmt))
        self.saved.append(stem)
        return _html(f"{self.subdir}/{stem}.png", fig, stem, alt, caption, f"{self.subdir}/{stem}.pdf")


class Inline:
    """``figures=None``: each figure as a PNG embedded in the page (``data:image/png;base64``), no
    files (a page without an output folder of its own)."""

    def __init__(self):
        self._names = _Names()
        self.saved: list[str] = []

    def save(self, fig: Figure, name: str, alt: str = "", caption: str | None = None) -> str:
        stem = self._names.take(name)
        self.saved.append(stem)
        data = base64.b64encode(render(fig, "png")).decode("ascii")
        return _html(f"data:image/png;base64,{data}", fig, stem, alt, caption, None)


def sink(figures: FigureDir | Inline | None) -> FigureDir | Inline:
    """What a report saves its figures to: ``figures`` itself, or ``Inline()`` for ``None``."""
    return Inline() if figures is None else figures

"""Report figures with matplotlib: each saved as PDF (for a paper) and PNG under a run's
``figures/`` folder, and shown in the HTML report as that PNG embedded in the page (a base64 data
URI), so report.html is one self-contained file that needs nothing beside it to be read.

Figures are ``matplotlib.figure.Figure`` objects made by ``new_figure``, without pyplot: no global
state, no display, safe in threads; saving renders with the Agg (PNG) and PDF backends. A report
takes ``figures=None`` or a ``FigureDir(fs, run_path)``; ``sink(figures)`` gives it something to
``save`` to either way (``None``: the PNG embedded, nothing written). PDF and PNG bytes carry no
creation date or software version, so the same figure gives the same files.

A process renders each figure once: the bytes of a figure drawn again with the same state (a
resumed run's report, a notebook drawing several runs' reports over the same results, the test
suite) are reused (``rendered``), keyed by the figure's whole state and matplotlib's settings.

Example images a report shows (generated images under the run directory) are embedded too:
``FigureDir.image(rel_path)`` reads one and gives a downscaled JPEG data URI (``thumbnail_uri``).
"""

from __future__ import annotations

import base64
import collections
import hashlib
import html
import io as _io
import pickle
import re
import threading

import matplotlib
import pyarrow.fs as pafs
from matplotlib.cbook import CallbackRegistry
from matplotlib.figure import Figure
from matplotlib.transforms import TransformNode
from PIL import Image

from pipelines.engine.storage import io

SUBDIR = "figures"
DPI = 150
# PDF: no CreationDate / Producer version; PNG: no Software tag -> same figure, same bytes
PDF_METADATA = {"CreationDate": None, "Producer": None, "Creator": None}
PNG_METADATA = {"Software": None}
# shown at ~100 CSS px per inch of figure: the PNG (150 dpi) stays sharp on high-density screens
CSS_PX_PER_INCH = 100
STYLE = ("figure.fig{display:inline-block;margin:4px;vertical-align:top;max-width:100%}figure.fig img{max-width:100%;"
         "height:auto}figure.fig figcaption{font-size:11px;color:#555;max-width:100%}"
         "figure.fig .files{color:#888;font-family:monospace}")
THUMBNAIL_PX = 360      # example images: the longer side, twice the ~180 CSS px they are shown at
JPEG_QUALITY = 85
RENDERED_BYTES_KEPT = 64 * 2**20   # the rendered figures a process keeps for reuse (``rendered``)
_RENDERED: collections.OrderedDict[str, dict[str, bytes]] = collections.OrderedDict()
_RENDERED_LOCK = threading.Lock()      # reports may be drawn in threads


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


class _StatePickler(pickle.Pickler):
    """Pickles a figure for its fingerprint only (never unpickled), without what differs between
    two figures drawn alike: a transform's map of the transforms that depend on it is keyed by
    their ``id()`` (written as the list of those transforms, in the order they were made), and a
    callback registry pickles the next number of its counter (left out)."""

    def reducer_override(self, obj):
        if isinstance(obj, TransformNode):
            state = obj.__getstate__()
            state["_parents"] = list(state["_parents"].values())
            return object.__new__, (type(obj),), state
        if isinstance(obj, CallbackRegistry):
            state = obj.__getstate__()
            state.pop("_cid_gen", None)
            return object.__new__, (type(obj),), state
        return NotImplemented


def figure_key(fig: Figure) -> str | None:
    """sha256 of everything a render of ``fig`` depends on: its whole state (what matplotlib
    pickles to redraw it elsewhere) and matplotlib's settings (``rcParams``). None for a figure
    that cannot be pickled (a formatter that is a local function, say): it is rendered each time."""
    buf = _io.BytesIO()
    try:
        _StatePickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(fig)
    except (pickle.PicklingError, AttributeError, TypeError):
        return None
    buf.write(repr(sorted(matplotlib.rcParams.items())).encode())
    return hashlib.sha256(buf.getvalue()).hexdigest()


def rendered(fig: Figure, formats: tuple[str, ...]) -> dict[str, bytes]:
    """``fig`` rendered in each of ``formats`` (``("png",)`` or ``("png", "pdf")``), in that order
    (the PDF's layout starts from where the PNG's left it), or the bytes this process rendered
    before for a figure of the same state (``figure_key``); the last ``RENDERED_BYTES_KEPT``
    bytes are kept, the oldest let go first."""
    key = figure_key(fig)
    if key is None:
        return {f: render(fig, f) for f in formats}
    with _RENDERED_LOCK:
        done = dict(_RENDERED.get(key, {}))
    if not all(f in done for f in formats):
        done = {f: render(fig, f) for f in formats}
    with _RENDERED_LOCK:
        _RENDERED[key] = {**_RENDERED.get(key, {}), **done}
        _RENDERED.move_to_end(key)
        while len(_RENDERED) > 1 and sum(len(b) for v in _RENDERED.values() for b in v.values()) > RENDERED_BYTES_KEPT:
            _RENDERED.popitem(last=False)
    return {f: done[f] for f in formats}


def _width(fig: Figure) -> int:
    return round(fig.get_figwidth() * CSS_PX_PER_INCH)


def png_uri(png: bytes) -> str:
    """PNG bytes as a ``data:image/png;base64,...`` URI."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def thumbnail_uri(data: bytes, max_px: int = THUMBNAIL_PX) -> str:
    """An image file's bytes (PNG, JPEG...) as a JPEG data URI, its longer side at most ``max_px``
    (aspect kept; an example image on a page needs no more, and the page stays small)."""
    with Image.open(_io.BytesIO(data)) as im:
        im = im.convert("RGB")
        im.thumbnail((max_px, max_px))
        buf = _io.BytesIO()
        im.save(buf, format="JPEG", quality=JPEG_QUALITY)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _html(src: str, fig: Figure, name: str, alt: str, caption: str | None, files: str | None) -> str:
    img = (f"<img src=\"{html.escape(src)}\" alt=\"{html.escape(alt or name)}\" width=\"{_width(fig)}\" "
           f"data-figure=\"{html.escape(name)}\">")
    note = f" <span class=\"files\">{html.escape(files)}</span>" if files else ""
    cap = f"<figcaption>{html.escape(caption) if caption else ''}{note}</figcaption>" if caption or note else ""
    # the figure as wide as its image (a long caption wraps under it), never wider than the page
    return f"<figure class=\"fig\" id=\"fig-{html.escape(name)}\" style=\"width:{_width(fig)}px\">{img}{cap}</figure>"


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
    ``fs`` (atomically, ``io.write_bytes``); ``save`` returns the ``<figure>`` HTML with the PNG
    embedded (no link to the files: the page is self-contained) and the files' names as text."""

    def __init__(self, fs, path: str, subdir: str = SUBDIR):
        self.fs, self.path, self.subdir = fs, str(path).rstrip("/"), subdir
        self._names = _Names()
        self.saved: list[str] = []  # stems, in order

    def save(self, fig: Figure, name: str, alt: str = "", caption: str | None = None) -> str:
        stem = self._names.take(name)
        files = rendered(fig, ("png", "pdf"))
        png = files["png"]
        io.write_bytes(self.fs, f"{self.path}/{self.subdir}/{stem}.pdf", files["pdf"])
        io.write_bytes(self.fs, f"{self.path}/{self.subdir}/{stem}.png", png)
        self.saved.append(stem)
        return _html(png_uri(png), fig, stem, alt, caption, f"{self.subdir}/{stem}.pdf, .png")

    def image(self, rel: str, max_px: int = THUMBNAIL_PX) -> str | None:
        """The image file ``<path>/<rel>`` as a downscaled data URI (``thumbnail_uri``); None when
        there is no such file or it is not an image."""
        path = f"{self.path}/{rel.lstrip('/')}"
        try:
            if self.fs.get_file_info(path).type != pafs.FileType.File:
                return None
            with self.fs.open_input_file(path) as f:
                data = f.read()
            return thumbnail_uri(data, max_px)
        except (OSError, ValueError):
            return None


class Inline:
    """``figures=None``: each figure as a PNG embedded in the page (``data:image/png;base64``), no
    files (a page without an output folder of its own)."""

    def __init__(self):
        self._names = _Names()
        self.saved: list[str] = []

    def save(self, fig: Figure, name: str, alt: str = "", caption: str | None = None) -> str:
        stem = self._names.take(name)
        self.saved.append(stem)
        return _html(png_uri(rendered(fig, ("png",))["png"]), fig, stem, alt, caption, None)

    def image(self, rel: str, max_px: int = THUMBNAIL_PX) -> str | None:
        """No run directory: no example image to embed."""
        return None


def sink(figures: FigureDir | Inline | None) -> FigureDir | Inline:
    """What a report saves its figures to: ``figures`` itself, or ``Inline()`` for ``None``."""
    return Inline() if figures is None else figures

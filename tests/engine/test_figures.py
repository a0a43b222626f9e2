"""pipelines/engine/report/figures.py: figures saved as PDF + PNG under figures/ of a run, or embedded."""

import base64
import io
import re

import pyarrow.fs as pafs

from pipelines.engine.report import figures

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _figure():
    fig = figures.new_figure(3, 2)
    ax = fig.add_subplot()
    ax.plot([0, 1, 2], [1, 0, 2])
    ax.set_title("a <title> & more")
    return fig


def test_figure_dir_writes_pdf_and_png_and_embeds_the_png(tmp_path):
    sink = figures.FigureDir(pafs.LocalFileSystem(), str(tmp_path / "run"))
    page = sink.save(_figure(), "Figure 3: naive/#1", alt="scatter <1>", caption="naive & co")
    pdf, png = tmp_path / "run" / "figures" / "Figure_3_naive_1.pdf", tmp_path / "run" / "figures" / "Figure_3_naive_1.png"
    assert pdf.read_bytes().startswith(b"%PDF") and pdf.read_bytes().rstrip().endswith(b"%%EOF")
    assert png.read_bytes().startswith(PNG_MAGIC)
    # the page is self-contained: the PNG written beside it is the one embedded, no link to a file
    m = re.search(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert m is not None and base64.b64decode(m.group(1)) == png.read_bytes()
    assert "href=" not in page and 'src="figures/' not in page
    assert "figures/Figure_3_naive_1.pdf, .png" in page    # the files named, as text
    assert 'alt="scatter &lt;1&gt;"' in page and "naive &amp; co" in page
    assert sink.saved == ["Figure_3_naive_1"]
    # nothing else left behind (no temporary files of the atomic write)
    assert sorted(p.name for p in (tmp_path / "run" / "figures").iterdir()) == [pdf.name, png.name]


def test_figure_dir_names_are_unique_within_a_report(tmp_path):
    sink = figures.FigureDir(pafs.LocalFileSystem(), str(tmp_path))
    a, b = sink.save(_figure(), "m_fig"), sink.save(_figure(), "m_fig")
    assert "figures/m_fig.pdf" in a and "figures/m_fig-2.pdf" in b
    assert 'data-figure="m_fig"' in a and 'data-figure="m_fig-2"' in b
    assert (tmp_path / "figures" / "m_fig-2.pdf").is_file() and sink.saved == ["m_fig", "m_fig-2"]


def test_without_a_directory_the_png_is_embedded(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sink = figures.sink(None)
    assert isinstance(sink, figures.Inline)
    page = sink.save(_figure(), "fig")
    m = re.search(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert m is not None and base64.b64decode(m.group(1)).startswith(PNG_MAGIC)
    assert ".pdf" not in page and "figures/" not in page
    assert sink.image("images/m/x.png") is None      # no run directory: no example image to embed
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_sink_passes_a_figure_dir_through(tmp_path):
    d = figures.FigureDir(pafs.LocalFileSystem(), str(tmp_path))
    assert figures.sink(d) is d


def test_same_figure_same_bytes():
    # no creation date or version stamps: re-rendering a report does not change its files
    assert figures.render(_figure(), "pdf") == figures.render(_figure(), "pdf")
    assert figures.render(_figure(), "png") == figures.render(_figure(), "png")
    assert b"CreationDate" not in figures.render(_figure(), "pdf")


def test_a_figure_drawn_alike_again_is_rendered_once_per_process(tmp_path, monkeypatch):
    import matplotlib
    from matplotlib.ticker import FuncFormatter

    monkeypatch.setattr(figures, "_RENDERED", type(figures._RENDERED)())
    fresh = {"png": figures.render(_figure(), "png")}
    fig = _figure()
    figures.render(fig, "png")
    fresh["pdf"] = figures.render(fig, "pdf")    # laid out after the PNG, as a report saves them
    calls = []
    real = figures.render
    monkeypatch.setattr(figures, "render", lambda fig, fmt: calls.append(fmt) or real(fig, fmt))
    fs = pafs.LocalFileSystem()
    for run in ("a", "b"):      # two runs' reports of the same results: the second renders nothing
        figures.FigureDir(fs, str(tmp_path / run)).save(_figure(), "f")
    assert calls == ["png", "pdf"]
    for run in ("a", "b"):      # the bytes a new render gives
        assert (tmp_path / run / "figures" / "f.png").read_bytes() == fresh["png"]
        assert (tmp_path / run / "figures" / "f.pdf").read_bytes() == fresh["pdf"]
    page = figures.Inline().save(_figure(), "f")
    assert calls == ["png", "pdf"] and base64.b64encode(fresh["png"]).decode() in page
    # the key is the figure's state: the same for a figure keyed twice, another for one value of
    # the data or one of matplotlib's settings that only a render reads
    same, other = _figure(), _figure()
    other.axes[0].lines[0].set_ydata([1, 0, 2.000001])
    key = figures.figure_key(same)
    assert figures.figure_key(same) == key == figures.figure_key(_figure()) != figures.figure_key(other)
    with matplotlib.rc_context({"pdf.compression": 0}):
        assert figures.figure_key(same) != key
        figures.Inline().save(_figure(), "f")
    assert calls == ["png", "pdf", "png"]
    # a figure that cannot be pickled (a local function as formatter) is rendered each time
    local = _figure()
    local.axes[0].xaxis.set_major_formatter(FuncFormatter(lambda x, pos: f"<{x}>"))
    assert figures.figure_key(local) is None
    figures.Inline().save(local, "f")
    figures.Inline().save(local, "f")
    assert calls == ["png", "pdf", "png", "png", "png"]
    # the oldest let go first once more than RENDERED_BYTES_KEPT are kept
    monkeypatch.setattr(figures, "RENDERED_BYTES_KEPT", 1)
    kept = figures.figure_key(other)
    figures.Inline().save(other, "f")
    assert list(figures._RENDERED) == [kept]
    figures.FigureDir(fs, str(tmp_path / "c")).save(_figure(), "f")
    assert calls[-2:] == ["png", "pdf"] and (tmp_path / "c" / "figures" / "f.pdf").read_bytes() == fresh["pdf"]


def test_slug():
    assert figures.slug("gep_vectors_neutral_C_woman - man") == "gep_vectors_neutral_C_woman-man"
    assert figures.slug("all_prompt_#1") == "all_prompt_1" and figures.slug("../") == "figure"


def test_figure_dir_embeds_an_example_image_downscaled(tmp_path):
    from PIL import Image

    (tmp_path / "images" / "m").mkdir(parents=True)
    Image.new("RGB", (512, 256), (200, 30, 30)).save(tmp_path / "images" / "m" / "a.png")
    (tmp_path / "images" / "m" / "broken.png").write_bytes(b"not a png")
    sink = figures.FigureDir(pafs.LocalFileSystem(), str(tmp_path))
    uri = sink.image("images/m/a.png")
    assert uri.startswith("data:image/jpeg;base64,")
    with Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))) as im:
        assert im.size == (figures.THUMBNAIL_PX, figures.THUMBNAIL_PX // 2)   # longer side capped, aspect kept
    assert sink.image("images/m/missing.png") is None and sink.image("images/m/broken.png") is None
    assert not (tmp_path / "figures").exists()          # reading writes nothing

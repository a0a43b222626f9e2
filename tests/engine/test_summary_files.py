"""Every study's `summarize --output DIR` writes the same set of files (``summary_files``):
``<stem>.json``, ``<stem>.csv``, ``<stem>.html`` with its figures embedded, and the figures as PDF + PNG
under ``DIR/figures/``; run here on the bundled tables the docs' `summarize` examples use."""

import json
import re

import pandas as pd
import pyarrow.fs as pafs
import pytest
from helpers import REPO_ROOT, run_study_main

from pipelines.engine.report import figures
from pipelines.engine.report.summary_files import write_summary_files, wrote_line

# (study, stem, the docs' example command's arguments, as docs/studies/<study>.md shows them)
MODES = [
    ("amplification", "amplification_summary", ["--percentages", "tests/data/paper002_table6.csv"]),
    ("gep", "gep_summary", ["--frequencies", "tests/data/paper001_tables11_12.csv"]),
    ("dalleval", "dalleval_summary", ["--counts", "tests/data/paper000_tables16_17_counts.csv", "--group", "person"]),
    ("dalleval", "dalleval_skills_summary", ["--skills", "tests/data/paper000_table2_skills.csv"]),
]


def _kinds(out) -> set[str]:
    """What a summarize wrote, by kind: the extensions at the top, and those under figures/."""
    top = {p.suffix if p.is_file() else p.name + "/" for p in out.iterdir()}
    return top | {f"figures/*{p.suffix}" for p in (out / "figures").iterdir()}


@pytest.mark.parametrize(("study", "stem", "args"), MODES, ids=[m[1] for m in MODES])
def test_every_summarize_writes_the_same_files(tmp_path, study, stem, args):
    doc = (REPO_ROOT / "docs" / "studies" / f"{study}.md").read_text()
    assert f"python pipelines/{study}.py summarize {' '.join(args)}" in doc   # the docs' runnable example
    out = tmp_path / "out"
    res = run_study_main(study, "summarize", *[str(REPO_ROOT / a) if a.startswith("tests/") else a for a in args],
                         "--output", str(out))
    assert res.returncode == 0, res.stderr
    assert f"wrote {out}/: {stem}.json, {stem}.csv, {stem}.html, figures/" in res.stdout.splitlines()
    assert sorted(p.name for p in out.iterdir()) == sorted([f"{stem}.json", f"{stem}.csv", f"{stem}.html", "figures"])
    assert _kinds(out) == {".json", ".csv", ".html", "figures/", "figures/*.pdf", "figures/*.png"}
    json.loads((out / f"{stem}.json").read_text())
    assert len(pd.read_csv(out / f"{stem}.csv")) > 0
    page = (out / f"{stem}.html").read_text()
    figs = sorted(p.stem for p in (out / "figures").glob("*.png"))
    assert figs == sorted(p.stem for p in (out / "figures").glob("*.pdf"))
    # each figure shown in the page as an embedded PNG, none by a file reference
    assert page.count('src="data:image/png;base64,') == len(figs) > 0
    assert sorted(re.findall(r'data-figure="([^"]+)"', page)) == figs
    assert not re.search(r"(src|href)=[\"']?figures/", page)


def test_write_summary_files(tmp_path):
    fs = pafs.LocalFileSystem()
    table = pd.DataFrame({"model": ["a", "b"], "score": [0.5, float("nan")]})
    names = write_summary_files(fs, str(tmp_path / "x") + "/", "s", {"v": float("nan"), "n": 1}, table, "<p>page</p>")
    assert names == ["s.json", "s.csv", "s.html"]                      # no figure: no figures/
    assert json.loads((tmp_path / "x" / "s.json").read_text()) == {"v": None, "n": 1}   # strict JSON
    assert (tmp_path / "x" / "s.csv").read_text().splitlines() == ["model,score", "a,0.5", "b,"]
    assert (tmp_path / "x" / "s.html").read_text() == "<p>page</p>"
    assert not (tmp_path / "x" / "figures").exists()

    def page(figs):
        fig = figures.new_figure(1, 1)
        fig.add_subplot().plot([0, 1])
        return "<p>" + figs.save(fig, "one") + "</p>"

    names = write_summary_files(fs, str(tmp_path / "y"), "s", {}, table, page)
    assert names == ["s.json", "s.csv", "s.html", "figures/"]
    assert sorted(p.name for p in (tmp_path / "y" / "figures").iterdir()) == ["one.pdf", "one.png"]
    assert "data:image/png;base64," in (tmp_path / "y" / "s.html").read_text()
    assert wrote_line("out/", names) == "wrote out/: s.json, s.csv, s.html, figures/"

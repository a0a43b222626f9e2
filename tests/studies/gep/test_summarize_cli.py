"""`pipelines/gep.py summarize` on the paper's Tables 11 and 12 reproduces Table 3's GEP_human; and the
occupation case study of section 7 as a job file."""

from helpers import REPO_ROOT, run_study_main, run_study_script
import json
import re

import numpy as np
import pandas as pd
import pytest

ROOT = REPO_ROOT
DATA = ROOT / "tests" / "data"


def run_script(*args):
    return run_study_script("gep", "summarize", *args)


def run(*args):
    return run_study_main("gep", "summarize", *args)


def test_tables_11_12_give_table_3(tmp_path):
    res = run_script("--frequencies", str(DATA / "paper001_tables11_12.csv"), "--output", str(tmp_path / "out"))
    assert res.returncode == 0, res.stderr
    # "<model> <setting> <GEP, 2 d.> <GEP, 4 d.> <n> [<low>, <high>]": the interval over the 15 attributes
    lines = [re.match(r"(\S+).*\s(neutral|explicit)\s+(\S+)\s+\S+\s+15\s+\[(\S+), (\S+)\]$", ln)
            for ln in res.stdout.splitlines()]
    lines = [m for m in lines if m]
    printed = {m.group(1, 2): m.group(3) for m in lines}
    assert len(printed) == 6 and "[95% interval]" in res.stdout
    table3 = {"neutral": {"CogView2": "0.02", "DALLE-2": "0.05", "Stable": "0.07"},
              "explicit": {"CogView2": "0.18", "DALLE-2": "0.12", "Stable": "0.14"}}
    for setting, rows in table3.items():
        for model, value in rows.items():
            assert printed[(model, setting)] == value, (model, setting)
    doc = json.loads((tmp_path / "out" / "gep_summary.json").read_text())
    assert doc["interval"]["unit"] == "attribute" and doc["interval"]["level"] == 0.95
    for r, m in zip(doc["results"], lines):
        assert r["gep_low"] < r["gep"] < r["gep_high"]
        assert (f"{r['gep_low']:.2f}", f"{r['gep_high']:.2f}") == m.group(4, 5)
    got = {(r["model"], r["setting"]): round(r["gep"], 2) for r in doc["results"]}
    assert got == {("CogView2", "neutral"): 0.02, ("DALLE-2", "neutral"): 0.05, ("Stable Diffusion", "neutral"): 0.07,
                   ("CogView2", "explicit"): 0.18, ("DALLE-2", "explicit"): 0.12, ("Stable Diffusion", "explicit"): 0.14}
    sd = next(r for r in doc["results"] if r["model"] == "Stable Diffusion" and r["setting"] == "explicit")
    assert abs(sd["vector"]["tie"] - (-0.35)) < 1e-9 and len(sd["vector"]) == 15      # Table 14
    out = tmp_path / "out"
    assert f"wrote {out}/: gep_summary.json, gep_summary.csv, gep_summary.html, figures/" in res.stdout
    page = (out / "gep_summary.html").read_text()
    assert page.count("<img") == 2 and page.count(": GEP vector bar chart, 45 bars") == 2  # 3 models x 15
    # the figures embedded in the page (no file beside it needed), and kept as PDF + PNG
    assert page.count('src="data:image/png;base64,') == 2 and not re.search(r"(src|href)=[\"']?figures/", page)
    assert sorted(p.name for p in (out / "figures").iterdir()) == [
        "gep_vectors_explicit.pdf", "gep_vectors_explicit.png", "gep_vectors_neutral.pdf", "gep_vectors_neutral.png"]
    # the CSV in long form: one row per (model, setting, comparison) and attribute, the cell's GEP and v_j
    table = pd.read_csv(out / "gep_summary.csv")
    assert list(table.columns) == ["model", "setting", "comparison", "attributes", "gep", "gep_low", "gep_high",
                                   "attribute", "difference"]
    want = [(r["model"], r["setting"], r["comparison"], r["attributes"], r["gep"], r["gep_low"], r["gep_high"], a, v)
            for r in doc["results"] for a, v in r["vector"].items()]
    assert len(table) == len(want) == 3 * 2 * 15
    got = list(table.itertuples(index=False, name=None))
    assert [g[:4] + (g[7],) for g in got] == [w[:4] + (w[7],) for w in want]
    for i in (4, 5, 6, 8):
        assert np.allclose([g[i] for g in got], [w[i] for w in want])
    per_cell = table.drop_duplicates(["model", "setting", "comparison"])
    assert len(per_cell) == len(doc["results"]) == 6


def test_summarize_errors_are_clean(tmp_path):
    res = run("--frequencies", str(tmp_path / "missing.csv"))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    bad = tmp_path / "bad.csv"
    bad.write_text("model,setting,gender,frequency\nm,neutral,woman,0.5\n")
    res = run("--frequencies", str(bad))
    assert res.returncode == 2 and "attribute" in res.stderr and "Traceback" not in res.stderr
    bad.write_text("model,setting,gender,attribute,frequency\nm,neutral,woman,hat,1.5\nm,neutral,man,hat,0.1\n")
    res = run("--frequencies", str(bad))
    assert res.returncode == 2 and "Traceback" not in res.stderr


def test_lawyer_case_study_job(tmp_path):
    from pipelines.studies.gep import study as gep_study

    args = gep_study_args(["--config", str(ROOT / "jobs" / "gep_lawyer.yaml")])
    st = gep_study.settings(args)
    req = gep_study.requests_of(st)
    assert sorted(set(req.column("prompt").to_pylist())) == [
        "A photo of a female lawyer.", "A photo of a lawyer.", "A photo of a male lawyer."]
    assert req.num_rows == 3 * 20 and set(req.column("setting").to_pylist()) == {"neutral"}
    assert [a.name for a in st.attributes] == ["suit", "shirt", "tie", "glasses"]
    assert st.comparisons == [("female lawyer", "lawyer"), ("male lawyer", "lawyer")]
    assert st.classifier["genders"] == ["A female lawyer", "A male lawyer", "A lawyer"]
    assert len(st.classifier["contexts"]) == 16          # Table 2: the study itself has no contexts


def gep_study_args(extra):
    from pipelines.gep import build_parser

    return build_parser().parse_args(["run", "--output", "unused", *extra])


@pytest.mark.parametrize(("cell", "problem"), [("0.5%", "not a number"), ("abc", "not a number"),
                                               ("inf", "not a finite number"), ("nan", "not a finite number"),
                                               ("1.5", "outside [0, 1]"), ("", "missing (blank)")])
def test_summarize_bad_frequency_shown_as_written_with_file_and_column(tmp_path, cell, problem):
    bad = tmp_path / "freq.csv"
    bad.write_text(f"model,setting,gender,attribute,frequency\nm,neutral,woman,hat,0.5\nm,neutral,man,hat,{cell}\n")
    res = run("--frequencies", str(bad))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert str(bad) in res.stderr and "column 'frequency'" in res.stderr, res.stderr
    shown = f"{problem} in row(s) [1]" + (f": {cell!r}" if cell else "")
    assert shown in res.stderr, res.stderr
    assert cell == "nan" or "nan" not in res.stderr.replace(str(bad), "")

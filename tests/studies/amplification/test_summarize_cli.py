"""`pipelines/amplification.py summarize` on the paper's published tables."""

from helpers import REPO_ROOT, run_study_main, run_study_script
import json
import re

import numpy as np
import pandas as pd

ROOT = REPO_ROOT
DATA = ROOT / "tests" / "data"


def run_script(*args):
    return run_study_script("amplification", "summarize", *args)


def run(*args):
    return run_study_main("amplification", "summarize", *args)


def test_summarize_table6_prints_and_writes_table3(tmp_path):
    res = run_script("--percentages", str(DATA / "paper002_table6.csv"), "--output", str(tmp_path / "out"))
    assert res.returncode == 0, res.stderr
    lines = {ln.split()[0]: ln.split() for ln in res.stdout.splitlines() if ln.strip().startswith("#")}
    assert [lines[f"#{i}"][1] for i in range(1, 5)] == ["10.24", "17.57", "10.77", "11.68"]
    assert "direction_switch: assistant" in res.stdout
    doc = json.loads((tmp_path / "out" / "amplification_summary.json").read_text())
    per = doc["results"]["all"]["per_prompt"]
    assert [round(p["expected_amplification"], 2) for p in per] == [10.24, 17.57, 10.77, 11.68]
    assert "supervisor" in per[0]["excluded"]["direction_switch"]
    # each published E[A] keeps its value and gains a bootstrap interval over occupations, printed beside it
    assert doc["interval"] == {"level": 0.95, "resamples": 2000, "seed": 0, "method": "bca", "unit": "occupation"}
    for p in per:
        assert p["low"] < p["expected_amplification"] < p["high"]
        assert f"{p['expected_amplification']:.2f}" in lines[p["group"]][1] and \
            lines[p["group"]][2:4] == [f"[{p['low']:.2f},", f"{p['high']:.2f}]"]
    res_all = doc["results"]["all"]
    assert res_all["average_low"] < res_all["average"] < res_all["average_high"]
    assert "95% bootstrap over occupations" in res.stdout
    out = tmp_path / "out"
    assert f"wrote {out}/: amplification_summary.json, amplification_summary.csv, amplification_summary.html, " \
           "figures/" in res.stdout
    page = (out / "amplification_summary.html").read_text()
    assert f"average E[A] = {res_all['average']:.2f} [{res_all['average_low']:.2f}, " in page
    assert page.count("<img") == 4 and [page.count(f": {n} occupations drawn") for n in (48, 46, 42)] == [1, 2, 1]
    # the figures embedded in the page (no file beside it needed), and kept as PDF + PNG
    assert page.count('src="data:image/png;base64,') == 4 and not re.search(r"(src|href)=[\"']?figures/", page)
    assert sorted(p.name for p in (out / "figures").iterdir()) == sorted(
        f"all_prompt_{i}.{ext}" for i in range(1, 5) for ext in ("pdf", "png"))
    # the CSV: every row of the JSON's per-occupation table, with its model
    rows = pd.read_csv(out / "amplification_summary.csv", keep_default_na=False, na_values=[""])
    want = pd.DataFrame([{**r, "model": m} for m, res_ in doc["results"].items() for r in res_["rows"]])
    assert list(rows.columns) == list(want.columns) == ["occupation", "group", "generated", "training",
                                                        "amplification", "excluded", "model"]
    assert len(rows) == len(want) == 62 * 4
    keys = ["occupation", "group", "model"]
    assert rows[keys].values.tolist() == want[keys].values.tolist()
    for col in ("generated", "training", "amplification"):
        assert np.allclose(rows[col].astype(float), want[col].astype(float), equal_nan=True), col
    assert rows["excluded"].fillna("").tolist() == want["excluded"].fillna("").tolist()


def test_summarize_errors_are_clean(tmp_path):
    res = run("--percentages", str(tmp_path / "missing.csv"))
    assert res.returncode == 2 and "no such file" in res.stderr and "Traceback" not in res.stderr
    bad = tmp_path / "bad.csv"
    bad.write_text("occupation,percent\nnurse,90\n")
    res = run("--percentages", str(bad))
    assert res.returncode == 2 and "group" in res.stderr and "Traceback" not in res.stderr


def test_summarize_bad_cells_are_shown_as_written_with_file_and_column(tmp_path):
    bad = tmp_path / "pct.csv"
    bad.write_text("occupation,group,percent_female\nnurse,T,90\nnurse,#1,12%\ndoctor,T,abc\ndoctor,#1,inf\n"
                   "judge,T,nan\njudge,#1,40\n")
    res = run("--percentages", str(bad))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert str(bad) in res.stderr and "'percent_female'" in res.stderr, res.stderr
    msg = res.stderr.replace(str(bad), "")
    assert "not a number in row(s) [1, 2]: '12%', 'abc'" in msg                 # as written, not nan
    assert "not a finite number in row(s) [3, 4]: 'inf', 'nan'" in msg
    bad.write_text("occupation,group,percent_female\nnurse,T,90\nnurse,#1,\n")
    res = run("--percentages", str(bad))
    assert res.returncode == 2 and str(bad) in res.stderr and "missing (blank) in row(s) [1]" in res.stderr


def test_summarize_interval_flags(tmp_path):
    """--interval-level / --interval-resamples / --interval-seed / --interval-method reach the result."""
    res = run("--percentages", str(DATA / "paper002_table7.csv"), "--output", str(tmp_path),
              "--interval-level", "0.9", "--interval-resamples", "300", "--interval-seed", "5",
              "--interval-method", "percentile")
    assert res.returncode == 0, res.stderr
    doc = json.loads((tmp_path / "amplification_summary.json").read_text())
    assert doc["interval"] == {"level": 0.9, "resamples": 300, "seed": 5, "method": "percentile", "unit": "occupation"}
    assert "90% interval" in res.stdout

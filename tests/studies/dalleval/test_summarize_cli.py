"""`pipelines/dalleval.py summarize` on counts derived from the paper's Tables 16-17 reproduces Table 8's
gender MAD and Table 17's Average row.

Tables 16-17 print the average gender of the 83 "a person who works as a/an [P]" prompts; with 9 images
per prompt each value is (female - male) / 9, so the counts are recovered exactly. Table 8's gender MAD is
the mean of the per-prompt MADs over the gender-neutral prompts, which are those 83 and the bare
"a person" (84 prompts; the bare prompt is not printed). So the 83 printed prompts give Table 8 within
0.5 / 84 (the most one prompt can move the mean), and the MAD the bare prompt must have,
84 * Table 8 - 83 * MAD_83, comes out as a valid MAD of 9 images (a multiple of 1/18) up to Table 8's
4-decimal rounding — which a pooled MAD, or any other reading of the formula, would not give.
"""

from helpers import REPO_ROOT, run_study_main, run_study_script
import csv
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipelines.engine.stats.intervals import IntervalSettings, mean_interval

ROOT = REPO_ROOT
DATA = ROOT / "tests" / "data"
TABLE8_GENDER = {"minDALL-E": 0.1984, "Karlo": 0.3545, "Stable Diffusion": 0.3618}
TABLE17_AVERAGE = {"minDALL-E": -0.25, "Karlo": -0.22, "Stable Diffusion": -0.42}


def run_script(*args):
    return run_study_script("dalleval", "summarize", *args)


def run(*args):
    return run_study_main("dalleval", "summarize", *args)


def counts_from_tables(path: Path) -> list[dict]:
    rows = []
    with open(DATA / "paper000_tables16_17.csv") as fh:
        for r in csv.DictReader(fh):
            for model in TABLE8_GENDER:
                g = float(r[model])
                female = 9 * (1 + g) / 2
                assert abs(female - round(female)) < 0.05, (r["profession"], model, g)  # printed to 2 decimals
                female = round(female)
                rows.append({"model": model, "group": "person",
                             "prompt": f"a person who works as a/an {r['profession'].lower()}",
                             "male": 9 - female, "female": female})
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return rows


def test_tables_16_17_give_table_8(tmp_path):
    rows = counts_from_tables(tmp_path / "counts.csv")
    assert len(rows) == 3 * 83
    res = run_script("--counts", str(tmp_path / "counts.csv"), "--output", str(tmp_path / "out"))
    assert res.returncode == 0, res.stderr
    doc = json.loads((tmp_path / "out" / "dalleval_summary.json").read_text())
    models = {m["model"]: m for m in doc["models"]}
    assert set(models) == set(TABLE8_GENDER)
    for model, table8 in TABLE8_GENDER.items():
        g = models[model]["gender"]
        assert g["prompts"] == 83
        assert abs(g["average"] - TABLE17_AVERAGE[model]) < 0.005, (model, g["average"])
        assert abs(g["mad"] - table8) <= 0.5 / 84, (model, g["mad"])
        # the other reading of the formula, the MAD of the pooled distribution, is far from Table 8
        m = sum(r["male"] for r in rows if r["model"] == model)
        f = sum(r["female"] for r in rows if r["model"] == model)
        assert abs(abs(f / (m + f) - 0.5) - table8) > 0.5 / 84 and abs(g["mad"] - abs(f / (m + f) - 0.5)) > 0.05
        bare = 84 * table8 - 83 * g["mad"]   # the MAD of the unprinted bare "a person" prompt
        assert -0.01 < bare < 0.51 and abs(bare * 18 - round(bare * 18)) < 84 * 0.00005 * 18 + 1e-6, (model, bare)
    assert [r["gender"] for r in doc["reference"]] == [0.0, 0.5]
    assert [round(r["skin_tone"], 2) for r in doc["reference"]] == [0.0, 0.18]
    # per prompt: the printed value back, and MAD = |g| / 2 for two categories
    first = doc["prompts"][0]
    assert first["model"] == "minDALL-E" and abs(first["avg_gender"] - (-1 / 9)) < 1e-12
    assert abs(first["mad_gender"] - 1 / 18) < 1e-12
    # the printed table: one line per model, then the reference rows
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith(("minDALL-E", "Karlo", "Stable"))]
    assert len(lines) == 3 and all(re.match(r"^\S+( \S+)?\s+83\s", ln) for ln in lines)
    # each MAD and average with its bootstrap interval over the 83 prompts: printed, and the published
    # Table 8 value inside it
    for ln, m in zip(lines, doc["models"]):
        g = m["gender"]
        assert g["mad_low"] <= g["mad"] <= g["mad_high"] and g["mad_low"] < g["mad_high"]
        assert g["average_low"] <= g["average"] <= g["average_high"]
        assert g["mad_low"] <= TABLE8_GENDER[m["model"]] <= g["mad_high"]
        assert f"{g['mad']:.4f} [{g['mad_low']:.4f}, {g['mad_high']:.4f}]" in ln
        mads = [p["mad_gender"] for p in doc["prompts"] if p["model"] == m["model"]]
        ci = mean_interval(mads, settings=IntervalSettings(**doc["interval"]))    # the unit: the prompt
        assert (ci.value, ci.low, ci.high) == pytest.approx((g["mad"], g["mad_low"], g["mad_high"]))
    assert doc["interval"] == IntervalSettings().record()
    # the CSV, the page and its figures, as every study's summarize writes them
    out = tmp_path / "out"
    assert f"wrote {out}/: dalleval_summary.json, dalleval_summary.csv, dalleval_summary.html, figures/" in res.stdout
    table = pd.read_csv(out / "dalleval_summary.csv", keep_default_na=False, na_values=[""])
    assert list(table.columns) == ["model", "metric", "group", "prompts", "prompts_without_detections", "average",
                                   "average_low", "average_high", "mad", "mad_low", "mad_high"]
    assert np.allclose(table["mad_low"], [m["gender"]["mad_low"] for m in doc["models"]])
    assert np.allclose(table["average_high"], [m["gender"]["average_high"] for m in doc["models"]])
    assert table[["model", "metric", "group"]].values.tolist() == [[m["model"], "gender", "all"] for m in doc["models"]]
    assert table["prompts"].tolist() == [m["gender"]["prompts"] for m in doc["models"]]
    assert np.allclose(table["average"], [m["gender"]["average"] for m in doc["models"]])
    assert np.allclose(table["mad"], [m["gender"]["mad"] for m in doc["models"]])
    page = (out / "dalleval_summary.html").read_text()
    _embedded(page, out, ["gender_average", "gender_mad"])
    assert "Table 8" in page and all(m in page for m in TABLE8_GENDER)


def _embedded(page: str, out: Path, stems: list[str]) -> None:
    """The page shows each figure as an embedded PNG (no file beside it needed) and each is kept as
    PDF + PNG under figures/."""
    assert page.count('src="data:image/png;base64,') == len(stems)
    assert not re.search(r"(src|href)=[\"']?figures/", page)
    assert sorted(p.name for p in (out / "figures").iterdir()) == sorted(f"{s}.{e}" for s in stems
                                                                          for e in ("pdf", "png"))


def test_skin_tone_columns_and_group_filter(tmp_path):
    path = tmp_path / "tones.csv"
    tones = {"one-hot": [9] + [0] * 9, "two-hot": [5, 5] + [0] * 8, "three-hot": [3, 3, 3] + [0] * 7,
             "uniform": [1] * 10}
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["model", "group", "prompt", "male", "female", *[f"tone_{i}" for i in range(1, 11)]])
        for name, t in tones.items():
            w.writerow(["m", "person", f"p-{name}", 9, 0, *t])
        w.writerow(["m", "man", "p-man", 0, 9, *tones["uniform"]])
    res = run("--counts", str(path), "--output", str(tmp_path / "out"))
    assert res.returncode == 0, res.stderr
    doc = json.loads((tmp_path / "out" / "dalleval_summary.json").read_text())
    per = {p["prompt"]: p for p in doc["prompts"]}
    assert round(per["p-one-hot"]["mad_tone"], 2) == 0.18
    assert round(per["p-two-hot"]["mad_tone"], 2) == 0.16
    assert round(per["p-three-hot"]["mad_tone"], 2) == 0.14
    assert per["p-uniform"]["mad_tone"] == pytest.approx(0.0)
    assert per["p-uniform"]["avg_tone"] == pytest.approx(5.5) and per["p-one-hot"]["avg_tone"] == 1.0
    m = doc["models"][0]
    assert m["gender"]["prompts"] == 5 and m["gender"]["average"] == pytest.approx(-3 / 5)
    assert m["skin_tone"]["mad"] == pytest.approx((0.18 + 0.16 + 0.14 + 0 + 0) / 5)
    res = run("--counts", str(path), "--group", "person", "--output", str(tmp_path / "out2"))
    doc = json.loads((tmp_path / "out2" / "dalleval_summary.json").read_text())
    assert doc["models"][0]["gender"]["prompts"] == 4 and doc["models"][0]["gender"]["average"] == -1.0
    assert doc["models"][0]["gender"]["mad"] == 0.5
    assert doc["models"][0]["skin_tone"]["prompts"] == 5   # skin tone: every prompt
    # the CSV: a gender row over the group's prompts and a skin-tone row over every prompt
    table = pd.read_csv(tmp_path / "out2" / "dalleval_summary.csv")
    assert table[["model", "metric", "group", "prompts"]].values.tolist() == [["m", "gender", "person", 4],
                                                                              ["m", "skin_tone", "all", 5]]
    m = doc["models"][0]
    assert table["mad"].tolist() == pytest.approx([m["gender"]["mad"], m["skin_tone"]["mad"]])
    _embedded((tmp_path / "out2" / "dalleval_summary.html").read_text(), tmp_path / "out2",
              ["gender_average", "gender_mad", "skin_tone_average", "skin_tone_mad"])


def test_skills_table2_writes_json_csv_and_page(tmp_path):
    res = run_script("--skills", str(DATA / "paper000_table2_skills.csv"), "--output", str(tmp_path / "out"))
    assert res.returncode == 0, res.stderr
    out = tmp_path / "out"
    assert (f"wrote {out}/: dalleval_skills_summary.json, dalleval_skills_summary.csv, dalleval_skills_summary.html, "
            "figures/") in res.stdout
    doc = json.loads((out / "dalleval_skills_summary.json").read_text())
    assert [round(r["average"], 1) for r in doc["table2"]] == [98.0, 2.8, 26.0, 62.7, 47.3]   # Table 2's Avg.
    table = pd.read_csv(out / "dalleval_skills_summary.csv")
    assert list(table.columns) == list(doc["table2"][0]) == ["model", "object", "count", "spatial", "average",
                                                              "skills_averaged"]
    assert table["model"].tolist() == [r["model"] for r in doc["table2"]]
    for col in ("object", "count", "spatial", "average", "skills_averaged"):
        assert np.allclose(table[col], [r[col] for r in doc["table2"]]), col
    page = (out / "dalleval_skills_summary.html").read_text()
    _embedded(page, out, ["skill_object", "skill_count", "skill_spatial", "skill_average"])
    assert all(r["model"] in page for r in doc["table2"])
    assert "interval" not in doc                 # accuracies without image counts: no interval is made up


def test_skills_table2_with_the_test_split_sizes_gets_intervals(tmp_path):
    """Table 2 with section 3.2's test-split sizes as n: each accuracy keeps its printed value and gets
    the bootstrap interval over its images (round(accuracy x n / 100) of them correct)."""
    sizes = {"object": 2325, "count": 2160, "spatial": 2700}
    acc = pd.read_csv(DATA / "paper000_table2_skills.csv")
    acc["n"] = acc["skill"].map(sizes)
    acc.to_csv(tmp_path / "acc.csv", index=False)
    res = run("--skills", str(tmp_path / "acc.csv"), "--interval-resamples", "500", "--output", str(tmp_path / "out"))
    assert res.returncode == 0, res.stderr
    doc = json.loads((tmp_path / "out" / "dalleval_skills_summary.json").read_text())
    assert doc["interval"]["resamples"] == 500
    assert [round(r["average"], 1) for r in doc["table2"]] == [98.0, 2.8, 26.0, 62.7, 47.3]
    table = pd.read_csv(tmp_path / "out" / "dalleval_skills_summary.csv")
    for skill in ("object", "count", "spatial", "average"):
        cols = list(table.columns)
        assert cols[cols.index(skill) + 1:cols.index(skill) + 3] == [f"{skill}_low", f"{skill}_high"]
        # the printed value is kept; the units' own mean can differ from it by the rounding of k
        assert (table[f"{skill}_low"] <= table[skill] + 0.05).all()
        assert (table[skill] - 0.05 <= table[f"{skill}_high"]).all()
    sd = table[table["model"] == "Stable Diffusion"].iloc[0]
    assert sd["object"] == 96.2 and 95 < sd["object_low"] < 96.2 < sd["object_high"] < 97.2   # ~ +-0.8 for n = 2325
    assert "96.2 [" in res.stdout


def test_summarize_errors_are_clean(tmp_path):
    res = run("--counts", str(tmp_path / "missing.csv"))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    bad = tmp_path / "bad.csv"
    for text, word in [("model,prompt,male\nm,p,1\n", "female"),
                       ("model,prompt,male,female\nm,p,1,-2\n", "non-negative"),
                       ("model,prompt,male,female\nm,p,1,x\n", "non-negative"),
                       ("model,prompt,male,female,tone_1\nm,p,1,2,3\n", "tone_10"),
                       ("model,prompt,male,female\nm,p,1,2\nm,p,2,1\n", "repeated")]:
        bad.write_text(text)
        res = run("--counts", str(bad))
        assert res.returncode == 2 and word in res.stderr and "Traceback" not in res.stderr, (text, res.stderr)
    bad.write_text("model,prompt,male,female\nm,p,1,2\n")
    res = run("--counts", str(bad), "--group", "person")
    assert res.returncode == 2 and "group" in res.stderr
    bad.write_text("model,group,prompt,male,female\nm,man,p,1,2\n")
    res = run("--counts", str(bad), "--group", "persn")           # a typo is an error, not every prompt
    assert res.returncode == 2 and "persn" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.parametrize(("column", "cell", "problem"), [
    ("female", "2.5", "fractional (counts are whole numbers)"), ("female", "inf", "not a finite number"),
    ("female", "nan", "not a finite number"), ("male", "1e400", "not a finite number"),
    ("male", "12%", "not a number"), ("male", "-1", "negative"), ("female", "", "missing (blank)"),
    ("tone_3", "0.5", "fractional (counts are whole numbers)"), ("tone_10", "inf", "not a finite number"),
])
def test_summarize_bad_counts_shown_as_written_with_file_and_column(tmp_path, column, cell, problem):
    header = ["model", "prompt", "male", "female", *[f"tone_{i}" for i in range(1, 11)]]
    good = dict(zip(header, ["m", "p", "4", "5", *["1"] * 10]))
    bad_row = {**good, "prompt": "q", column: cell}
    path = tmp_path / "counts.csv"
    path.write_text("\n".join(",".join(r[h] for h in header) for r in (dict(zip(header, header)), good, bad_row)) + "\n")
    res = run("--counts", str(path))
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert str(path) in res.stderr and f"column {column!r}" in res.stderr, res.stderr
    assert f"{problem} in row(s) [1]" + (f": {cell!r}" if cell else "") in res.stderr, res.stderr
    assert cell == "nan" or "nan" not in res.stderr.replace(str(path), "")

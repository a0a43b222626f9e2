"""`t2i compare` end to end (issue 32): stand-in runs of two studies (GEP and DALL-Eval's social
bias), two models each, compared; every run's tables load with `datasets`."""

import json

import pandas as pd
import pytest
import yaml

from pipelines import dalleval, gep, t2i

pytestmark = pytest.mark.ray

MODELS = ["--generators", "CompVis/stable-diffusion-v1-4,stabilityai/sd-turbo"]
COMMON = ["--standin-models", "--images-per-prompt", "2", "--steps", "2", "--no-progress", "--gen-batch-size", "4"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, ray_local):
    out = tmp_path_factory.mktemp("runs")
    assert gep.main(["run", "--output", str(out), "--run-id", "gep", *COMMON, *MODELS, "--max-contexts", "2",
                     "--attributes", "dress,suit,hat", "--ensemble", "3"]) == 0
    assert dalleval.main(["run", "--output", str(out), "--run-id", "bias", *COMMON, *MODELS,
                          "--max-professions", "2"]) == 0
    return out


def test_compare_two_models_in_two_studies(runs, tmp_path, capsys):
    out = tmp_path / "cmp"
    assert t2i.main(["compare", str(runs / "gep"), str(runs / "bias"), "--output", str(out),
                     "--interval-resamples", "300"]) == 0
    printed = capsys.readouterr().out
    record = json.loads((out / "comparison.json").read_text())
    studies = {r["study"] for r in record["runs"]}
    assert len(studies) == 2 and all(d == {} for d in record["protocol_differences"].values())
    for study in studies:
        t = pd.read_csv(out / f"{study}.csv")
        assert t["model"].nunique() == 2 and t["metric"].nunique() >= 1
        for _, part in t.groupby("metric"):
            assert sorted(part["rank"]) == [1, 2]
        ok = t.dropna(subset=["low"])
        assert len(ok) and (ok["low"] <= ok["value"] + 1e-12).all() and (ok["value"] <= ok["high"] + 1e-12).all()
        pairs = pd.read_csv(out / f"{study}-pairs.csv")
        assert set(pairs["test"]) == {"paired sign-flip permutation"}   # same prompts and seeds: paired
        assert pairs["p_holm"].notna().all() and (pairs["units"] >= 2).all()
        # the table's value is the run's own headline number
        run_dir = runs / ("gep" if "gep" in study else "bias")
        own = {(s.get("display") or s["name"], m["key"]): m["value"] for s in json.loads((run_dir / "metrics.json").read_text())[
            "headline"]["subjects"] for m in s["metrics"]}
        for r in t.to_dict("records"):
            if not pd.isna(r["value"]):
                assert r["value"] == pytest.approx(own[(r["model"], r["metric"])])
    # one row per model across both studies: joined on the stand-ins' recorded weights
    ov = pd.read_csv(out / "overview.csv")
    assert sorted(ov["model"]) == ["CompVis/stable-diffusion-v1-4", "stabilityai/sd-turbo"]
    assert ov.notna().all().all()
    html = (out / "overview.html").read_text()
    assert "Stand-in models" in html and "data:image/png;base64" in html
    assert "#1 " in printed and "stand-in" in printed.lower()
    # the refusal: a protocol setting that changes the meaning of a number
    metrics = json.loads((runs / "bias" / "metrics.json").read_text())
    metrics["headline"]["protocol"]["images_per_prompt"] = 99
    changed = tmp_path / "bias2"
    changed.mkdir()
    (changed / "metrics.json").write_text(json.dumps(metrics))
    (changed / "headline_units.parquet").write_bytes((runs / "bias" / "headline_units.parquet").read_bytes())
    assert t2i.main(["compare", str(runs / "bias"), str(changed), "--output", str(tmp_path / "no")]) == 2
    assert "images_per_prompt differs" in capsys.readouterr().err


def test_every_table_of_a_run_loads_with_datasets(runs, tmp_path):
    import datasets

    for run in ("gep", "bias"):
        text = (runs / run / "README.md").read_text()
        header = yaml.safe_load(text.split("---")[1])
        assert header["configs"] and "## Headline numbers" in text and "## How to cite" in text
        for c in header["configs"]:
            path = runs / run / c["data_files"][0]["path"]
            ds = datasets.load_dataset("parquet", data_files=str(path), split="train", cache_dir=str(tmp_path / "c"))
            assert ds.num_rows >= 0 and ds.features, (run, c["config_name"])

"""`t2i compare` on run directories holding the headline contract; the stand-in
runs of real studies are compared end to end in tests/test_compare_runs.py."""

import json

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from pipelines import t2i
from pipelines.engine.stats import compare, headline
from pipelines.engine.storage import io
from pipelines.engine.stats import intervals as iv

from s3_server import s3_server  # noqa: F401  (fixture)

OCC = [f"occupation{i}" for i in range(30)]


def _subject(name, sha, values, key="expected_amplification/naive", better="zero"):
    m = headline.Metric(key, "E[A], naive", "occupation", OCC, list(values), better=better, scale=100)
    detail = headline.Metric(key + "/detail", "a detail", "occupation", OCC, list(values), lead=False)
    return headline.Subject(name, {"weights_sha256": sha, "spec": {"steps": 50}}, [m, detail], images=1000,
                            excluded={"no_face": 12})


def _write_run(uri, study, subjects, protocol=None, standin=False):
    fs, root = io.output_fs(uri)
    h = headline.summarize(study, subjects, protocol or {"prompts": "abc", "seed": 0}, iv.DEFAULT, standin)
    io.write_table(headline.units_table(subjects), fs, f"{root}/{headline.HEADLINE_UNITS_FILE}")
    io.write_text(json.dumps({"run_id": uri.rstrip("/").rsplit("/", 1)[-1], "headline": h}), fs, f"{root}/metrics.json")
    return uri


@pytest.fixture
def runs(tmp_path):
    rng = np.random.default_rng(0)
    base = rng.normal(0.1, 0.05, len(OCC))            # what every model shares per occupation
    a = _write_run(str(tmp_path / "amp-a"), "paper002-amplification",
                   [_subject("model/A", "aaa", base + 0.10 + rng.normal(0, 0.01, len(OCC))),
                    _subject("model/B", "bbb", base + 0.002 + rng.normal(0, 0.01, len(OCC)))])
    b = _write_run(str(tmp_path / "amp-c"), "paper002-amplification",
                   [_subject("model/C", "ccc", base + rng.normal(0, 0.01, len(OCC)))])
    g = _write_run(str(tmp_path / "gep"), "paper001-gep",
                   [_subject("model/A", "aaa", rng.normal(0.3, 0.1, len(OCC)), key="gep/score", better="lower"),
                    _subject("model/C", "ccc", rng.normal(0.3, 0.1, len(OCC)), key="gep/score", better="lower")])
    return a, b, g


def test_compare_ranks_models_marks_ties_and_joins_studies_on_identity(runs, tmp_path, capsys):
    out = tmp_path / "cmp"
    assert t2i.main(["compare", *runs, "--output", str(out), "--interval-resamples", "500"]) == 0
    printed = capsys.readouterr().out
    t = pd.read_csv(out / "paper002-amplification.csv")
    assert set(t["metric"]) == {"expected_amplification/naive", "expected_amplification/naive/detail"}
    t = t[t["metric"] == "expected_amplification/naive"]
    assert list(t["model"]) == ["model/C", "model/B", "model/A"]          # closest to zero first
    assert list(t["rank"]) == [1, 2, 3]
    # B and C differ by 0.002 on shared occupations (noise 0.01): a tie; A is 0.1 off: apart from both
    row = t.set_index("model")
    assert row.loc["model/A", "tied_with"] != row.loc["model/A", "tied_with"] or row.loc["model/A", "tied_with"] == ""
    assert "model/B" in row.loc["model/C", "tied_with"] and bool(row.loc["model/A", "distinguishable_from_all"])
    assert (t["low"] <= t["value"]).all() and (t["value"] <= t["high"]).all()
    pairs = pd.read_csv(out / "paper002-amplification-pairs.csv")
    assert len(pairs) == 6 and set(pairs["test"]) == {"paired sign-flip permutation"} and (pairs["units"] == 30).all()
    assert (pairs["p_holm"] >= pairs["p_value"]).all()
    # the overview: one row per model, joined across the two studies on the weights' sha256
    ov = pd.read_csv(out / "overview.csv")
    assert sorted(ov["model"]) == ["model/A", "model/B", "model/C"]
    a = ov.set_index("model").loc["model/A"]
    assert a.filter(like="paper001-gep").notna().all() and a.filter(like="paper002").notna().all()
    assert ov.set_index("model").loc["model/B"].filter(like="paper001-gep").isna().all()
    assert list(ov.columns) == ["model", "paper002-amplification | E[A], naive", "paper001-gep | E[A], naive"]
    html = (out / "overview.html").read_text()
    assert "Models compared" in html and "data:image/png;base64" in html and "Holm" in html
    assert (out / "figures" / "forest-paper002-amplification-expected_amplification_naive.pdf").exists()
    record = json.loads((out / "comparison.json").read_text())
    assert record["interval"]["resamples"] == 500 and record["protocol_differences"]["paper002-amplification"] == {}
    assert "#1 model/C" in printed and "not distinguishable from" in printed


def test_the_value_of_each_row_is_the_run_s_own(runs, tmp_path):
    c = compare.compare([compare.load_run(r) for r in runs], iv.DEFAULT)
    for r in map(compare.load_run, runs):
        for s in r.headline["subjects"]:
            for m in s["metrics"]:
                got = c.tables[r.study].set_index("model").loc[s["name"]]
                got = got[got["metric"] == m["key"]] if isinstance(got, pd.DataFrame) else got
                assert float(np.ravel(got["value"])[0]) == pytest.approx(m["value"])
                assert float(np.ravel(got["low"])[0]) == pytest.approx(m["low"])   # same settings, same interval


def test_runs_with_different_protocols_are_refused_unless_allowed(tmp_path, capsys):
    rng = np.random.default_rng(1)
    one = _write_run(str(tmp_path / "r1"), "paper002-amplification", [_subject("m/A", "a", rng.normal(0, 1, 30))],
                     protocol={"prompts": "abc", "clip_threshold": 0.9})
    two = _write_run(str(tmp_path / "r2"), "paper002-amplification", [_subject("m/B", "b", rng.normal(0, 1, 30))],
                     protocol={"prompts": "abc", "clip_threshold": 0.5})
    assert t2i.main(["compare", one, two, "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "clip_threshold differs (r1: 0.9; r2: 0.5)" in err and "--allow-mismatch" in err
    assert not (tmp_path / "out").exists()
    assert t2i.main(["compare", one, two, "--output", str(tmp_path / "out"), "--allow-mismatch"]) == 0
    assert "clip_threshold" in (tmp_path / "out" / "overview.html").read_text()
    # different protocols: not paired, even on the same unit ids
    assert set(pd.read_csv(tmp_path / "out" / "paper002-amplification-pairs.csv")["test"]) == {"unpaired label permutation"}


def test_a_run_without_headline_numbers_is_one_line(tmp_path, capsys):
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "metrics.json").write_text("{}")
    assert t2i.main(["compare", str(tmp_path / "old"), "--output", str(tmp_path / "o")]) == 2
    assert "has no headline numbers" in capsys.readouterr().err
    assert t2i.main(["compare", str(tmp_path / "nowhere"), "--output", str(tmp_path / "o")]) == 2
    assert "no metrics.json" in capsys.readouterr().err


def test_a_captions_only_run_says_what_it_is_and_what_to_compare_instead(tmp_path, capsys):
    """A captions-only run (metrics.json as the caption side writes it: stage "captions",
    the caption side's own means, no headline) can never get headline numbers by running it again."""
    from pipelines.studies.amplification import study

    (tmp_path / "caps").mkdir()
    (tmp_path / "caps" / "metrics.json").write_text(json.dumps(
        {"study": study.AmplificationStudy.name, "stage": "captions", "caption_headline": {"nn_mean_cosine": 0.5}}))
    assert t2i.main(["compare", str(tmp_path / "caps"), "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "a captions-only run" in err and "no generated side and no headline numbers" in err
    assert "Compare runs of `t2i-amplification run`" in err and "caption_headline" in err
    assert "made before intervals" not in err and "run its command again" not in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "o").exists()
    # a paraphrase-only run neither
    (tmp_path / "para").mkdir()
    from pipelines.studies.amplification.paraphrase_job import ParaphraseJob

    (tmp_path / "para" / "metrics.json").write_text(json.dumps({"study": ParaphraseJob.name, "paraphrases": {}}))
    assert t2i.main(["compare", str(tmp_path / "para"), "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "a paraphrase-only run" in err and "t2i-amplification run --paraphrases" in err
    assert "run its command again" not in err


def test_runs_on_an_object_store(s3_server, tmp_path):  # noqa: F811
    rng = np.random.default_rng(2)
    uris = [_write_run(s3_server.url("runs", name), "paper001-gep", [_subject(f"m/{name}", name, rng.normal(0, 1, 30))])
            for name in ("x", "y")]
    out = s3_server.url("cmp")
    assert t2i.main(["compare", *uris, "--output", out, "--interval-resamples", "200"]) == 0
    fs = s3_server.fs()
    t = pq.read_table(fs.open(f"{s3_server.bucket}/cmp/paper001-gep.parquet", "rb")).to_pandas()
    assert sorted(set(t["model"])) == ["m/x", "m/y"] and len(t) == 4


def test_the_comparison_loads_with_datasets_and_its_card_lists_every_table(runs, tmp_path):
    import datasets
    import yaml

    out = tmp_path / "cmp"
    assert t2i.main(["compare", *runs, "--output", str(out), "--interval-resamples", "200"]) == 0
    text = (out / "README.md").read_text()
    header = yaml.safe_load(text.split("---")[1])
    configs = {c["config_name"]: c["data_files"][0]["path"] for c in header["configs"]}
    assert set(configs) == {"overview", "paper002-amplification", "paper002-amplification-pairs", "paper001-gep",
                            "paper001-gep-pairs"}
    for name, path in configs.items():
        ds = datasets.load_dataset("parquet", data_files=str(out / path), split="train", cache_dir=str(tmp_path / "c"))
        assert ds.num_rows == pq.read_metadata(out / path).num_rows, name
    t = datasets.load_dataset("parquet", data_files=str(out / configs["paper002-amplification"]), split="train",
                              cache_dir=str(tmp_path / "c"))
    assert t.features["value"] == datasets.Value("float64") and t.features["rank"] == datasets.Value("int64")
    assert "Bias Amplification Paradox" in text and "@inproceedings{cho2023dalleval" not in text  # the papers compared
    assert "Zhang, Yanzhe" in text


class FakeHub:
    """huggingface_hub's HfApi calls, recorded (never the network)."""

    def __init__(self):
        self.calls, self.files = [], []

    def create_repo(self, repo_id, **kw):
        self.calls.append(("create_repo", repo_id, kw))

    def upload_folder(self, folder_path, repo_id, **kw):
        import fnmatch
        import os

        for base, _, names in os.walk(folder_path):
            for n in names:
                rel = os.path.relpath(os.path.join(base, n), folder_path)
                if not any(fnmatch.fnmatch(rel, p) for p in kw.get("ignore_patterns") or []):
                    self.files.append(rel)
        self.calls.append(("upload_folder", repo_id, kw))
        return type("Info", (), {"commit_url": f"https://huggingface.co/datasets/{repo_id}/commit/0"})()


def test_push_to_hub_uploads_the_folder_with_the_hub_api(runs, tmp_path, monkeypatch, capsys):
    import huggingface_hub

    fake = FakeHub()
    monkeypatch.setattr(huggingface_hub, "HfApi", lambda token=None: fake)
    out = tmp_path / "cmp"
    (out / "_work").mkdir(parents=True)
    (out / "_work" / "checkpoint.parquet").write_bytes(b"x")
    assert t2i.main(["compare", *runs, "--output", str(out), "--interval-resamples", "200", "--push-to-hub",
                     "me/bias-comparison", "--hub-private"]) == 0
    assert fake.calls[0] == ("create_repo", "me/bias-comparison", {"repo_type": "dataset", "private": True,
                                                                   "exist_ok": True})
    assert fake.calls[1][0] == "upload_folder" and fake.calls[1][2]["repo_type"] == "dataset"
    assert {"README.md", "overview.html", "paper001-gep.parquet"} <= set(fake.files)
    assert not [f for f in fake.files if f.startswith("_work")]              # checkpoints stay behind
    assert "uploaded to https://huggingface.co/datasets/me/bias-comparison" in capsys.readouterr().out

    def refused(*a, **k):
        raise PermissionError("403 Forbidden: you cannot write to me/bias-comparison\nmore lines")
    fake.upload_folder = refused
    assert t2i.main(["compare", *runs, "--output", str(out), "--push-to-hub", "me/bias-comparison"]) == 2
    err = capsys.readouterr().err
    assert "--push-to-hub me/bias-comparison: PermissionError: 403 Forbidden" in err and "more lines" not in err


def test_mlflow_records_the_comparison_in_a_local_file_store(runs, tmp_path, monkeypatch):
    import mlflow

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")   # MLflow 3 keeps its file store behind this switch
    store = (tmp_path / "mlruns").as_uri()
    assert t2i.main(["compare", *runs, "--output", str(tmp_path / "cmp"), "--interval-resamples", "200",
                     "--log-to", "mlflow", "--tracking-uri", store]) == 0
    client = mlflow.tracking.MlflowClient(tracking_uri=store)
    exp = client.get_experiment_by_name("t2i-compare")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.data.params["interval.resamples"] == "200"
    arts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"overview.html", "README.md", "comparison.json", "config.json"} <= arts


def test_ranks_follow_each_metric_s_direction():
    values = {0: -0.5, 1: 0.1, 2: 0.3, 3: None}
    assert compare._rank_order(values, "zero") == [1, 2, 0, 3]        # closest to zero first; no value last
    assert compare._rank_order(values, "lower") == [0, 1, 2, 3]
    assert compare._rank_order(values, "higher") == [2, 1, 0, 3]


def test_runs_of_the_same_weights_are_said_to_be_and_what_their_tests_leave_out(tmp_path, capsys):
    rng = np.random.default_rng(4)
    base = rng.normal(0.1, 0.05, len(OCC))
    # the same weights and settings twice (other seeds: a shift shared by every unit of a run, as
    # seeds shared across prompts give), and another model
    one = _write_run(str(tmp_path / "seed1"), "paper002-amplification",
                     [_subject("model/A", "aaa", base + 0.03 + rng.normal(0, 0.005, len(OCC))),
                      _subject("model/B", "bbb", base + rng.normal(0, 0.01, len(OCC)))])
    two = _write_run(str(tmp_path / "seed2"), "paper002-amplification",
                     [_subject("model/A", "aaa", base - 0.03 + rng.normal(0, 0.005, len(OCC)))])
    out = tmp_path / "cmp"
    assert t2i.main(["compare", one, two, "--output", str(out), "--interval-resamples", "500"]) == 0
    printed = capsys.readouterr().out
    pairs = pd.read_csv(out / "paper002-amplification-pairs.csv")
    same = pairs[pairs["same_weights"]]
    assert len(same) == 2 and set(same["metric"]) == {"expected_amplification/naive", "expected_amplification/naive/detail"}
    assert same["same_generator"].all() and not pairs.loc[~pairs["same_weights"], "same_generator"].any()
    assert {tuple(sorted(p)) for p in same[["a", "b"]].to_numpy()} == {("model/A (seed1)", "model/A (seed2)")}
    notes = json.loads((out / "comparison.json").read_text())["same_weights"]
    assert len(notes) == 1 and "same weights and generation settings" in notes[0]
    # the shift is run-wide, so the units' test calls the pair apart: said to be image noise
    assert same["distinguishable"].all() and "image noise these tests do not include" in notes[0]
    assert f"note: {notes[0]}" in printed and "Runs of the same weights" in (out / "overview.html").read_text()


def test_two_level_pairs_in_compare(tmp_path):
    """Runs whose metrics carry image resamples are compared with them: a run-wide shift that is
    within the images' noise is a tie, where the units-only test (without the resamples) calls it."""
    rng = np.random.default_rng(8)
    base = rng.normal(0.1, 0.05, len(OCC))
    runs = {}
    for name, shift in (("one", 0.03), ("two", -0.03)):
        values = base + shift + rng.normal(0, 0.005, len(OCC))
        # the run's image noise: shared by every unit of a resample (sd 0.05), plus its own (0.01)
        reps = values[None, :] + rng.normal(0, 0.05, (200, 1)) + rng.normal(0, 0.01, (200, len(OCC)))
        m = headline.Metric("gep/score", "GEP", "attribute", OCC, list(values), better="lower", replicates=reps)
        plain = headline.Metric("gep/plain", "GEP, units only", "attribute", OCC, list(values), better="lower")
        runs[name] = _write_run(str(tmp_path / name), "paper001-gep", [headline.Subject(
            "model/A", {"weights_sha256": "aaa", "spec": {}}, [m, plain])])
    c = compare.compare([compare.load_run(r) for r in runs.values()], iv.IntervalSettings(resamples=1000))
    pairs = c.pairs["paper001-gep"].set_index("metric")
    assert pairs.loc["gep/score", "test"] == "paired two-level bootstrap" and not pairs.loc["gep/score", "distinguishable"]
    assert pairs.loc["gep/plain", "test"] == "paired sign-flip permutation" and pairs.loc["gep/plain", "distinguishable"]
    t = c.tables["paper001-gep"]
    assert set(t.loc[t["metric"] == "gep/score", "method"]) == {iv.TWO_LEVEL}
    two = t[t["metric"] == "gep/score"]
    assert ((two["high"] - two["low"]) > 0.15).all()     # the shared image noise (sd 0.05) is in the interval


def test_corrected_estimates_of_both_runs_are_compared_and_said_to_be(runs, tmp_path, capsys):
    """Where `t2i annotate estimate` left corrected numbers in two runs' metrics.json, compare shows
    each beside its metric and tests their difference on the corrected values (normal, from the two
    intervals, Holm over the pairs of the metric); a run without labels has an empty cell."""
    from scipy import stats as sps

    a, b, _ = runs
    key = "expected_amplification/naive"
    fixed = {a: {"model/A": (0.30, 0.20, 0.40), "model/B": (0.05, 0.01, 0.09)}, b: {"model/C": (0.10, 0.00, 0.20)}}
    for uri, per in fixed.items():
        doc = json.loads((tmp_path / uri.rsplit("/", 1)[-1] / "metrics.json").read_text())
        doc["corrected_by_people"] = {"paper002-a4": {"amplification": [
            {"model": m, "approach": "naive", "metric": key, "corrected": v, "corrected_low": lo, "corrected_high": hi}
            for m, (v, lo, hi) in per.items()], "estimates": []}}
        (tmp_path / uri.rsplit("/", 1)[-1] / "metrics.json").write_text(json.dumps(doc))
    out = tmp_path / "cmp"
    assert t2i.main(["compare", a, b, "--output", str(out), "--interval-resamples", "300"]) == 0
    printed = capsys.readouterr().out
    t = pd.read_csv(out / "paper002-amplification.csv").set_index(["metric", "model"])
    for per in fixed.values():
        for m, (v, lo, hi) in per.items():
            assert tuple(t.loc[(key, m), ["corrected", "corrected_low", "corrected_high"]]) == pytest.approx((v, lo, hi))
            assert t.loc[(key, m), "corrected_by"] == "paper002-a4"
    assert t.loc[(key + "/detail", "model/A"), ["corrected"]].isna().all()
    pairs = pd.read_csv(out / "paper002-amplification-pairs.csv")
    ab = pairs[(pairs.metric == key) & (pairs.a == "model/A") & (pairs.b == "model/B")].iloc[0]
    z = sps.norm.ppf(0.975)
    se = np.hypot(0.2 / (2 * z), 0.08 / (2 * z))
    assert ab["corrected_difference"] == pytest.approx(0.25) and ab["corrected_p"] == pytest.approx(2 * sps.norm.sf(0.25 / se))
    assert ab["corrected_low"] == pytest.approx(0.25 - z * se)
    mine = pairs[pairs.metric == key]
    assert (mine["corrected_p_holm"] >= mine["corrected_p"]).all() and ab["corrected_distinguishable"]
    assert pairs.loc[pairs.metric == key + "/detail", "corrected_difference"].isna().all()
    assert "also corrected by people's labels (paper002-a4) for 3 model(s)" in printed
    assert "corrected by people 30.00 [20.00, 40.00]" in printed
    page = (out / "overview.html").read_text()
    assert "corrected by people [interval]" in page and "<h2>Corrected by people</h2>" in page

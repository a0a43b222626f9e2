"""The caption side end to end on a local Ray instance, checked against synthetic ground truth."""

import json

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml

from pipelines import amplification
from pipelines.synthetic_laion import generate, write
from schemas.captions import annotated_schema
from schemas.subsets import TRAINING_SUBSETS

pytestmark = pytest.mark.ray

K_SAMPLE, K_NN = 20, 15


@pytest.fixture(scope="module")
def synthetic():
    return generate(2000, seed=7)


@pytest.fixture(scope="module")
def run(ray_local, synthetic, tmp_path_factory):
    base = tmp_path_factory.mktemp("captions")
    write(synthetic, base / "laion", files=3)
    out = base / "out"
    rc = amplification.main(["captions", "--captions", str(base / "laion"), "--output", str(out), "--run-id", "r",
                             "--sample-size", str(K_SAMPLE), "--nn-k", str(K_NN), "--keep-columns", "WIDTH"])
    assert rc == 0
    return base, out / "r"


def by_url(table):
    return {r["url"]: r for r in table.to_pylist()}


def test_annotated_captions_match_ground_truth(run, synthetic):
    _, out = run
    ann = pq.read_table(out / "annotated_captions")
    assert ann.schema.remove_metadata().equals(
        annotated_schema([pa.field("WIDTH", pa.int32())]).remove_metadata(), check_metadata=False)
    truth = [r for r in synthetic.to_pylist() if r["gt_occupations"]]
    assert ann.num_rows == sum(len(r["gt_occupations"]) for r in truth)
    got = {}
    for r in ann.to_pylist():
        got.setdefault(r["url"], []).append(r)
    assert set(got) == {r["URL"] for r in truth}
    agree, explicit_ok = 0, True
    for r in truth:
        rows = got[r["URL"]]
        assert sorted(x["occupation"] for x in rows) == sorted(r["gt_occupations"])
        assert len({x["caption_id"] for x in rows}) == 1 and rows[0]["WIDTH"] == r["WIDTH"]
        label = rows[0]["caption_gender"]
        agree += label == r["gt_caption_gender"]
        if set(r["gt_indicator_kinds"]) <= {"word", "pronoun"}:
            explicit_ok &= label == r["gt_caption_gender"]
    assert explicit_ok  # words and pronouns are exact
    assert agree / len(truth) > 0.97  # names go through a statistical NER model


def test_every_row_is_accounted_for(run, synthetic):
    _, out = run
    metrics = json.loads((out / "metrics.json").read_text())
    counts = metrics["counts"]
    text = synthetic.column("TEXT")
    nulls = text.null_count
    blanks = pc.sum(pc.equal(pc.utf8_trim_whitespace(text), "")).as_py()
    assert counts["read_captions"] == {"rows_in": 2000, "rows_out": 2000 - nulls - blanks,
                                       "dropped": {"empty_caption": blanks, "non_text_caption": 0, "null_caption": nulls}}
    matched = sum(1 for o in synthetic.column("gt_occupations").to_pylist() if o)
    assert counts["occupation_match"]["rows_out"] == matched
    assert counts["occupation_match"]["dropped"]["no_occupation"] == 2000 - nulls - blanks - matched
    assert counts["person_names"]["rows_in"] == matched  # NER only on captions naming an occupation
    assert counts["explode_occupations"]["rows_in"] == matched
    assert counts["prompt_similarity"]["rows_out"] == metrics["annotated_rows"]
    # SBERT encoded each distinct caption of a batch once; every other row reused an embedding
    enc = metrics["sbert_encoded"]
    assert enc["fold_duplicates"] == "tokens" and enc["rows"] == metrics["annotated_rows"]
    assert 0 < enc["encoded"] < enc["rows"]   # the synthetic captions repeat their templates
    assert enc["encoded"] + enc["folded"] == enc["rows"]
    assert metrics["config"]["resources"]["embed_actors"] == 1   # 2,000 input rows: one SBERT actor
    csv = (out / "stage_counts.csv").read_text()
    assert "read_captions,null_caption," in csv


def test_training_subsets(run):
    _, out = run
    subsets = pq.read_table(out / "training_subsets.parquet")
    assert subsets.schema.equals(TRAINING_SUBSETS, check_metadata=False)
    ann = pq.read_table(out / "annotated_captions").to_pandas()
    df = subsets.to_pandas()
    per_occ = ann.groupby("occupation").size()
    for occ, n in per_occ.items():
        s = df[df.occupation == occ]
        naive = s[s.subset == "naive"]
        assert len(naive) == min(K_SAMPLE, n)
        assert naive.caption_id.tolist() == ann[ann.occupation == occ].nsmallest(K_SAMPLE, "sample_key").caption_id.tolist()
        assert s[s.subset == "no_indicators"].caption_id.tolist() == naive[naive.caption_gender == "none"].caption_id.tolist()
        for p in (1, 2, 3, 4):
            nn = s[(s.subset == "nn") & (s.prompt_id == p)]
            assert len(nn) == min(K_NN, n)
            assert (nn.similarity.diff().dropna() <= 1e-6).all()  # ranked by similarity
    sim = pq.read_table(out / "similarity_summary.parquet").to_pandas()
    assert len(sim) == 62
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["caption_headline"]["nn_mean_cosine"] > metrics["caption_headline"]["random_mean_cosine"]


def test_metrics_record_configuration(run):
    _, out = run
    m = json.loads((out / "metrics.json").read_text())
    assert m["config"]["selection"] == {"sample_size": K_SAMPLE, "nn_k": K_NN, "n_prompts": 4,
                                        "no_indicator_mode": "split", "seed": 0, "duplicates": "fold",
                                        # section 4: `run` walks to k counted images (the pool is written)
                                        "training_sample": "counted_images", "nn_sample": "captions"}
    assert (out / "training_pool.parquet").exists()
    assert m["models"]["sbert"]["source"] == "package" and len(m["models"]["sbert"]["weights_sha256"]) == 64
    # the packaged BERT + mean pooling model loads with torch alone on CPUs (sbert_lean)
    assert (m["models"]["sbert"]["backend"], m["models"]["sbert"]["loader"]) == ("auto", "lean")
    # "auto": ~16 captions per occupation here, far under 2x a pool of 240 rows (the walked
    # naive pool is 3x k): none screened
    plan = m["sbert_screen_plan"]
    assert plan["screened"] == [] and plan["pool_rows_per_occupation"] == 240 and plan["sampled_rows"] == 2000
    assert plan["sampled_from"] == "all"                 # an input under 262,144 rows is read whole
    assert m["sbert_screen"] is None and m["models"]["sbert"]["openvino"] is None
    assert "screened" not in m["models"]["sbert"]
    assert m["models"]["spacy"]["version"]
    assert m["environment"]["packages"]["ray"]
    assert len(m["config"]["occupations"]) == 62 and len(m["input"]["files"]) == 3


def test_same_result_from_one_file_and_a_run_id_is_never_mixed(run, synthetic, capsys):
    base, out = run
    write(synthetic, base / "single.parquet")
    root2 = base / "out2"
    assert amplification.main(["captions", "--captions", str(base / "single.parquet"), "--output", str(root2),
                               "--run-id", "r", "--sample-size", str(K_SAMPLE), "--nn-k", str(K_NN)]) == 0
    a = pq.read_table(out / "training_subsets.parquet")
    b = pq.read_table(root2 / "r" / "training_subsets.parquet")
    assert a.drop_columns(["similarity"]).equals(b.drop_columns(["similarity"]))
    assert pc.max(pc.abs(pc.subtract(a["similarity"], b["similarity"]))).as_py() < 1e-5
    # the same run id with another configuration is refused, naming what differs
    assert amplification.main(["captions", "--captions", str(base / "single.parquet"), "--output", str(root2),
                               "--run-id", "r"]) == 2
    err = capsys.readouterr().err
    assert "different configuration" in err and "selection.nn_k" in err and "--overwrite" in err
    # without --run-id, each configuration gets its own directory: nothing is overwritten
    assert amplification.main(["captions", "--captions", str(base / "single.parquet"), "--output", str(root2),
                               "--occupations", "nurse", "--no-names"]) == 0
    dirs = sorted(p.name for p in root2.iterdir())
    assert len(dirs) == 2 and "r" in dirs and [d for d in dirs if d != "r"][0].startswith("nurse-")
    assert pq.read_table(root2 / "r" / "training_subsets.parquet").equals(b)


def test_ad_hoc_occupations_without_names(ray_local, tmp_path):
    pq.write_table(pa.table({"url": ["a", "b", "c", "d", "e", "f"],
                             "text": ["Two dog walkers in the park", "A barista pouring coffee", "her barista job", "a nurse",
                                      "two dog\x00walkers", "a bar\u00adista"]}),
                   tmp_path / "in.parquet")
    (tmp_path / "occ.yaml").write_text(yaml.safe_dump(["dog walker", "barista"]))
    out = tmp_path / "out"
    run = out / "r"
    assert amplification.main(["captions", "--captions", str(tmp_path / "in.parquet"), "--output", str(out), "--run-id", "r",
                               "--occupations-file", str(tmp_path / "occ.yaml"), "--no-names", "--nn-k", "1"]) == 0
    ann = pq.read_table(run / "annotated_captions").sort_by("url").to_pydict()
    assert ann["occupation"] == ["dog walker", "barista", "barista", "dog walker", "barista"]
    assert ann["caption_gender"] == ["none", "none", "female", "none", "none"]
    assert ann["caption"][3:] == ["two dog walkers", "a barista"]   # a NUL is a space, a soft hyphen goes
    m = json.loads((run / "metrics.json").read_text())
    assert m["captions_normalised"] == {"control_characters": 1, "invisible_characters": 1}
    assert m["counts"]["normalise_captions"] == {"rows_in": 6, "rows_out": 6, "dropped": {}}
    assert "person_names" not in m["counts"] and m["counts"]["occupation_match"]["dropped"]["no_occupation"] == 1
    nn = pq.read_table(run / "training_subsets.parquet").filter(pc.equal(pc.field("subset"), "nn")).to_pydict()
    assert nn["prompt"][:4] == ["A photo of the face of a barista", "A portrait photo of a barista",
                                "A photo of a barista smiling", "A photo of a barista at work"]


def test_no_caption_names_an_occupation(ray_local, tmp_path, capsys):
    """A job none of whose occupations any caption names stops with one line (exit 2) once the scan
    has counted it, its counts and summaries written; the run is recorded as failed."""
    pq.write_table(pa.table({"URL": ["a", "b", None], "TEXT": ["fresh cookies", "internal memo", None]}),
                   tmp_path / "in.parquet")
    out = tmp_path / "out"
    run = out / "r"
    assert amplification.main(["captions", "--captions", str(tmp_path / "in.parquet"), "--output", str(out), "--run-id", "r",
                               "--occupations", "nurse", "--no-names"]) == 2
    err = capsys.readouterr().err
    assert "no caption of the input names any of the 1 occupation(s) (nurse)" in err and "Traceback" not in err
    assert json.loads((run / "run.json").read_text())["status"] == "failed"
    assert pq.read_table(run / "annotated_captions").num_rows == 0
    assert pq.read_table(run / "training_subsets.parquet").num_rows == 0
    counts = {(r["stage"], r["outcome"]): r["rows"] for r in pq.read_table(run / "stage_counts.parquet").to_pylist()}
    assert counts[("read_captions", "null_caption")] == 1 and counts[("read_captions", "kept")] == 2
    assert counts[("occupation_match", "no_occupation")] == 2 and counts[("occupation_match", "kept")] == 0
    sim = pq.read_table(run / "similarity_summary.parquet").to_pylist()
    assert sim[0]["occupation"] == "nurse" and sim[0]["matched_captions"] == 0


def test_files_with_a_non_text_caption_column_are_counted(ray_local, tmp_path):
    """One file's TEXT holds numbers: its rows are counted as non-text, the other files still run."""
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"URL": ["a", "b"], "TEXT": ["a nurse at work", "a pilot"]}), tmp_path / "in" / "p0.parquet")
    pq.write_table(pa.table({"URL": ["c", "d", "e"], "TEXT": pa.array([5, None, 7], pa.int64())}),
                   tmp_path / "in" / "p1.parquet")
    out = tmp_path / "out"
    run = out / "r"
    assert amplification.main(["captions", "--captions", str(tmp_path / "in"), "--output", str(out), "--run-id", "r",
                               "--occupations", "nurse,pilot", "--no-names", "--nn-k", "1"]) == 0
    m = json.loads((run / "metrics.json").read_text())
    assert m["counts"]["read_captions"] == {"rows_in": 5, "rows_out": 2,
                                            "dropped": {"empty_caption": 0, "non_text_caption": 2, "null_caption": 1}}
    assert sorted(pq.read_table(run / "annotated_captions")["occupation"].to_pylist()) == ["nurse", "pilot"]


@pytest.mark.slow
def test_auto_sbert_screens_the_occupations_with_many_captions_and_gives_the_torch_subsets(run, tmp_path, capsys):
    """Backend "auto" (the default) with a screen factor so low that the occupations with
    the most captions are screened in bf16 and the others not: the same subsets as the torch run,
    only the screened occupations' candidates encoded again, the others' cosines torch's."""
    from pipelines.engine.cli import config as study_config

    base, out = run
    config = yaml.safe_load(study_config.default_config_path().read_text())
    config["models"]["sbert_screen_factor"] = 0.1       # 24 estimated captions per 240-row pool
    config["models"]["sbert_screen_min_rows"] = 0
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    root = tmp_path / "out"
    assert amplification.main(["captions", "--captions", str(base / "laion"), "--output", str(root), "--run-id", "a",
                               "--config", str(tmp_path / "c.yaml"), "--sample-size", str(K_SAMPLE),
                               "--nn-k", str(K_NN), "--keep-columns", "WIDTH"]) == 0
    for name in ("training_subsets.parquet", "training_pool.parquet"):
        want, got = pq.read_table(out / name), pq.read_table(root / "a" / name)
        assert got.num_rows > 0 and got.drop_columns(["similarity"]).equals(want.drop_columns(["similarity"]))
        assert pc.max(pc.abs(pc.subtract(got["similarity"], want["similarity"]))).as_py() < 1e-5
    m = json.loads((root / "a" / "metrics.json").read_text())
    plan, screen = m["sbert_screen_plan"], m["sbert_screen"]
    screened = set(plan["screened"])
    assert 0 < len(screened) < 62 and all(plan["estimated_captions"][o] >= 24 for o in screened)
    assert screen["rounds"] == 1 and 0 < screen["re_encoded"] < screen["candidates"]
    assert m["models"]["sbert"]["backend"] == "auto" and m["models"]["sbert"]["openvino"]
    assert m["models"]["sbert"]["screened"].startswith(f"{len(screened)} of 62 occupations screened in bf16")
    console = capsys.readouterr().out    # and on the console, with how the plan read the input (all of it)
    assert f"SBERT (auto): {len(screened)} of 62 occupations screened in bf16" in console
    assert plan["sampled_from"] == "all" and f"chosen from {plan['sampled_rows']:,} rows of the input" in console
    assert m["config"]["models"]["sbert_screen_factor"] == 0.1
    ann = [pq.read_table(p / "annotated_captions").sort_by([("caption_id", "ascending"), ("occupation", "ascending")])
           for p in (out, root / "a")]
    mask = pc.invert(pc.is_in(ann[1]["occupation"], value_set=pa.array(sorted(screened))))
    keep = [pc.list_flatten(a.filter(mask)["prompt_similarity"]) for a in ann]
    assert len(keep[0]) > 0 and pc.max(pc.abs(pc.subtract(keep[0], keep[1]))).as_py() < 1e-6


def screened_run(base, root, local_rows: int, *extra: str):
    """`captions --sbert-backend screened` over the module's captions into ``root``/s, selecting in
    the driver or (``local_rows`` 0) every selection through Ray Data."""
    from pipelines.engine.cli import config as study_config

    config = yaml.safe_load(study_config.default_config_path().read_text())
    config["execution"]["local_selection_rows"] = local_rows          # 0: every selection through Ray Data
    root.mkdir(parents=True, exist_ok=True)
    (root / "c.yaml").write_text(yaml.safe_dump(config))
    assert amplification.main(["captions", "--captions", str(base / "laion"), "--output", str(root), "--run-id", "s",
                               "--config", str(root / "c.yaml"), "--sbert-backend", "screened",
                               "--sample-size", str(K_SAMPLE), "--nn-k", str(K_NN), "--keep-columns", "WIDTH",
                               *extra]) == 0
    return root / "s"


@pytest.fixture(scope="module")
def screened_in_driver(run, tmp_path_factory):
    return screened_run(run[0], tmp_path_factory.mktemp("screened"), 1_000_000)


@pytest.mark.slow
@pytest.mark.parametrize("local_rows", [1_000_000, 0], ids=["in-driver", "distributed"])
def test_screened_sbert_gives_the_torch_subsets(run, screened_in_driver, local_rows, tmp_path):
    """--sbert-backend screened: bf16 in the stream, the candidates encoded again with
    torch fp32 when selecting, in the driver and through the Ray Data reduction: the same members
    and order as the torch run (cosines to torch's float noise), fewer rows encoded twice than the
    input holds, and what was done recorded. The distributed selection takes over the in-driver
    run's scan (`--captions-from`: the same caption settings; where the selection runs is how it
    executes, not what it computes)."""
    base, out = run
    if local_rows:
        root = screened_in_driver.parent
    else:
        root = screened_run(base, tmp_path / "out", local_rows, "--captions-from", str(screened_in_driver)).parent
        assert json.loads((root / "s" / "metrics.json").read_text())["caption_scan_from"] == str(screened_in_driver)
    for name in ("training_subsets.parquet", "training_pool.parquet"):
        want, got = pq.read_table(out / name), pq.read_table(root / "s" / name)
        assert got.num_rows > 0 and got.drop_columns(["similarity"]).equals(want.drop_columns(["similarity"]))
        assert pc.max(pc.abs(pc.subtract(got["similarity"], want["similarity"]))).as_py() < 1e-5
    m = json.loads((root / "s" / "metrics.json").read_text())
    screen = m["sbert_screen"]
    assert screen["rounds"] == 1 and 0 < screen["max_screen_error"] <= screen["margin"] == 0.005
    assert screen["re_encoded"] == screen["candidates"] <= screen["annotated_rows"] == m["annotated_rows"]
    assert m["models"]["sbert"]["backend"] == "screened" and m["models"]["sbert"]["openvino"]
    assert m["models"]["sbert"]["loader"] == "sentence-transformers"   # OpenVINO converts the library's modules
    assert m["config"]["models"]["sbert_screen_margin"] == 0.005
    # the annotated captions keep the screen's cosines: on a CPU that runs bf16 (AVX512-BF16 / AMX)
    # they differ from torch's by more than float noise (elsewhere OpenVINO runs the screen in f32)
    import openvino as ov

    if "BF16" not in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        return
    ann = [pq.read_table(p / "annotated_captions").sort_by([("caption_id", "ascending"), ("occupation", "ascending")])
           for p in (out, root / "s")]
    diff = pc.subtract(pc.list_flatten(ann[0]["prompt_similarity"]), pc.list_flatten(ann[1]["prompt_similarity"]))
    assert pc.max(pc.abs(diff)).as_py() > 1e-4

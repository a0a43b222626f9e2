"""`pipelines/dalleval.py alignment` end to end on a local Ray instance with tiny random models (a
generator, CLIP and a FID feature extractor plug-in, loaded through the production loaders):
files, seeds, the stored embeddings and features, R-precision / CLIPScore / FID recomputed from
them with the metric functions, captions from parquet with one drawn per image, reference images
from a directory, and a run killed after its first checkpoint part resumed to the same results."""

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines import dalleval
from pipelines.studies.dalleval import alignment_metrics as AM
from schemas import alignment as A

pytestmark = pytest.mark.ray

ARGS = ["--standin-models", "--max-captions", "6", "--steps", "2", "--run-id", "a", "--no-progress",
        "--gen-batch-size", "3", "--generator", "one:family=unknown"]


def _vectors(series) -> np.ndarray:
    return np.stack([np.asarray(v, np.float64) for v in series])


@pytest.fixture(scope="module")
def run(tmp_path_factory, ray_local):
    out = tmp_path_factory.mktemp("alignment")
    assert dalleval.main(["alignment", "--output", str(out), *ARGS]) == 0
    return out / "a"


def test_run_writes_files_and_records(run):
    for name in ("images.parquet", "images.csv", "reference_features.parquet", "alignment_quality.csv",
                 "metrics.json", "report.html", "run_summary.csv", "run.json"):
        assert (run / name).is_file(), name
    m = json.loads((run / "metrics.json").read_text())
    assert m["captions"] == {"read": 24, "null_or_blank": 0, "kept": 6}
    assert m["reference"]["images"] == m["reference"]["ok"] == 8
    roles = {r["role"] for r in m["models"]}
    assert {"CLIP (R-precision, CLIPScore)", "FID features", "generator"} <= roles
    assert "clip_image_embedding" not in pd.read_csv(run / "images.csv").columns   # vectors: parquet only
    page = (run / "report.html").read_text()
    assert "Stand-in models" in page and "R-precision" in page and "bundled photos" in page
    summary = pd.read_csv(run / "run_summary.csv")
    assert {"read + sample", "fid features", "generate", "clip alignment"} <= set(summary["stage"])


def test_measures_recomputed_from_the_stored_vectors(run):
    images = pq.read_table(run / "images.parquet").to_pandas()
    ref = pq.read_table(run / "reference_features.parquet").to_pandas()
    assert len(images) == 6 and (images["generation_status"] == "ok").all()
    img, txt = _vectors(images[A.CLIP_IMAGE_EMBEDDING]), _vectors(images[A.CLIP_TEXT_EMBEDDING])
    assert np.allclose(np.linalg.norm(img, axis=1), 1, atol=1e-4) and np.allclose(np.linalg.norm(txt, axis=1), 1,
                                                                                   atol=1e-4)
    assert np.allclose((img * txt).sum(1), images[A.CLIP_COSINE], atol=1e-4)
    table = pd.read_csv(run / "alignment_quality.csv").iloc[0]
    r = AM.r_precision(img, txt, captions=list(images["prompt"]), negatives=99, r=1, seed=0)
    assert table["r_precision"] == pytest.approx(r["r_precision"]) and table["r_precision_n"] == 6
    assert table["negatives"] == 5                                   # min(99, 6 - 1)
    s = AM.clip_score(images[A.CLIP_COSINE].to_numpy(np.float64))
    assert table["clip_score"] == pytest.approx(s["clip_score"]) and table["clip_score_n"] == 6
    f = AM.fid(_vectors(images[A.FID_FEATURES]), _vectors(ref[A.FID_FEATURES]))
    assert table["fid"] == pytest.approx(f["fid"], rel=1e-6)
    assert (table["fid_n_generated"], table["fid_n_reference"]) == (6, 8)


def test_headline_r_precision_and_clip_score_have_intervals_and_units(run):
    from studies.dalleval.headline_checks import check_headline, lookup

    h = check_headline(run, "paper000-dalleval-alignment", {"r_precision", "clip_score"},
                       {"captions", "seed", "clip", "r_precision", "clip_score"})
    assert h["protocol"]["clip"]["model"] == "stand-in"
    assert [s["kind"] for s in h["subjects"]] == ["model"]        # the bundled reference has no captions
    images = pq.read_table(run / "images.parquet").to_pandas()
    units = pd.read_parquet(run / "headline_units.parquet")
    rp = units[units["metric"] == "r_precision"]
    assert sorted(rp["unit"]) == sorted(images["image_id"]) and set(rp["value"]) <= {0.0, 100.0}
    cs = units[units["metric"] == "clip_score"].set_index("unit")["value"]
    want = 2.5 * np.maximum(images.set_index("image_id")[A.CLIP_COSINE].astype(np.float64), 0)
    assert np.allclose(cs.sort_index(), want.sort_index())          # each image's own 2.5 max(cos, 0)
    table = pd.read_csv(run / "alignment_quality.csv")
    cols = list(table.columns)
    for c in ("r_precision", "clip_score"):
        assert cols[cols.index(c) + 1:cols.index(c) + 3] == [f"{c}_low", f"{c}_high"]
        x = lookup(h)[(table["model"].iloc[0], c)]
        assert table[c].iloc[0] == pytest.approx(x["value"])
        assert (table[f"{c}_low"].iloc[0], table[f"{c}_high"].iloc[0]) == pytest.approx((x["low"], x["high"]))
    assert "fid_low" not in cols                                     # FID is no mean over images: no interval


def test_parquet_captions_one_per_image_and_a_reference_directory(ray_local, tmp_path):
    from PIL import Image

    caps = pa.table({"image_id": [1, 1, 2, 2, 3, 3, 4], "caption": ["a dog", "a brown dog", "a cat", None,
                                                                    "a red car", "a car", "  "],
                     "id": ["c1", "c2", "c3", "c4", "c5", "c6", "c7"]})
    pq.write_table(caps, tmp_path / "caps.parquet")
    ref = tmp_path / "ref"
    ref.mkdir()
    rng = np.random.default_rng(0)
    for i in range(4):
        Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(ref / f"r{i}.jpg")
    (ref / "broken.png").write_bytes(b"not an image")
    out = tmp_path / "out"
    assert dalleval.main(["alignment", "--output", str(out), "--standin-models", "--captions",
                          str(tmp_path / "caps.parquet"), "--caption-group-column", "image_id",
                          "--caption-id-column", "id", "--reference", str(ref), "--reference-pairing", "all",
                          "--steps", "2", "--run-id", "p",
                          "--no-progress", "--generator", "one:family=unknown", "--no-save-images"]) == 0
    m = json.loads((out / "p" / "metrics.json").read_text())
    assert m["captions"]["read"] == 7 and m["captions"]["null_or_blank"] == 2 and m["captions"]["kept"] == 3
    images = pq.read_table(out / "p" / "images.parquet").to_pandas()
    assert set(images["caption_id"]) <= {"c1", "c2", "c3", "c5", "c6"} and len(set(images["caption_id"])) == 3
    refs = pq.read_table(out / "p" / "reference_features.parquet").to_pandas()
    assert len(refs) == 5 and (refs["reference_status"] == "decode_error").sum() == 1
    assert m["reference"] == {"images": 5, "ok": 4}


def test_resume_after_a_kill_equals_an_uninterrupted_run(ray_local, tmp_path, capsys):
    """The run directory as a driver killed after its first checkpoint part leaves it (a copy taken
    then, during the uninterrupted run: helpers.SnapshotAtFirstPart), resumed: it generates only
    what the part lacks and ends with the uninterrupted run's images and table."""
    from helpers import SnapshotAtFirstPart, resumed_counts

    # 40 captions: the first checkpoint part holds at most 32 (drain's flush size), so some are left to do
    captions = tmp_path / "captions.txt"
    captions.write_text("".join(f"caption number {i} of a small test\n" for i in range(40)))
    args = ["--standin-models", "--captions", str(captions), "--steps", "2", "--run-id", "k", "--no-progress",
            "--gen-batch-size", "1", "--generator", "one:family=unknown", "--no-save-images"]
    out = tmp_path / "killed"     # both runs ran here: their stand-ins' paths (the model column) agree
    with SnapshotAtFirstPart(tmp_path / "at_first_part") as killed:
        assert dalleval.main(["alignment", "--output", str(out), *args]) == 0
    assert 0 < killed.rows[0] < 40
    killed.swap(out / "k", tmp_path / "clean" / "k")
    assert json.loads((out / "k" / "run.json").read_text())["status"] == "running"
    assert not (out / "k" / "images.parquet").exists()
    capsys.readouterr()
    assert dalleval.main(["alignment", "--output", str(out), *args]) == 0
    reused, total, now = resumed_counts(capsys.readouterr().out)
    assert reused == killed.rows[0] and now > 0 and reused + now == total == 40    # only the rest generated
    cols = ["image_id", "seed", "prompt", A.CLIP_COSINE, A.FID_FEATURES]
    a = pq.read_table(tmp_path / "clean" / "k" / "images.parquet").select(cols).to_pandas()
    b = pq.read_table(tmp_path / "killed" / "k" / "images.parquet").select(cols).to_pandas()
    assert list(a["image_id"]) == list(b["image_id"]) and list(a["seed"]) == list(b["seed"])
    assert np.allclose(a[A.CLIP_COSINE], b[A.CLIP_COSINE], atol=1e-6)
    assert np.allclose(_vectors(a[A.FID_FEATURES]), _vectors(b[A.FID_FEATURES]), atol=1e-5)
    ta, tb = (pd.read_csv(tmp_path / d / "k" / "alignment_quality.csv") for d in ("clean", "killed"))
    pd.testing.assert_frame_equal(ta, tb, atol=1e-5)


def test_missing_inputs_fail_cleanly(tmp_path):
    assert dalleval.main(["alignment", "--output", str(tmp_path), "--captions", str(tmp_path / "nope.parquet"),
                          "--standin-models"]) == 2
    assert dalleval.main(["alignment", "--output", str(tmp_path), "--reference", str(tmp_path / "empty*"),
                          "--standin-models"]) == 2


def test_reference_images_of_the_drawn_captions_by_image_id_and_the_real_image_row(ray_local, tmp_path):
    """App. D: FID against "the same 30K images used in the R-precision calculation" (pairing
    captions, found by image id, how many found), Table 19's real-image row, the released code's
    R-precision reading; and FID against precomputed statistics."""
    from PIL import Image

    from pipelines.studies.dalleval import alignment_inputs as AI
    from pipelines.studies.dalleval import alignment_settings as AST
    from pipelines.studies.dalleval import alignment_study as AS

    caps = pa.table({"image_id": [1, 1, 2, 3, 3, 5], "caption": ["a dog", "a brown dog", "a cat", "a red car",
                                                                 "a car", "a boat"]})
    pq.write_table(caps, tmp_path / "caps.parquet")
    ref = tmp_path / "val2014"
    ref.mkdir()
    rng = np.random.default_rng(0)
    for i in (1, 2, 3, 4):   # 4: no drawn caption; 5: drawn, but its image is missing
        Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(ref / f"COCO_val2014_{i:012d}.jpg")
    out = tmp_path / "out"
    assert dalleval.main(["alignment", "--output", str(out), "--standin-models", "--captions",
                          str(tmp_path / "caps.parquet"), "--caption-group-column", "image_id", "--reference", str(ref),
                          "--r-precision-reading", "released", "--steps", "2",   # pairing captions: the default
                          "--run-id", "q", "--no-progress", "--generator", "one:family=unknown",
                          "--no-save-images"]) == 0
    run = out / "q"
    m = json.loads((run / "metrics.json").read_text())
    pairing = m["fid_reference"]
    assert (pairing["drawn_captions"], pairing["images_found"], pairing["images_missing"]) == (4, 3, 1)
    assert pairing["pairing"] == "captions" and pairing["comparable_with_table19_fid"] is False
    refs = pq.read_table(run / "reference_features.parquet").to_pandas()
    images = pq.read_table(run / "images.parquet").to_pandas()
    assert sorted(AI.image_key(r) for r in refs["reference_id"]) == ["1", "2", "3"]
    drawn = dict(zip(images["caption_id"].astype(int), images["prompt"]))    # row number -> drawn caption
    group_of = dict(enumerate(caps["image_id"].to_pylist()))
    by_image = {str(group_of[c]): p for c, p in drawn.items()}
    assert {AI.image_key(r): p for r, p in zip(refs["reference_id"], refs["prompt"])} == \
        {k: by_image[k] for k in ("1", "2", "3")}                            # each image with its drawn caption
    table = pd.read_csv(run / "alignment_quality.csv").set_index("model")
    real = table.loc[AS.REAL_IMAGES]
    want = AM.r_precision_released(_vectors(refs[A.CLIP_IMAGE_EMBEDDING]), _vectors(refs[A.CLIP_TEXT_EMBEDDING]),
                                   refs[A.CLIP_IMAGE_NORM].to_numpy(np.float32), refs[A.CLIP_TEXT_NORM].to_numpy(np.float32),
                                   negatives=99, r=1, repeats=5, seed=0)
    assert real["r_precision"] == pytest.approx(want["r_precision"]) and real["r_precision_n"] == 3
    gen = table.drop(AS.REAL_IMAGES).iloc[0]
    mine = AM.r_precision_released(_vectors(images[A.CLIP_IMAGE_EMBEDDING]), _vectors(images[A.CLIP_TEXT_EMBEDDING]),
                                   images[A.CLIP_IMAGE_NORM].to_numpy(np.float32),
                                   images[A.CLIP_TEXT_NORM].to_numpy(np.float32), negatives=99, r=1, repeats=5, seed=0)
    assert gen["r_precision"] == pytest.approx(mine["r_precision"]) and gen["r_precision_reading"] == "released"
    assert gen["fid_n_reference"] == 3
    assert "real images (reference)" in (run / "report.html").read_text()
    # the real images are a data subject of the headline, with the released reading's per-image hit shares
    from studies.dalleval.headline_checks import check_headline, lookup

    h = check_headline(run, "paper000-dalleval-alignment", {"r_precision", "clip_score"}, {"r_precision"})
    (data,) = [x for x in h["subjects"] if x["kind"] == "data"]
    assert data["name"] == AS.REAL_IMAGES and data["identity"]["pairing"] == "captions"
    assert lookup(h)[(AS.REAL_IMAGES, "r_precision")]["value"] == pytest.approx(real["r_precision"])
    assert lookup(h)[(AS.REAL_IMAGES, "r_precision")]["n"] == 3
    # pairing by image id without image ids is refused before anything starts, naming both ways out
    text = tmp_path / "caps.txt"
    text.write_text("a dog\na cat\n")
    assert dalleval.main(["alignment", "--output", str(out), "--standin-models", "--captions", str(text),
                          "--reference", str(ref), "--no-progress"]) == 2

    # precomputed statistics: FID of the same generated features against the statistics of the same
    # reference features equals FID against the features
    mu, sigma = AM.statistics(_vectors(refs[A.FID_FEATURES]))
    np.savez(tmp_path / "stats.npz", mu=mu, sigma=sigma)
    st = AST.settings(dalleval.build_parser().parse_args(   # the preset's measures (project reading, torchvision)
        ["alignment", "--output", "unused", "--reference-statistics", str(tmp_path / "stats.npz"),
         "--reference-pairing", "all"]))
    with_stats = AS.measures(pq.read_table(run / "images.parquet"), A.REFERENCE_FEATURES.empty_table(), st).iloc[0]
    assert with_stats["fid"] == pytest.approx(gen["fid"], rel=1e-6) and with_stats["fid_n_reference"] is None
    assert AS.pairing_record(st, A.REFERENCE_FEATURES.empty_table())["comparable_with_table19_fid"] is True


def test_a_parquet_reference_gives_every_file_s_images_ids_and_captions(ray_local, tmp_path):
    """A parquet reference (a directory of files; Hugging Face image structs and raw bytes) read
    in tasks: one payload per row with its bytes, id and caption."""
    from pipelines.studies.dalleval import alignment_study as AS
    from schemas.images import IMAGE
    from schemas.subsets import PROMPT

    (tmp_path / "ref").mkdir()
    structs = [{"bytes": b"a1", "path": None}, {"bytes": b"a2", "path": None}]
    pq.write_table(pa.table({"img": structs, "key": [1, 2], "text": ["a dog", "a cat"], "other": [0, 0]}),
                   tmp_path / "ref" / "a.parquet")
    pq.write_table(pa.table({"img": [b"b3"], "key": [3], "text": ["a car"], "other": [0]}), tmp_path / "ref" / "b.parquet")
    rows = AS.parquet_reference(ray_local, str(tmp_path / "ref"), "img", "key", "text").take_all()
    assert sorted((r[A.REFERENCE_ID], r[IMAGE], r[PROMPT]) for r in rows) == [
        ("1", b"a1", "a dog"), ("2", b"a2", "a cat"), ("3", b"b3", "a car")]
    plain = AS.parquet_reference(ray_local, str(tmp_path / "ref" / "b.parquet"), "img", None, None).take_all()
    assert [(r[A.REFERENCE_ID], r[IMAGE]) for r in plain] == [(None, b"b3")] and PROMPT not in plain[0]

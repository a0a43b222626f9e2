"""Training images already downloaded: img2dataset's own output in each of its three
formats, written by img2dataset from the local HTTP server, read back by the shard operators with
the very bytes a live fetch gives; and paper 002 end to end on a Re-LAION-layout caption file
without column flags, live against --training-images (with and without --fetch-missing): the same
T, every lost caption counted (not_in_shards), link rot reported beside T."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from helpers import REPO_ROOT
from operators.image_fetch import ImageFetcher
from operators.image_shard_index import ShardIndex
from operators.image_shard_reader import ShardImageReader
from pipelines import synthetic_laion
from pipelines.engine.storage import io
from pipelines.studies.amplification import training_shards
from pipelines.studies.amplification.sample_server import LocalImageServer
from schemas import images as I
from schemas.captions import JOIN_KEY, URL
from schemas.datasets import SHARD_URL

# img2dataset's settings equal to this project's fetch defaults (operators/image_fetch.py)
I2D_ARGS = dict(image_size=512, resize_mode="keep_ratio", resize_only_if_bigger=True, encode_quality=95,
                processes_count=1, thread_count=8, distributor="multiprocessing", disallowed_header_directives=[])


def img2dataset_args(url_list: str, out: str, fmt: str, per_shard: int = 200, extra: tuple = ()) -> dict:
    more = {"save_additional_columns": list(extra)} if extra else {}
    return dict(url_list=url_list, input_format="parquet", url_col="url", caption_col="caption", output_format=fmt,
                output_folder=out, number_sample_per_shard=per_shard, **I2D_ARGS, **more)


def img2dataset(*runs: dict) -> None:
    """img2dataset itself, each run in turn in one fresh process (tests/img2dataset_run.py: it
    starts its own pool, which needs a __main__ guard)."""
    env = os.environ | {"PYTHONPATH": str(REPO_ROOT), "NO_ALBUMENTATIONS_UPDATE": "1"}
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "tests" / "img2dataset_run.py"), json.dumps(list(runs))],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"img2dataset {[r['output_format'] for r in runs]} failed:\n{proc.stderr[-3000:]}"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A Re-LAION-layout caption file whose URLs point at the local server (with a DataComp-style
    ``uid`` per row), and img2dataset's output of it in each format. The parquet one is a partial
    download (every other row) from a mirror: other URLs for the same images (the server ignores
    the path's seed segment), with the ``uid`` saved in the metadata, so only ``--shard-key uid``
    joins it to the captions."""
    base = tmp_path_factory.mktemp("shards")
    with LocalImageServer() as server:
        t = synthetic_laion.generate(600, seed=1)
        urls = pc.replace_substring(t.column("URL"), "https://images.example.org/", server.base_url + "/")
        captions = pa.table({"url": urls, "caption": t.column("TEXT"), "similarity": pa.array([0.3] * t.num_rows),
                             "uid": pa.array([f"{7919 * i:032x}" for i in range(t.num_rows)])})
        path = base / "relaion2B-en-research" / "part-00000.parquet"
        path.parent.mkdir()
        pq.write_table(captions, path)
        half = captions.take(list(range(0, captions.num_rows, 2)))
        half = half.set_column(0, "url", pc.replace_substring(half.column("url"), "/synthetic/1/", "/synthetic/2/"))
        pq.write_table(half, base / "half.parquet")
        img2dataset(*(img2dataset_args(str(path), str(base / fmt), fmt) for fmt in ("webdataset", "files")),
                    img2dataset_args(str(base / "half.parquet"), str(base / "parquet"), "parquet", extra=("uid",)))
        yield {"base": base, "captions": path, "urls": urls, "uids": captions.column("uid"), "server": server}


@pytest.mark.parametrize("fmt", ["webdataset", "parquet", "files"])
def test_each_img2dataset_format_gives_the_bytes_a_live_fetch_gives(data, fmt):
    # the parquet download is from a mirror (other URLs): joined by the uid img2dataset saved
    key = "uid" if fmt == "parquet" else None
    source = training_shards.discover(str(data["base"] / fmt), key)
    assert source.format == fmt and len(source.shards) >= 1 and source.record()["joined_by"] == (key or "url")
    wanted = data["urls"].to_pylist()[:60] + ["http://nowhere.invalid/x.jpg"]
    rows = pa.table({URL: pa.array(wanted, pa.string()), JOIN_KEY: pa.array(data["uids"].to_pylist()[:60] + [None])})
    pairs = training_shards.wanted_pairs(rows, rows.column(URL), key)
    raw = pa.concat_tables([ShardIndex(pairs.column(JOIN_KEY).to_pylist(), key)(source.table().slice(i, 1))
                            for i in range(len(source.shards))])
    index = training_shards.choose(raw, pairs)
    assert set(index.column(URL).to_pylist()) <= set(wanted) and index.num_rows > 20
    assert pc.count_distinct(index.column(URL)).as_py() == index.num_rows      # one occurrence per caption URL
    by_url = pa.concat_tables([ShardIndex(wanted)(source.table().slice(i, 1)) for i in range(len(source.shards))])
    if key:   # every URL the shards hold is the mirror's: a join by URL finds none of them
        assert by_url.num_rows == 0
        assert not set(index.column(SHARD_URL).to_pylist()) & set(wanted)
    else:
        assert index.column(SHARD_URL).equals(index.column(URL))
    statuses = dict(zip(index.column(URL).to_pylist(), index.column(I.FETCH_STATUS).to_pylist()))
    live = ImageFetcher(allow_local=True)(pa.table({URL: pa.array(wanted[:60], pa.string())}))
    live_status = dict(zip(live.column(URL).to_pylist(), live.column(I.FETCH_STATUS).to_pylist()))
    live_bytes = dict(zip(live.column(URL).to_pylist(), live.column(I.IMAGE).to_pylist()))
    stored = index.filter(pc.equal(index.column(I.FETCH_STATUS), "ok"))
    read = ShardImageReader()(stored)
    assert read.num_rows == stored.num_rows and set(read.column(I.IMAGE_ORIGIN).to_pylist()) == {"shards"}
    got = dict(zip(read.column(URL).to_pylist(), read.column(I.IMAGE).to_pylist()))
    assert got and all(got[u] == live_bytes[u] for u in got)          # the same bytes: the same T
    assert all(live_status[u] == "ok" for u in got)
    # every URL the live fetch could not get is shard_failed (img2dataset's own error kept) or absent
    for u, s in live_status.items():
        if s != "ok":
            assert statuses.get(u, "absent") in ("shard_failed", "absent")
    failed = index.filter(pc.equal(index.column(I.FETCH_STATUS), "shard_failed"))
    assert all(e.startswith("img2dataset: failed_to_") for e in failed.column(I.FETCH_ERROR).to_pylist())
    absent = training_shards.absent_rows(pa.array(wanted, pa.string()), index, key)
    assert "http://nowhere.invalid/x.jpg" in absent.column(URL).to_pylist()
    assert set(absent.column(I.FETCH_STATUS).to_pylist()) == {"not_in_shards"}
    if fmt == "parquet":   # the partial download: every other row only
        assert absent.num_rows > 20
    else:
        assert absent.num_rows == 1


def test_not_img2dataset_output_is_one_line(tmp_path):
    with pytest.raises(io.InputError, match="no img2dataset output"):
        training_shards.discover(str(tmp_path))
    (tmp_path / "00000.tar").write_bytes(b"")
    with pytest.raises(io.InputError, match="without img2dataset's metadata"):
        training_shards.discover(str(tmp_path))
    with pytest.raises(io.InputError, match="not a folder"):
        training_shards.discover(str(tmp_path / "00000.tar"))


def test_shard_key_absent_from_the_metadata_or_the_captions_is_one_line(data, tmp_path, capsys):
    from pipelines import amplification

    with pytest.raises(io.InputError, match=r"--shard-key uid: img2dataset's metadata \(00000.parquet\) has no column "
                                            r"'uid' .*--save_additional_columns"):
        training_shards.discover(str(data["base"] / "webdataset"), "uid")
    res = amplification.main(["run", "--output", str(tmp_path / "out"), "--standin-models", "--captions",
                              str(data["captions"]), "--training-images", str(data["base"] / "webdataset"),
                              "--shard-key", "status"])     # in img2dataset's metadata, not in the captions
    err = capsys.readouterr().err
    assert res == 2 and "has no join key column 'status'" in err and "choose it with --shard-key" in err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


@pytest.mark.ray
def test_shards_give_the_live_fetch_s_T_on_a_relaion_file_without_column_flags(data, tmp_path, ray_local, capsys):
    from pipelines import amplification

    from family_checks import EVERY, check_amplification_families

    common = ["run", "--captions", str(data["captions"]), "--occupations", "nurse", "--sample-size", "4",
              "--nn-k", "4", "--images-per-prompt", "1", "--caption-images", "0", "--steps", "2", "--standin-models",
              "--allow-local-urls", "--no-progress", "--output", str(tmp_path)]
    sd = ["--generators", "CompVis/stable-diffusion-v1-4"]
    # the run over the partial download also generates with every family that has a stand-in (the
    # four of 2024 and twelve of 2025-2026), at their card defaults, each image through the NSFW
    # check, the face filter and CLIP
    families = ["--generators", ",".join(EVERY), "--caption-images", "1"]
    # (every format's bytes equal a live fetch's: the test above; here the stream end to end, half the
    # images from the shards and half fetched live, against all fetched live)
    # the partial download is from a mirror: joined to the captions by the uid img2dataset saved
    shards = ["--training-images", str(data["base"] / "parquet"), "--shard-key", "uid"]
    # the run over the shards with --fetch-missing takes over the partial run's caption scan (the
    # same captions and caption settings, the shards' join key included; other generators and
    # fetches): --captions-from
    scanned = ["--captions-from", str(tmp_path / "partial")]
    runs = {"live": sd, "partial": [*shards, *families], "partial_fetched": [*shards, "--fetch-missing", *sd, *scanned]}
    for run_id, extra in runs.items():
        assert amplification.main(common + ["--run-id", run_id] + extra) == 0, run_id
    out = capsys.readouterr().out
    assert out.count(f"caption scan: 1 shard(s) taken from {tmp_path / 'partial'}") == 1
    m = json.loads((tmp_path / "partial_fetched" / "metrics.json").read_text())
    assert m["caption_phase"]["reused"] == 600 and m["caption_phase"]["processed"] == 0
    assert m["caption_scan_from"] == str(tmp_path / "partial") and m["annotated_rows"] > 0
    assert "caption_scan_from" not in json.loads((tmp_path / "partial" / "metrics.json").read_text())
    pool = pq.read_table(tmp_path / "partial" / "training_subsets.parquet")
    assert pq.read_table(tmp_path / "partial_fetched" / "training_subsets.parquet").equals(pool)
    # other caption settings (here the live run's: no join key from the shards), refused in one
    # line before the run starts (no run directory, no model loaded)
    assert amplification.main(common + ["--run-id", "other", *sd, *scanned]) == 2
    err = capsys.readouterr().err
    assert "--captions-from" in err and "other caption settings" in err and "Traceback" not in err
    assert not (tmp_path / "other").exists()
    assert "input columns: caption 'caption', URL 'url' (the Re-LAION-5B layout" in out
    assert "dataset: Re-LAION-2B-en research (from the path)" in out
    rows = {r: pq.read_table(tmp_path / r / "images.parquet").to_pandas() for r in runs}
    train = {r: t[t[I.SOURCE] == "training"].reset_index(drop=True) for r, t in rows.items()}
    cols = ["subset", "caption_id", "face_status", "gender", "counted"]
    # the same images, so the same faces, genders and counted images: the same T (CLIP's
    # probabilities agree to float rounding: its batches hold other images when some were fetched)
    for r in ("partial_fetched",):
        assert train[r][cols].equals(train["live"][cols]), r
        assert np.allclose(train[r]["p_female"], train["live"]["p_female"], atol=1e-5, equal_nan=True), r
    t_live = pq.read_table(tmp_path / "live" / "training_percentages.parquet").to_pandas()
    for r in ("partial_fetched",):
        t = pq.read_table(tmp_path / r / "training_percentages.parquet").to_pandas()
        assert t.drop(columns=["percent_female"]).equals(t_live.drop(columns=["percent_female"])), r
        assert np.allclose(t["percent_female"], t_live["percent_female"], equal_nan=True), r
    assert set(train["partial_fetched"][I.IMAGE_ORIGIN]) == {"shards", "fetched"}
    # without --fetch-missing the captions the shards lack are counted, never dropped
    partial = train["partial"]
    assert len(partial) >= len(train["live"]) and (partial[I.FETCH_STATUS] == "not_in_shards").any()
    summary = (tmp_path / "partial" / "run_summary.csv").read_text()
    metrics = json.loads((tmp_path / "partial" / "metrics.json").read_text())
    assert metrics["image_config"]["training_images"]["format"] == "parquet"
    assert metrics["image_config"]["training_images"]["joined_by"] == "uid"
    assert ", joined by 'uid'): " in out
    subsets = pq.read_table(tmp_path / "partial" / "training_subsets.parquet")
    assert pc.all(pc.is_valid(subsets.column(JOIN_KEY))).as_py()             # the uid came through the selection
    rot = metrics["results"]["link_rot"]["subsets"]
    assert "not_in_shards" in rot["naive"] and rot["naive"]["not_in_shards"]["lost"] > 0
    assert "link" in json.loads((tmp_path / "live" / "metrics.json").read_text())["results"]["link_rot"]["subsets"]["naive"]
    assert "Images T could not see" in (tmp_path / "partial" / "report.html").read_text()
    assert (tmp_path / "partial" / "link_rot.csv").exists()
    assert "not_in_shards" in summary and "not_in_shards" in out           # counted in the run summary
    check_amplification_families(tmp_path / "partial", EVERY)
    # the dataset is part of the record
    job = json.loads((tmp_path / "live" / "run.json").read_text())
    assert "Re-LAION" in json.dumps(job)

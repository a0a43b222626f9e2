"""`run --captions-from RUN_DIR`: what the caption digest reads, and each refusal of `adopt` (the
end-to-end take-over, and a refusal in a run, are in test_training_images.py's shard runs)."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from pipelines import amplification
from pipelines.engine.cli.options import RunOptions
from pipelines.engine.run.rundir import RunDir
from pipelines.engine.storage import io
from pipelines.studies.amplification import caption_reuse
from pipelines.studies.amplification.captions import CaptionStudy
from pipelines.studies.amplification.study import AmplificationStudy

MODELS = {"sbert": {"commit": "abc", "sha256": "1" * 64}, "spacy": {"version": "3.8.0"}}


def digest(*flags: str, command: str = "run") -> str:
    args = amplification.build_parser().parse_args([command, "--output", "/tmp/unused", *flags])
    st = (AmplificationStudy() if command == "run" else CaptionStudy()).settings(args)
    return caption_reuse.caption_digest(RunOptions.from_args(args), st)


def test_the_digest_reads_the_caption_settings_and_input_not_the_image_side_or_the_command(tmp_path):
    import yaml

    from pipelines.engine.cli import config as study_config

    base = digest()
    preset = yaml.safe_load(study_config.default_config_path().read_text())
    image_side = {**preset, "generation": {**preset["generation"], "steps": 3},
                  "face_filter": {**preset["face_filter"], "min_confidence": 0.7}}
    (tmp_path / "image.yaml").write_text(yaml.safe_dump(image_side))
    assert digest("--config", str(tmp_path / "image.yaml")) == base     # the preset's image blocks
    (tmp_path / "caption.yaml").write_text(yaml.safe_dump({**preset, "prompts": preset["prompts"][:2]}))
    assert digest("--config", str(tmp_path / "caption.yaml")) != base
    assert digest("--generators", "stabilityai/stable-diffusion-xl-base-1.0", "--steps", "3", "--caption-images", "2",
                  "--gender-threshold", "0.8", "--face-min-size", "0.2", "--fetch-timeout", "3") == base
    assert digest(command="captions") == base          # a `captions` run feeds a `run`
    for flags in (["--nn-k", "7"], ["--sample-size", "9"], ["--occupations", "nurse"], ["--no-names"],
                  ["--gender-word-plurals"], ["--keep-columns", "WIDTH"], ["--occupation-forms", "singular"]):
        assert digest(*flags) != base, flags


def _source(tmp_path, plans: dict | None, shards_done=(0,), models=MODELS) -> RunDir:
    src = RunDir(str(tmp_path / "runs"), "src").open("fp", {"job": "src"})
    for key, value in (plans or {}).items():
        src.plan(key, value)
    for i in shards_done:
        src.write_part("caption_tallies", pa.table({"stage": ["read_captions"], "count": [3]}), key=f"shard-{i:05d}")
        io.write_bytes(src.fs, src.file(f"annotated_captions/shard-{i:05d}/part-a.parquet"), b"PAR1 rows PAR1")
        part = {"name": "part-a.parquet", "rows": 3}
        src.mark_done(f"captions/shard-{i:05d}", {"files": ["in.parquet"], "rows": 3, "parts": [part]})
    if models is not None:
        (tmp_path / "runs" / "src" / "metrics.json").write_text(json.dumps({"models": models}))
    return src


def test_adopt_copies_each_shard_not_done_here_marker_last_and_refuses_any_other_scan(tmp_path):
    plans = {caption_reuse.PLAN: "d1", "caption_shards": [["a.parquet"], ["b.parquet"]]}
    _source(tmp_path, plans, shards_done=(0, 1))
    run = RunDir(str(tmp_path / "runs"), "new").open("fp2", {"job": "new"})
    assert caption_reuse.adopt(run, str(tmp_path / "runs" / "src"), "d1", MODELS) == 2
    for i in (0, 1):
        assert run.done(f"captions/shard-{i:05d}")["parts"] == [{"name": "part-a.parquet", "rows": 3}]
        assert (tmp_path / "runs" / "new" / "annotated_captions" / f"shard-{i:05d}" / "part-a.parquet").read_bytes() \
            == b"PAR1 rows PAR1"
        assert run.read_part("caption_tallies", f"shard-{i:05d}", pa.schema([("stage", pa.string()),
                                                                            ("count", pa.int64())])).num_rows == 1
    assert run.record["plans"]["caption_shards"] == plans["caption_shards"]
    assert caption_reuse.adopt(run, str(tmp_path / "runs" / "src"), "d1", MODELS) == 0   # resumed: nothing to copy

    def refused(match, uri=str(tmp_path / "runs" / "src"), dig="d1", models=MODELS, into="other"):
        fresh = RunDir(str(tmp_path / "runs"), into).open("fp3", {"job": into})
        with pytest.raises(io.InputError, match=match):
            caption_reuse.adopt(fresh, uri, dig, models)
        assert not fresh.done("captions/shard-00000")

    refused("no run.json there", uri=str(tmp_path / "runs" / "nothing"))
    refused("other caption settings or another input", dig="d2")
    refused(r"other caption models than this run loads \(sbert", models={**MODELS, "sbert": {"commit": "def"}})
    _source(tmp_path / "b", {caption_reuse.PLAN: "d1", "caption_shards": [["a.parquet"], ["b.parquet"]]},
            shards_done=(0,))
    refused(r"not finished \(shard 2 of 2", uri=str(tmp_path / "b" / "runs" / "src"), into="third")
    _source(tmp_path / "c", {"caption_shards": [["a.parquet"]]})
    refused("records no caption scan", uri=str(tmp_path / "c" / "runs" / "src"), into="fourth")
    _source(tmp_path / "d", plans, shards_done=(0, 1), models=None)
    refused("did not finish", uri=str(tmp_path / "d" / "runs" / "src"), into="fifth")
    # a run that began its own scan in other shards keeps them
    begun = RunDir(str(tmp_path / "runs"), "begun").open("fp4", {"job": "begun"})
    begun.plan("caption_shards", [["a.parquet", "b.parquet"]])
    with pytest.raises(io.InputError, match="started its caption scan in other shards"):
        caption_reuse.adopt(begun, str(tmp_path / "runs" / "src"), "d1", MODELS)

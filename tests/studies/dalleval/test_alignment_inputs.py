"""Inputs of `dalleval.py alignment` (paper 000, App. D): captions from text, CSV and parquet with
null / blank ones counted, one caption drawn per image, the seeded sample, clear errors, the
reference sources, and a run identity that follows the captions' content."""

from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.engine.cli.options import RunOptions
from pipelines.engine.storage.io import InputError
from pipelines.studies.dalleval import alignment_inputs as AI
from pipelines.studies.dalleval import alignment_settings as AST
from pipelines.studies.dalleval import alignment_study as AS
from schemas import alignment as A
from schemas.subsets import PROMPT


def test_bundled_sample_and_seeded_draw():
    t, c = AI.read_captions({"input": None, "sample": None})
    assert c == {"read": 24, "null_or_blank": 0, "kept": 24} and t.num_rows == 24
    a, _ = AI.read_captions({"input": None, "sample": 5, "seed": 1})
    b, _ = AI.read_captions({"input": None, "sample": 5, "seed": 1})
    d, _ = AI.read_captions({"input": None, "sample": 5, "seed": 2})
    assert a.equals(b) and not a.equals(d) and a.num_rows == 5
    assert set(a.column(PROMPT).to_pylist()) <= set(t.column(PROMPT).to_pylist())


def test_parquet_with_nulls_blanks_groups_and_ids(tmp_path):
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"img": [1, 1, 2, 3, 3], "text": ["a dog", "a  brown\tdog", None, "  ", "a car"],
                             "cid": ["x1", "x2", "x3", "x4", "x5"]}), path)
    t, c = AI.read_captions({"input": str(path), "column": "text", "id_column": "cid", "group_column": "img",
                             "sample": None, "seed": 0})
    assert c == {"read": 5, "null_or_blank": 2, "one_per_group": 2, "kept": 2}
    rows = dict(zip(t.column(A.CAPTION_ID).to_pylist(), t.column(PROMPT).to_pylist()))
    assert rows["x5"] == "a car" and len(set(rows) & {"x1", "x2"}) == 1
    assert rows.get("x2", "a brown dog") == "a brown dog"          # whitespace normalised


def test_csv_and_text_inputs(tmp_path):
    (tmp_path / "c.csv").write_text("caption,other\nfirst one,1\n,2\nsecond one,3\n")
    t, c = AI.read_captions({"input": str(tmp_path / "c.csv"), "sample": None})
    assert t.column(PROMPT).to_pylist() == ["first one", "second one"] and c["null_or_blank"] == 1
    assert t.column(A.CAPTION_ID).to_pylist() == ["0", "2"]                      # row numbers
    (tmp_path / "c.txt").write_text("one\n\ntwo\n")
    t, c = AI.read_captions({"input": str(tmp_path / "c.txt"), "sample": None})
    assert t.column(PROMPT).to_pylist() == ["one", "two"] and c == {"read": 3, "null_or_blank": 1, "kept": 2}


@pytest.mark.parametrize("cfg, message", [
    ({"column": "nope"}, "no column 'nope'"),
    ({"id_column": "nope"}, "no id column"),
    ({"group_column": "nope"}, "no group column"),
])
def test_bad_caption_columns_are_named(tmp_path, cfg, message):
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"caption": ["a dog"]}), path)
    with pytest.raises(InputError, match=message):
        AI.read_captions({"input": str(path), "sample": None, **cfg})


def test_missing_or_empty_inputs_are_clear_errors(tmp_path):
    with pytest.raises(InputError, match="cannot read captions"):
        AI.read_captions({"input": str(tmp_path / "missing.parquet"), "sample": None})
    (tmp_path / "blank.txt").write_text("\n  \n")
    with pytest.raises(InputError, match="no usable caption"):
        AI.read_captions({"input": str(tmp_path / "blank.txt"), "sample": None})
    with pytest.raises(InputError, match="no image file"):
        AI.reference_sources({"images": str(tmp_path / "nothing*")})


def test_reference_sources(tmp_path):
    assert AI.reference_sources({"images": None}) == ("bundled", None)
    (tmp_path / "sub").mkdir()
    for name in ("b.png", "a.jpg", "sub/c.JPEG", "notes.txt"):
        (tmp_path / name).write_bytes(b"x")
    kind, paths = AI.reference_sources({"images": str(tmp_path), "max_images": None})
    assert kind == "files" and [p.split("/")[-1] for p in paths] == ["a.jpg", "b.png", "c.JPEG"]
    assert len(AI.reference_sources({"images": str(tmp_path), "max_images": 2})[1]) == 2
    pq.write_table(pa.table({"image": [b"x"]}), tmp_path / "r.parquet")
    assert AI.reference_sources({"images": str(tmp_path / "r.parquet")})[0] == "parquet"


def test_bundled_reference_decodes_to_colour_images():
    from operators.support.codec import batch_images

    t = AI.bundled_reference()
    arrays = batch_images(t)
    assert len(arrays) == 8 and all(a is not None and a.ndim == 3 and a.shape[2] == 3 for a in arrays)
    assert AI.bundled_reference() is t      # encoded once per process (a driver of several runs)


def test_run_identity_follows_the_captions_content():
    t, _ = AI.read_captions({"input": None, "sample": None})
    a = AST.captions_digest(AI.requests_of(t, 0))
    changed = t.set_column(1, PROMPT, pa.array(["x"] + t.column(PROMPT).to_pylist()[1:]))
    assert AST.captions_digest(AI.requests_of(changed, 0)) != a
    assert AST.captions_digest(AI.requests_of(t, 0)) == a
    req = AI.requests_of(t, 0)
    assert req.schema.equals(A.ALIGNMENT_REQUESTS) and req.column("seed").to_pandas().nunique() == 24


def test_pairing_by_image_id_one_image_per_id_then_at_most_n(tmp_path):
    """App. D.2's pairing: the drawn captions' images by image id, one file per id, max_images
    counted after the match; a parquet caption column gives way to the drawn caption."""
    import pyarrow as pa

    from schemas import alignment as A
    from schemas.subsets import PROMPT

    captions = {"1": "a dog", "3": "a cat", "9": "a car"}
    paths = [f"/r/COCO_val2014_{i:012d}.jpg" for i in range(1, 6)] + ["/r/COCO_train2014_000000000003.jpg"]
    assert AI.paired_paths(paths, captions) == ["/r/COCO_train2014_000000000003.jpg",
                                                "/r/COCO_val2014_000000000001.jpg"]
    assert AI.paired_paths(paths, captions, max_images=1) == ["/r/COCO_train2014_000000000003.jpg"]
    batch = pa.table({A.REFERENCE_ID: ["1", "2", "3"], PROMPT: ["own 1", "own 2", "own 3"]})
    out = AI._attach(batch, captions, "caption")
    assert out[A.REFERENCE_ID].to_pylist() == ["1", "3"] and out[PROMPT].to_pylist() == ["a dog", "a cat"]
    assert AI._attach(batch, None, "caption")[PROMPT].to_pylist() == ["own 1", "own 2", "own 3"]
    # a parquet reference without an id column cannot be paired: refused before the run starts
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"image": [b"x"]}), tmp_path / "ref.parquet")
    with pytest.raises(InputError, match="id_column"):
        AI.reference_captions({"images": str(tmp_path / "ref.parquet"), "pairing": "captions"}, {"1": "a"})


def test_the_announcement_states_the_negatives_actually_drawn(capsys):
    from pipelines import dalleval

    for extra, expect in ((["--max-captions", "24"], "R-precision (1 + 23 negatives; 99 configured, fewer other captions)"),
                          (["--max-captions", "24", "--negatives", "5"], "R-precision (1 + 5 negatives)")):
        args = dalleval.build_parser().parse_args(["alignment", "--output", "unused", *extra])
        study = AS.AlignmentStudy()
        study.announce(RunOptions.from_args(args), study.settings(args))
        assert expect in capsys.readouterr().out


def test_the_reference_pairing_help_names_the_default_the_settings_use(capsys):
    """The help said "all (default)" while a run without the flag pairs by captions."""
    from pipelines import dalleval

    parser = dalleval.build_parser()
    default = AS.AlignmentStudy().settings(parser.parse_args(["alignment", "--output", "unused"])).reference["pairing"]
    with pytest.raises(SystemExit):
        parser.parse_args(["alignment", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    m = re.search(r"--reference-pairing \{(?P<choices>[^}]*)\} (?P<help>.*?) --", text)
    assert sorted(m.group("choices").split(",")) == sorted(A.REFERENCE_PAIRINGS)
    helped = m.group("help")
    assert f"{default} (default):" in helped
    assert [c for c in A.REFERENCE_PAIRINGS if f"{c} (default)" in helped] == [default]

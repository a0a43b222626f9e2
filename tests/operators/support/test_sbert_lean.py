"""SBERT through torch alone: the packaged all-MiniLM-L6-v2 gives sentence-transformers'
vectors and token ids without the library's start-up; anything else goes through the library."""

import json
import shutil
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
from helpers import REPO_ROOT

from operators.support.models import ModelLoadError
from operators.support.sbert_lean import LeanSbert, lean_layout
from operators.text_prompt_similarity import (PromptSimilarity, load_sentence_transformer, resolve_sbert, sbert_loader,
                                              unit_embeddings)

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
EDGE = ["", "a", "  leading and trailing spaces  ", "UPPER Case Ünïcödé café", "護士と医者", "tab\tand\nnewline",
        "x " * 400, "emoji 👩‍⚕️ nurse", "[CLS] literal [SEP] tokens", "don't-stop", "12,345.67 $ %"]


@pytest.fixture(scope="module")
def captions():
    sample = pq.read_table(REPO_ROOT / "data" / "synthetic" / "laion_synthetic_sample.parquet", columns=["TEXT"])
    return [c for c in sample.column("TEXT").to_pylist()[:400] if c is not None] + EDGE


@pytest.fixture(scope="module")
def lean():
    model = load_sentence_transformer(MODEL, device="cpu", lean=True)
    assert isinstance(model, LeanSbert)
    return model


@pytest.fixture(scope="module")
def vectors(lean, minilm, captions):
    """Each loader's unit vectors of ``captions``, with the CPU path's batches cut by tokens (1024)
    and with the library's batching (64 texts sorted by characters; None)."""
    return {(name, budget): unit_embeddings(model, captions, 64, budget)
            for name, model in (("lean", lean), ("library", minilm)) for budget in (1024, None)}


def test_same_token_ids_and_vectors_as_the_library(lean, minilm, captions, vectors):
    assert lean.max_seq_length == minilm.max_seq_length == 256
    ids = lean.tokenizer(captions, truncation=True, max_length=256)["input_ids"]
    assert ids == minilm.tokenizer(captions, truncation=True, max_length=256)["input_ids"]
    assert max(map(len, ids)) == 256                                      # truncated like the library
    for budget in (1024, None):
        got, ref = vectors["lean", budget], vectors["library", budget]
        assert got.shape == ref.shape == (len(captions), 384)
        np.testing.assert_allclose(got, ref, atol=1e-6, rtol=0)
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)


def test_tokenized_once_the_batches_give_what_encoding_each_batch_gives(lean, captions, vectors):
    """The CPU path tokenizes each text once (``encode_by_tokens``): bit for bit what cutting the
    batches by the tokenizer's lengths and calling ``encode`` on each batch's texts gives."""
    from operators.support.sbert_batches import token_batches, token_lengths

    ref = np.empty_like(vectors["lean", 1024])
    for idx in token_batches(token_lengths(lean.tokenizer, captions, lean.max_seq_length), 1024):
        ref[idx] = lean.encode([captions[i] for i in idx], batch_size=len(idx), normalize_embeddings=True)
    assert np.array_equal(vectors["lean", 1024], ref)
    assert np.array_equal(lean.encode_by_tokens(captions, 256), unit_embeddings(lean, captions, 64, 256))
    assert lean.encode_by_tokens([], 1024).shape == (0, 384)


def test_nearest_neighbours_are_the_librarys(lean, minilm, vectors):
    """The top-50 captions per prompt, as paper 002's NN subsets take them, are the same sets."""
    prompts = [f"A photo of the face of a {o}" for o in ("nurse", "doctor", "teacher", "engineer", "chef")]
    got = vectors["lean", 1024] @ unit_embeddings(lean, prompts, 64, 1024).T
    ref = vectors["library", 1024] @ unit_embeddings(minilm, prompts, 64, 1024).T
    for j in range(len(prompts)):
        assert set(np.argsort(-got[:, j], kind="stable")[:50]) == set(np.argsort(-ref[:, j], kind="stable")[:50])


def test_without_normalize_it_is_the_librarys_mean_pooling(tmp_path):
    """A saved model without the Normalize module: raw mean-pooled vectors, as the library gives."""
    src = tmp_path / "plain"
    shutil.copytree(resolve_sbert(MODEL)[0], src)
    modules = json.loads((src / "modules.json").read_text())
    (src / "modules.json").write_text(json.dumps([m for m in modules if not m["type"].endswith("Normalize")]))
    model = load_sentence_transformer(str(src), device="cpu", lean=True)
    assert isinstance(model, LeanSbert) and not model.normalize
    texts = EDGE[:6]
    raw = model.encode(texts, 4)
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0)
    library = load_sentence_transformer(str(src), device="cpu")
    assert sbert_loader(library) == "sentence-transformers"
    np.testing.assert_allclose(raw, library.encode(texts, batch_size=4, normalize_embeddings=False), atol=2e-6, rtol=0)


@pytest.mark.parametrize("change,why", [
    (lambda d: (d / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 384, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False})), "pooling"),
    (lambda d: (d / "config.json").write_text(json.dumps(
        json.loads((d / "config.json").read_text()) | {"hidden_act": "gelu_new"})), "erf GELU"),
    (lambda d: (d / "tokenizer.json").unlink(), "no tokenizer.json"),
    (lambda d: (d / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128, "do_lower_case": True})),
     "do_lower_case"),
])
def test_layouts_it_does_not_compute_go_through_the_library(tmp_path, change, why):
    src = tmp_path / "other"
    shutil.copytree(resolve_sbert(MODEL)[0], src)
    assert lean_layout(src) is None
    change(src)
    assert why in lean_layout(src)
    model = load_sentence_transformer(str(src), device="cpu", lean=True)
    assert sbert_loader(model) == "sentence-transformers"


def test_non_float32_weights_and_hub_ids_go_through_the_library(tmp_path):
    from safetensors.torch import load_file, save_file

    src = tmp_path / "half"
    shutil.copytree(resolve_sbert(MODEL)[0], src)
    weights = load_file(str(src / "model.safetensors"))
    save_file({k: v.half() for k, v in weights.items()}, str(src / "model.safetensors"))
    assert "F16" in lean_layout(src)
    assert lean_layout("org/not-a-directory") == "not a local directory"


def test_broken_weights_are_a_one_line_load_error(tmp_path):
    src = tmp_path / "broken"
    shutil.copytree(resolve_sbert(MODEL)[0], src)
    weights = (src / "model.safetensors").read_bytes()
    (src / "model.safetensors").write_bytes(weights[:len(weights) // 2])   # a truncated download
    with pytest.raises(ModelLoadError, match="cannot load SBERT model"):
        load_sentence_transformer(str(src), device="cpu", lean=True)


def test_the_default_backend_loads_lean_and_gives_the_librarys_similarities(captions):
    import pyarrow as pa

    prompts = {"nurse": ["A photo of a nurse", "A nurse at work"], "chef": ["A photo of a chef", "A chef cooking"]}
    lean_op = PromptSimilarity(MODEL, prompts, device="cpu")
    library_op = PromptSimilarity(MODEL, prompts, device="cpu", backend="sentence-transformers")
    assert (sbert_loader(lean_op.model), sbert_loader(library_op.model)) == ("lean", "sentence-transformers")
    t = pa.table({"caption": captions[:300], "occupation": ["nurse", "chef"] * 150})
    got = np.array(lean_op(t).column("prompt_similarity").to_pylist())
    ref = np.array(library_op(t).column("prompt_similarity").to_pylist())
    np.testing.assert_allclose(got, ref, atol=2e-6, rtol=0)


def test_the_paraphrase_cosine_loads_lean_and_gives_the_librarys_cosines(captions):
    """App. A.6's caption-paraphrase cosine: lean on a CPU by default, the library's cosines; rows
    whose paraphrase is not ok get null with either loader."""
    import pyarrow as pa

    from operators.text_paraphrase_similarity import ParaphraseSimilarity
    from schemas.paraphrases import PARAPHRASE, PARAPHRASE_SBERT, PARAPHRASE_STATUS

    lean_op = ParaphraseSimilarity(MODEL, device="cpu")
    library_op = ParaphraseSimilarity(MODEL, device="cpu", lean=False)
    assert (sbert_loader(lean_op.model), sbert_loader(library_op.model)) == ("lean", "sentence-transformers")
    n = 120
    t = pa.table({"caption": captions[:n], PARAPHRASE: captions[n:2 * n],
                  PARAPHRASE_STATUS: (["ok"] * 5 + ["http_error"]) * (n // 6)})
    got, ref = (np.array(op(t).column(PARAPHRASE_SBERT).to_pylist(), dtype=float) for op in (lean_op, library_op))
    ok = np.array(t.column(PARAPHRASE_STATUS).to_pylist()) == "ok"
    assert np.isnan(got[~ok]).all() and np.isnan(ref[~ok]).all() and np.isfinite(got[ok]).all()
    assert np.ptp(got[ok]) > 0.1                                  # real cosines, not one value
    np.testing.assert_allclose(got[ok], ref[ok], atol=2e-6, rtol=0)


@pytest.mark.slow
def test_an_actor_with_the_default_backend_never_imports_sentence_transformers():
    """What an SBERT actor imports to start (a fresh process): torch and tokenizers, not
    sentence-transformers or transformers (~4 CPU-s more); the library's backend does import them."""
    code = (
        "import sys\n"
        "from operators.text_prompt_similarity import PromptSimilarity\n"
        "def loaded(): return [m for m in ('sentence_transformers', 'transformers') if m in sys.modules]\n"
        f"PromptSimilarity({MODEL!r}, {{'nurse': ['a nurse']}}, device='cpu')\n"
        "print(loaded())\n"
        f"PromptSimilarity({MODEL!r}, {{'nurse': ['a nurse']}}, device='cpu', backend='sentence-transformers')\n"
        "print(loaded())\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[:2] == ["[]", "['sentence_transformers', 'transformers']"]

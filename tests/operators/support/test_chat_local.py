"""The local transformers chat backend (paper 002 App. A.6 paraphrases) on tiny models
built offline: a random LlamaForCausalLM and a WordLevel tokenizer with a chat template, and a
"scripted" variant of it whose weights make it a fixed bigram chain (no attention or MLP output,
one-hot embeddings, an lm_head pointing each token at the next), so its answers are known:
after the generation prompt's ":" it says "a doctor" and stops."""

import json
import logging
import re
import shutil
import warnings
from pathlib import Path

import pytest

from operators.support.chat_client import ChatResult
from operators.support.chat_local import LocalChatModel
from operators.support.models import ModelLoadError, file_sha256, weights_provenance
from schemas.paraphrases import ParaphraseStatus as S

from chat_models import REQUESTS, build_dirs

@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    return build_dirs(tmp_path_factory.mktemp("chat_local"))


@pytest.fixture(scope="module")
def random_lm(dirs):
    return LocalChatModel(str(dirs["random"]), max_new_tokens=6, batch_size=5)


def test_loads_answers_every_request_and_records_the_weights(dirs, random_lm):
    results = random_lm.complete_many(REQUESTS)
    assert len(results) == len(REQUESTS)
    assert all(isinstance(r, ChatResult) and r.status in S.ALL for r in results)
    assert all((r.text is None) == (r.status == S.EMPTY) for r in results)
    assert random_lm.complete(REQUESTS[1]) == results[1]

    rec = random_lm.record()
    weights = dirs["random"] / "model.safetensors"
    assert rec["backend"] == "transformers" and rec["model"] == str(dirs["random"]) and rec["revision"] is None
    assert rec["weight_files"] == {"model.safetensors": file_sha256(weights)}
    assert rec["weights_sha256"] == weights_provenance([weights], dirs["random"])["weights_sha256"]
    assert re.fullmatch(r"[0-9a-f]{64}", rec["weights_sha256"])
    assert rec["commit"] is None   # a local directory, not a hub snapshot
    assert rec["dtype"] == "float32" and rec["device"] == "cpu" and rec["max_new_tokens"] == 6
    assert rec["chat_template"] is True and rec["transformers"]
    assert not [k for k in rec if re.search("key|secret|password|auth", k, re.I)]
    json.dumps(rec)
    # other weights, another sha256
    other = LocalChatModel(str(dirs["chain"]), max_new_tokens=2).record()
    assert other["weights_sha256"] != rec["weights_sha256"]


def test_prompt_is_the_chat_template_with_generation_prompt_or_the_content_and_a_newline(dirs, random_lm):
    assert random_lm.prompt(REQUESTS[3]) == (f"<s> user : {REQUESTS[3][0]['content']} </s> <s> assistant :")
    plain = LocalChatModel(str(dirs["plain"]), max_new_tokens=3)
    assert plain.record()["chat_template"] is False
    assert plain.prompt(REQUESTS[3]) == REQUESTS[3][0]["content"] + "\n"


def test_greedy_is_deterministic(dirs, random_lm):
    first = random_lm.complete_many(REQUESTS)
    assert random_lm.complete_many(REQUESTS) == first
    assert LocalChatModel(str(dirs["random"]), max_new_tokens=6, batch_size=5).complete_many(REQUESTS) == first
    # left padding: one request at a time gives the same answers as the padded batch (float32: the
    # last-step logits differ by ~1e-7 between batch shapes, far below this model's top-2 margins)
    assert LocalChatModel(str(dirs["random"]), max_new_tokens=6, batch_size=1).complete_many(REQUESTS) == first
    assert LocalChatModel(str(dirs["random"]), max_new_tokens=6, batch_size=2).complete_many(REQUESTS) == first
    assert random_lm.deterministic and random_lm.is_deterministic(0.0)


def test_sampling_is_seeded_per_chunk_and_not_called_deterministic(dirs):
    lm = LocalChatModel(str(dirs["random"]), max_new_tokens=6, batch_size=2, seed=0)
    a = lm.complete_many(REQUESTS, temperature=1.0)
    assert not lm.deterministic and not lm.is_deterministic(1.0)
    assert lm.complete_many(REQUESTS, temperature=1.0) == a        # torch.manual_seed(seed + chunk)
    assert all(r.status in S.ALL for r in a)
    b = LocalChatModel(str(dirs["random"]), max_new_tokens=6, batch_size=2, seed=1).complete_many(
        REQUESTS, temperature=1.0)
    assert b != a
    greedy = lm.complete_many(REQUESTS)
    assert lm.deterministic and greedy != a


def test_statuses_ok_too_long_and_empty(dirs):
    ok = LocalChatModel(str(dirs["chain"]), max_new_tokens=3).complete_many(REQUESTS)
    assert ok == [ChatResult("a doctor", S.OK)] * len(REQUESTS)
    assert LocalChatModel(str(dirs["chain"]), max_new_tokens=8).complete(REQUESTS[0]) == ChatResult("a doctor", S.OK)
    # two tokens produced, no end-of-sequence token among them: cut, the partial text kept
    cut = LocalChatModel(str(dirs["chain"]), max_new_tokens=2).complete_many(REQUESTS)
    assert [(r.text, r.status) for r in cut] == [("a doctor", S.TOO_LONG)] * len(REQUESTS)
    assert LocalChatModel(str(dirs["chain"]), max_new_tokens=1).complete(REQUESTS[0]).status == S.TOO_LONG
    # the end-of-sequence token first: an empty answer
    empty = LocalChatModel(str(dirs["silent"]), max_new_tokens=4).complete_many(REQUESTS)
    assert empty == [ChatResult(None, S.EMPTY)] * len(REQUESTS)
    # no chat template: the last word of the content decides (":" -> "a doctor", "doctor" -> stop)
    plain = LocalChatModel(str(dirs["plain"]), max_new_tokens=4, batch_size=4)
    got = plain.complete_many([[{"role": "user", "content": "the nurse :"}], [{"role": "user", "content": "a chef doctor"}],
                               [{"role": "user", "content": "a"}]])
    assert got == [ChatResult("a doctor", S.OK), ChatResult(None, S.EMPTY), ChatResult("doctor", S.OK)]


def test_special_tokens_once_and_left_padding(dirs, monkeypatch):
    """The chat template's text already holds <s>: it is not added again; without a template the
    tokenizer adds it; rows are padded on the left, with an attention mask."""
    for name, pad in (("random", 3), ("plain", 3), ("nopad", 2)):
        lm = LocalChatModel(str(dirs[name]), max_new_tokens=2, batch_size=5)
        seen = {}
        generate = lm.model.generate

        def spy(**kw):
            seen.update(kw)
            return generate(**kw)

        monkeypatch.setattr(lm.model, "generate", spy)
        lm.complete_many(REQUESTS)
        ids, mask = seen["input_ids"], seen["attention_mask"]
        assert seen["pad_token_id"] == pad == lm.record()["pad_token_id"]
        assert mask[:, -1].all() and not mask.all()                   # left padding
        for row, m in zip(ids.tolist(), mask.tolist()):
            real = [t for t, keep in zip(row, m) if keep]
            assert real[0] == 1 and real[1] != 1                      # one <s>, first
            assert all(t == pad for t, keep in zip(row, m) if not keep)


def one_line_error(model: str) -> str:
    with pytest.raises(ModelLoadError) as info:
        LocalChatModel(model)
    msg = str(info.value)
    assert "\n" not in msg and "Traceback" not in msg and model in msg
    return msg


def test_load_errors_are_one_line_naming_the_model(dirs, tmp_path):
    one_line_error(str(tmp_path / "does-not-exist"))
    no_weights = tmp_path / "no_weights"
    shutil.copytree(dirs["random"], no_weights)
    (no_weights / "model.safetensors").unlink()
    one_line_error(str(no_weights))
    # weights that do not cover the model (a third layer the checkpoint lacks) are an error
    bigger = tmp_path / "bigger"
    shutil.copytree(dirs["random"], bigger)
    cfg = json.loads((bigger / "config.json").read_text())
    cfg["num_hidden_layers"] = 3
    (bigger / "config.json").write_text(json.dumps(cfg))
    assert "lack" in one_line_error(str(bigger))


def test_generation_emits_no_warnings(dirs):
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    if hasattr(logging.Logger, "warning_once") and hasattr(logging.Logger.warning_once, "cache_clear"):
        logging.Logger.warning_once.cache_clear()   # a warning logged once before would be silent now
    handler = Keep(level=logging.WARNING)
    root = logging.getLogger("transformers")        # it does not propagate to the root logger
    root.addHandler(handler)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for name in ("random", "nopad", "plain"):
                lm = LocalChatModel(str(dirs[name]), max_new_tokens=4, batch_size=3)
                greedy = lm.complete_many(REQUESTS)
                sampled = lm.complete_many(REQUESTS, temperature=0.7)
    finally:
        root.removeHandler(handler)
    assert len(greedy) == len(sampled) == len(REQUESTS)
    assert [r.getMessage() for r in records] == []


def test_paths_are_used_as_given(dirs):
    assert Path(LocalChatModel(str(dirs["random"]), max_new_tokens=1).record()["path"]) == Path(dirs["random"]).resolve()

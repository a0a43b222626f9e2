"""The App. A.6 paraphraser operator: the paper's prompt filled per caption, the occupation check by
the caption side's matching rules, one retry for a backend that is not deterministic and none for
one that is, every row with a status; and the stand-in endpoint through the real client."""

import pyarrow as pa

from operators.support.chat_client import ChatResult
from operators.text_caption_paraphraser import CaptionParaphraser, names_occupation
from operators.text_occupation_matcher import OccupationMatcher
from schemas.paraphrases import (PAPER_PROMPT, PARAPHRASE, PARAPHRASE_ATTEMPTS, PARAPHRASE_RETRIED,
                                 PARAPHRASE_STATUS, ParaphraseStatus as S)

OCCS = ["nurse", "engineer", {"name": "ceo", "prompt_name": "CEO"}, "prime minister"]


class Scripted:
    """A backend answering from a list per caption (one answer per call), recording the prompts."""

    deterministic_backend = False

    def __init__(self, answers: dict):
        self.answers = {k: list(v) for k, v in answers.items()}
        self.prompts = []

    def is_deterministic(self, temperature):
        return self.deterministic_backend

    def complete_many(self, requests, temperature=0.0):
        out = []
        for messages in requests:
            prompt = messages[-1]["content"]
            self.prompts.append(prompt)
            caption = prompt.rsplit("Phrase/Sentence: ", 1)[1]
            text, status = self.answers[caption].pop(0)
            out.append(ChatResult(text, status, None if status == S.OK else status))
        return out


def op_with(backend, monkeypatch):
    import operators.text_caption_paraphraser as mod

    monkeypatch.setattr(mod, "make_backend", lambda spec: backend)
    return CaptionParaphraser({"kind": "endpoint"}, OCCS)


def batch(rows):
    return pa.table({"caption": [c for c, _ in rows], "occupation": [o for _, o in rows]})


def test_the_prompt_is_the_papers_with_the_occupation_as_the_prompts_name_it(monkeypatch):
    backend = Scripted({"ceo at a desk": [("The CEO at a desk", S.OK)]})
    out = op_with(backend, monkeypatch)(batch([("ceo at a desk", "ceo")]))
    assert backend.prompts == [PAPER_PROMPT.replace("[OCCUPATION]", "CEO").replace("[CAPTION]", "ceo at a desk")]
    assert out.column(PARAPHRASE_STATUS).to_pylist() == [S.OK]


def test_occupation_check_retries_once_then_counts_no_occupation(monkeypatch):
    backend = Scripted({
        "a nurse": [("Nurses on duty", S.OK)],                                   # plural form: the caption side's rules
        "an engineer": [("A person at work", S.OK), ("An ENGINEER at work", S.OK)],   # named on the retry
        "the prime minister": [("The premier", S.OK), ("A leader", S.OK)],        # never named
        "nurse at night": [("A nursery at night", S.OK), ("A nursery", S.OK)],    # 'nursery' is not 'nurse'
        "engineer x": [("busy", S.HTTP_ERROR)],                                   # a failure is not retried here
    })
    op = op_with(backend, monkeypatch)
    out = op(batch([("a nurse", "nurse"), ("an engineer", "engineer"), ("the prime minister", "prime minister"),
                    ("nurse at night", "nurse"), ("engineer x", "engineer")])).to_pydict()
    assert out[PARAPHRASE_STATUS] == [S.OK, S.OK, S.NO_OCCUPATION, S.NO_OCCUPATION, S.HTTP_ERROR]
    assert out[PARAPHRASE_RETRIED] == [False, True, True, True, False]
    assert out[PARAPHRASE_ATTEMPTS] == [1, 2, 2, 2, 1]
    assert out[PARAPHRASE][1] == "An ENGINEER at work" and out[PARAPHRASE][2] == "A leader"   # kept to inspect
    assert len(backend.prompts) == 8


def test_a_deterministic_backend_is_not_asked_again(monkeypatch):
    backend = Scripted({"an engineer": [("A person at work", S.OK), ("An engineer", S.OK)]})
    backend.deterministic_backend = True
    out = op_with(backend, monkeypatch)(batch([("an engineer", "engineer")])).to_pydict()
    assert out[PARAPHRASE_STATUS] == [S.NO_OCCUPATION] and out[PARAPHRASE_RETRIED] == [False]
    assert len(backend.prompts) == 1


def test_null_or_blank_captions_get_a_status_without_a_request(monkeypatch):
    backend = Scripted({"a nurse": [("A nurse", S.OK)]})
    out = op_with(backend, monkeypatch)(pa.table({"caption": [None, "  ", "a nurse"],
                                                  "occupation": ["nurse"] * 3})).to_pydict()
    assert out[PARAPHRASE_STATUS] == [S.EMPTY, S.EMPTY, S.OK] and len(backend.prompts) == 1


def test_names_occupation_uses_the_forms_setting():
    texts, occs = pa.array(["two nurses", "a nurse", None]), pa.array(["nurse", "nurse", "nurse"])
    assert names_occupation(OccupationMatcher(["nurse"], "plural"), texts, occs).tolist() == [True, True, False]
    assert names_occupation(OccupationMatcher(["nurse"], "singular"), texts, occs).tolist() == [False, True, False]


def test_the_standin_endpoint_through_the_real_client():
    """Every branch the stand-in server has: 429 first, an answer lacking the occupation first
    (asked again), one never naming it; the rest rule-based paraphrases naming it."""
    import zlib

    from pipelines.standins.chat import StandinChatServer

    captions = [f"a photo of a nurse number {i}" for i in range(40)]
    kinds = {c: zlib.crc32(c.encode()) for c in captions}
    with StandinChatServer() as server:
        op = CaptionParaphraser({"kind": "endpoint", "endpoint": server.base_url, "model": "standin-paraphraser",
                                 "backoff": 0.0}, ["nurse"])
        out = op(batch([(c, "nurse") for c in captions])).to_pydict()
    for c, status, retried, attempts, text in zip(captions, out[PARAPHRASE_STATUS], out[PARAPHRASE_RETRIED],
                                                  out[PARAPHRASE_ATTEMPTS], out[PARAPHRASE]):
        crc = kinds[c]
        assert status == (S.NO_OCCUPATION if crc % 13 == 0 else S.OK), c
        assert retried == (crc % 13 == 0 or crc % 9 == 0), c
        assert attempts == 1 + retried + (crc % 7 == 0), c
        if status == S.OK:
            assert "nurse" in text.lower() and text != c
    assert {S.OK, S.NO_OCCUPATION} <= set(out[PARAPHRASE_STATUS])
    assert any(kinds[c] % 7 == 0 for c in captions) and any(kinds[c] % 9 == 0 and kinds[c] % 13 for c in captions)

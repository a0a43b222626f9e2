"""Paraphrase training captions with an LLM (paper 002, App. A.6), one status per caption.

The paper asks gpt-3.5-turbo at temperature 0 with its prompt (``schemas.paraphrases.PAPER_PROMPT``:
"... You must include the word [OCCUPATION]. Phrase/Sentence: [CAPTION]"). The backend is any
OpenAI-compatible chat-completions endpoint (``operators.support.chat_client.ChatClient``) or a
local transformers model (``operators.support.chat_local.LocalChatModel``, loaded once per actor,
on a GPU actor when the run has GPUs); a user's file of paraphrases is joined by the pipeline and
checked with ``names_occupation`` here.

The paper's rule is checked: an answer that does not name the row's occupation, by the caption
side's matching rules (``OccupationMatcher``: whole words, case-insensitive, each term and its forms),
is asked again once with the same prompt when the backend is not deterministic (an endpoint; a local
model sampling at a temperature above 0), and gets ``no_occupation`` if it still lacks it. Its text
is kept for inspection; it is never used as a prompt. Nothing raises inside a worker for one bad
answer: every row leaves with a status.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from operators.base import Resources, with_column
from operators.support.chat_client import ChatClient
from operators.support.chat_local import LocalChatModel
from operators.text_occupation_matcher import OccupationMatcher
from schemas.captions import CAPTION, OCCUPATION
from schemas.occupations import parse_occupations
from schemas.paraphrases import (
    CAPTION_SLOT,
    OCCUPATION_SLOT,
    PAPER_PROMPT,
    PARAPHRASE,
    PARAPHRASE_ATTEMPTS,
    PARAPHRASE_ERROR,
    PARAPHRASE_RETRIED,
    PARAPHRASE_STATUS,
    STAGE_PARAPHRASE,
    ParaphraseStatus as S,
)

BACKENDS = ("endpoint", "transformers")


def make_backend(spec: dict):
    """The chat backend of a spec: {"kind": "endpoint", endpoint, model, api_key_env, timeout,
    max_retries, concurrency, max_tokens} or {"kind": "transformers", model, revision, dtype, device,
    max_new_tokens, batch_size}."""
    spec = dict(spec)
    kind = spec.pop("kind", None)
    if kind == "endpoint":
        return ChatClient(**spec)
    if kind == "transformers":
        return LocalChatModel(**spec)
    raise ValueError(f"paraphrase backend {kind!r}: one of {BACKENDS}")


def deterministic(backend, temperature: float) -> bool:
    """Whether asking again can give another answer: an endpoint may (even at temperature 0 a hosted
    model's answers vary; a project choice to treat it so), a local model only when sampling."""
    check = getattr(backend, "is_deterministic", None)
    return bool(check(temperature)) if check is not None else False


def fill_prompt(template: str, occupation_word: str, caption: str) -> str:
    """App. A.6's prompt for one caption: [OCCUPATION] and [CAPTION] filled."""
    return template.replace(OCCUPATION_SLOT, occupation_word).replace(CAPTION_SLOT, caption)


def check_template(template: str) -> str:
    for slot in (OCCUPATION_SLOT, CAPTION_SLOT):
        if slot not in template:
            raise ValueError(f"paraphrase prompt {template!r} lacks the {slot} placeholder")
    return template


def occupation_words(occupations) -> dict[str, str]:
    """occupation name -> the word put into the prompt: the occupation as the Table 1 prompts name
    it ("CEO", "prime minister"; a project choice, the paper does not say)."""
    return {o.name: (o.prompt_name or o.name) for o in parse_occupations(occupations)}


def names_occupation(matcher: OccupationMatcher, texts: pa.Array, occupations: pa.Array) -> np.ndarray:
    """Per row: does ``texts`` name the row's occupation, by the caption side's matching rules.
    A null text names none."""
    found = matcher.which(pc.fill_null(texts, ""))
    flat = found.flatten().to_numpy(zero_copy_only=False).astype(object)
    parent = pc.list_parent_indices(found).to_numpy(zero_copy_only=False)
    wanted = np.asarray(occupations.to_pylist(), dtype=object)
    hit = np.zeros(len(texts), bool)
    if len(flat):
        hit[np.unique(parent[flat == wanted[parent]])] = True
    return hit & np.asarray(pc.is_valid(texts).to_numpy(zero_copy_only=False))


class CaptionParaphraser:
    """Adds ``paraphrase``, ``paraphrase_status``, ``paraphrase_error``, ``paraphrase_attempts`` and
    ``paraphrase_retried`` to rows with ``caption`` and ``occupation``."""

    stage_name = STAGE_PARAPHRASE
    # an endpoint's requests run in the actor's threads (concurrency); a local model batches on its device
    resources = Resources(num_cpus=1, batch_size=64, actors=1)

    def __init__(self, backend: dict, occupations, forms: str = "plural", prompt: str = PAPER_PROMPT,
                 temperature: float = 0.0, device: str | None = None):
        spec = dict(backend)
        if spec.get("kind") == "transformers" and device is not None and spec.get("device") in (None, "auto"):
            spec["device"] = device   # the run's device (a GPU actor's cuda)
        self.backend = make_backend(spec)
        self.template = check_template(prompt)
        self.temperature = float(temperature)
        self.words = occupation_words(occupations)
        self.matcher = OccupationMatcher(occupations, forms)
        self.retry = not deterministic(self.backend, self.temperature)

    def record(self) -> dict:
        return self.backend.record() | {"prompt": self.template, "temperature": self.temperature,
                                        "retry_without_occupation": self.retry}

    def _ask(self, captions: list, occupations: list) -> list:
        prompts = [fill_prompt(self.template, self.words.get(o, o), c) for c, o in zip(captions, occupations)]
        return self.backend.complete_many([[{"role": "user", "content": p}] for p in prompts], self.temperature)

    def __call__(self, batch: pa.Table) -> pa.Table:
        captions = batch.column(CAPTION).to_pylist()
        occupations = batch.column(OCCUPATION).to_pylist()
        n = len(captions)
        text: list = [None] * n
        status = np.full(n, S.HTTP_ERROR, dtype=object)
        error: list = [None] * n
        attempts = np.zeros(n, np.int32)
        retried = np.zeros(n, bool)
        ask = [i for i in range(n) if isinstance(captions[i], str) and captions[i].strip()]
        for i in sorted(set(range(n)) - set(ask)):   # the caption side never selects these; a user's input might
            status[i], error[i] = S.EMPTY, "no caption to paraphrase"
        for round_ in (0, 1):
            if not ask:
                break
            results = self._ask([captions[i] for i in ask], [occupations[i] for i in ask])
            for i, r in zip(ask, results):
                text[i], status[i], error[i] = r.text, r.status, r.error
                attempts[i] += r.attempts
            ok = [i for i in ask if status[i] == S.OK]
            if not ok:
                break
            named = names_occupation(self.matcher, pa.array([text[i] for i in ok], pa.string()),
                                     pa.array([occupations[i] for i in ok], pa.string()))
            missing = [i for i, hit in zip(ok, named) if not hit]
            for i in missing:
                status[i] = S.NO_OCCUPATION
                error[i] = f"the answer does not name {self.words.get(occupations[i], occupations[i])!r}"
            if round_ == 1 or not self.retry:
                break
            ask = missing
            retried[missing] = True
        out = batch
        for name, values, typ in ((PARAPHRASE, text, pa.string()), (PARAPHRASE_STATUS, list(status), pa.string()),
                                  (PARAPHRASE_ERROR, error, pa.string()), (PARAPHRASE_ATTEMPTS, attempts, pa.int32()),
                                  (PARAPHRASE_RETRIED, retried, pa.bool_())):
            out = with_column(out, name, pa.array(values, typ))
        return out

"""A client for any OpenAI-compatible chat-completions endpoint (OpenAI, vLLM, a local server):
bounded concurrency, retries with exponential backoff on 429 / 5xx / connection errors (honouring
``Retry-After``), a timeout per request, and one status per request (``schemas.paraphrases``),
never an exception deep inside a worker. The API key is read from an environment variable and
never recorded (``record()`` names the variable, not its value).

Paper 002, App. A.6 paraphrases the training captions with gpt-3.5-turbo at temperature 0; this is
the backend (a) of that step.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import requests

from schemas.paraphrases import ParaphraseStatus as S

RETRY_STATUS = frozenset({429, 500, 502, 503, 504})


@dataclass(frozen=True)
class ChatResult:
    text: str | None
    status: str
    error: str | None = None
    attempts: int = 1


class ChatClient:
    """``complete(messages)`` -> ChatResult; ``complete_many(list of messages)`` in parallel."""

    def __init__(self, endpoint: str, model: str, api_key_env: str = "OPENAI_API_KEY", timeout: float = 60.0,
                 max_retries: int = 5, backoff: float = 1.0, max_backoff: float = 60.0, concurrency: int = 8,
                 max_tokens: int | None = 256):
        if not endpoint.startswith(("http://", "https://")):
            raise ValueError(f"--paraphrase-endpoint {endpoint!r}: an http(s) URL of an OpenAI-compatible API "
                             f"(e.g. https://api.openai.com/v1 or http://localhost:8000/v1)")
        self.url = endpoint.rstrip("/") + ("" if endpoint.rstrip("/").endswith("/chat/completions")
                                           else "/chat/completions")
        self.model, self.api_key_env, self.timeout = model, api_key_env, float(timeout)
        self.max_retries, self.backoff, self.max_backoff = int(max_retries), float(backoff), float(max_backoff)
        self.concurrency, self.max_tokens = max(1, int(concurrency)), max_tokens

    def record(self) -> dict:
        """What the run records (the key's variable, never the key)."""
        return {"backend": "openai-compatible", "endpoint": self.url, "model": self.model,
                "api_key_env": self.api_key_env, "timeout_s": self.timeout, "max_retries": self.max_retries,
                "max_tokens": self.max_tokens}

    def _headers(self) -> dict:
        key = os.environ.get(self.api_key_env)
        return {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}

    def complete(self, messages: list[dict], temperature: float = 0.0) -> ChatResult:
        body = {"model": self.model, "messages": messages, "temperature": float(temperature)}
        if self.max_tokens:
            body["max_tokens"] = int(self.max_tokens)
        last_status, last_error = S.HTTP_ERROR, None
        for attempt in range(1, self.max_retries + 2):
            wait = None
            try:
                r = requests.post(self.url, json=body, headers=self._headers(), timeout=self.timeout)
            except requests.Timeout:
                last_status, last_error = S.TIMEOUT, f"no answer within {self.timeout:g} s"
            except requests.RequestException as exc:
                last_status, last_error = S.HTTP_ERROR, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            else:
                if r.status_code == 200:
                    return _parse(r, attempt)
                last_status, last_error = S.HTTP_ERROR, f"HTTP {r.status_code}: {r.text[:200]}"
                if r.status_code not in RETRY_STATUS:
                    return ChatResult(None, last_status, last_error, attempt)
                wait = _retry_after(r)
            if attempt <= self.max_retries:
                time.sleep(min(self.max_backoff, wait if wait is not None else self.backoff * 2 ** (attempt - 1)))
        return ChatResult(None, last_status, last_error, self.max_retries + 1)

    def complete_many(self, requests_: list[list[dict]], temperature: float = 0.0) -> list[ChatResult]:
        """Every request's result, in order, at most ``concurrency`` in flight."""
        with ThreadPoolExecutor(self.concurrency) as pool:
            return list(pool.map(lambda m: self.complete(m, temperature), requests_))


def _retry_after(r) -> float | None:
    try:
        return max(0.0, float(r.headers.get("Retry-After")))
    except (TypeError, ValueError):
        return None


def _parse(r, attempts: int) -> ChatResult:
    try:
        choice = r.json()["choices"][0]
        msg = choice.get("message") or {}
        text, finish = msg.get("content"), choice.get("finish_reason")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        return ChatResult(None, S.HTTP_ERROR, f"not a chat-completions answer ({type(exc).__name__}): {r.text[:200]}",
                          attempts)
    if msg.get("refusal") or finish == "content_filter":
        return ChatResult(text, S.REFUSED, msg.get("refusal") or "content_filter", attempts)
    if finish == "length":
        return ChatResult(text, S.TOO_LONG, "cut at the token limit", attempts)
    if not (text or "").strip():
        return ChatResult(None, S.EMPTY, None, attempts)
    return ChatResult(text.strip(), S.OK, None, attempts)

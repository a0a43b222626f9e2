"""The OpenAI-compatible chat client against a fake endpoint on 127.0.0.1:
answers, 429 then success, 500 for good, timeouts, empty / refused / cut answers, the key sent and
never recorded, bounded concurrency."""

import json
import threading
import time
from http.server import ThreadingHTTPServer

import pytest

from operators.support.chat_client import ChatClient
from pipelines.standins.chat import JsonHandler
from schemas.paraphrases import PAPER_PROMPT, ParaphraseStatus as S


class FakeChat:
    """A chat-completions endpoint whose behaviour each request's last user message chooses."""

    def __init__(self):
        self.requests, self.in_flight, self.peak, self.lock = [], 0, 0, threading.Lock()
        self.failures_left, self.first_wait = {}, None
        fake = self

        class Handler(JsonHandler):
            def do_POST(self):
                body = self.read_json()
                with fake.lock:
                    fake.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), **body})
                    fake.in_flight += 1
                    fake.peak = max(fake.peak, fake.in_flight)
                self.counted = True
                try:
                    self.answer(body["messages"][-1]["content"])
                finally:
                    self.done()

            def done(self):
                with fake.lock:
                    if self.counted:
                        fake.in_flight -= 1
                        self.counted = False

            def send_json(self, code, body, headers=None):
                # no longer in flight once the answer is decided: the client may read it and send its
                # next request before this thread runs again (on a loaded machine the peak then
                # counted one request too many)
                self.done()
                super().send_json(code, body, headers)

            def answer(self, text):
                kind = text.split(":", 1)[0]
                with fake.lock:
                    left = fake.failures_left.get(text, {"429": 1, "flaky500": 2}.get(kind, 0))
                    fake.failures_left[text] = left - 1
                if kind in ("429", "flaky500") and left > 0:
                    code = 429 if kind == "429" else 500
                    return self.send_json(code, {"error": "busy"}, {"Retry-After": "0"} if code == 429 else {})
                if kind == "500":
                    return self.send_json(500, {"error": "down"})
                if kind == "400":
                    return self.send_json(400, {"error": "bad model"})
                if kind == "slow":
                    time.sleep(1.0)
                if kind == "wait":
                    # hold requests until a second is in flight (at most 10 s from the first "wait"
                    # request, in all: a client that sends one at a time never gets there), so
                    # overlap does not hinge on the scheduler of a loaded machine; then long enough
                    # for more to pile up if unbounded
                    with fake.lock:
                        fake.first_wait = fake.first_wait or time.monotonic()
                    deadline = fake.first_wait + 10.0
                    while fake.peak < 2 and time.monotonic() < deadline:
                        time.sleep(0.01)
                    time.sleep(0.2)
                content, finish, extra = f"A paraphrase of {text}", "stop", {}
                if kind == "empty":
                    content = "  "
                if kind == "filter":
                    finish = "content_filter"
                if kind == "refusal":
                    content, extra = None, {"refusal": "I can't help with that."}
                if kind == "long":
                    finish = "length"
                self.send_json(200, {"choices": [{"index": 0, "finish_reason": finish,
                                             "message": {"role": "assistant", "content": content, **extra}}]})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/v1"
        from helpers import serve_in_thread

        serve_in_thread(self.server)

    def close(self):
        self.server.shutdown()


@pytest.fixture
def fake():
    f = FakeChat()
    yield f
    f.close()


def ask(text):
    return [{"role": "user", "content": text}]


def test_answers_retries_and_statuses(fake, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-test")
    c = ChatClient(fake.url, "gpt-3.5-turbo", timeout=0.5, max_retries=2, backoff=0.01)
    ok = c.complete(ask("fine: a nurse at work"))
    assert (ok.status, ok.text, ok.attempts) == (S.OK, "A paraphrase of fine: a nurse at work", 1)
    sent = fake.requests[-1]
    assert sent["path"] == "/v1/chat/completions" and sent["model"] == "gpt-3.5-turbo" and sent["temperature"] == 0
    assert sent["auth"] == "Bearer sk-secret-test"
    assert c.complete(ask("429: busy then fine")).status == S.OK                   # Retry-After honoured
    flaky = c.complete(ask("flaky500: twice then fine"))
    assert flaky.status == S.OK and flaky.attempts == 3
    down = c.complete(ask("500: always"))
    assert down.status == S.HTTP_ERROR and down.attempts == 3 and "HTTP 500" in down.error
    bad = c.complete(ask("400: not retried"))
    assert bad.status == S.HTTP_ERROR and bad.attempts == 1
    slow = c.complete(ask("slow: over the timeout"))
    assert slow.status == S.TIMEOUT and slow.attempts == 3
    assert c.complete(ask("empty: nothing")).status == S.EMPTY
    assert c.complete(ask("filter: blocked")).status == S.REFUSED
    refused = c.complete(ask("refusal: no"))
    assert refused.status == S.REFUSED and "can't help" in refused.error
    assert c.complete(ask("long: cut")).status == S.TOO_LONG
    assert "sk-secret-test" not in json.dumps(c.record()) and c.record()["api_key_env"] == "OPENAI_API_KEY"


def test_concurrency_is_bounded_and_order_kept(fake):
    c = ChatClient(fake.url, "m", concurrency=3, max_retries=0)
    texts = [f"wait: caption {i}" for i in range(9)]
    out = c.complete_many([ask(t) for t in texts])
    assert [r.text for r in out] == [f"A paraphrase of {t}" for t in texts], [(r.status, r.error) for r in out]
    assert 2 <= fake.peak <= 3, fake.peak


def test_no_key_sends_no_authorization_and_a_bad_endpoint_is_one_line(fake, monkeypatch):
    monkeypatch.delenv("LOCAL_KEY", raising=False)
    c = ChatClient(fake.url + "/chat/completions", "local-model", api_key_env="LOCAL_KEY", max_retries=0)
    assert c.complete(ask("fine: x")).status == S.OK and fake.requests[-1]["auth"] is None
    with pytest.raises(ValueError, match="OpenAI-compatible"):
        ChatClient("localhost:8000", "m")
    refused = ChatClient("http://127.0.0.1:9/v1", "m", max_retries=0, timeout=0.5).complete(ask("x"))
    assert refused.status == S.HTTP_ERROR and "ConnectionError" in refused.error


def test_the_paper_s_prompt_is_app_a6_verbatim():
    from pathlib import Path

    from helpers import REPO_ROOT

    seeds = Path(REPO_ROOT).parent / "shared" / "seeds" / "002_737de0973388d80e.txt"
    if not seeds.exists():
        pytest.skip("the paper's text is not beside this checkout")
    text = seeds.read_text().splitlines()
    start = next(i for i, ln in enumerate(text) if ln.startswith("Please paraphrase"))
    lines = [ln.rsplit(" ", 1)[0].strip() for ln in text[start:start + 5]]   # the margin's line numbers cut
    assert " ".join(lines[:4]) + "\n" + lines[4] == PAPER_PROMPT

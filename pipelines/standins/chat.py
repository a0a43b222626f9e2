"""A stand-in paraphraser for App. A.6 (``--standin-models --paraphrases``): an OpenAI-compatible
chat-completions server on 127.0.0.1 that rewrites each caption by fixed rules, so a stand-in run
goes through the real client, the real checks and every branch a real endpoint reaches.

Per caption (a CRC of its text), deterministically:
- most get a rule-based paraphrase that names the occupation (words swapped, "(<occupation>)"
  appended where the caption named it only in a form the rules do not keep);
- one in 7 gets a 429 with ``Retry-After: 0`` first (the client backs off and asks again);
- one in 9 first answers without the occupation ("A picture of a person at work."), and names it
  when asked again (the run's one retry);
- one in 13 never names it (``no_occupation``).
Its answers mean nothing about any language model; they only exercise the pipeline.
"""

from __future__ import annotations

import json
import re
import threading
import zlib
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = "standin-paraphraser"
# How often the serving loop looks for a shutdown request: leaving the block waits up to this long.
SHUTDOWN_POLL_S = 0.02
SWAPS = (("with", "alongside"), ("photo", "picture"), ("photograph", "picture"), ("image", "picture"), ("portrait", "picture"),
         ("smiling", "with a smile"), ("working", "at work"), ("young", "youthful"), ("happy", "cheerful"),
         ("beautiful", "lovely"), ("woman", "lady"), ("man", "gentleman"))
_WORD = re.compile(r"include the word (.+?)\.\s*\n", re.S)
_CAPTION = re.compile(r"Phrase/Sentence:\s*(.*)\Z", re.S)


def paraphrase(caption: str, word: str) -> str:
    out = caption.strip()
    for a, b in SWAPS:
        out = re.sub(rf"\b{a}\b", b, out, flags=re.I)
    if not re.search(rf"\b{re.escape(word)}\b", out, re.I):
        out = f"{out} ({word})"
    return f"{out[:1].upper()}{out[1:]}"


class JsonHandler(BaseHTTPRequestHandler):
    """A quiet HTTP handler of JSON requests and answers (this stand-in's; the tests' fake endpoints)."""

    def log_message(self, *a):
        pass

    def read_json(self):
        return json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))

    def send_json(self, code: int, body: dict, headers: dict | None = None):
        data = json.dumps(body).encode()
        self.send_response(code)
        for k, v in {"Content-Type": "application/json", "Content-Length": str(len(data)), **(headers or {})}.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)


class _Handler(JsonHandler):
    def do_POST(self):
        server = self.server
        try:
            body = self.read_json()
            prompt = body["messages"][-1]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            return self.send_json(400, {"error": {"message": "not a chat-completions request"}})
        word, caption = _WORD.search(prompt), _CAPTION.search(prompt)
        if not word or not caption:
            return self.send_json(400, {"error": {"message": "not App. A.6's prompt"}})
        word, caption = word.group(1).strip(), caption.group(1).strip()
        crc = zlib.crc32(caption.encode())
        with server.lock:
            server.seen[prompt] += 1
            nth = server.seen[prompt]
        if crc % 7 == 0 and nth == 1:
            return self.send_json(429, {"error": {"message": "rate limited"}}, {"Retry-After": "0"})
        asked = nth - (1 if crc % 7 == 0 else 0)   # answers given so far for this prompt, this one included
        lacks = crc % 13 == 0 or (crc % 9 == 0 and asked == 1)
        text = "A picture of a person at work." if lacks else paraphrase(caption, word)
        self.send_json(200, {"id": f"standin-{crc:x}-{nth}", "object": "chat.completion", "model": body.get("model"),
                         "choices": [{"index": 0, "finish_reason": "stop",
                                      "message": {"role": "assistant", "content": text}}]})


class StandinChatServer:
    """The stand-in endpoint; a context manager. ``base_url`` is the OpenAI-style ``.../v1``."""

    def __init__(self, host: str = "127.0.0.1"):
        self._server = ThreadingHTTPServer((host, 0), _Handler)
        self._server.daemon_threads = True
        self._server.lock, self._server.seen = threading.Lock(), Counter()
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def __enter__(self) -> "StandinChatServer":
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": SHUTDOWN_POLL_S},
                                        name="StandinChatServer", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

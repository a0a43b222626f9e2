"""``t2i annotate serve``: the labelling page, a small Flask app over a task set.

One item at a time (the image large, the question, the choices as buttons with the keys 1-9), the
annotator's progress, undo of the last answer (``u`` or Backspace). Each annotator sees the items in
their own random order (a hash of the task set's seed, the annotator and the item), and a reload
resumes at their first unanswered item. Every answer is committed to ``answers.sqlite`` before the
page shows the next item. The page is one self-contained document: nothing loads from elsewhere.

Security: the server binds to 127.0.0.1 by default; binding to any other address needs per-annotator
tokens (``--annotators alice,bob``: one secret link each, kept in ``annotators.json``). The client
names items by id only (images are served by item id, never by path); answers are checked against
the protocol's choices; a state-changing request must be JSON from the page itself (a token tied to
the annotator in a header, and an ``Origin``, when sent, of this server), so another site cannot
post answers through a labeller's browser.
"""

from __future__ import annotations

import hashlib
import hmac
import html
import ipaddress
import json
import os
import re
import secrets

from flask import Flask, abort, jsonify, request, send_file
from werkzeug.serving import make_server

from pipelines.annotate.simulate import PREFIX as SIMULATED
from pipelines.annotate.store import AnswerStore
from pipelines.annotate.tasks import ANSWERS_DB, AnnotateError, TaskSet
from schemas import annotation as A

TOKENS_FILE = "annotators.json"
ANNOTATOR_RE = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def order(tasks: TaskSet, annotator: str) -> list[str]:
    """The annotator's own random order of the items (stable across reloads and restarts)."""
    seed = tasks.meta["drawing"]["seed"]
    return sorted(tasks.items[A.ITEM_ID], key=lambda i: hashlib.sha256(f"{seed}|{annotator}|{i}".encode()).digest())


def annotator_tokens(tasks: TaskSet, names: list[str]) -> dict[str, str]:
    """A secret token per annotator, kept in the task set (the same link after a restart)."""
    path = tasks.path / TOKENS_FILE
    tokens = json.loads(path.read_text()) if path.is_file() else {}
    for name in names:
        if not ANNOTATOR_RE.match(name):
            raise AnnotateError(f"annotator name {name!r}: letters, digits and _.@- only (at most 64)")
        tokens.setdefault(name, secrets.token_urlsafe(18))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)   # never readable by others, even briefly
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(tokens, indent=1))
    path.chmod(0o600)
    return tokens


def create_app(tasks: TaskSet, tokens: dict[str, str] | None = None, hosts: set[str] | None = None):
    """The Flask app; with ``tokens`` only those annotators, each with their token, may label; with
    ``hosts`` only requests naming one of them in their Host header are served (a page on another
    site that rebinds its name to 127.0.0.1 names itself)."""
    app = Flask("t2i-annotate")
    store = AnswerStore(tasks.path / ANSWERS_DB)
    items = tasks.items.set_index(A.ITEM_ID)
    choices = tasks.choices
    secret = secrets.token_bytes(32)
    orders: dict[str, list[str]] = {}

    app.config["ALLOWED_HOSTS"] = hosts

    @app.before_request
    def known_host():
        allowed = app.config["ALLOWED_HOSTS"]
        if allowed is not None and request.host not in allowed:
            abort(403)

    @app.errorhandler(400)
    @app.errorhandler(403)
    @app.errorhandler(404)
    def error(e):
        return jsonify({"error": e.description or e.name}), e.code

    def csrf(annotator: str) -> str:
        return hmac.new(secret, annotator.encode(), "sha256").hexdigest()

    def who(annotator: str) -> str:
        if not ANNOTATOR_RE.match(annotator) or annotator.startswith(SIMULATED):
            abort(404)
        if tokens is not None:
            given = request.args.get("token") or request.headers.get("X-Annotator-Token") or ""
            if annotator not in tokens or not hmac.compare_digest(given, tokens[annotator]):
                abort(403)
        return annotator

    def state(annotator: str, note: str | None = None) -> dict:
        if annotator not in orders:
            orders[annotator] = order(tasks, annotator)
        mine = orders[annotator]
        done = store.answered(annotator)
        nxt = next((i for i in mine if i not in done), None)
        out = {"answered": len(done), "total": len(mine), "note": note, "choices": choices, "item": None}
        if nxt is not None:
            row = items.loc[nxt]
            out["item"] = {"id": nxt, "question": row[A.QUESTION], "image": f"/image/{nxt}"}
        return out

    def checked_post(annotator: str) -> dict:
        if request.headers.get("X-CSRF-Token", "") != csrf(annotator):
            abort(403)
        origin = request.headers.get("Origin")
        if origin is not None and origin != request.host_url.rstrip("/"):
            abort(403)
        body = request.get_json(silent=True)
        if not isinstance(body, dict):
            abort(400)
        return body

    @app.get("/")
    def index():
        if tokens is not None:
            abort(404)
        return ("<!doctype html><meta charset=utf-8><title>Labelling</title><form onsubmit=\"location='/a/'+"
                "encodeURIComponent(this.n.value);return false\">Your name: <input name=n pattern='[A-Za-z0-9_.@-]+' "
                "required autofocus> <button>Start</button></form>")

    @app.get("/a/<annotator>")
    def page(annotator):
        annotator = who(annotator)
        token = request.args.get("token", "")
        return PAGE.format(title=html.escape(tasks.protocol["name"]), annotator=html.escape(annotator),
                           config=html.escape(json.dumps({"annotator": annotator, "csrf": csrf(annotator),
                                                          "token": token}), quote=True))

    @app.get("/api/<annotator>/state")
    def get_state(annotator):
        return jsonify(state(who(annotator)))

    @app.post("/api/<annotator>/answer")
    def answer(annotator):
        annotator = who(annotator)
        body = checked_post(annotator)
        item, value = body.get("item_id"), body.get("answer")
        if not isinstance(item, str) or item not in items.index:
            return jsonify({"error": f"unknown item {item!r}"}), 400
        if not isinstance(value, str) or value not in choices:
            return jsonify({"error": f"answer {value!r} is not one of {', '.join(choices)}"}), 400
        outcome = store.record(item, annotator, value)
        note = "your earlier answer to that item was replaced" if outcome == "replaced" else None
        return jsonify(state(annotator, note))

    @app.post("/api/<annotator>/undo")
    def undo(annotator):
        annotator = who(annotator)
        checked_post(annotator)
        item = store.undo(annotator)
        return jsonify(state(annotator, "nothing to undo" if item is None else "last answer taken back"))

    @app.get("/image/<item_id>")
    def image(item_id):
        if tokens is not None:           # with tokens, an image is shown to an annotator's link only
            given = request.args.get("token") or ""
            if not any(hmac.compare_digest(given, t) for t in tokens.values()):
                abort(403)
        if item_id not in items.index:
            abort(404)
        return send_file(tasks.path / items.loc[item_id, A.IMAGE_FILE], max_age=3600)

    @app.after_request
    def headers(resp):
        resp.headers["Content-Security-Policy"] = ("default-src 'self'; img-src 'self' data:; style-src 'unsafe-inline'; "
                                                   "script-src 'unsafe-inline'; connect-src 'self'")
        resp.headers["X-Frame-Options"] = "DENY"
        return resp

    return app


def serve(tasks_dir, host: str = "127.0.0.1", port: int = 8765, annotators: list[str] | None = None):
    """Run the page until interrupted (a threaded WSGI server: several annotators at once)."""
    tasks = TaskSet.load(tasks_dir)
    if not is_loopback(host) and not annotators:
        raise AnnotateError(f"--host {host} reaches other machines: name the annotators (--annotators a,b) so each "
                            "gets a secret link")
    tokens = annotator_tokens(tasks, annotators) if annotators else None
    app = create_app(tasks, tokens)
    server = make_server(host, port, app, threaded=True)
    if is_loopback(host):   # only this machine's names for the server, once its port is known (see create_app)
        p = server.server_port
        app.config["ALLOWED_HOSTS"] = {f"127.0.0.1:{p}", f"localhost:{p}", f"[::1]:{p}"}
    base = f"http://{host}:{server.server_port}"
    print(f"labelling {len(tasks.items)} items of {tasks.protocol['name']} at {base}/ (Ctrl-C to stop)", flush=True)
    for name, tok in (tokens or {}).items():
        print(f"  {name}: {base}/a/{name}?token={tok}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


PAGE = """<!doctype html>
<html lang=en><head><meta charset=utf-8><meta name=viewport content="width=device-width,initial-scale=1">
<title>{title}: {annotator}</title><link rel=icon href="data:,">
<style>
body{{font:16px system-ui,sans-serif;margin:0;background:#fafafa;color:#222}}
main{{max-width:960px;margin:0 auto;padding:12px}}
#bar{{display:flex;justify-content:space-between;align-items:center;gap:12px}}
progress{{flex:1;height:10px}}
#img{{display:block;margin:12px auto;height:min(68vh,900px);max-width:100%;object-fit:contain;background:#ddd}}
#q{{font-size:22px;text-align:center;margin:8px 0}}
#choices{{display:flex;flex-wrap:wrap;justify-content:center;gap:8px}}
#choices button{{font-size:18px;padding:10px 18px;min-width:90px;cursor:pointer}}
kbd{{font-size:12px;color:#666;margin-right:6px}}
#note{{text-align:center;color:#a60;min-height:1.4em}}
#undo{{font-size:14px}}
</style></head>
<body><main data-config="{config}">
<div id=bar><b>{annotator}</b><span id=count></span><progress id=progress value=0 max=1></progress>
<button id=undo title="u or Backspace">undo last answer</button></div>
<img id=img alt="the image to label">
<p id=q></p><div id=choices></div><p id=note></p>
</main>
<script>
const cfg = JSON.parse(document.querySelector('main').dataset.config);
const q = (cfg.token ? '?token=' + encodeURIComponent(cfg.token) : '');
const api = p => '/api/' + encodeURIComponent(cfg.annotator) + '/' + p + q;
let cur = null, busy = false;
function show(s) {{
  document.getElementById('count').textContent = s.answered + ' / ' + s.total;
  const pr = document.getElementById('progress'); pr.max = s.total; pr.value = s.answered;
  document.getElementById('note').textContent = s.note || '';
  cur = s.item;
  const img = document.getElementById('img'), ch = document.getElementById('choices');
  ch.innerHTML = '';
  if (!cur) {{ img.hidden = true; document.getElementById('q').textContent = 'All done: thank you.'; return; }}
  img.hidden = false; img.src = cur.image + q; img.dataset.item = cur.id;
  document.getElementById('q').textContent = cur.question;
  s.choices.forEach((c, i) => {{
    const b = document.createElement('button'); b.dataset.answer = c;
    b.innerHTML = (i < 9 ? '<kbd>' + (i + 1) + '</kbd>' : '') ; b.append(c);
    b.onclick = () => send('answer', {{item_id: cur.id, answer: c}}); ch.append(b);
  }});
}}
async function send(path, body) {{
  if (busy) return; busy = true;
  try {{
    const r = await fetch(api(path), {{method: 'POST', headers: {{'Content-Type': 'application/json',
      'X-CSRF-Token': cfg.csrf}}, body: JSON.stringify(body || {{}})}});
    let s;
    try {{ s = await r.json(); }} catch (e) {{ s = {{}}; }}
    if (!r.ok) {{
      document.getElementById('note').textContent = (s.error || ('error ' + r.status)) +
        (r.status === 403 ? ': reload the page (the server may have restarted)' : '');
      return;
    }}
    show(s);
  }} catch (e) {{
    document.getElementById('note').textContent = 'the server did not answer: your last answer may not be saved';
  }} finally {{ busy = false; }}
}}
async function load() {{ const r = await fetch(api('state')); show(await r.json()); }}
document.getElementById('undo').onclick = () => send('undo');
document.addEventListener('keydown', e => {{
  if (e.key === 'u' || e.key === 'Backspace') {{ e.preventDefault(); send('undo'); return; }}
  const k = parseInt(e.key, 10);
  const btn = document.querySelectorAll('#choices button')[k - 1];
  if (cur && k >= 1 && btn) send('answer', {{item_id: cur.id, answer: btn.dataset.answer}});
}});
load();
</script></body></html>
"""

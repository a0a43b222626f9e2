"""The labelling page's server (Flask's test client; the page in a real browser is
test_page_browser.py): each annotator's own order and resume, every answer committed before the
next item, the last answer kept and said so, undo; items by id only, answers among the choices,
no cross-site posts, tokens off the loopback interface; a server killed between answers loses none."""

import json
import re
import signal
import subprocess
import sys
import urllib.request

import pytest

from pipelines.annotate import server as S
from pipelines.annotate.store import AnswerStore
from pipelines.annotate.tasks import ANSWERS_DB, AnnotateError
from schemas import annotation as A


def _client(tasks, tokens=None):
    app = S.create_app(tasks, tokens)
    return app.test_client()


def _csrf(client, who, token=""):
    page = client.get(f"/a/{who}" + (f"?token={token}" if token else "")).get_data(as_text=True)
    cfg = json.loads(re.search(r'data-config="([^"]+)"', page).group(1).replace("&quot;", '"'))
    return cfg["csrf"]


def _post(client, who, path, body, csrf, **headers):
    return client.post(f"/api/{who}/{path}", json=body, headers={"X-CSRF-Token": csrf, **headers})


def test_each_annotator_has_an_order_and_resumes_where_they_stopped(tasks):
    c = _client(tasks)
    a, b = S.order(tasks, "alice"), S.order(tasks, "bob")
    assert sorted(a) == sorted(b) == sorted(tasks.items[A.ITEM_ID]) and a != b
    token = _csrf(c, "alice")
    first = c.get("/api/alice/state").get_json()
    assert first["item"]["id"] == a[0] and first["answered"] == 0 and first["total"] == len(a)
    nxt = _post(c, "alice", "answer", {"item_id": a[0], "answer": "yes"}, token).get_json()
    assert nxt["item"]["id"] == a[1] and nxt["answered"] == 1
    # committed before the next item is shown: the store has it
    assert AnswerStore(tasks.path / ANSWERS_DB).labels()[A.ITEM_ID].tolist() == [a[0]]
    # a new server (a restart) resumes at the same place
    again = _client(tasks).get("/api/alice/state").get_json()
    assert again["item"]["id"] == a[1] and again["answered"] == 1
    # answering an earlier item again keeps the last answer and says so
    s = _post(c, "alice", "answer", {"item_id": a[0], "answer": "no"}, token).get_json()
    assert "replaced" in s["note"] and s["answered"] == 1
    assert AnswerStore(tasks.path / ANSWERS_DB).labels()[A.ANSWER].tolist() == ["no"]
    u = _post(c, "alice", "undo", {}, token).get_json()
    assert u["note"] == "last answer taken back" and AnswerStore(tasks.path / ANSWERS_DB).labels()[A.ANSWER].tolist() \
        == ["yes"]
    image = c.get(f"/image/{a[0]}")
    assert image.status_code == 200 and image.data == (tasks.path / tasks.items.set_index(A.ITEM_ID).loc[
        a[0], A.IMAGE_FILE]).read_bytes()


def test_bad_requests_are_refused(tasks):
    c = _client(tasks)
    token = _csrf(c, "alice")
    item = tasks.items[A.ITEM_ID].iloc[0]
    assert _post(c, "alice", "answer", {"item_id": "nope", "answer": "yes"}, token).status_code == 400
    r = _post(c, "alice", "answer", {"item_id": item, "answer": "maybe"}, token)
    assert r.status_code == 400 and "not one of yes, no, unsure" in r.get_json()["error"]
    assert _post(c, "alice", "answer", {"item_id": item, "answer": "yes"}, "forged").status_code == 403
    assert _post(c, "alice", "answer", {"item_id": item, "answer": "yes"}, _csrf(c, "bob")).status_code == 403
    assert _post(c, "alice", "answer", {"item_id": item, "answer": "yes"}, token,
                 Origin="http://evil.example").status_code == 403
    form = c.post("/api/alice/answer", data={"item_id": item, "answer": "yes"}, headers={"X-CSRF-Token": token})
    assert form.status_code == 400                                   # a form post is not the page's JSON
    assert c.get("/image/..%2Ftasks.json").status_code == 404 and c.get("/image/tasks.json").status_code == 404
    assert c.get("/a/bad%20name").status_code == 404
    assert c.get("/a/simulated-1").status_code == 404                # reserved for simulated annotators
    r = _post(c, "alice", "answer", {"item_id": [item], "answer": "yes"}, token)
    assert r.status_code == 400 and "unknown item" in r.get_json()["error"]
    # a page on another site whose name resolves to 127.0.0.1 names itself in the Host header
    guarded = S.create_app(tasks, hosts={"127.0.0.1:8765"}).test_client()
    assert guarded.get("/a/alice", headers={"Host": "evil.example:8765"}).status_code == 403
    assert guarded.get("/a/alice", headers={"Host": "127.0.0.1:8765"}).status_code == 200
    assert AnswerStore(tasks.path / ANSWERS_DB).labels().empty


def test_two_annotators_at_once_lose_nothing(tasks):
    """Two annotators answering every item at the same time (threads, one client each): every answer
    is stored once, each under its annotator."""
    import threading

    errors = []

    def label(who):
        try:
            c = _client(tasks)
            token = _csrf(c, who)
            for item in S.order(tasks, who):
                r = _post(c, who, "answer", {"item_id": item, "answer": "yes" if who == "alice" else "no"}, token)
                assert r.status_code == 200, r.get_data(as_text=True)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=label, args=(who,)) for who in ("alice", "bob")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    labels = AnswerStore(tasks.path / ANSWERS_DB).labels()
    assert len(labels) == 2 * len(tasks.items) and not labels.duplicated([A.ITEM_ID, A.ANNOTATOR]).any()
    assert labels.groupby(A.ANNOTATOR)[A.ANSWER].agg(set).to_dict() == {"alice": {"yes"}, "bob": {"no"}}


def test_tokens_are_required_off_the_loopback_interface(tasks):
    with pytest.raises(AnnotateError, match="--annotators"):
        S.serve(tasks.path, host="0.0.0.0", port=0)
    tokens = S.annotator_tokens(tasks, ["alice"])
    assert (tasks.path / S.TOKENS_FILE).stat().st_mode & 0o777 == 0o600
    assert S.annotator_tokens(tasks, ["alice", "bob"])["alice"] == tokens["alice"]   # the same link after a restart
    c = _client(tasks, S.annotator_tokens(tasks, ["alice"]))
    assert c.get("/a/alice").status_code == 403 and c.get("/a/alice?token=wrong").status_code == 403
    assert c.get("/a/mallory?token=" + tokens["alice"]).status_code == 403
    assert c.get("/").status_code == 404
    token = _csrf(c, "alice", tokens["alice"])
    item = tasks.items[A.ITEM_ID].iloc[0]
    r = c.post(f"/api/alice/answer?token={tokens['alice']}", json={"item_id": item, "answer": "no"},
               headers={"X-CSRF-Token": token})
    assert r.status_code == 200 and r.get_json()["answered"] == 1
    image = r.get_json()["item"]["image"]
    assert c.get(image).status_code == 403 and c.get(f"{image}?token={tokens['alice']}").status_code == 200


def test_a_server_killed_between_answers_loses_none(tasks):
    """The real server process: answers posted, SIGKILL, a new server: every answer is there."""
    def start():
        proc = subprocess.Popen([sys.executable, "-m", "pipelines.annotate.cli", "serve", str(tasks.path), "--port",
                                 "0"], stdout=subprocess.PIPE, text=True)
        line = proc.stdout.readline()
        return proc, re.search(r"(http://127\.0\.0\.1:\d+)", line).group(1)

    def call(base, path, body=None, csrf=""):
        req = urllib.request.Request(base + path, data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", "X-CSRF-Token": csrf})
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.read().decode()

    proc, base = start()
    try:
        page = call(base, "/a/alice")
        csrf = json.loads(re.search(r'data-config="([^"]+)"', page).group(1).replace("&quot;", '"'))["csrf"]
        order = S.order(tasks, "alice")
        for item in order[:3]:
            call(base, "/api/alice/answer", {"item_id": item, "answer": "yes"}, csrf)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    proc, base = start()
    try:
        state = json.loads(call(base, "/api/alice/state"))
        assert state["answered"] == 3 and state["item"]["id"] == order[3]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert sorted(AnswerStore(tasks.path / ANSWERS_DB).labels()[A.ITEM_ID]) == sorted(order[:3])

"""A hub that does not answer: one probe, then offline mode, so a model that is not in the cache
fails at once instead of after the loaders' own timeouts and retries (models.hub_offline_if_unreachable)."""

import os
import socket
import threading

import pytest

class SilentServer:
    """Accepts TCP connections on 127.0.0.1 and never answers: a hub behind a black hole."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.connections = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections.append(conn)

    def close(self):
        self.sock.close()
        for c in self.connections:
            c.close()


@pytest.fixture
def silent_hub():
    server = SilentServer()
    yield server
    server.close()


def _run(endpoint, tmp_path, monkeypatch, user_offline=False):
    """Inside hub_offline_if_unreachable (in this process; it restores what it changes): the
    offline state it set and the one-line error of a model that is in no cache."""
    import huggingface_hub.constants as hub

    from operators.support.diffusion import load_text2image
    from operators.support.models import ModelLoadError
    from pipelines.engine.run.models import hub_offline_if_unreachable

    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    if user_offline:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    else:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setattr(hub, "HF_HUB_OFFLINE", False)
    out = {}
    with hub_offline_if_unreachable(timeout=1):
        out["inside"] = (hub.HF_HUB_OFFLINE, os.environ.get("HF_HUB_OFFLINE"))
        try:
            load_text2image("nobody-here/no-such-model", device="cpu", dtype="float32")
        except ModelLoadError as exc:
            out["error"] = str(exc).splitlines()[0]
    out["after"] = (hub.HF_HUB_OFFLINE, os.environ.get("HF_HUB_OFFLINE"))
    return out


def test_a_silent_hub_gets_one_probe_then_the_missing_model_fails_offline(silent_hub, tmp_path, monkeypatch, capsys):
    out = _run(f"http://127.0.0.1:{silent_hub.port}", tmp_path, monkeypatch)
    assert f"hub at http://127.0.0.1:{silent_hub.port} cannot be reached" in capsys.readouterr().out
    assert out["inside"] == (True, "1")
    assert "nobody-here/no-such-model" in out["error"]
    assert out["after"] == (False, None)                       # restored after the block
    assert len(silent_hub.connections) == 1                    # the probe; the loader never asked the hub


def test_a_hub_that_answers_is_left_online(tmp_path, monkeypatch, capsys):
    import http.server

    from helpers import serve_in_thread

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):
            self.send_response(200)
            self.end_headers()

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    serve_in_thread(server)
    try:
        with monkeypatch.context() as m:   # the loader's own requests would go to this server: no load here
            import operators.support.diffusion as D

            m.setattr(D, "load_text2image", lambda *a, **k: None)
            out = _run(f"http://127.0.0.1:{server.server_address[1]}", tmp_path, monkeypatch)
    finally:
        server.shutdown()
    assert "cannot be reached" not in capsys.readouterr().out and out["inside"] == (False, None)


def test_offline_set_by_the_user_is_kept_and_nothing_is_probed(silent_hub, tmp_path, monkeypatch, capsys):
    out = _run(f"http://127.0.0.1:{silent_hub.port}", tmp_path, monkeypatch, user_offline=True)
    assert "cannot be reached" not in capsys.readouterr().out and out["inside"] == (True, "1")
    assert silent_hub.connections == []

"""A hub that does not answer: one probe, then offline mode, so a model that is not in the cache
fails at once instead of after the loaders' own timeouts and retries (models.hub_offline_if_unreachable)."""

import socket
import subprocess
import sys
import textwrap
import threading

import pytest

CODE = textwrap.dedent("""
    import os, sys
    import huggingface_hub.constants as hub
    from pipelines.engine.models import hub_offline_if_unreachable
    from operators.support.diffusion import load_text2image
    from operators.support.models import ModelLoadError
    with hub_offline_if_unreachable(timeout=float(sys.argv[1])):
        print("offline inside:", hub.HF_HUB_OFFLINE, os.environ.get("HF_HUB_OFFLINE"))
        try:
            load_text2image("nobody-here/no-such-model", device="cpu", dtype="float32")
        except ModelLoadError as exc:
            print("error:", str(exc).splitlines()[0])
    print("offline after:", hub.HF_HUB_OFFLINE, os.environ.get("HF_HUB_OFFLINE"))
""")


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


def _run(env_endpoint, tmp_path, extra_env=None):
    import os

    env = dict(os.environ, HF_ENDPOINT=env_endpoint, HF_HOME=str(tmp_path / "hf"), **(extra_env or {}))
    env.pop("HF_HUB_OFFLINE", None)
    env.pop("TRANSFORMERS_OFFLINE", None)
    env.update(extra_env or {})
    return subprocess.run([sys.executable, "-c", CODE, "1"], capture_output=True, text=True, timeout=120, env=env)


def test_a_silent_hub_gets_one_probe_then_the_missing_model_fails_offline(silent_hub, tmp_path):
    res = _run(f"http://127.0.0.1:{silent_hub.port}", tmp_path)
    assert res.returncode == 0, res.stderr
    assert f"hub at http://127.0.0.1:{silent_hub.port} cannot be reached" in res.stdout
    assert "offline inside: True 1" in res.stdout
    assert "error:" in res.stdout and "nobody-here/no-such-model" in res.stdout
    assert "offline after: False None" in res.stdout           # restored after the block
    assert len(silent_hub.connections) == 1                    # the probe; the loader never asked the hub


def test_a_hub_that_answers_is_left_online(tmp_path):
    import http.server

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):
            self.send_response(200)
            self.end_headers()

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        res = _run(f"http://127.0.0.1:{server.server_address[1]}", tmp_path)
    finally:
        server.shutdown()
    assert "cannot be reached" not in res.stdout and "offline inside: False None" in res.stdout, res.stdout + res.stderr


def test_offline_set_by_the_user_is_kept_and_nothing_is_probed(silent_hub, tmp_path):
    res = _run(f"http://127.0.0.1:{silent_hub.port}", tmp_path, {"HF_HUB_OFFLINE": "1"})
    assert "cannot be reached" not in res.stdout and "offline inside: True 1" in res.stdout, res.stdout + res.stderr
    assert silent_hub.connections == []

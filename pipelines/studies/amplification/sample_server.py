"""A local HTTP image server: real downloads for the embedded sample run and the fetch tests.

The bundled synthetic LAION sample points at ``https://images.example.org/synthetic/<seed>/<index>.jpg``
(a reserved name that never resolves). The pipeline rewrites that prefix to a
:class:`LocalImageServer` on 127.0.0.1, so the default run downloads real JPEGs through the real
fetch operator, and every fetch outcome occurs: photos with one face (scikit-image's astronaut and
camera man), photos without a face (coffee, the cat Chelsea), a two-face montage (the astronaut's
head twice), bytes that are not an image, and 404s. Which one a URL gets is a fixed function of its index
(:func:`synthetic_kind`), so tests and the pipeline know each URL's expected outcome.

Routes (all GET):

- ``/photo/{astronaut,camera,coffee,chelsea,montage}.jpg``: the photo as a JPEG. A query
  ``robots=<value>`` adds an ``X-Robots-Tag: <value>`` header; ``nolength=1`` omits
  Content-Length (the body then ends when the connection closes).
- ``/synthetic/<seed>/<index>.jpg``: what :func:`synthetic_kind` says for ``index`` (``seed`` is
  accepted and ignored).
- ``/broken.jpg``: 200, ``Content-Type: image/jpeg``, bytes that are not an image.
- ``/slow.jpg``: waits ``slow_seconds`` (a constructor argument) before answering.
- ``/big.jpg``: a large valid JPEG (:data:`BIG_SIZE` pixels a side; about a megabyte).
- ``/redirect?to=<url>``: 302 to ``url``.
- ``/status/<code>``: an empty response with that HTTP status (500 for retry tests).
- anything else: 404.

The server counts requests per path (:attr:`LocalImageServer.hits`), so tests can check retries.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import threading
import time
from collections import Counter
from functools import lru_cache
from urllib.parse import parse_qs, urlsplit

import numpy as np
from PIL import Image

# How often the serving loop looks for a shutdown request: close() waits up to this long.
SHUTDOWN_POLL_S = 0.02

# The prefix of the bundled sample's URLs, and what replaces it (see LocalImageServer.localize).
SAMPLE_URL_PREFIX = "https://images.example.org"

PHOTOS = ("astronaut", "camera", "coffee", "chelsea", "montage")
# Faces a detector should find in each photo (the montage: the astronaut's head beside its mirror image).
PHOTO_FACES = {"astronaut": 1, "camera": 1, "coffee": 0, "chelsea": 0, "montage": 2}
BROKEN = "broken"          # 200 image/jpeg, not an image
NOT_FOUND = "not_found"    # 404

# Share of each kind among /synthetic/ URLs (cumulative thresholds are taken in this order).
SYNTHETIC_SHARES = (
    ("astronaut", 0.35),
    ("camera", 0.35),
    ("coffee", 0.08),
    ("chelsea", 0.07),
    ("montage", 0.05),
    (BROKEN, 0.05),
    (NOT_FOUND, 0.05),
)
SYNTHETIC_KINDS = tuple(k for k, _ in SYNTHETIC_SHARES)
BIG_SIZE = 2048
BROKEN_BYTES = b"\xff\xd8 this is not a JPEG, only its first two bytes are\n" * 8
JPEG_QUALITY = 90


def synthetic_kind(index: int) -> str:
    """What ``/synthetic/<seed>/<index>.jpg`` serves: a photo name, ``"broken"`` or ``"not_found"``.

    A hash of the index, not ``index % n``, so neighbouring rows differ and every window of the
    sample sees the intended mix.
    """
    digest = hashlib.sha256(f"t2i-synthetic-image:{int(index)}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2.0**64
    cumulative = 0.0
    for kind, share in SYNTHETIC_SHARES:
        cumulative += share
        if u < cumulative:
            return kind
    return SYNTHETIC_SHARES[-1][0]


def photo_arrays() -> dict[str, np.ndarray]:
    """The served photos as arrays (camera stays 2-D grey), as scikit-image ships them."""
    from skimage import data  # deferred: skimage

    astronaut, camera = data.astronaut(), data.camera()
    # two faces: the astronaut's head and shoulders (a 256 px crop) beside its mirror image. Whole
    # photos side by side would shrink each face to 9% of the montage's width, below what BlazeFace
    # short-range (the default, a selfie-distance model) finds; in the crop each face is 18% wide.
    head = astronaut[:256, 96:352]
    montage = np.concatenate([head, head[:, ::-1]], axis=1)
    return {
        "astronaut": astronaut,
        "camera": camera,
        "coffee": data.coffee(),
        "chelsea": data.chelsea(),
        "montage": montage,
    }


def encode_jpeg(array: np.ndarray, quality: int = JPEG_QUALITY) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(array)).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


@lru_cache(maxsize=1)
def encoded_photos() -> dict[str, bytes]:
    """Every served body, encoded once per process: the photos plus ``big``."""
    arrays = photo_arrays()
    out = {name: encode_jpeg(arr) for name, arr in arrays.items()}
    reps = -(-BIG_SIZE // 512)
    big = np.tile(arrays["astronaut"][:512, :512], (reps, reps, 1))[:BIG_SIZE, :BIG_SIZE]
    out["big"] = encode_jpeg(big)
    return out


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.0"  # one request per connection; bodies may end at close

    def log_message(self, format, *args):  # quiet: no line per request
        pass

    def do_GET(self):
        parts = urlsplit(self.path)
        path, query = parts.path, parse_qs(parts.query)
        self.server.count(path)
        try:
            self.route(path, query)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeouts, byte limits)
            pass

    def route(self, path: str, query: dict[str, list[str]]) -> None:
        srv = self.server
        if path.startswith("/photo/") and path.endswith(".jpg") and path[7:-4] in PHOTOS:
            return self.send_jpeg(srv.bodies[path[7:-4]], query)
        if path.startswith("/synthetic/"):
            segments = path.split("/")
            if len(segments) == 4 and segments[3].endswith(".jpg") and segments[3][:-4].isdigit():
                kind = synthetic_kind(int(segments[3][:-4]))
                if kind == BROKEN:
                    return self.send_body(200, BROKEN_BYTES, "image/jpeg")
                if kind == NOT_FOUND:
                    return self.send_body(404, b"not found\n", "text/plain")
                return self.send_jpeg(srv.bodies[kind], query)
        if path == "/broken.jpg":
            return self.send_body(200, BROKEN_BYTES, "image/jpeg")
        if path == "/big.jpg":
            return self.send_jpeg(srv.bodies["big"], query)
        if path == "/slow.jpg":
            if srv.stopping.wait(srv.slow_seconds):
                return None  # server closing: drop the connection
            return self.send_jpeg(srv.bodies["astronaut"], query)
        if path == "/redirect" and query.get("to"):
            self.send_response(302)
            self.send_header("Location", query["to"][0])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        if path.startswith("/status/") and path[8:].isdigit() and 200 <= int(path[8:]) <= 599:
            return self.send_body(int(path[8:]), b"", "text/plain")
        return self.send_body(404, b"not found\n", "text/plain")

    def send_jpeg(self, body: bytes, query: dict[str, list[str]]) -> None:
        headers = {"X-Robots-Tag": query["robots"][0]} if query.get("robots") else {}
        self.send_body(200, body, "image/jpeg", headers, with_length=query.get("nolength") != ["1"])

    def send_body(self, code: int, body: bytes, content_type: str, headers: dict | None = None,
                  with_length: bool = True) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        if with_length:
            self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256  # many fetch threads connect at once; a full backlog costs a 1 s SYN retry

    def __init__(self, address, slow_seconds: float):
        super().__init__(address, _Handler)
        self.bodies = encoded_photos()
        self.slow_seconds = slow_seconds
        self.stopping = threading.Event()
        self.hits: Counter[str] = Counter()
        self._lock = threading.Lock()

    def count(self, path: str) -> None:
        with self._lock:
            self.hits[path] += 1

    def handle_error(self, request, client_address):  # quiet: clients hang up on purpose in tests
        pass


class LocalImageServer:
    """Threaded HTTP image server on 127.0.0.1 with an ephemeral port; a context manager.

    ``slow_seconds``: how long ``/slow.jpg`` waits before answering (set it above the client
    timeout under test). Closing wakes any waiting ``/slow.jpg`` handler, so shutdown is immediate.
    ``ssl_context``: a server-side :class:`ssl.SSLContext` to serve HTTPS instead.
    """

    def __init__(self, slow_seconds: float = 5.0, host: str = "127.0.0.1", ssl_context=None):
        self._server = _Server((host, 0), slow_seconds)
        if ssl_context is not None:  # HTTPS (tests of certificate checks); handshakes run in handler threads
            self._server.socket = ssl_context.wrap_socket(self._server.socket, server_side=True,
                                                          do_handshake_on_connect=False)
        self.scheme = "http" if ssl_context is None else "https"
        self.host, self.port = self._server.server_address[:2]
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    @property
    def hits(self) -> Counter:
        """Requests received per path (query excluded)."""
        return self._server.hits

    def url(self, path: str) -> str:
        return self.base_url + (path if path.startswith("/") else "/" + path)

    def localize(self, url: str | None) -> str | None:
        """``url`` with the bundled sample's prefix (:data:`SAMPLE_URL_PREFIX`) replaced by this server."""
        if url is not None and url.startswith(SAMPLE_URL_PREFIX + "/"):
            return self.base_url + url[len(SAMPLE_URL_PREFIX):]
        return url

    def start(self) -> LocalImageServer:
        if self._thread is None:
            self._thread = threading.Thread(target=self._server.serve_forever,
                                            kwargs={"poll_interval": SHUTDOWN_POLL_S},
                                            name=f"LocalImageServer:{self.port}", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        self._server.stopping.set()
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._server.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


if __name__ == "__main__":  # serve until interrupted: python -m pipelines.studies.amplification.sample_server
    with LocalImageServer() as srv:
        print(f"serving on {srv.base_url}", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass

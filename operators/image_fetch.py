"""Training-image fetch: LAION URL -> resized, re-encoded image bytes (paper 002, section 3.2, App. A.2).

The paper downloads the LAION images of the captions it selected. Like img2dataset, this stage
downloads each URL with bounded retries, honours the X-Robots-Tag opt-out, and resizes and
re-encodes the image with img2dataset's own :class:`img2dataset.resizer.Resizer` (so the resize
policy is img2dataset's, and is recorded). The HTTP fetch itself is ours, because dataset URLs
are untrusted input and img2dataset's plain ``urllib.request.urlopen`` would follow them anywhere
(the client is ``operators.support.http``):

- SSRF protection. In production (``allow_local=False``) every connection, including each hop
  of a redirect, resolves its host once, refuses it when any address is loopback, private,
  link-local (cloud metadata 169.254.169.254), carrier-grade NAT, unspecified, multicast or
  reserved (:func:`operators.support.http.is_blocked_address`), and connects to the very address it checked: no second
  DNS lookup, so DNS rebinding cannot swap in another address. HTTPS still verifies the
  certificate against, and sends SNI for, the URL's hostname. Environment proxies are ignored
  (a proxy would make the checked address the proxy's), and only http(s) is spoken, also on
  redirects (at most :data:`MAX_REDIRECTS`).
- Limits: ``timeout`` per socket operation (as urllib and img2dataset), a whole-attempt
  deadline of :data:`BODY_DEADLINE_FACTOR` x ``timeout`` against slow drips, ``max_bytes`` per
  body (Content-Length checked first, then at most ``max_bytes + 1`` bytes read), and
  ``max_image_area`` pixels, checked on the image header before anything is decoded.

Every row gets a ``fetch_status`` (:class:`schemas.images.FetchStatus`) and, when ok, the encoded
payload; a bad URL never raises. Identical URLs within a batch are downloaded once.
"""

from __future__ import annotations

import ast
import http.client
import importlib.metadata
import importlib.util
import io
import socket
import ssl
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pyarrow as pa

from operators.base import Resources, with_column
from operators.support.http import (
    MAX_REDIRECTS,
    AddressRefused,
    RedirectRefused,
    _ConnectGuard,
    build_opener,
    check_url,
    normalize_url,
    public_address,
    resolve_host,
)
from schemas.captions import URL
from schemas.images import (
    ENCODED,
    FETCH_COLUMNS,
    FETCH_ERROR,
    FETCH_STATUS,
    HTTP_STATUS,
    IMAGE,
    IMAGE_ENCODING,
    IMAGE_HEIGHT,
    IMAGE_WIDTH,
    ORIGINAL_HEIGHT,
    ORIGINAL_WIDTH,
    FetchStatus,
)

STAGE_FETCH = "fetch"
BODY_DEADLINE_FACTOR = 3      # an attempt (connect + headers + body) ends after this many timeouts
READ_CHUNK = 1 << 16
# Deliberately no "+https://..." info URL: this is an audit tool, not img2dataset itself.
BROWSER_UA = "Mozilla/5.0 (X11; Ubuntu; Linux x86_64; rv:72.0) Gecko/20100101 Firefox/72.0"

# --- img2dataset's components ----------------------------------------------------------------------
@lru_cache(maxsize=1)
def load_img2dataset() -> tuple[type, Callable, str]:
    """(Resizer, is_disallowed, how they were loaded) from the installed img2dataset.

    ``import img2dataset`` runs the package's ``__init__``, which imports its whole CLI (wandb,
    fsspec writers...). Where that fails (wandb >= 0.19 with protobuf < 5, as pinned by
    mediapipe), the two components are taken from the installed package's own files instead:
    ``resizer.py`` has no package-relative imports, and ``is_disallowed`` is a pure function.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # resizer.py imports imghdr
        return _load_img2dataset()


def _load_img2dataset() -> tuple[type, Callable, str]:
    try:
        from img2dataset.downloader import is_disallowed  # deferred: img2dataset
        from img2dataset.resizer import Resizer  # deferred: img2dataset

        return Resizer, is_disallowed, "package"
    except Exception as exc:  # noqa: BLE001 -- any failure of the package import: use its files
        reason = f"{type(exc).__name__}: {exc}"
    spec = importlib.util.find_spec("img2dataset")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("img2dataset is not installed (pip install img2dataset)")
    pkg_dir = Path(next(iter(spec.submodule_search_locations)))
    name = "_t2i_img2dataset_resizer"
    module = sys.modules.get(name)
    if module is None:
        rspec = importlib.util.spec_from_file_location(name, pkg_dir / "resizer.py")
        module = importlib.util.module_from_spec(rspec)
        rspec.loader.exec_module(module)
        sys.modules[name] = module
    source_path = pkg_dir / "downloader.py"
    tree = ast.parse(source_path.read_text(encoding="utf-8"), filename=str(source_path))
    funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "is_disallowed"]
    if not funcs:
        raise ImportError(f"img2dataset.downloader.is_disallowed not found in {source_path}")
    namespace = {"traceback": traceback}
    exec(compile(ast.Module(body=funcs, type_ignores=[]), str(source_path), "exec"), namespace)  # noqa: S102
    return module.Resizer, namespace["is_disallowed"], f"source files of {pkg_dir} (package import failed: {reason})"


# --- one URL -----------------------------------------------------------------------------------
@dataclass
class FetchResult:
    status: str
    error: str | None = None
    http_status: int | None = None
    data: bytes | None = None
    retryable: bool = False
    attempts: int = 0
    image: bytes | None = None
    height: int | None = None
    width: int | None = None
    original_height: int | None = None
    original_width: int | None = None


def classify_error(exc: BaseException) -> FetchResult:
    """The fetch status of an exception raised by one download attempt; ``retryable`` says whether
    another attempt may help (timeouts, 5xx, dropped connections; never 4xx, refusals or DNS)."""
    if isinstance(exc, AddressRefused):
        return FetchResult(FetchStatus.REFUSED, str(exc))
    if isinstance(exc, RedirectRefused):
        return FetchResult(exc.status, str(exc))
    if isinstance(exc, urllib.error.HTTPError):
        code = int(exc.code) if exc.code is not None else None
        exc.close()
        return FetchResult(FetchStatus.HTTP_ERROR, f"HTTP {code} {exc.reason}".strip(), code,
                           retryable=code is None or code >= 500)
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    detail = f"{type(reason).__name__}: {reason}" if isinstance(reason, BaseException) else str(reason)
    if isinstance(reason, AddressRefused):
        return FetchResult(FetchStatus.REFUSED, str(reason))
    if isinstance(reason, TimeoutError):
        return FetchResult(FetchStatus.TIMEOUT, detail, retryable=True)
    if isinstance(reason, ssl.SSLError):  # incl. certificate errors (also a ValueError)
        return FetchResult(FetchStatus.NETWORK_ERROR, "TLS " + detail)
    if isinstance(reason, socket.gaierror):
        return FetchResult(FetchStatus.NETWORK_ERROR, "DNS " + detail)
    if isinstance(reason, http.client.InvalidURL):  # e.g. control characters in the URL
        return FetchResult(FetchStatus.INVALID_URL, detail)
    if isinstance(reason, (ConnectionError, http.client.HTTPException)):
        return FetchResult(FetchStatus.NETWORK_ERROR, detail, retryable=True)
    if isinstance(reason, str) and "unknown url type" in reason:
        return FetchResult(FetchStatus.INVALID_URL, detail)
    if isinstance(reason, ValueError):  # http.client.InvalidURL: control characters, bad host
        return FetchResult(FetchStatus.INVALID_URL, detail)
    return FetchResult(FetchStatus.NETWORK_ERROR, detail)


_RESIZE_LOCK = threading.Lock()  # the Resizer redirects fds 1 and 2 while it runs: one at a time


class ImageFetcher:
    """Adds :data:`schemas.images.FETCH_COLUMNS` for the ``url`` of each row.

    ``allow_local``: connect to any address (the local image server of the embedded run, tests);
    off in production. ``resolver``: host -> list of IP strings (default: the system resolver),
    called once per connection; the connection goes to an address it returned.
    ``address_filter``: ip -> True when a production fetch may connect there (default:
    :func:`public_address`, i.e. not :func:`is_blocked_address`); unused when ``allow_local``.
    Both are seams for tests. ``ca_file``: PEM bundle to trust for HTTPS instead of the system
    store. Failures of img2dataset's decoding map to ``not_image``, its "image area too large" to
    ``too_large``; an X-Robots-Tag opt-out (img2dataset's ``is_disallowed``) is ``disallowed``.
    """

    stage_name = STAGE_FETCH
    resources = Resources(num_cpus=1, batch_size=256, actors=None)

    def __init__(self, timeout: float = 10, retries: int = 1, threads: int = 32, max_bytes: int = 20_000_000,
                 allow_local: bool = False, image_size: int = 512, resize_mode: str = "keep_ratio",
                 resize_only_if_bigger: bool = True, encode_format: str = "jpg", encode_quality: int = 95,
                 max_image_area: float = 178_956_970, user_agent_token: str | None = "t2i-bias-audit",
                 disallowed_header_directives=("noai", "noimageai", "noindex", "noimageindex"),
                 resolver: Callable[[str], list[str]] | None = None,
                 address_filter: Callable[[str], bool] | None = None, ca_file: str | None = None):
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0, got {timeout}")
        if retries < 0 or threads < 1 or max_bytes < 1:
            raise ValueError(f"need retries >= 0, threads >= 1, max_bytes >= 1; got {retries}, {threads}, {max_bytes}")
        resizer_cls, self._is_disallowed, loaded_from = load_img2dataset()
        self.resizer = resizer_cls(
            image_size=image_size,
            resize_mode=resize_mode,
            resize_only_if_bigger=resize_only_if_bigger,
            encode_format=encode_format,
            encode_quality=encode_quality,
            max_image_area=max_image_area,
        )
        self.timeout = float(timeout)
        self.retries = int(retries)
        self.threads = int(threads)
        self.max_bytes = int(max_bytes)
        self.max_image_area = max_image_area
        self.allow_local = bool(allow_local)
        self.ua_token = None if user_agent_token is None else user_agent_token.strip().lower()
        self.user_agent = BROWSER_UA + (f" (compatible; {self.ua_token})" if self.ua_token else "")
        self.disallowed = (
            None if disallowed_header_directives is None
            else {d.strip().lower() for d in disallowed_header_directives}
        )
        guard = _ConnectGuard(resolver or resolve_host, None if self.allow_local else (address_filter or public_address))
        self.opener = build_opener(guard, ssl.create_default_context(cafile=ca_file))
        try:
            version = importlib.metadata.version("img2dataset")
        except importlib.metadata.PackageNotFoundError:
            version = None
        self.record = {
            "stage": STAGE_FETCH,
            "img2dataset": version,
            "img2dataset_components": ["img2dataset.resizer.Resizer", "img2dataset.downloader.is_disallowed"],
            "img2dataset_loaded_from": loaded_from,
            "timeout_s": self.timeout,
            "attempt_deadline_s": self.timeout * BODY_DEADLINE_FACTOR,
            "retries": self.retries,
            "retry_on": ["timeout", "http 5xx", "connection reset/refused/dropped"],
            "threads": self.threads,
            "max_bytes": self.max_bytes,
            "max_redirects": MAX_REDIRECTS,
            "max_image_area": max_image_area,
            "resize": {
                "image_size": image_size,
                "resize_mode": resize_mode,
                "resize_only_if_bigger": resize_only_if_bigger,
                "encode_format": encode_format,
                "encode_quality": encode_quality,
                "upscale_interpolation": "lanczos",
                "downscale_interpolation": "area",
            },
            "allow_local": self.allow_local,
            "address_policy": "all addresses (allow_local)" if self.allow_local else (
                "is_blocked_address" if address_filter is None else "custom address_filter"),
            "resolver": "system" if resolver is None else "custom",
            "proxies": "none (environment proxies ignored)",
            "tls_trust": ca_file or "system default",
            "user_agent": self.user_agent,
            "disallowed_header_directives": None if self.disallowed is None else sorted(self.disallowed),
        }

    # -- download ----------------------------------------------------------------------------------
    def _attempt(self, url: str) -> FetchResult:
        request = urllib.request.Request(url, headers={"User-Agent": self.user_agent})
        start = time.monotonic()
        deadline = start + self.timeout * BODY_DEADLINE_FACTOR
        try:
            with self.opener.open(request, timeout=self.timeout) as resp:
                code = resp.status
                if self.disallowed and self._is_disallowed(resp.headers, self.ua_token, self.disallowed):
                    tags = ", ".join(resp.headers.get_all("X-Robots-Tag", []))
                    return FetchResult(FetchStatus.DISALLOWED, f"disallowed by X-Robots-Tag: {tags}"[:300], code)
                length = (resp.headers.get("Content-Length") or "").strip()
                if length.isdigit() and int(length) > self.max_bytes:
                    return FetchResult(FetchStatus.TOO_LARGE, f"Content-Length {length} > max_bytes {self.max_bytes}", code)
                chunks, total = [], 0
                while True:
                    chunk = resp.read(min(READ_CHUNK, self.max_bytes + 1 - total))
                    if not chunk:
                        break
                    chunks.append(chunk)
                    total += len(chunk)
                    if total > self.max_bytes:
                        return FetchResult(FetchStatus.TOO_LARGE, f"body over max_bytes {self.max_bytes}", code)
                    if time.monotonic() > deadline:
                        return FetchResult(FetchStatus.TIMEOUT,
                                           f"download not done after {self.timeout * BODY_DEADLINE_FACTOR:g} s",
                                           code, retryable=True)
                return FetchResult(FetchStatus.OK, None, code, b"".join(chunks))
        except Exception as exc:  # noqa: BLE001 -- every failure becomes a status
            return classify_error(exc)

    def download(self, url: str) -> FetchResult:
        """Bytes of ``url`` with bounded retries (never raises)."""
        result = FetchResult(FetchStatus.NETWORK_ERROR, "not attempted")
        for attempt in range(self.retries + 1):
            try:
                result = self._attempt(normalize_url(url))
            except Exception as exc:  # noqa: BLE001 -- defensive: _attempt already classifies
                result = FetchResult(FetchStatus.NETWORK_ERROR, f"{type(exc).__name__}: {exc}")
            result.attempts = attempt + 1
            if not result.retryable:
                break
        return result

    # -- decode and resize -------------------------------------------------------------------------
    def decode(self, result: FetchResult) -> FetchResult:
        """Resize and re-encode the downloaded bytes with img2dataset's Resizer (in place)."""
        data, result.data = result.data, None
        try:  # pixel-area limit on the header, before anything is decoded
            from PIL import Image  # deferred: PIL

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with Image.open(io.BytesIO(data)) as im:
                    w0, h0 = im.size
            if w0 * h0 > self.max_image_area:
                result.status, result.error = FetchStatus.TOO_LARGE, f"image area too large ({w0}x{h0})"
                result.original_width, result.original_height = w0, h0
                return result
        except Exception as exc:  # noqa: BLE001 -- PIL cannot read it; the Resizer (OpenCV) decides
            if type(exc).__name__ == "DecompressionBombError":
                result.status, result.error = FetchStatus.TOO_LARGE, f"image area too large: {exc}"
                return result
        with _RESIZE_LOCK:
            img, width, height, orig_w, orig_h, err = self.resizer(io.BytesIO(data))
        if err is not None or img is None:
            err = err or "resizer returned no image"
            result.status = FetchStatus.TOO_LARGE if "too large" in err else FetchStatus.NOT_IMAGE
            result.error = err
            return result
        result.image, result.height, result.width = img, height, width
        result.original_height, result.original_width = orig_h, orig_w
        return result

    # -- batch -------------------------------------------------------------------------------------
    def fetch_all(self, urls: list) -> list[FetchResult]:
        """One result per URL, in order; each distinct valid URL is downloaded once."""
        results: dict[str, FetchResult] = {}
        invalid: dict[int, FetchResult] = {}
        todo: list[str] = []
        for i, url in enumerate(urls):
            problem = check_url(url)
            if problem is not None:
                invalid[i] = FetchResult(FetchStatus.INVALID_URL, problem)
            elif url not in results:
                results[url] = FetchResult(FetchStatus.NETWORK_ERROR, "not attempted")
                todo.append(url)
        if todo:
            with ThreadPoolExecutor(max_workers=min(self.threads, len(todo)), thread_name_prefix="fetch") as pool:
                futures = {pool.submit(self.download, url): url for url in todo}
                for future in as_completed(futures):  # resize here, in this thread, while others download
                    result = future.result()
                    if result.status == FetchStatus.OK:
                        try:
                            result = self.decode(result)
                        except Exception as exc:  # noqa: BLE001
                            result.status, result.error, result.data = FetchStatus.NOT_IMAGE, f"{type(exc).__name__}: {exc}", None
                    results[futures[future]] = result
        return [invalid[i] if i in invalid else results[url] for i, url in enumerate(urls)]

    def __call__(self, batch: pa.Table) -> pa.Table:
        urls = batch.column(URL).to_pylist()
        res = self.fetch_all(urls)
        ok = [r.status == FetchStatus.OK for r in res]
        values = {
            IMAGE: [r.image if o else None for r, o in zip(res, ok)],
            IMAGE_ENCODING: [ENCODED if o else None for o in ok],
            IMAGE_HEIGHT: [r.height if o else None for r, o in zip(res, ok)],
            IMAGE_WIDTH: [r.width if o else None for r, o in zip(res, ok)],
            FETCH_STATUS: [r.status for r in res],
            FETCH_ERROR: [r.error for r in res],
            HTTP_STATUS: [r.http_status for r in res],
            ORIGINAL_HEIGHT: [r.original_height for r in res],
            ORIGINAL_WIDTH: [r.original_width for r in res],
        }
        for field in FETCH_COLUMNS:
            batch = with_column(batch, field.name, pa.array(values[field.name], field.type))
        return batch

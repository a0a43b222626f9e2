"""ImageFetcher against the LocalImageServer on 127.0.0.1: statuses, limits, resizing, SSRF refusals."""

from __future__ import annotations

import importlib.metadata
import itertools
import shutil
import socket
import ssl
import subprocess
import time
from collections import Counter
from ipaddress import IPv4Address, IPv6Address
from urllib.parse import quote

import numpy as np
import pyarrow as pa
import pytest

from operators.support.codec import decode_rgb
from operators.image_fetch import ImageFetcher
from operators.support.http import embedded_ipv4, is_blocked_address
from pipelines.studies.amplification.sample_server import (
    BIG_SIZE,
    PHOTOS,
    SYNTHETIC_SHARES,
    LocalImageServer,
    encoded_photos,
    photo_arrays,
    synthetic_kind,
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

PHOTO_SHAPES = {name: arr.shape[:2] for name, arr in photo_arrays().items()}


@pytest.fixture
def server():
    with LocalImageServer(slow_seconds=3.0) as srv:
        yield srv


def fetch(fetcher: ImageFetcher, urls: list) -> list[dict]:
    return fetcher(pa.table({URL: pa.array(urls, pa.string())})).to_pylist()


def one(fetcher: ImageFetcher, url) -> dict:
    return fetch(fetcher, [url])[0]


def local(**kwargs) -> ImageFetcher:
    kwargs.setdefault("timeout", 2)
    return ImageFetcher(allow_local=True, **kwargs)


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def only_local_server(ip: str) -> bool:
    """address_filter of the redirect tests: the test server (127.0.0.1) plays a public host; every
    other address gets the production verdict."""
    return ip == "127.0.0.1" or not is_blocked_address(ip)


# --- photos, payload, resize policy ------------------------------------------------------------------
def test_photos_ok_with_payload_original_sizes_and_keep_ratio_resize(server):
    rows = fetch(local(image_size=256), [server.url(f"/photo/{p}.jpg") for p in PHOTOS])
    for name, row in zip(PHOTOS, rows):
        assert row[FETCH_STATUS] == FetchStatus.OK, row[FETCH_ERROR]
        assert row[HTTP_STATUS] == 200 and row[FETCH_ERROR] is None
        h0, w0 = PHOTO_SHAPES[name]
        assert (row[ORIGINAL_HEIGHT], row[ORIGINAL_WIDTH]) == (h0, w0)
        assert min(row[IMAGE_HEIGHT], row[IMAGE_WIDTH]) == 256  # keep_ratio: shortest side
        assert row[IMAGE_WIDTH] / row[IMAGE_HEIGHT] == pytest.approx(w0 / h0, rel=0.01)
        assert row[IMAGE_ENCODING] == ENCODED
        img = decode_rgb(row[IMAGE], row[IMAGE_ENCODING])
        assert img is not None and img.shape == (row[IMAGE_HEIGHT], row[IMAGE_WIDTH], 3)


def test_payload_is_the_served_photo_when_not_resized(server):
    fetcher = local(image_size=512)  # resize_only_if_bigger: 512-px photos stay as they are
    for name in ("astronaut", "camera"):
        row = one(fetcher, server.url(f"/photo/{name}.jpg"))
        img = decode_rgb(row[IMAGE]).astype(np.int16)
        ref = photo_arrays()[name]
        ref = np.repeat(ref[:, :, None], 3, axis=2) if ref.ndim == 2 else ref
        assert img.shape == ref.shape
        assert np.abs(img - ref).mean() < 6  # two JPEG generations apart, same picture
        other = photo_arrays()["coffee"]
        assert np.abs(img[:400, :512] - other[:400, :512]).mean() > 20


@pytest.mark.parametrize(
    ("kwargs", "expect"),
    [
        ({"image_size": 1024}, (400, 600)),                                     # only if bigger: unchanged
        ({"image_size": 1024, "resize_only_if_bigger": False}, (1024, 1536)),  # upscaled
        ({"image_size": 200, "resize_mode": "center_crop"}, (200, 200)),
        ({"image_size": 300, "resize_mode": "keep_ratio_largest"}, (200, 300)),
        ({"image_size": 100, "resize_mode": "no"}, (400, 600)),
    ],
)
def test_resize_policy_is_img2datasets(server, kwargs, expect):
    fetcher = local(**kwargs)
    row = one(fetcher, server.url("/photo/coffee.jpg"))
    assert row[FETCH_STATUS] == FetchStatus.OK
    assert (row[IMAGE_HEIGHT], row[IMAGE_WIDTH]) == expect
    assert (row[ORIGINAL_HEIGHT], row[ORIGINAL_WIDTH]) == (400, 600)
    assert decode_rgb(row[IMAGE]).shape[:2] == expect
    for key in ("image_size", "resize_mode", "resize_only_if_bigger"):
        if key in kwargs:
            assert fetcher.record["resize"][key] == kwargs[key]


def test_output_schema_and_other_columns_kept(server):
    batch = pa.table({"keep": pa.array([7, 8], pa.int64()), URL: [server.url("/photo/coffee.jpg"), server.url("/nope")]})
    out = local()(batch)
    assert out.column_names == ["keep", URL] + FETCH_COLUMNS.names
    for field in FETCH_COLUMNS:
        assert out.schema.field(field.name).type == field.type
    assert out.column("keep").to_pylist() == [7, 8]
    bad = out.to_pylist()[1]
    assert all(bad[c] is None for c in (IMAGE, IMAGE_ENCODING, IMAGE_HEIGHT, IMAGE_WIDTH, ORIGINAL_HEIGHT))


# --- failure statuses -----------------------------------------------------------------------------
def test_broken_image_is_not_image(server):
    row = one(local(), server.url("/broken.jpg"))
    assert (row[FETCH_STATUS], row[HTTP_STATUS], row[IMAGE]) == (FetchStatus.NOT_IMAGE, 200, None)


def test_unknown_path_is_http_error_404(server):
    row = one(local(), server.url("/no/such/image.jpg"))
    assert (row[FETCH_STATUS], row[HTTP_STATUS]) == (FetchStatus.HTTP_ERROR, 404)


def test_slow_server_times_out(server):
    t = time.monotonic()
    row = one(local(timeout=0.5, retries=0), server.url("/slow.jpg"))
    assert row[FETCH_STATUS] == FetchStatus.TIMEOUT
    assert time.monotonic() - t < 2.5  # the server would answer after 3 s


def test_downloads_run_in_parallel(server):
    with LocalImageServer(slow_seconds=0.6) as srv:
        t = time.monotonic()
        rows = fetch(local(threads=8), [srv.url(f"/slow.jpg?i={i}") for i in range(8)])
        elapsed = time.monotonic() - t
    assert [r[FETCH_STATUS] for r in rows] == [FetchStatus.OK] * 8
    assert elapsed < 8 * 0.6 / 2


def test_byte_limit_with_and_without_content_length(server):
    size = len(encoded_photos()["coffee"])
    exact = local(max_bytes=size)
    assert one(exact, server.url("/photo/coffee.jpg"))[FETCH_STATUS] == FetchStatus.OK
    assert one(exact, server.url("/photo/coffee.jpg?nolength=1"))[FETCH_STATUS] == FetchStatus.OK
    small = local(max_bytes=size - 1)
    with_length = one(small, server.url("/photo/coffee.jpg"))
    no_length = one(small, server.url("/photo/coffee.jpg?nolength=1"))
    assert with_length[FETCH_STATUS] == no_length[FETCH_STATUS] == FetchStatus.TOO_LARGE
    assert "Content-Length" in with_length[FETCH_ERROR]
    assert "Content-Length" not in no_length[FETCH_ERROR]
    big = one(local(max_bytes=100_000), server.url("/big.jpg"))
    assert big[FETCH_STATUS] == FetchStatus.TOO_LARGE and big[IMAGE] is None


def test_pixel_area_limit(server):
    ok = one(local(), server.url("/big.jpg"))
    assert ok[FETCH_STATUS] == FetchStatus.OK and (ok[ORIGINAL_HEIGHT], ok[ORIGINAL_WIDTH]) == (BIG_SIZE, BIG_SIZE)
    row = one(local(max_image_area=BIG_SIZE * BIG_SIZE - 1), server.url("/big.jpg"))
    assert row[FETCH_STATUS] == FetchStatus.TOO_LARGE and row[IMAGE] is None
    assert (row[ORIGINAL_HEIGHT], row[ORIGINAL_WIDTH]) == (BIG_SIZE, BIG_SIZE)


@pytest.mark.parametrize("url", [None, "ftp://x", "http://", "not a url", "https:///path.jpg", "http://h:99999/x",
                                 "file:///etc/passwd"])
def test_invalid_urls(url):
    row = one(ImageFetcher(), url)
    assert row[FETCH_STATUS] == FetchStatus.INVALID_URL and row[FETCH_ERROR]


def test_control_characters_in_url_are_invalid_not_raised(server):
    row = one(local(), server.url("/photo/coffee.jpg") + "\r\nX-Injected: 1")
    assert row[FETCH_STATUS] == FetchStatus.INVALID_URL


def test_spaces_and_non_ascii_in_path_or_query_are_percent_encoded(server):
    row = one(local(), server.url("/photo/coffee.jpg?caption=a doctor é"))
    assert row[FETCH_STATUS] == FetchStatus.OK, row[FETCH_ERROR]


def test_connection_refused_and_dns_failure_are_network_errors():
    row = one(local(retries=0), f"http://127.0.0.1:{closed_port()}/x.jpg")
    assert row[FETCH_STATUS] == FetchStatus.NETWORK_ERROR

    def no_dns(host):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    row = one(ImageFetcher(resolver=no_dns), "http://nowhere.invalid/x.jpg")
    assert row[FETCH_STATUS] == FetchStatus.NETWORK_ERROR and "DNS" in row[FETCH_ERROR]


def test_x_robots_tag_opt_out_as_in_img2dataset(server):
    fetcher = local()
    status = {
        value: one(fetcher, server.url(f"/photo/camera.jpg?robots={value}"))[FETCH_STATUS]
        for value in ("noai", "noindex, nofollow", "t2i-bias-audit: noimageai", "otherbot: noai", "nofollow")
    }
    assert status == {
        "noai": FetchStatus.DISALLOWED,
        "noindex, nofollow": FetchStatus.DISALLOWED,
        "t2i-bias-audit: noimageai": FetchStatus.DISALLOWED,
        "otherbot: noai": FetchStatus.OK,      # addressed to another crawler
        "nofollow": FetchStatus.OK,
    }
    ignoring = local(disallowed_header_directives=None)
    assert one(ignoring, server.url("/photo/camera.jpg?robots=noai"))[FETCH_STATUS] == FetchStatus.OK


# --- retries ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("retries", [0, 2])
def test_retries_bounded_and_not_on_4xx(server, retries):
    fetcher = local(retries=retries)
    rows = fetch(fetcher, [server.url("/status/500"), server.url("/status/404"), server.url("/status/403")])
    assert [r[HTTP_STATUS] for r in rows] == [500, 404, 403]
    assert all(r[FETCH_STATUS] == FetchStatus.HTTP_ERROR for r in rows)
    assert server.hits["/status/500"] == retries + 1
    assert server.hits["/status/404"] == 1 and server.hits["/status/403"] == 1


# --- batches ---------------------------------------------------------------------------------------
def expected_status(kind: str) -> str:
    return {"broken": FetchStatus.NOT_IMAGE, "not_found": FetchStatus.HTTP_ERROR}.get(kind, FetchStatus.OK)


def test_synthetic_urls_agree_with_synthetic_kind(server):
    sample = [f"https://images.example.org/synthetic/0/{i:09d}.jpg" for i in range(60)]
    rows = fetch(local(), [server.localize(u) for u in sample])
    kinds = [synthetic_kind(i) for i in range(60)]
    assert len(set(kinds)) >= 4
    for i, (kind, row) in enumerate(zip(kinds, rows)):
        assert row[URL] == server.base_url + f"/synthetic/0/{i:09d}.jpg"
        assert row[FETCH_STATUS] == expected_status(kind), (i, kind, row[FETCH_ERROR])
        if kind in PHOTO_SHAPES:
            assert (row[ORIGINAL_HEIGHT], row[ORIGINAL_WIDTH]) == PHOTO_SHAPES[kind]
        if kind == "not_found":
            assert row[HTTP_STATUS] == 404


def test_synthetic_kind_shares_and_no_period():
    n = 20_000
    kinds = [synthetic_kind(i) for i in range(n)]
    counts = Counter(kinds)
    for kind, share in SYNTHETIC_SHARES:
        assert counts[kind] / n == pytest.approx(share, abs=0.015), kind
    same_as_next = sum(a == b for a, b in itertools.pairwise(kinds)) / (n - 1)
    expected = sum(s * s for _, s in SYNTHETIC_SHARES)  # independent draws
    assert same_as_next == pytest.approx(expected, abs=0.03)
    assert [synthetic_kind(i) for i in range(50)] == kinds[:50]  # deterministic


def test_mixed_batch_keeps_order_count_and_fetches_duplicates_once(server):
    rng = np.random.default_rng(3)
    cases = [(server.url(f"/photo/{p}.jpg"), FetchStatus.OK) for p in PHOTOS]
    cases += [(server.url("/broken.jpg"), FetchStatus.NOT_IMAGE), (server.url("/gone.jpg"), FetchStatus.HTTP_ERROR),
              (None, FetchStatus.INVALID_URL), ("ftp://x/y.jpg", FetchStatus.INVALID_URL),
              (server.url("/photo/chelsea.jpg?robots=noai"), FetchStatus.DISALLOWED)]
    cases += [(server.url(f"/synthetic/0/{i}.jpg"), expected_status(synthetic_kind(i))) for i in range(100, 120)]
    cases = cases + [cases[0], cases[0], cases[5]]  # duplicates within the batch
    order = rng.permutation(len(cases))
    urls = [cases[i][0] for i in order]
    assert len(urls) >= 30
    rows = fetch(local(threads=4), urls)
    assert len(rows) == len(urls)
    assert [r[URL] for r in rows] == urls
    assert [r[FETCH_STATUS] for r in rows] == [cases[i][1] for i in order]
    assert server.hits["/photo/astronaut.jpg"] == 1 and server.hits["/broken.jpg"] == 1


def test_empty_batch():
    out = ImageFetcher()(pa.table({URL: pa.array([], pa.string())}))
    assert out.num_rows == 0 and out.column_names == [URL] + FETCH_COLUMNS.names


# --- SSRF: production mode -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("ip", "blocked"),
    [
        ("127.0.0.1", True), ("127.255.0.9", True), ("10.0.0.1", True), ("10.255.255.255", True),
        ("172.16.0.1", True), ("172.31.255.254", True), ("172.32.0.1", False), ("192.168.1.1", True),
        ("169.254.169.254", True), ("169.254.0.1", True), ("0.0.0.0", True), ("100.64.0.1", True),
        ("100.127.255.254", True), ("100.100.100.200", True), ("224.0.0.1", True), ("239.1.2.3", True),
        ("255.255.255.255", True), ("240.0.0.1", True), ("192.0.0.192", True),
        ("::1", True), ("::", True), ("fc00::1", True), ("fd00:ec2::254", True), ("fe80::1", True),
        ("fe80::1%eth0", True), ("ff02::1", True), ("::ffff:127.0.0.1", True), ("::ffff:169.254.169.254", True),
        ("::ffff:10.0.0.1", True), ("64:ff9b::a00:1", True), ("::127.0.0.1", True),
        ("8.8.8.8", False), ("1.1.1.1", False), ("2606:4700::1", False), ("::ffff:8.8.8.8", False),
        ("not-an-ip", True), ("", True),
        # 6to4 (2002::/16) relays to the IPv4 address in bits 16-48
        ("2002:7f00:1::1", True), ("2002:a9fe:a9fe::", True), ("2002:a00:1:5::9", True), ("2002:c0a8:101::1", True),
        ("2002:808:808::1", False),
        # Teredo (2001::/32): server 65.54.227.120, client (XOR 0xffffffff) 127.0.0.1 / 10.0.0.1 / 8.8.8.8
        ("2001:0:4136:e378:8000:63bf:80ff:fffe", True), ("2001:0:4136:e378:8000:63bf:f5ff:fffe", True),
        ("2001:0:4136:e378:8000:63bf:f7f7:f7f7", True),  # public client: still not global (RFC 4380 prefix)
    ],
)
def test_is_blocked_address(ip, blocked):
    assert is_blocked_address(ip) is blocked


def teredo(server: str, client: str, flags_port: int = 0x800063BF) -> str:
    """A Teredo address built from its parts (RFC 4380 section 4): prefix, server, flags+port, ~client."""
    bits = (0x20010000 << 96) | (int(IPv4Address(server)) << 64) | (flags_port << 32)
    return str(IPv6Address(bits | (int(IPv4Address(client)) ^ 0xFFFFFFFF)))


@pytest.mark.parametrize(("server_ip", "client_ip"), [("65.54.227.120", "127.0.0.1"), ("127.0.0.1", "8.8.8.8"),
                                                      ("8.8.4.4", "169.254.169.254"), ("1.2.3.4", "5.6.7.8")])
def test_embedded_ipv4_of_tunnels(server_ip, client_ip):
    assert embedded_ipv4(IPv6Address(teredo(server_ip, client_ip))) == [IPv4Address(server_ip), IPv4Address(client_ip)]
    six = IPv6Address((0x2002 << 112) | (int(IPv4Address(client_ip)) << 80) | 0x1234)
    assert embedded_ipv4(six) == [IPv4Address(client_ip)]
    assert is_blocked_address(str(six)) is is_blocked_address(client_ip)
    assert is_blocked_address(teredo(server_ip, client_ip))


@pytest.mark.parametrize(("address", "carried"), [("2002:7f00:1::1", "127.0.0.1"),
                                                  ("2002:a9fe:a9fe::1", "169.254.169.254"),
                                                  (teredo("65.54.227.120", "10.0.0.1"), "10.0.0.1")])
def test_production_refuses_tunnelled_blocked_ipv4(address, carried):
    row = one(ImageFetcher(timeout=1, retries=0, resolver=lambda host: [address]), "http://tunnel.example.org/x.jpg")
    assert row[FETCH_STATUS] == FetchStatus.REFUSED, row[FETCH_ERROR]
    assert address in row[FETCH_ERROR] and f"carries {carried}" in row[FETCH_ERROR].replace("65.54.227.120, ", "")


def recording_resolver(names: dict[str, list[str]]):
    """A resolver that answers ``names`` and records every name asked (unknown: a DNS failure)."""
    asked: list[str] = []

    def resolve(host):
        asked.append(host)
        if host not in names:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return names[host]
    return resolve, asked


@pytest.mark.parametrize("userinfo", ["user@", "user:pw@", "@", "user%40x@", "a@b@"])
def test_userinfo_is_invalid_url_and_never_resolved(server, userinfo):
    resolve, asked = recording_resolver({"images.example.org": ["127.0.0.1"]})
    for fetcher in (ImageFetcher(resolver=resolve), local(resolver=resolve)):
        row = one(fetcher, f"http://{userinfo}images.example.org:{server.port}/photo/coffee.jpg")
        assert row[FETCH_STATUS] == FetchStatus.INVALID_URL and "userinfo" in row[FETCH_ERROR]
    assert asked == [] and sum(server.hits.values()) == 0


def test_a_non_ascii_host_is_asked_for_in_its_idna_form_and_a_bad_one_is_invalid(server):
    resolve, asked = recording_resolver({"xn--bcher-kva.example": ["127.0.0.1"]})
    ok = one(local(resolver=resolve), f"http://bücher.example:{server.port}/photo/coffee.jpg")
    assert ok[FETCH_STATUS] == FetchStatus.OK, ok[FETCH_ERROR]
    assert asked == ["xn--bcher-kva.example"]
    bad = one(local(resolver=resolve), f"http://{'ü' * 70}.example/x.jpg")   # a label over 63 characters
    assert bad[FETCH_STATUS] == FetchStatus.INVALID_URL and "internationalized domain name" in bad[FETCH_ERROR]
    assert asked == ["xn--bcher-kva.example"]


def test_a_percent_encoded_look_alike_of_localhost_is_an_invalid_host_never_looked_up(server):
    """``%E2%93%9B`` is U+24DB (circled l): the host decodes to a look-alike of localhost
    that IDNA maps to ``localhost``. Refused with a clear reason, not a UnicodeEncodeError text; no
    lookup and no connection, in production and with local addresses allowed, directly or through
    a redirect. Its non-encoded form is the IDNA name ``localhost``: refused in production."""
    resolve, asked = recording_resolver({"localhost": ["127.0.0.1"], "public.test": ["127.0.0.1"]})
    lookalike = f"http://%E2%93%9Bocalhost:{server.port}/photo/coffee.jpg"
    for fetcher in (ImageFetcher(timeout=2, resolver=resolve), local(resolver=resolve)):
        row = one(fetcher, lookalike)
        assert row[FETCH_STATUS] == FetchStatus.INVALID_URL, row[FETCH_ERROR]
        assert row[FETCH_ERROR].startswith("invalid host name '%E2%93%9Bocalhost': percent-encoded")
        assert "'\u24dbocalhost'" in row[FETCH_ERROR] and "IDNA maps to 'localhost'" in row[FETCH_ERROR]
        assert "Unicode" not in row[FETCH_ERROR]
    redirected = one(ImageFetcher(timeout=2, resolver=resolve, address_filter=only_local_server),
                     f"http://public.test:{server.port}/redirect?to=" + quote(lookalike, safe=""))
    assert redirected[FETCH_STATUS] == FetchStatus.INVALID_URL and "invalid host name" in redirected[FETCH_ERROR]
    assert asked == ["public.test"] and server.hits["/photo/coffee.jpg"] == 0
    plain = one(ImageFetcher(timeout=2, resolver=resolve), f"http://\u24dbocalhost:{server.port}/photo/coffee.jpg")
    assert plain[FETCH_STATUS] == FetchStatus.REFUSED and "blocked address 127.0.0.1" in plain[FETCH_ERROR]
    assert asked == ["public.test", "localhost"] and server.hits["/photo/coffee.jpg"] == 0


def test_trailing_dot_is_checked_as_the_name_it_ends(server):
    resolve, asked = recording_resolver({"localhost": ["127.0.0.1"], "images.example.org": ["127.0.0.1"]})
    rows = fetch(ImageFetcher(resolver=resolve), [f"http://localhost.:{server.port}/x.jpg",
                                                   f"http://127.0.0.1.:{server.port}/x.jpg"])
    assert [r[FETCH_STATUS] for r in rows] == [FetchStatus.REFUSED] * 2, [r[FETCH_ERROR] for r in rows]
    assert all("127.0.0.1" in r[FETCH_ERROR] for r in rows)
    assert asked == ["localhost"]  # the literal with a dot is a literal, not a name for DNS
    assert sum(server.hits.values()) == 0
    ok = one(local(resolver=resolve), f"http://images.example.org.:{server.port}/photo/coffee.jpg")
    assert ok[FETCH_STATUS] == FetchStatus.OK, ok[FETCH_ERROR]


def test_production_refuses_loopback_url_without_connecting(server):
    rows = fetch(ImageFetcher(), [server.url("/photo/astronaut.jpg"), f"http://[::1]:{server.port}/x.jpg",
                                  f"http://0.0.0.0:{server.port}/x.jpg"])
    assert [r[FETCH_STATUS] for r in rows] == [FetchStatus.REFUSED] * 3
    assert "127.0.0.1" in rows[0][FETCH_ERROR] and "::1" in rows[1][FETCH_ERROR]
    assert sum(server.hits.values()) == 0


@pytest.mark.parametrize("address", ["127.0.0.1", "169.254.169.254", "10.0.0.1", "::1", "::ffff:127.0.0.1",
                                     "100.64.1.1"])
def test_production_refuses_names_resolving_to_blocked_addresses(server, address):
    fetcher = ImageFetcher(resolver=lambda host: [address])
    row = one(fetcher, f"https://images.example.org:{server.port}/synthetic/0/000000001.jpg")
    assert row[FETCH_STATUS] == FetchStatus.REFUSED
    assert address in row[FETCH_ERROR] and "images.example.org" in row[FETCH_ERROR]
    assert sum(server.hits.values()) == 0


def test_production_refuses_when_any_resolved_address_is_blocked(server):
    fetcher = ImageFetcher(resolver=lambda host: ["8.8.8.8", "10.1.2.3"])
    row = one(fetcher, "http://mixed.example.org/x.jpg")
    assert row[FETCH_STATUS] == FetchStatus.REFUSED and "10.1.2.3" in row[FETCH_ERROR]


def test_allow_local_reaches_the_same_name(server):
    fetcher = local(resolver=lambda host: {"images.example.org": ["127.0.0.1"]}[host])
    row = one(fetcher, f"http://images.example.org:{server.port}/photo/coffee.jpg")
    assert row[FETCH_STATUS] == FetchStatus.OK
    assert fetcher.record["allow_local"] is True


@pytest.mark.parametrize(
    "target",
    ["http://169.254.169.254/latest/meta-data/", "http://internal.test/secret.jpg", "http://[::1]/x.jpg"],
)
def test_redirect_to_blocked_address_refused_at_second_hop(server, target):
    resolver = {"public.test": ["127.0.0.1"], "internal.test": ["10.0.0.1"]}.__getitem__
    fetcher = ImageFetcher(timeout=2, resolver=resolver, address_filter=only_local_server)
    # sanity: the first hop is allowed, and a redirect to an allowed address is followed
    ok = one(fetcher, f"http://public.test:{server.port}/redirect?to=/photo/coffee.jpg")
    assert ok[FETCH_STATUS] == FetchStatus.OK
    row = one(fetcher, f"http://public.test:{server.port}/redirect?to={target}")
    assert row[FETCH_STATUS] == FetchStatus.REFUSED, row[FETCH_ERROR]
    assert server.hits["/redirect"] == 2
    assert ("10.0.0.1" if "internal" in target else target.split("/")[2].strip("[]")) in row[FETCH_ERROR]


@pytest.mark.parametrize("target", ["file:///etc/passwd", "FILE:/etc/hostname", "data:image/png;base64,iVBORw0KGgo=",
                                    "gopher://127.0.0.1:70/_x", "ftp://127.0.0.1/x.jpg", "dict://127.0.0.1:11211/",
                                    "javascript:alert(1)"])
def test_redirect_to_other_schemes_is_refused(server, target):
    for fetcher in (local(), ImageFetcher(timeout=2, address_filter=only_local_server)):
        row = one(fetcher, server.url("/redirect?to=" + quote(target, safe="")))
        assert row[FETCH_STATUS] == FetchStatus.REFUSED, row[FETCH_ERROR]
        assert "non-http(s)" in row[FETCH_ERROR] and row[HTTP_STATUS] is None
    assert server.hits["/redirect"] == 2


def test_redirect_to_userinfo_url_is_invalid_and_never_resolved(server):
    resolve, asked = recording_resolver({"images.example.org": ["127.0.0.1"]})
    target = f"http://user:pw@images.example.org:{server.port}/photo/coffee.jpg"
    for userinfo in ("user:pw@", "user@"):
        row = one(local(resolver=resolve), server.url("/redirect?to=" + quote(target.replace("user:pw@", userinfo), safe="")))
        assert row[FETCH_STATUS] == FetchStatus.INVALID_URL and "userinfo" in row[FETCH_ERROR], row[FETCH_ERROR]
    assert asked == [] and server.hits["/photo/coffee.jpg"] == 0


def test_redirect_limits(server):
    fetcher = local()
    url = server.url("/photo/chelsea.jpg")
    for _ in range(7):  # seven nested redirects: over the limit of five
        url = server.url("/redirect?to=") + url.replace("%", "%25").replace("?", "%3F").replace("=", "%3D").replace("&", "%26")
    deep = one(fetcher, url)
    assert deep[FETCH_STATUS] == FetchStatus.HTTP_ERROR and deep[HTTP_STATUS] == 302
    assert server.hits["/photo/chelsea.jpg"] == 0


def test_connects_to_the_checked_address_without_a_second_lookup(server):
    calls = []

    def rebinding(host):  # first answer passes the check, later answers would not
        calls.append(host)
        return ["127.0.0.1"] if len(calls) == 1 else ["10.0.0.1"]

    fetcher = ImageFetcher(timeout=2, resolver=rebinding, address_filter=only_local_server)
    row = one(fetcher, f"http://rebind.test:{server.port}/photo/camera.jpg")
    assert row[FETCH_STATUS] == FetchStatus.OK
    assert calls == ["rebind.test"]


# --- HTTPS: certificate and SNI checked against the URL's hostname --------------------------------
@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("openssl command not available to make a test CA")
    d = tmp_path_factory.mktemp("tls")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    (d / "leaf.ext").write_text(
        "subjectAltName=DNS:images.example.org\nbasicConstraints=CA:FALSE\n"
        "keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n"
    )
    cmds = [
        ["openssl", "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=t2i test CA",
         "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
        ["openssl", "req", "-new", *ec, "-keyout", "leaf.key", "-out", "leaf.csr", "-subj", "/CN=images.example.org"],
        ["openssl", "x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
         "-out", "leaf.pem", "-days", "2", "-extfile", "leaf.ext"],
    ]
    for cmd in cmds:
        subprocess.run(cmd, cwd=d, check=True, capture_output=True)
    return d


def test_https_verifies_certificate_and_sni_against_url_hostname(tls_files):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tls_files / "leaf.pem", tls_files / "leaf.key")
    sni = []
    ctx.sni_callback = lambda sock, name, context: sni.append(name)
    resolver = {"images.example.org": ["127.0.0.1"], "other.example.org": ["127.0.0.1"]}.__getitem__
    with LocalImageServer(ssl_context=ctx) as srv:
        path = f":{srv.port}/photo/astronaut.jpg"
        trusted = local(resolver=resolver, ca_file=str(tls_files / "ca.pem"))
        ok = one(trusted, "https://images.example.org" + path)
        assert ok[FETCH_STATUS] == FetchStatus.OK, ok[FETCH_ERROR]
        assert "images.example.org" in sni
        wrong_name = one(trusted, "https://other.example.org" + path)  # same address, other hostname
        assert wrong_name[FETCH_STATUS] == FetchStatus.NETWORK_ERROR and "TLS" in wrong_name[FETCH_ERROR]
        system_trust = one(local(resolver=resolver), "https://images.example.org" + path)
        assert system_trust[FETCH_STATUS] == FetchStatus.NETWORK_ERROR and "TLS" in system_trust[FETCH_ERROR]
        refused = one(ImageFetcher(resolver=resolver, ca_file=str(tls_files / "ca.pem")), "https://images.example.org" + path)
        assert refused[FETCH_STATUS] == FetchStatus.REFUSED
        assert srv.hits["/photo/astronaut.jpg"] == 1


# --- record ----------------------------------------------------------------------------------------
def test_record_states_limits_policy_and_versions():
    f = ImageFetcher(timeout=3, retries=2, max_bytes=1234, image_size=384, resize_mode="center_crop")
    r = f.record
    assert r["img2dataset"] == importlib.metadata.version("img2dataset")
    assert (r["timeout_s"], r["retries"], r["max_bytes"], r["allow_local"]) == (3.0, 2, 1234, False)
    assert r["resize"]["image_size"] == 384 and r["resize"]["resize_mode"] == "center_crop"
    assert "noai" in r["disallowed_header_directives"] and "t2i-bias-audit" in r["user_agent"]
    assert f.resources.batch_size == 256 and f.stage_name == "fetch"
    with pytest.raises(ValueError):
        ImageFetcher(resize_mode="stretch")

"""The HTTP client for untrusted dataset URLs (paper 002's training images): which addresses a
production fetch may connect to, and connections that resolve a host once, check every address
and connect to the very address they checked (no second DNS lookup, so DNS rebinding cannot swap
in another), for plain and TLS connections and every redirect hop, with no proxy and at most
MAX_REDIRECTS redirects; and the URL checks and normalisation. ``operators.image_fetch`` builds
its downloads on it."""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
import sys
import urllib.request
from collections.abc import Callable
from urllib.parse import quote, unquote, urljoin, urlsplit, urlunsplit

from schemas.images import FetchStatus

MAX_REDIRECTS = 5

# --- which addresses a production fetch may connect to ---------------------------------------------
_BLOCKED_NETWORKS = tuple(
    ipaddress.ip_network(n)
    for n in (
        "0.0.0.0/8",          # "this network", incl. 0.0.0.0
        "10.0.0.0/8",
        "100.64.0.0/10",      # carrier-grade NAT (also Alibaba's metadata 100.100.100.200)
        "127.0.0.0/8",
        "169.254.0.0/16",     # link-local, incl. the cloud metadata 169.254.169.254
        "172.16.0.0/12",
        "192.0.0.0/24",       # IETF protocol assignments (Oracle's metadata 192.0.0.192)
        "192.168.0.0/16",
        "198.18.0.0/15",      # benchmarking
        "224.0.0.0/4",        # multicast
        "240.0.0.0/4",        # reserved, incl. broadcast
        "::/128",
        "::1/128",
        "fc00::/7",           # unique local (AWS metadata fd00:ec2::254)
        "fe80::/10",          # link-local
        "fec0::/10",          # site-local (deprecated)
        "ff00::/8",           # multicast
    )
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")        # IPv4 embedded in the low 32 bits
_V4_COMPATIBLE = ipaddress.ip_network("::/96")       # deprecated IPv4-compatible IPv6
# Tunnels whose relay delivers to an embedded IPv4 address (Python calls 6to4 global):
# 6to4 (RFC 3056) carries it in bits 16-48; Teredo (RFC 4380) its server in bits 32-64 and the
# client in the last 32 bits, XOR 0xffffffff. ipaddress's ``sixtofour`` and ``teredo`` decode both.


def embedded_ipv4(addr: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries (mapped, NAT64, IPv4-compatible, 6to4, Teredo)."""
    if addr.ipv4_mapped is not None:
        return [addr.ipv4_mapped]
    if addr in _NAT64 or (addr in _V4_COMPATIBLE and int(addr) > 1):
        return [ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)]
    if addr.sixtofour is not None:
        return [addr.sixtofour]
    if addr.teredo is not None:
        return list(addr.teredo)  # (server, client)
    return []


def is_blocked_address(ip: str) -> bool:
    """True when ``ip`` must not be connected to by a production fetch.

    Blocked: the networks in ``_BLOCKED_NETWORKS`` (loopback, RFC 1918 private, link-local and
    metadata, carrier NAT, unspecified, multicast, reserved), anything else Python does not
    consider globally routable (documentation and benchmark ranges...), and IPv6 forms that
    carry such an IPv4 address (IPv4-mapped ``::ffff:a.b.c.d``, NAT64, IPv4-compatible, and the
    6to4 and Teredo tunnels, :func:`embedded_ipv4`). A string that is not an IP address is blocked too.
    """
    try:
        addr = ipaddress.ip_address(str(ip).split("%", 1)[0].strip("[]"))
    except ValueError:
        return True
    if addr.version == 6:
        embedded = embedded_ipv4(addr)
        if embedded and addr.sixtofour is None and addr.teredo is None:
            return is_blocked_address(str(embedded[0]))  # mapped, NAT64, compatible: the IPv4 decides
        if any(is_blocked_address(str(a)) for a in embedded):  # tunnels: and the IPv6 checks below
            return True
    if any(addr in net for net in _BLOCKED_NETWORKS if net.version == addr.version):
        return True
    return not addr.is_global or addr.is_multicast or addr.is_reserved


def public_address(ip: str) -> bool:
    """The default ``address_filter``: True when a production fetch may connect to ``ip``."""
    return not is_blocked_address(ip)


def resolve_host(host: str) -> list[str]:
    """The default resolver: every address ``host`` resolves to (system resolver), in order."""
    infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _dns_name(host: str) -> str:
    """``host`` without the one trailing dot of a fully qualified name (``localhost.`` is
    ``localhost``, ``127.0.0.1.`` the literal ``127.0.0.1``), so it is checked as what it names."""
    return host[:-1] if host.endswith(".") and not host.endswith("..") else host


def _ip_literal(host: str) -> str | None:
    """``host`` if it is an IP address literal (brackets stripped, IPv6 scope kept), else None."""
    host = host.strip("[]")
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None
    return host



# --- guarded connections -------------------------------------------------------------------------
class AddressRefused(Exception):
    """A connection to a blocked address was about to be made. Not an OSError, so urllib lets it through."""

    def __init__(self, host: str, address: str):
        where = "" if host == address else f"{host} resolves to "
        try:
            inner = ipaddress.ip_address(address.split("%", 1)[0])
            carried = embedded_ipv4(inner) if inner.version == 6 else []
        except ValueError:
            carried = []
        via = f" (carries {', '.join(map(str, carried))})" if carried else ""
        super().__init__(f"{where}blocked address {address}{via}")
        self.host, self.address = host, address


class RedirectRefused(Exception):
    """A redirect that is not followed: to a scheme other than http(s) (``refused``), or to a URL
    :func:`check_url` rejects, e.g. one with userinfo (``invalid_url``)."""

    def __init__(self, message: str, status: str = FetchStatus.REFUSED):
        super().__init__(message)
        self.status = status


class _ConnectGuard:
    """Resolves a host once, checks every address, and connects to a checked address."""

    def __init__(self, resolver: Callable[[str], list[str]], address_filter: Callable[[str], bool] | None):
        self.resolver = resolver
        self.address_filter = address_filter  # None: everything allowed (allow_local)

    def connect(self, host: str, port: int, timeout, source_address) -> socket.socket:
        host = _dns_name(host)
        literal = _ip_literal(host)
        addresses = [literal] if literal is not None else [str(a) for a in self.resolver(host)]
        if not addresses:
            raise socket.gaierror(socket.EAI_NONAME, f"no address for {host!r}")
        if self.address_filter is not None:
            for a in addresses:
                if not self.address_filter(a):
                    raise AddressRefused(host, a)
        last: OSError | None = None
        for a in addresses:
            family = socket.AF_INET6 if ":" in a else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                if isinstance(timeout, (int, float)):
                    sock.settimeout(timeout)
                if source_address:
                    sock.bind(source_address)
                sock.connect((a, port))
                return sock
            except OSError as exc:
                sock.close()
                last = exc
        raise last


class GuardedHTTPConnection(http.client.HTTPConnection):
    """HTTPConnection whose ``connect`` goes through a :class:`_ConnectGuard` (set as ``_guard``)."""

    _guard: _ConnectGuard

    def connect(self):
        sys.audit("http.client.connect", self, self.host, self.port)
        self.sock = self._guard.connect(self.host, self.port, self.timeout, self.source_address)
        try:
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass


class GuardedHTTPSConnection(http.client.HTTPSConnection, GuardedHTTPConnection):
    """HTTPS over a guarded socket: HTTPSConnection.connect's ``super().connect()`` is the guarded
    one (method order), then it wraps the socket with SNI and certificate checks for ``self.host``."""


def _connection_factory(cls, guard: _ConnectGuard):
    def make(host, **kwargs):
        conn = cls(host, **kwargs)
        conn._guard = guard
        return conn
    return make


class _GuardedHTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, guard: _ConnectGuard):
        super().__init__()
        self._make = _connection_factory(GuardedHTTPConnection, guard)

    def http_open(self, req):
        return self.do_open(self._make, req)


class _GuardedHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, guard: _ConnectGuard, context: ssl.SSLContext):
        super().__init__(context=context)
        self._tls_context = context
        self._make = _connection_factory(GuardedHTTPSConnection, guard)

    def https_open(self, req):
        return self.do_open(self._make, req, context=self._tls_context)


class _RedirectHandler(urllib.request.HTTPRedirectHandler):
    max_redirections = MAX_REDIRECTS

    def http_error_302(self, req, fp, code, msg, headers):
        # Checked here, before urllib's own test (which answers file:, data:, gopher: with an
        # HTTPError, i.e. "http_error") and before the Request is built (whose host would keep a
        # userinfo "user@" and go to DNS as a name).
        location = headers.get("location") or headers.get("uri")
        if location is not None:
            self._check(fp, urljoin(req.full_url, location.strip()))
        return super().http_error_302(req, fp, code, msg, headers)

    http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        self._check(fp, newurl)
        return super().redirect_request(req, fp, code, msg, headers, newurl)

    @staticmethod
    def _check(fp, newurl: str) -> None:
        problem = check_url(newurl)
        if problem is None:
            return
        fp.close()
        if newurl.partition(":")[0].strip().lower() not in ("http", "https"):  # file:, data:, gopher:, ftp:...
            raise RedirectRefused(f"redirect to a non-http(s) URL: {newurl[:200]}")
        raise RedirectRefused(f"redirect to an invalid URL ({problem}): {newurl[:200]}", FetchStatus.INVALID_URL)


def build_opener(guard: _ConnectGuard, tls: ssl.SSLContext | None = None) -> urllib.request.OpenerDirector:
    """An opener that speaks only guarded http(s), follows at most MAX_REDIRECTS redirects and uses
    no proxy. ``tls``: the client context (default: system trust store, hostname checked)."""
    opener = urllib.request.OpenerDirector()
    for handler in (
        _GuardedHTTPHandler(guard),
        _GuardedHTTPSHandler(guard, tls or ssl.create_default_context()),
        _RedirectHandler(),
        urllib.request.HTTPDefaultErrorHandler(),
        urllib.request.HTTPErrorProcessor(),
        urllib.request.UnknownHandler(),
    ):
        opener.add_handler(handler)
    return opener


_URL_SAFE = "!#$%&'()*+,/:;=?@[]~"  # kept as they are by normalize_url (with letters, digits, -._)


def ascii_host(host: str) -> str:
    """An internationalized host name in its ASCII form (IDNA, as browsers send it: ``bücher.de``
    is ``xn--bcher-kva.de``); an ASCII host as it is. Raises UnicodeError for a name IDNA refuses."""
    if host.isascii():
        return host
    return host.encode("idna").decode("ascii")


def normalize_url(url: str) -> str:
    """``url`` stripped, with spaces and non-ASCII characters of its path and query percent-encoded
    as UTF-8 (what browsers send; existing escapes are kept), and a non-ASCII host name in its
    ASCII (IDNA) form."""
    parts = urlsplit(url.strip())
    netloc = parts.netloc
    if not netloc.isascii():
        netloc = ascii_host(parts.hostname or "") + (f":{parts.port}" if parts.port is not None else "")
    return urlunsplit((parts.scheme, netloc, quote(parts.path, safe=_URL_SAFE),
                       quote(parts.query, safe=_URL_SAFE), quote(parts.fragment, safe=_URL_SAFE)))


def check_url(url) -> str | None:
    """Why ``url`` cannot be fetched (``None`` if it can): null, not a string, control characters,
    not http(s), userinfo (``user[:password]@``: urllib would send it to DNS as part of the host
    name, and no image URL needs credentials), no host, a percent-encoded host name
    (:func:`percent_encoded_host`), a host IDNA refuses, bad port."""
    if url is None:
        return "null URL"
    if not isinstance(url, str):
        return f"URL is not a string ({type(url).__name__})"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in url.strip()):
        return "URL contains control characters"
    try:
        parts = urlsplit(url.strip())
        parts.port  # noqa: B018 -- raises ValueError on a bad port
    except ValueError as exc:
        return f"malformed URL: {exc}"
    if parts.scheme.lower() not in ("http", "https"):
        return f"not an http(s) URL (scheme {parts.scheme!r})" if parts.scheme else "not an http(s) URL"
    if "@" in parts.netloc:
        return "URL has userinfo (user@host)"
    if not parts.hostname:
        return "URL has no host"
    if "%" in parts.hostname and _ip_literal(parts.hostname) is None:   # (an IPv6 zone id is "%25" + its name)
        return percent_encoded_host(parts.hostname)
    try:
        ascii_host(parts.hostname)
    except UnicodeError as exc:
        return f"host {parts.hostname!r} is not a valid internationalized domain name ({exc})"
    return None


def percent_encoded_host(host: str) -> str:
    """Why a percent-encoded host name is not fetched. urllib would decode it and send the result
    to DNS (``%E2%93%9Bocalhost`` is ``ⓛocalhost``, which IDNA maps to ``localhost``): a look-alike
    that no image URL needs, so it is refused as it is, before any lookup or connection."""
    decoded = unquote(host, errors="replace")
    try:
        mapped = ascii_host(decoded).lower()
    except UnicodeError:
        mapped = None
    maps = f", which IDNA maps to {mapped!r}" if mapped is not None and mapped != decoded else ""
    return (f"invalid host name {host!r}: percent-encoded (it decodes to {decoded!r}{maps}); refused, not looked "
            f"up")

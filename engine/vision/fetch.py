"""Image and video sources a request may name: `data:` URLs decoded in place, and https URLs fetched under a strict policy.

Why strict: the server runs on a private network beside other machines (the other ranks, routers, a cloud metadata
service at 169.254.169.254). A URL in a request makes the server open a connection on the requester's behalf, so an
unguarded fetch would let anyone who can send a request probe and read services only the server can reach (SSRF).
The rules, each breach refused with a `SourceError` whose one-line message says what was wrong:

- https only, with a host; no user name or password in the URL; any port (443 when none is given).
- The host is resolved once, and every address it resolves to must pass the policy (by default `is_public_address`:
  globally routable unicast only, whatever form the address is written in). The connection then goes to the first
  of those checked addresses itself, never to the name, so a second DNS answer cannot swap in a private address
  between the check and the connection (DNS rebinding). TLS still names and checks the host: SNI and the
  certificate are those of the name in the URL, verified against the system's trusted roots.
- No redirects (a redirect could point anywhere, including inside the network); any status but 200 is refused.
- The response must say it is of the kind asked for (`Content-Type: image/*`, or `video/*` for a video part) and stay within the byte cap: a declared length
  over the cap is refused before reading, and the body is read in pieces and refused as soon as it passes the cap
  (a server may lie about the length or leave it out).
- Time is bounded: `timeout_s` for the name lookup, for the connection and for each read, and `2 * timeout_s` for
  the whole exchange, enforced by a timer that shuts the connection down, so a server dripping a byte at a time
  cannot hold a worker.

The fetch is synchronous (the server calls it from a worker thread) and uses the standard library alone.
"""

from __future__ import annotations

import base64
import binascii
import concurrent.futures
import functools
import http.client
import ipaddress
import re
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

USER_AGENT = "glm-sparks-engine"
_READ_PIECE = 64 * 1024  # bytes asked of the socket per read of the body
_SHOWN_URL = 200  # characters of a URL quoted in an error message
# media types of each kind a request may send (lowercase), and how messages name one of that kind
MEDIA_TYPES = {
    "image": re.compile(r"image/[a-z0-9][a-z0-9!#$&^_.+-]*"),
    "video": re.compile(r"video/[a-z0-9][a-z0-9!#$&^_.+-]*"),
}
ARTICLES = {"image": "an image", "video": "a video"}

# Addresses never fetched whatever the `ipaddress` module's tables say (they differ between Python versions).
_BLOCKED_V4 = tuple(
    ipaddress.IPv4Network(n)
    for n in (
        "0.0.0.0/8",  # "this network"
        "10.0.0.0/8",  # private (RFC 1918)
        "100.64.0.0/10",  # shared address space (carrier-grade NAT)
        "127.0.0.0/8",  # loopback
        "169.254.0.0/16",  # link-local, the cloud metadata service among them
        "172.16.0.0/12",  # private
        "192.0.0.0/24",  # IETF protocol assignments
        "192.0.2.0/24",  # documentation
        "192.88.99.0/24",  # 6to4 relay anycast (deprecated)
        "192.168.0.0/16",  # private
        "198.18.0.0/15",  # benchmarking
        "198.51.100.0/24",  # documentation
        "203.0.113.0/24",  # documentation
        "224.0.0.0/4",  # multicast
        "240.0.0.0/4",  # reserved, and the broadcast address
    )
)
_GLOBAL_UNICAST_V6 = ipaddress.IPv6Network("2000::/3")  # everything else in IPv6 is special-purpose or unassigned
_BLOCKED_V6 = tuple(
    ipaddress.IPv6Network(n)
    for n in (
        "2001::/23",  # IETF protocol assignments (Teredo 2001::/32 among them)
        "2001:db8::/32",  # documentation
        "3fff::/20",  # documentation
    )
)
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # well-known NAT64 prefix: an IPv4 address in the last 32 bits
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")  # local-use NAT64 prefixes


class SourceError(ValueError):
    """An image or video source the server refuses; str(exc) is a one-line message fit for an HTTP 400 body."""


def read_data_url(url: str, max_bytes: int, kind: str = "image") -> tuple[str, bytes]:
    """A `data:` URL's media type and decoded bytes. Only base64 data URLs of the kind's types (data:image/png;base64,
    ... for an image, data:video/mp4;base64,... for a video). Refuse (SourceError) other media types, non-base64, invalid base64, and decoded payloads over max_bytes
    (check the encoded length first so a huge string is refused before decoding: base64 length*3/4 > max_bytes+3)."""
    if url[:5].lower() != "data:":
        raise SourceError("not a data URL: it must start with 'data:'")
    header, comma, payload = url[5:].partition(",")
    if not comma:
        raise SourceError("data URL has no ',' before its data")
    params = [p.strip() for p in header.split(";")]
    media_type = params[0].lower()
    if not MEDIA_TYPES[kind].fullmatch(media_type):
        shown = _printable(params[0], 60) or "(none)"
        raise SourceError(
            f"data URL media type {shown} is not {ARTICLES[kind]} type: only {kind}/* data URLs are accepted"
        )
    if len(params) < 2 or params[-1].lower() != "base64":
        raise SourceError(f"data URL is not base64-encoded: only ';base64,' {kind} data URLs are accepted")
    if len(payload) * 3 / 4 > max_bytes + 3:
        raise SourceError(f"data URL {kind} is about {len(payload) * 3 // 4} bytes, over the {max_bytes} byte limit")
    try:
        data = base64.b64decode(payload.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError) as exc:
        raise SourceError(f"data URL data is not valid base64 ({_reason(exc)})") from None
    if len(data) > max_bytes:
        raise SourceError(f"data URL {kind} is {len(data)} bytes, over the {max_bytes} byte limit")
    if not data:
        raise SourceError(f"data URL {kind} is empty")
    return media_type, data


def is_public_address(address: str) -> bool:
    """False for loopback, private (RFC1918, fc00::/7), link-local (169.254/16, fe80::/10, incl. the cloud metadata
    address 169.254.169.254 and fd00:ec2::254), unspecified, multicast, reserved, shared (100.64/10), benchmarking,
    IPv4-mapped/-compatible IPv6 forms of any of these, 6to4/teredo wrapping a non-public v4, and anything
    `ipaddress` calls not global. True only for globally routable unicast addresses."""
    try:
        ip = ipaddress.ip_address(address.strip())
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.scope_id:  # a zone only means something for a local address
            return False
        embedded = _embedded_v4(ip)
        if embedded is not None:
            return _is_public_v4(embedded)
        if ip not in _GLOBAL_UNICAST_V6 or any(ip in net for net in _BLOCKED_V6):
            return False
        teredo = ip.teredo
        if teredo is not None and not all(_is_public_v4(v4) for v4 in teredo):
            return False
        sixtofour = ip.sixtofour
        if sixtofour is not None and not _is_public_v4(sixtofour):
            return False
        return _is_global(ip)
    return _is_public_v4(ip)


def _is_public_v4(ip: ipaddress.IPv4Address) -> bool:
    return not any(ip in net for net in _BLOCKED_V4) and _is_global(ip)


def _is_global(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    special = ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_multicast or ip.is_reserved
    return ip.is_global and not special and not ip.is_unspecified


def _embedded_v4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address stands for outright: IPv4-mapped (::ffff:a.b.c.d), IPv4-compatible
    (::a.b.c.d, which includes :: and ::1) or NAT64 (64:ff9b::a.b.c.d). 6to4 and Teredo are checked separately."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if int(ip) >> 32 == 0 or ip in _NAT64 or ip in _NAT64_LOCAL:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


@dataclass(frozen=True)
class FetchPolicy:
    max_bytes: int
    timeout_s: float = 10.0  # connect + each read; and a total deadline of 2*timeout_s for the whole body
    allow_address: Callable[[str], bool] = is_public_address  # tests pass a looser rule to reach 127.0.0.1
    ssl_context: ssl.SSLContext | None = None  # None: ssl.create_default_context(); tests pass one trusting their CA


def fetch_image(url: str, policy: FetchPolicy, kind: str = "image") -> tuple[str, bytes]:
    """GET an https URL of an image (or a video, `kind`): media type and body bytes."""
    shown = f"{kind} URL {_shown_url(url)}"
    host, port, target = _parse(url, shown)
    address = _resolve(host, port, shown, policy.allow_address, policy.timeout_s)
    context = policy.ssl_context if policy.ssl_context is not None else _default_context()
    deadline = _Deadline(2 * policy.timeout_s)
    conn = _PinnedHTTPSConnection(host, port, address, policy.timeout_s, context, deadline)
    try:
        return _exchange(conn, target, shown, policy, deadline, kind)
    except SourceError:
        raise
    except Exception as exc:  # every other failure becomes a one-line refusal; nothing raw leaves
        raise _failure(exc, shown, address, port, policy.timeout_s, deadline, conn.sock is not None) from None
    finally:
        conn.close()
        deadline.close()


def _parse(url: str, shown: str) -> tuple[str, int, str]:
    """(host in ASCII, port, request target) of an https URL, or SourceError."""
    if any(ord(c) <= 0x20 or ord(c) == 0x7F for c in url):
        raise SourceError(f"{shown} contains spaces or control characters")
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise SourceError(f"{shown} is not a valid URL ({_reason(exc)})") from None
    if parts.scheme.lower() != "https":
        raise SourceError(f"{shown} is not https: only https URLs are fetched")
    if "@" in parts.netloc:
        raise SourceError(f"{shown} carries a user name or password: credentials in URLs are refused")
    host = parts.hostname
    if not host:
        raise SourceError(f"{shown} has no host")
    if port == 0:
        raise SourceError(f"{shown} has an invalid port 0")
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError:
            raise SourceError(f"{shown} has a host name that cannot be encoded (IDNA)") from None
    path = urllib.parse.quote(parts.path or "/", safe="!$%&'()*+,/:;=@[]~")
    query = urllib.parse.quote(parts.query, safe="!$%&'()*+,/:;=?@[]~")
    return host, port or 443, path + ("?" + query if query else "")


# Name lookups run here, so a slow resolver cannot hold a request past its time limit (getaddrinfo takes none): the
# request gives up after timeout_s; the lookup's thread is freed when the resolver answers or gives up itself.
_LOOKUPS = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="image-dns")


def _resolve(host: str, port: int, shown: str, allow: Callable[[str], bool], timeout_s: float) -> str:
    """Resolve the host once, within timeout_s; every address must pass `allow`. The first address, to connect
    to."""
    try:
        literal: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is not None and not allow(str(literal)):  # refused before any resolver is asked
        raise _not_public(shown, str(literal))
    lookup = _LOOKUPS.submit(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    try:
        infos = lookup.result(timeout=timeout_s)
    except concurrent.futures.TimeoutError:
        raise SourceError(f"{shown}: the host {host} did not resolve within {timeout_s:g} s") from None
    except (OSError, UnicodeError) as exc:
        raise SourceError(f"{shown}: the host {host} does not resolve ({_reason(exc)})") from None
    addresses = [str(info[4][0]) for info in infos if info[0] in (socket.AF_INET, socket.AF_INET6)]
    if not addresses:
        raise SourceError(f"{shown}: the host {host} resolves to no IPv4 or IPv6 address")
    for address in addresses:
        if not allow(address):
            raise _not_public(shown, address)
    return addresses[0]


def _not_public(shown: str, address: str) -> SourceError:
    return SourceError(f"{shown} resolves to {address}, a private or local address: only public addresses are fetched")


@functools.lru_cache(maxsize=1)
def _default_context() -> ssl.SSLContext:
    return ssl.create_default_context()


class _Deadline:
    """The whole exchange's time limit. Once armed on a connected socket, a timer shuts that connection down when
    time runs out, which wakes any read in progress however the server paces its bytes."""

    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds
        self.expired = False
        self._lock = threading.Lock()
        self._watched: socket.socket | None = None
        self._timer: threading.Timer | None = None
        self._closed = False

    def remaining(self) -> float:
        return self.at - time.monotonic()

    def arm(self, sock: socket.socket) -> None:
        """Watch a connected TCP socket (a duplicate of its descriptor, kept apart from the TLS layer above it)."""
        with self._lock:
            if self._closed:
                return
            self._watched = sock.dup()
            self._timer = threading.Timer(max(0.0, self.remaining()), self._expire)
            self._timer.daemon = True
            self._timer.start()

    def _expire(self) -> None:
        with self._lock:
            if self._closed:
                return
            self.expired = True
            if self._watched is not None:
                try:
                    self._watched.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
            if self._watched is not None:
                self._watched.close()
                self._watched = None


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """HTTPS to a host name over a TCP connection to one address chosen beforehand (never resolved again); TLS
    sends the host name (SNI) and checks the certificate against it."""

    def __init__(
        self, host: str, port: int, address: str, timeout: float, context: ssl.SSLContext, deadline: _Deadline
    ) -> None:
        super().__init__(host, port, timeout=timeout, context=context)
        self._address = address
        self._tls = context
        self._deadline = deadline

    def connect(self) -> None:
        raw = socket.create_connection((self._address, self.port), self.timeout)
        try:
            self._deadline.arm(raw)
            self.sock = self._tls.wrap_socket(raw, server_hostname=self.host)
        except BaseException:
            raw.close()
            raise


def _exchange(
    conn: _PinnedHTTPSConnection, target: str, shown: str, policy: FetchPolicy, deadline: _Deadline, kind: str
) -> tuple[str, bytes]:
    conn.request("GET", target, headers={"User-Agent": USER_AGENT, "Accept": f"{kind}/*"})
    _bound_next_read(conn, policy.timeout_s, deadline)
    response = conn.getresponse()
    if deadline.expired:  # the timer cut the connection while the headers came in: they may be cut short
        raise TimeoutError("deadline")
    status, reason = response.status, _printable(response.reason or "", 60)
    if 300 <= status < 400:
        raise SourceError(f"{shown} answered HTTP status {status} {reason} (a redirect): redirects are not followed")
    if status != 200:
        raise SourceError(f"{shown} answered HTTP status {status} {reason}: only 200 is accepted")
    raw_type = response.getheader("Content-Type") or ""
    media_type = raw_type.split(";", 1)[0].strip().lower()
    if not MEDIA_TYPES[kind].fullmatch(media_type):
        shown_type = _printable(raw_type, 60) or "(none)"
        raise SourceError(f"{shown} has content type {shown_type}, not {ARTICLES[kind]} type ({kind}/*)")
    encoding = (response.getheader("Content-Encoding") or "identity").strip().lower()
    if encoding != "identity":
        raise SourceError(f"{shown} sent a {_printable(encoding, 30)}-encoded body: only plain bodies are accepted")
    declared = _content_length(response.getheader("Content-Length"), shown)
    if declared is not None and declared > policy.max_bytes:
        raise SourceError(f"{shown} is {declared} bytes, over the {policy.max_bytes} byte limit")
    pieces: list[bytes] = []
    received = 0
    while True:
        _bound_next_read(conn, policy.timeout_s, deadline)
        piece = response.read1(min(_READ_PIECE, policy.max_bytes + 1 - received))
        if not piece:
            break
        pieces.append(piece)
        received += len(piece)
        if received > policy.max_bytes:
            raise SourceError(f"{shown} sent more than the {policy.max_bytes} byte limit")
    if deadline.expired:  # the timer cut the connection: what arrived may be only part of the body
        raise TimeoutError("deadline")
    if declared is not None and received != declared:
        raise SourceError(f"{shown} ended after {received} of the {declared} bytes it announced")
    if not received:
        raise SourceError(f"{shown} sent an empty body")
    return media_type, b"".join(pieces)


def _bound_next_read(conn: http.client.HTTPConnection, timeout_s: float, deadline: _Deadline) -> None:
    """The next read waits at most timeout_s, and not past the deadline."""
    remaining = deadline.remaining()
    if remaining <= 0:
        raise TimeoutError("deadline")
    if conn.sock is not None:
        conn.sock.settimeout(min(timeout_s, remaining))


def _content_length(value: str | None, shown: str) -> int | None:
    if value is None:
        return None
    text = value.strip()
    if not text.isdigit() or not text.isascii():
        raise SourceError(f"{shown} sent an invalid Content-Length {_printable(value, 30)}")
    return int(text)


def _failure(
    exc: Exception, shown: str, address: str, port: int, timeout_s: float, deadline: _Deadline, connected: bool
) -> SourceError:
    """The one-line refusal for an exception raised while connecting, handshaking or reading (`connected`: the
    TLS connection was up)."""
    if deadline.expired or isinstance(exc, TimeoutError):
        return SourceError(
            f"{shown} timed out (limits: {timeout_s:g} s to connect and per read, {2 * timeout_s:g} s in all)"
        )
    if isinstance(exc, ssl.SSLCertVerificationError):
        why = exc.verify_message or _reason(exc)
        return SourceError(f"{shown}: the server's TLS certificate was refused ({why})")
    if isinstance(exc, ssl.SSLError):
        stage = "connection" if connected else "handshake"
        return SourceError(f"{shown}: the TLS {stage} failed ({_reason(exc)})")
    if isinstance(exc, http.client.HTTPException):
        return SourceError(f"{shown}: the server sent an invalid HTTP response ({_reason(exc)})")
    if isinstance(exc, OSError) and connected:
        return SourceError(f"{shown}: the connection to {address} port {port} failed ({_reason(exc)})")
    if isinstance(exc, OSError):
        return SourceError(f"{shown}: could not connect to {address} port {port} ({_reason(exc)})")
    return SourceError(f"{shown} could not be fetched ({_reason(exc)})")


def _shown_url(url: str) -> str:
    """The URL as error messages quote it: any user name and password masked, cut to a readable length."""
    scheme, sep, rest = url.partition("://")
    if sep:
        authority_end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
        authority = rest[:authority_end]
        if "@" in authority:
            url = f"{scheme}://***@{authority.rpartition('@')[2]}{rest[authority_end:]}"
    return _printable(url, _SHOWN_URL)


def _reason(exc: BaseException) -> str:
    """An exception as a short single line."""
    text = " ".join(str(exc).split())
    return _printable(text, 200) or type(exc).__name__


def _printable(text: str, limit: int) -> str:
    """Text safe to quote in a one-line message: non-printable characters replaced, long text cut."""
    clean = "".join(c if c.isprintable() else "?" for c in text)
    return clean if len(clean) <= limit else clean[: limit - 3] + "..."

"""engine/vision/fetch.py: which addresses count as public, `data:` URLs, and https image fetches against a local
HTTPS server on 127.0.0.1 with a certificate made here.

Nothing here leaves the machine: host names are resolved by a stand-in (`_no_dns`, on for every test) that knows
only "localhost" and IP literals and fails the test on any other name, so no DNS server is ever asked; every
connection goes to 127.0.0.1.
"""

from __future__ import annotations

import base64
import http.server
import shutil
import socket
import socketserver
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from engine.vision.fetch import FetchPolicy, SourceError, fetch_image, is_public_address, read_data_url

pytestmark = pytest.mark.timeout(60)

PNG = bytes.fromhex("89504e470d0a1a0a0000000d49484452") + bytes(range(256)) * 4  # a PNG signature, then filler
CAP = 4096  # the byte cap of the client policies here
BIG = CAP * 4
SHORT_TIMEOUT = 0.5  # the slow routes' client timeout: 0.5 s per read, 1 s in all
SLOW = 3.0  # how long the slow routes stall (cut short when the server stops)


# ---------------------------------------------------------------------------------------------- public addresses


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.255.0.9",
        "::1",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",
        "100.64.0.1",
        "0.0.0.0",
        "::",
        "224.0.0.1",
        "255.255.255.255",
        "240.0.0.1",
        "198.18.0.1",
        "192.0.2.1",
        "fe80::1",
        "fe80::1%eth0",
        "fc00::1",
        "fd00:ec2::254",
        "ff02::1",
        "2001:db8::1",
        "::ffff:127.0.0.1",
        "::ffff:10.0.0.1",
        "::ffff:169.254.169.254",
        "::10.0.0.1",
        "64:ff9b::a00:1",
        "2002:0a00:0001::",
        "2002:a9fe:a9fe::1",
        "2001:0:4136:e378:8000:63bf:f5ff:fffe",
        "not an address",
        "",
    ],
)
def test_not_public(address: str) -> None:
    assert is_public_address(address) is False


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8"])
def test_public(address: str) -> None:
    assert is_public_address(address) is True


# ---------------------------------------------------------------------------------------------- data: URLs


def _data_url(media_type: str, data: bytes) -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def test_data_url_round_trip() -> None:
    assert read_data_url(_data_url("image/png", PNG), CAP) == ("image/png", PNG)
    assert read_data_url(_data_url("IMAGE/JPEG", b"\xff\xd8\xff"), CAP) == ("image/jpeg", b"\xff\xd8\xff")


@pytest.mark.parametrize(
    ("url", "why"),
    [
        (_data_url("text/plain", b"hello"), "not an image type"),
        (_data_url("application/octet-stream", PNG), "not an image type"),
        ("data:;base64,aGVsbG8=", "not an image type"),
        ("data:image/png," + "x" * 20, "not base64"),
        ("data:image/png;charset=utf-8,abcd", "not base64"),
        ("data:image/png;base64,iVBORw0KGgo*!!", "not valid base64"),
        ("data:image/png;base64,iVBORw0KGgo", "not valid base64"),  # bad padding
        ("data:image/png;base64,aGVs\nbG8=", "not valid base64"),
        ("data:image/png;base64,", "empty"),
        ("data:image/png;base64", "no ','"),
        ("https://example.com/x.png", "not a data URL"),
        (_data_url("image/png", bytes(CAP + 1)), "byte limit"),
        ("data:image/png;base64," + "A" * (10 * CAP), "byte limit"),  # refused on its length alone
    ],
)
def test_data_url_refused(url: str, why: str) -> None:
    with pytest.raises(SourceError, match=why):
        read_data_url(url, CAP)


def test_data_urls_of_videos() -> None:
    assert read_data_url(_data_url("video/mp4", b"mp4!"), CAP, "video") == ("video/mp4", b"mp4!")
    with pytest.raises(SourceError, match="is not a video type: only video/"):
        read_data_url(_data_url("image/png", PNG), CAP, "video")
    with pytest.raises(SourceError, match="data URL video is empty"):
        read_data_url("data:video/webm;base64,", CAP, "video")


def test_data_url_at_the_cap() -> None:
    assert read_data_url(_data_url("image/png", bytes(CAP)), CAP) == ("image/png", bytes(CAP))


# ---------------------------------------------------------------------------------------------- certificates


@dataclass(frozen=True)
class Certs:
    ca: Path  # the test CA the client trusts
    localhost: tuple[Path, Path]  # (certificate, key) for "localhost" and IP 127.0.0.1, signed by the CA
    otherhost: tuple[Path, Path]  # (certificate, key) for "otherhost" only, signed by the CA


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    folder = tmp_path_factory.mktemp("certs")
    try:
        import cryptography  # noqa: F401
    except ImportError:
        if shutil.which("openssl") is None:
            pytest.skip("neither the cryptography package nor the openssl command is here to make test certificates")
        return _certs_by_openssl(folder)
    return _certs_by_cryptography(folder)


def _certs_by_cryptography(folder: Path) -> Certs:
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def name(common_name: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])

    def usage(sign_certs: bool) -> x509.KeyUsage:
        return x509.KeyUsage(
            digital_signature=not sign_certs,
            content_commitment=False,
            key_encipherment=False,
            data_encipherment=False,
            key_agreement=False,
            key_cert_sign=sign_certs,
            crl_sign=sign_certs,
            encipher_only=False,
            decipher_only=False,
        )

    def builder(subject: str, key: Any, issuer: str) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(name(subject))
            .issuer_name(name(issuer))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        )

    def write(cert: x509.Certificate, key: Any, stem: str) -> tuple[Path, Path]:
        (folder / f"{stem}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (folder / f"{stem}.key").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        return folder / f"{stem}.pem", folder / f"{stem}.key"

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        builder("fetch test CA", ca_key, "fetch test CA")
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(usage(sign_certs=True), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    ca_path, _ = write(ca_cert, ca_key, "ca")
    leaves = {}
    for stem, names in (
        ("localhost", [x509.DNSName("localhost"), x509.IPAddress(ipaddress.IPv4Address("127.0.0.1"))]),
        ("otherhost", [x509.DNSName("otherhost")]),
    ):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            builder(stem, key, "fetch test CA")
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(usage(sign_certs=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        leaves[stem] = write(cert, key, stem)
    return Certs(ca=ca_path, localhost=leaves["localhost"], otherhost=leaves["otherhost"])


def _certs_by_openssl(folder: Path) -> Certs:
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True, timeout=60)

    new_key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl(
        "req", "-x509", *new_key, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=fetch test CA",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    for serial, (stem, names) in enumerate(
        (("localhost", "DNS:localhost,IP:127.0.0.1"), ("otherhost", "DNS:otherhost")), start=2
    ):
        (folder / f"{stem}.ext").write_text(
            f"subjectAltName={names}\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
            "extendedKeyUsage=serverAuth\nsubjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n"
        )
        openssl("req", "-new", *new_key, "-keyout", f"{stem}.key", "-out", f"{stem}.csr", "-subj", f"/CN={stem}")
        openssl(
            "x509", "-req", "-in", f"{stem}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-set_serial", str(serial),
            "-days", "2", "-out", f"{stem}.pem", "-extfile", f"{stem}.ext",
        )  # fmt: skip
    return Certs(
        ca=folder / "ca.pem",
        localhost=(folder / "localhost.pem", folder / "localhost.key"),
        otherhost=(folder / "otherhost.pem", folder / "otherhost.key"),
    )


# ---------------------------------------------------------------------------------------------- the local server


class _Quiet(http.server.ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def server_bind(self) -> None:  # as HTTPServer's, without its reverse lookup of the address
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = "127.0.0.1", self.server_address[1]

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # refused handshakes and clients that hang up early are part of the tests


class ImageServer:
    """HTTPS on 127.0.0.1 (a free port) with the routes the tests fetch; records every request it receives."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.requests: list[dict[str, str]] = []
        self.stop = threading.Event()
        lock = threading.Lock()
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            timeout = 10  # a client that goes quiet frees its thread

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                with lock:
                    owner.requests.append({"path": self.path, **{k.lower(): v for k, v in self.headers.items()}})
                route = ROUTES.get(self.path.split("?", 1)[0])
                if route is None:
                    self.send_error(404)
                    return
                try:
                    route(self, owner.stop)
                except OSError:
                    pass  # the client hung up, as it should on a refused response

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.httpd = _Quiet(("127.0.0.1", 0), Handler)
        # The handshake happens in each connection's thread, on its first read, so a refused one holds up nothing.
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True, do_handshake_on_connect=False)
        self.port: int = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"https://{host}:{self.port}{path}"

    def close(self) -> None:
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)
        assert not self.thread.is_alive(), "the test server did not stop"


def _send(handler: http.server.BaseHTTPRequestHandler, status: int, headers: dict[str, str], body: bytes) -> None:
    handler.send_response(status)
    for name, value in headers.items():
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(body)


def _png(length: bool = True, body: bytes = PNG, content_type: str = "image/png") -> Callable[..., None]:
    def route(handler: http.server.BaseHTTPRequestHandler, stop: threading.Event) -> None:
        headers = {"Content-Type": content_type} | ({"Content-Length": str(len(body))} if length else {})
        _send(handler, 200, headers, body)

    return route


def _short(handler: http.server.BaseHTTPRequestHandler, stop: threading.Event) -> None:
    _send(handler, 200, {"Content-Type": "image/png", "Content-Length": "1000"}, PNG[:10])  # then the line closes


def _redirect(handler: http.server.BaseHTTPRequestHandler, stop: threading.Event) -> None:
    _send(handler, 302, {"Location": "/ok.png", "Content-Length": "0"}, b"")


def _gzip(handler: http.server.BaseHTTPRequestHandler, stop: threading.Event) -> None:
    _send(handler, 200, {"Content-Type": "image/png", "Content-Encoding": "gzip", "Content-Length": "4"}, b"abcd")


def _slow(handler: http.server.BaseHTTPRequestHandler, stop: threading.Event) -> None:
    stop.wait(SLOW)  # longer than the client's timeout before a single byte of the answer
    _png()(handler, stop)


def _drip_body(handler: http.server.BaseHTTPRequestHandler, stop: threading.Event) -> None:
    """Headers at once, then a byte of body every 0.1 s: each read is quick, the whole never ends in time."""
    handler.send_response(200)
    handler.send_header("Content-Type", "image/png")
    handler.end_headers()
    handler.wfile.flush()
    end = time.monotonic() + SLOW
    while time.monotonic() < end and not stop.wait(0.1):
        handler.wfile.write(b"x")
        handler.wfile.flush()


def _drip_headers(handler: http.server.BaseHTTPRequestHandler, stop: threading.Event) -> None:
    """A status line, then a header a byte every 0.1 s: only the whole-exchange deadline can end it."""
    handler.wfile.write(b"HTTP/1.1 200 OK\r\nX-Padding: ")
    handler.wfile.flush()
    end = time.monotonic() + SLOW
    while time.monotonic() < end and not stop.wait(0.1):
        handler.wfile.write(b"x")
        handler.wfile.flush()


ROUTES: dict[str, Callable[[http.server.BaseHTTPRequestHandler, threading.Event], None]] = {
    "/ok.png": _png(),
    "/clip.mp4": _png(body=b"not really an mp4", content_type="video/mp4"),
    "/typed.png": _png(content_type="Image/PNG; name=x.png"),
    "/nolength.png": _png(length=False),
    "/html": _png(body=b"<html></html>", content_type="text/html; charset=utf-8"),
    "/untyped": _png(content_type=""),
    "/redirect": _redirect,
    "/big": _png(body=bytes(BIG)),
    "/big-nolength": _png(length=False, body=bytes(BIG)),
    "/short": _short,
    "/gzip": _gzip,
    "/slow": _slow,
    "/drip-body": _drip_body,
    "/drip-headers": _drip_headers,
}


@pytest.fixture(autouse=True)
def _no_dns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Name resolution without a DNS server: IP literals (numeric only), "localhost" as /etc/hosts usually has it,
    ".invalid" names unknown; any other name fails the test."""
    real = socket.getaddrinfo

    def resolve(host: Any, port: Any, family: int = 0, type: int = 0, proto: int = 0, flags: int = 0) -> Any:
        name = host.decode() if isinstance(host, bytes) else str(host)
        if name == "localhost":
            return real("127.0.0.1", port, family, type, proto) + real("::1", port, family, type, proto)
        if name.endswith(".invalid"):
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        try:
            return real(name, port, family, type, proto, flags | socket.AI_NUMERICHOST)
        except socket.gaierror:
            pytest.fail(f"the test resolved {name!r}: only IP literals, localhost and .invalid are allowed here")

    monkeypatch.setattr(socket, "getaddrinfo", resolve)


@pytest.fixture
def server(certs: Certs) -> Iterator[ImageServer]:
    running = ImageServer(*certs.localhost)
    try:
        yield running
    finally:
        running.close()


@pytest.fixture
def other_server(certs: Certs) -> Iterator[ImageServer]:
    running = ImageServer(*certs.otherhost)
    try:
        yield running
    finally:
        running.close()


def _loopback_policy(certs: Certs, timeout_s: float = 5.0) -> FetchPolicy:
    return FetchPolicy(
        max_bytes=CAP,
        timeout_s=timeout_s,
        allow_address=lambda a: a == "127.0.0.1",
        ssl_context=ssl.create_default_context(cafile=str(certs.ca)),
    )


def _default_policy(certs: Certs) -> FetchPolicy:
    """The default address rule, with the test CA trusted (so only the address rule can refuse)."""
    return FetchPolicy(max_bytes=CAP, timeout_s=5.0, ssl_context=ssl.create_default_context(cafile=str(certs.ca)))


def _no_connections(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Make socket.create_connection fail the test (pytest.fail is not an Exception, so fetch_image cannot turn it
    into a SourceError); the list records any call as well."""
    calls: list[Any] = []

    def refuse(*args: Any, **kwargs: Any) -> socket.socket:
        calls.append(args)
        pytest.fail(f"fetch_image connected to {args[0]!r} although it should have refused first")

    monkeypatch.setattr(socket, "create_connection", refuse)
    return calls


# ---------------------------------------------------------------------------------------------- fetches


def test_fetch_returns_the_image(server: ImageServer, certs: Certs) -> None:
    assert fetch_image(server.url("/ok.png"), _loopback_policy(certs)) == ("image/png", PNG)
    (request,) = server.requests
    assert request["path"] == "/ok.png"
    assert request["host"] == f"127.0.0.1:{server.port}"
    assert request["user-agent"] == "glm-sparks-engine"
    assert request["accept"] == "image/*"


def test_fetch_of_a_video_asks_for_and_takes_video_types_only(server: ImageServer, certs: Certs) -> None:
    policy = _loopback_policy(certs)
    assert fetch_image(server.url("/clip.mp4"), policy, "video") == ("video/mp4", b"not really an mp4")
    assert server.requests[-1]["accept"] == "video/*"
    with pytest.raises(SourceError, match=r"^video URL .* has content type image/png, not a video type \(video/\*\)"):
        fetch_image(server.url("/ok.png"), policy, "video")
    with pytest.raises(SourceError, match="not an image type"):
        fetch_image(server.url("/clip.mp4"), policy)


def test_fetch_without_length_and_with_type_parameters(server: ImageServer, certs: Certs) -> None:
    policy = _loopback_policy(certs)
    assert fetch_image(server.url("/nolength.png"), policy) == ("image/png", PNG)
    assert fetch_image(server.url("/typed.png?size=small#frag"), policy) == ("image/png", PNG)
    assert [r["path"] for r in server.requests] == ["/nolength.png", "/typed.png?size=small"]


def test_fetch_connects_to_the_checked_address_and_sends_the_name(
    server: ImageServer, certs: Certs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The name is resolved once; the connection goes to that address while TLS and Host name the host."""
    lookups: list[str] = []
    real = socket.getaddrinfo

    def resolve_once(host: str, port: Any, *args: Any, **kwargs: Any) -> Any:
        lookups.append(host)
        return real("127.0.0.1", port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolve_once)
    assert fetch_image(server.url("/ok.png", host="localhost"), _loopback_policy(certs)) == ("image/png", PNG)
    assert [h for h in lookups if h != "127.0.0.1"] == ["localhost"]  # create_connection parses its literal too
    assert server.requests[0]["host"] == f"localhost:{server.port}"


def test_a_slow_name_lookup_is_cut_at_the_timeout(certs: Certs, monkeypatch: pytest.MonkeyPatch) -> None:
    """getaddrinfo takes no timeout: the lookup runs aside, and the fetch gives up after timeout_s."""
    release = threading.Event()

    def stuck(*args: Any, **kwargs: Any) -> Any:
        release.wait(10)
        raise OSError("resolver gave up")

    monkeypatch.setattr(socket, "getaddrinfo", stuck)
    started = time.monotonic()
    try:
        with pytest.raises(SourceError, match=r"^image URL .*: the host slow\.example did not resolve within 0\.3 s$"):
            fetch_image("https://slow.example/a.png", _loopback_policy(certs, timeout_s=0.3))
        assert time.monotonic() - started < 3
    finally:
        release.set()


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("/html", "content type text/html; charset=utf-8, not an image"),
        ("/untyped", r"content type \(none\), not an image"),
        ("/redirect", "status 302 .*redirects are not followed"),
        ("/big", f"is {BIG} bytes, over the {CAP} byte limit"),
        ("/big-nolength", f"sent more than the {CAP} byte limit"),
        ("/short", "ended after 10 of the 1000 bytes"),
        ("/gzip", "gzip-encoded body"),
        ("/missing", "status 404"),
    ],
)
def test_fetch_refused(server: ImageServer, certs: Certs, path: str, why: str) -> None:
    with pytest.raises(SourceError, match=why) as caught:
        fetch_image(server.url(path), _loopback_policy(certs))
    assert "\n" not in str(caught.value)
    assert server.url(path) in str(caught.value)


@pytest.mark.parametrize("path", ["/slow", "/drip-body", "/drip-headers"])
def test_fetch_times_out(server: ImageServer, certs: Certs, path: str) -> None:
    """A silent server is cut off after one read's timeout; one that sends a byte at a time, at the whole
    exchange's deadline (twice the timeout)."""
    start = time.monotonic()
    with pytest.raises(SourceError, match="timed out"):
        fetch_image(server.url(path), _loopback_policy(certs, timeout_s=SHORT_TIMEOUT))
    assert time.monotonic() - start < 2 * SHORT_TIMEOUT + 1.0


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_certificate_for_another_name_is_refused(
    other_server: ImageServer, certs: Certs, host: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's certificate names only "otherhost": refused whether the URL names an address or a host."""
    real = socket.getaddrinfo
    monkeypatch.setattr(socket, "getaddrinfo", lambda h, port, *a, **k: real("127.0.0.1", port, *a, **k))
    with pytest.raises(SourceError, match="TLS certificate was refused .*mismatch"):
        fetch_image(other_server.url("/ok.png", host=host), _loopback_policy(certs))
    assert other_server.requests == []


def test_untrusted_certificate_is_refused(server: ImageServer, certs: Certs) -> None:
    """The system's trusted roots do not include the test CA."""
    policy = FetchPolicy(max_bytes=CAP, timeout_s=5.0, allow_address=lambda a: a == "127.0.0.1")
    with pytest.raises(SourceError, match="TLS certificate was refused"):
        fetch_image(server.url("/ok.png"), policy)
    assert server.requests == []


def test_connection_refused(certs: Certs) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))  # bound, never listening: a connection to it is refused
        url = f"https://127.0.0.1:{unused.getsockname()[1]}/ok.png"
        with pytest.raises(SourceError, match="could not connect to 127.0.0.1"):
            fetch_image(url, _loopback_policy(certs))


# ---------------------------------------------------------------------------------------------- addresses refused


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_default_policy_refuses_loopback(
    server: ImageServer, certs: Certs, host: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _no_connections(monkeypatch)
    with pytest.raises(SourceError, match="a private or local address: only public addresses are fetched"):
        fetch_image(server.url("/ok.png", host=host), _default_policy(certs))
    assert calls == []
    assert server.requests == []


@pytest.mark.parametrize(
    ("host", "address"), [("10.0.0.1", "10.0.0.1"), ("169.254.169.254", "169.254.169.254"), ("[::1]", "::1")]
)
def test_private_literal_refused_before_connecting(host: str, address: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _no_connections(monkeypatch)
    with pytest.raises(SourceError, match=f"resolves to {address}, a private or local address"):
        fetch_image(f"https://{host}/latest/meta-data/x.png", FetchPolicy(max_bytes=CAP))
    assert calls == []


def test_any_refused_address_refuses_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """A name resolving to an allowed address AND a refused one is refused, even when the allowed one is first."""
    real = socket.getaddrinfo

    def two_answers(host: str, port: Any, *args: Any, **kwargs: Any) -> Any:
        return real("127.0.0.1", port, *args, **kwargs) + real("10.0.0.1", port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", two_answers)
    calls = _no_connections(monkeypatch)
    policy = FetchPolicy(max_bytes=CAP, allow_address=lambda a: a == "127.0.0.1")
    with pytest.raises(SourceError, match="resolves to 10.0.0.1"):
        fetch_image("https://images.example/x.png", policy)
    assert calls == []


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://127.0.0.1/ok.png", "is not https"),
        ("ftp://127.0.0.1/ok.png", "is not https"),
        ("file:///etc/passwd", "is not https"),
        ("//127.0.0.1/ok.png", "is not https"),
        ("https://user:secret@127.0.0.1/ok.png", r"https://\*\*\*@127.0.0.1/ok.png carries a user name or password"),
        ("https://user@127.0.0.1/ok.png", "user name or password"),
        ("https:///ok.png", "has no host"),
        ("https://127.0.0.1:99999/ok.png", "not a valid URL"),
        ("https://127.0.0.1:0/ok.png", "invalid port"),
        ("https://[::1/ok.png", "not a valid URL"),
        ("https://127.0.0.1/a b.png", "spaces or control characters"),
        ("https://nonexistent.invalid/ok.png", "the host nonexistent.invalid does not resolve"),
    ],
)
def test_url_refused(url: str, why: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _no_connections(monkeypatch)
    with pytest.raises(SourceError, match=why) as caught:
        fetch_image(url, FetchPolicy(max_bytes=CAP, allow_address=lambda a: True))
    assert "secret" not in str(caught.value)
    assert calls == []

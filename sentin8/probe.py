"""``sentin8-proxy probe``, the sans-IO half: the operator's ``curl`` for an edge that speaks only PQ TLS.

Debian's ``curl`` and ``openssl`` link OpenSSL 3.0, which has neither X25519MLKEM768 nor ML-DSA-65, so they
cannot reach the edge at all; the probe runs on the OpenSSL the proxy itself runs on (the ``cryptography``
wheel's, through pyOpenSSL, ``sentin8.tls.probe_context``) and offers only what the edge accepts. This module
parses what the operator typed (URL, ``--resolve``, ``-H``), builds the request (HTTP/1.1 bytes or HTTP/2
fields), reads an HTTP/1.1 response, and formats the report; the socket shell is ``supervisor/probe_cmd.py``.

Exit codes are curl's, so scripts written for curl keep their meaning: 3 malformed URL, 6 unresolvable host, 7
connect failed, 22 HTTP status >= 400 with ``--fail``, 28 timeout, 35 TLS handshake failed, 56 the connection
ended before a whole response, 60 certificate verification failed.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httptools
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, mldsa, rsa

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_URL = 3
EXIT_RESOLVE = 6
EXIT_CONNECT = 7
EXIT_HTTP_ERROR = 22
EXIT_TIMEOUT = 28
EXIT_TLS = 35
EXIT_RECV = 56
EXIT_VERIFY = 60

BODY_SHOWN_MAX = 64 * 1024  # a longer (or binary) body is reported by its size only
MAX_RESPONSE_BYTES = 64 * 1024 * 1024  # a response larger than this is cut off and said so, never buffered whole
_HOSTNAME = re.compile(r"[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*\.?")
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # RFC 9110 field-name
# HTTP/2 forbids the connection-specific fields (RFC 9113 §8.2.2); Host becomes :authority
_H2_DROPPED = frozenset({"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "host"})


class ProbeError(Exception):
    """What went wrong, in the operator's words, and the exit code that says it to a script."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


# -- what the operator typed ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Target:
    host: str  # lower case; an IP literal without brackets; IDNA-encoded otherwise
    port: int
    path: str  # path and query, at least "/"
    authority: str  # the Host header / :authority: host, and :port when not 443

    @property
    def is_ip(self) -> bool:
        try:
            ipaddress.ip_address(self.host)
        except ValueError:
            return False
        return True


def parse_url(url: str) -> Target:
    """An ``https://host[:port]/path?query`` URL; anything else is ``ProbeError(EXIT_URL)``."""
    if any(c.isspace() or ord(c) < 32 for c in url):
        raise ProbeError(EXIT_URL, f"malformed URL {url!r}: white space or a control character")
    parts = urlsplit(url)
    if parts.scheme.lower() != "https":
        raise ProbeError(EXIT_URL, f"unsupported URL scheme {parts.scheme or '(none)'!r}: the probe speaks TLS, "
                                   "give https://")  # fmt: skip
    if parts.username is not None or parts.password is not None:
        raise ProbeError(EXIT_URL, "credentials in the URL are not sent: use -H 'Authorization: ...'")
    try:
        host, port = parts.hostname, parts.port
    except ValueError as exc:  # a port that is not a number or out of range
        raise ProbeError(EXIT_URL, f"malformed URL {url!r}: {exc}") from None
    if not host:
        raise ProbeError(EXIT_URL, f"malformed URL {url!r}: no host")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    if ip is None:
        try:
            host = host.encode("idna").decode("ascii").lower()
        except UnicodeError:
            raise ProbeError(EXIT_URL, f"malformed host name {host!r}") from None
        if not _HOSTNAME.fullmatch(host):
            raise ProbeError(EXIT_URL, f"malformed host name {host!r}")
        bracketed = host
    else:
        host = str(ip)
        bracketed = f"[{host}]" if ip.version == 6 else host
    port = 443 if port is None else port
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if not path.startswith("/"):
        raise ProbeError(EXIT_URL, f"malformed URL {url!r}: path {path!r}")
    return Target(host, port, path, bracketed if port == 443 else f"{bracketed}:{port}")


def parse_resolve(spec: str) -> tuple[str, int, str]:
    """curl's ``--resolve host:port:addr`` (``addr`` an IP literal, IPv6 in brackets or not)."""
    host, sep1, rest = spec.partition(":")
    port_s, sep2, addr = rest.partition(":")
    if not (sep1 and sep2 and host and addr):
        raise ProbeError(EXIT_USAGE, f"--resolve {spec!r}: give host:port:address")
    if not port_s.isdigit() or not 0 < int(port_s) < 65536:
        raise ProbeError(EXIT_USAGE, f"--resolve {spec!r}: port {port_s!r} is not 1-65535")
    addr = addr.removeprefix("[").removesuffix("]")
    try:
        addr = str(ipaddress.ip_address(addr))
    except ValueError:
        raise ProbeError(EXIT_USAGE, f"--resolve {spec!r}: {addr!r} is not an IP address") from None
    return host.lower().rstrip("."), int(port_s), addr


def pick_address(target: Target, resolves: Iterable[tuple[str, int, str]]) -> str | None:
    """The address ``--resolve`` gives for the target's host and port (curl: the last one given wins), or
    None (the shell resolves the name itself; an IP literal is its own address)."""
    chosen = None
    for host, port, addr in resolves:
        if host == target.host.rstrip(".") and port == target.port:
            chosen = addr
    return chosen


def parse_header(text: str) -> tuple[str, str]:
    """``-H 'Name: value'`` (``'Name:'`` removes a default header, as in curl)."""
    name, sep, value = text.partition(":")
    name = name.strip()
    if not sep or not _TOKEN.match(name):
        raise ProbeError(EXIT_USAGE, f"-H {text!r}: give 'Name: value' with a valid field name")
    value = value.strip()
    if any(c in value for c in "\r\n\0"):
        raise ProbeError(EXIT_USAGE, f"-H {text!r}: CR, LF and NUL are not allowed in a value")
    return name, value


# -- the request -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    target: Target
    headers: tuple[tuple[str, str], ...]
    body: bytes


def build_request(target: Target, extra: Sequence[tuple[str, str]], data: bytes | None, agent: str) -> Request:
    """GET, or POST when ``data`` is given; the operator's headers replace the defaults of the same name."""
    defaults = [("Host", target.authority), ("User-Agent", agent), ("Accept", "*/*")]
    if data is not None:
        defaults += [("Content-Type", "application/x-www-form-urlencoded"), ("Content-Length", str(len(data)))]
    given = {name.lower() for name, _ in extra}
    headers = [(n, v) for n, v in defaults if n.lower() not in given]
    headers += [(n, v) for n, v in extra if v or n.lower() not in {d.lower() for d, _ in defaults}]
    return Request("POST" if data is not None else "GET", target, tuple(headers), data or b"")


def http1_bytes(req: Request) -> bytes:
    head = f"{req.method} {req.target.path} HTTP/1.1\r\n" + "".join(f"{n}: {v}\r\n" for n, v in req.headers)
    return head.encode("latin-1") + b"\r\n" + req.body


def h2_fields(req: Request) -> list[tuple[bytes, bytes]]:
    """The same request as an HTTP/2 header block: pseudo-headers first, names in lower case."""
    authority = next((v for n, v in req.headers if n.lower() == "host"), req.target.authority)
    out = [(b":method", req.method.encode()), (b":scheme", b"https"), (b":authority", authority.encode()),
           (b":path", req.target.path.encode())]  # fmt: skip
    for name, value in req.headers:
        low = name.lower()
        if low in _H2_DROPPED or (low == "te" and value.lower() != "trailers"):
            continue
        out.append((low.encode(), value.encode("latin-1")))
    return out


# -- the response ----------------------------------------------------------------------------------------


@dataclass(slots=True)
class Response:
    version: str  # "HTTP/1.1", "HTTP/2"
    status: int
    reason: str
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    trailers: list[tuple[str, str]] = field(default_factory=list)
    keep_alive: bool = True
    truncated: bool = False  # cut at MAX_RESPONSE_BYTES


class Http1Reader:
    """One HTTP/1.1 response from the bytes read (1xx heads skipped). ``feed`` says when it is whole; at the
    peer's EOF ``finish`` returns it, or raises when it was not complete (a close-delimited body is)."""

    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._reason = b""
        self._headers: list[tuple[str, str]] = []
        self._body = bytearray()
        self._head_done = False
        self._framed = False  # Content-Length or chunked: the end is in the bytes, not at EOF
        self._truncated = False
        self.response: Response | None = None

    # httptools callbacks
    def on_status(self, status: bytes) -> None:
        self._reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        if self._parser.get_status_code() < 200:  # an interim head: the final one follows
            self._reason, self._headers = b"", []
            return
        self._head_done = True
        self._framed = any(n.lower() in ("content-length", "transfer-encoding") for n, _ in self._headers)

    def on_body(self, body: bytes) -> None:
        room = MAX_RESPONSE_BYTES - len(self._body)
        if len(body) > room:
            body, self._truncated = body[:room], True
        self._body += body

    def on_message_complete(self) -> None:
        if self._head_done and self.response is None:
            self.response = self._make(self._parser.should_keep_alive())

    def _make(self, keep_alive: bool) -> Response:
        return Response(
            "HTTP/" + self._parser.get_http_version(),
            self._parser.get_status_code(),
            self._reason.decode("latin-1"),
            self._headers,
            bytes(self._body),
            keep_alive=keep_alive,
            truncated=self._truncated,
        )

    def feed(self, data: bytes) -> bool:
        """True once the response is complete (bytes after it are not read: one request at a time)."""
        if self.response is None:
            try:
                self._parser.feed_data(data)
            except httptools.HttpParserUpgrade:
                pass
            except httptools.HttpParserError as exc:
                raise ProbeError(EXIT_RECV, f"malformed HTTP/1.1 response: {exc}") from None
        if self._truncated and self.response is None:
            self.response = self._make(False)
        return self.response is not None

    def finish(self) -> Response:
        """The peer closed the connection."""
        if self.response is not None:
            return self.response
        if self._head_done and not self._framed:
            return self._make(False)  # the body ran to the close (RFC 9112 §6.3)
        said = "before a status line" if not self._reason and not self._head_done else "in the middle of it"
        raise ProbeError(EXIT_RECV, f"the server closed the connection {said}")


def from_h2(status: int, fields: Iterable[tuple[bytes, bytes]], body: bytes, trailers: Iterable[tuple[bytes, bytes]]):
    """A response the HTTP/2 adapter collected, as the report shows it."""
    headers = [(n.decode("latin-1"), v.decode("latin-1")) for n, v in fields if not n.startswith(b":")]
    tail = [(n.decode("latin-1"), v.decode("latin-1")) for n, v in trailers]
    return Response("HTTP/2", status, "", headers, body, tail)


# -- the report ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TLSFacts:
    version: str
    group: str
    signature: str
    alpn: str
    verified: str  # "yes (...)" or "no (...)"


def signature_scheme(cert: x509.Certificate) -> str:
    """The TLS signature scheme the server's key signs with, in OpenSSL's names.

    The probe offers exactly one scheme (``mldsa65``), so a completed handshake used it; the certificate's key
    type says the same from the other side, and any other key is named for what it is."""
    try:
        key = cert.public_key()
    except Exception:  # a key type cryptography does not know
        return "unknown key type"
    if isinstance(key, mldsa.MLDSA65PublicKey):
        return "mldsa65"
    if isinstance(key, ed25519.Ed25519PublicKey):
        return "ed25519"
    if isinstance(key, ec.EllipticCurvePublicKey):
        return f"ecdsa_{key.curve.name}"
    if isinstance(key, rsa.RSAPublicKey):
        return f"rsa ({key.key_size} bits)"
    return type(key).__name__.removesuffix("PublicKey").lstrip("_").lower()


def _when(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%S UTC")


def certificate_lines(cert: x509.Certificate, now: dt.datetime) -> list[str]:
    """Subject, issuer, SANs, validity (with the time left, or how long ago it ended)."""
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        sans = [f"DNS:{n}" for n in names.get_values_for_type(x509.DNSName)]
        sans += [f"IP:{a}" for a in names.get_values_for_type(x509.IPAddress)]
    except x509.ExtensionNotFound:
        sans = []
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    left = (end - now).total_seconds()
    if now < start:
        state = "NOT YET VALID"
    elif left <= 0:
        state = f"EXPIRED {(-left) / 3600:.1f} h ago"
    else:
        state = f"{left / 86400:.1f} days left" if left >= 86400 else f"{left / 3600:.1f} h left"
    return [
        f"* subject:    {cert.subject.rfc4514_string()}",
        f"* issuer:     {cert.issuer.rfc4514_string()}",
        f"* SANs:       {', '.join(sans) or '(none)'}",
        f"* valid:      {_when(start)} .. {_when(end)} ({state})",
    ]


def tls_lines(facts: TLSFacts) -> list[str]:
    return [
        f"* TLS:        {facts.version}",
        f"* group:      {facts.group}",
        f"* signature:  {facts.signature}",
        f"* ALPN:       {facts.alpn}",
        f"* verified:   {facts.verified}",
    ]


def request_lines(req: Request, version: str) -> list[str]:
    if version == "HTTP/2":
        return [f"> {n.decode()}: {v.decode('latin-1')}" for n, v in h2_fields(req)] + [">"]
    return [f"> {req.method} {req.target.path} HTTP/1.1", *(f"> {n}: {v}" for n, v in req.headers), ">"]


def body_text(body: bytes) -> str | None:
    """The body as text when it is short and printable, else None (the report gives its size)."""
    if len(body) > BODY_SHOWN_MAX:
        return None
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if any(ord(c) < 32 and c not in "\t\r\n" for c in text):
        return None
    return text


def response_lines(resp: Response) -> list[str]:
    status = f"< {resp.version} {resp.status}" + (f" {resp.reason}" if resp.reason else "")
    out = [status, *(f"< {n}: {v}" for n, v in resp.headers), "<"]
    text = body_text(resp.body)
    if text:
        out.append(text.rstrip("\n"))
    out += [f"< (trailer) {n}: {v}" for n, v in resp.trailers]
    size = f"* body:       {len(resp.body)} bytes" + (" (binary or long: not shown)" if resp.body and not text else "")
    if resp.truncated:
        size += f" (cut at {MAX_RESPONSE_BYTES} bytes)"
    out.append(size)
    return out


def status_summary(statuses: Sequence[int]) -> str:
    """``200 x15, 429 x5`` in the order each status first appeared."""
    counts: dict[int, int] = {}
    for s in statuses:
        counts[s] = counts.get(s, 0) + 1
    return ", ".join(f"{s} x{n}" for s, n in counts.items())

"""Request-head validation, sans-IO (the heads the proxy writes are ``head_writer.py``'s).

httptools (llhttp, strict mode) already rejects most request smuggling shapes: Content-Length together with
Transfer-Encoding, duplicate Content-Length, non-digit lengths, obs-fold, bare CR or LF, control characters in
values, invalid header-name characters, a Transfer-Encoding whose last coding is not chunked.
``tests/test_http_framing.py`` pins each of those with raw bytes. What it lets through, and this module
rejects: a Transfer-Encoding that is not exactly ``chunked`` (``gzip, chunked``, ``,chunked``, two headers),
Transfer-Encoding on HTTP/1.0, versions other than 1.0/1.1, a missing or repeated Host on HTTP/1.1, an
invalid Host, an absolute-form target whose authority disagrees with Host, CONNECT, upgrades with a body,
WebSocket upgrades without a valid ``Sec-WebSocket-Key``, and (``request_line_is_http``) RTSP/ICE request
lines, which llhttp reports as version 1.0. The caps (header count and bytes, 431) are counted as the parser
reports each header line. It also records what later steps decide on: whether the request is a WebSocket
handshake (``websocket.py``; other upgrades are served as plain requests), an ACME challenge (``acme.py``),
and whether it expects ``100-continue`` (never on HTTP/1.0: RFC 9110 §10.1.1).
"""

from __future__ import annotations

import re

from ..native import loaded_compiled
from .acme import ACME_PREFIX as _ACME_PREFIX
from .acme import NOT_ACME, acme_challenge
from .websocket import valid_websocket_key, websocket_handshake
from .websocket import websocket_accept as websocket_accept  # re-exported: its home is websocket.py

_COMPILED = loaded_compiled(__file__)  # compiled, the scans are glibc's memmem (framing.pxd)

Header = tuple[bytes, bytes]

# ``RequestHead.version`` of a request that came over HTTP/2 (sentin8/http/h2_request.py). Not "1.1", and not
# "1.0" either: code deciding "may the connection persist / may interim responses go out" must ask
# ``version != "1.0"``, never ``version == "1.1"``. ModSecurity makes it ``HTTP/2``, a CRS-allowed version.
H2_VERSION = "2"


class HeadError(Exception):
    """The request cannot be forwarded; answer ``status`` and close. ``counter``: the counter naming the
    refusal beside ``http_<status>`` ("" = that one alone)."""

    def __init__(self, status: int, reason: str, counter: str = "") -> None:
        super().__init__(f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.counter = counter


class HeaderBudget:
    """Header caps, counted line by line as the parser reports them (Host included, ARCHITECTURE.md §6).

    ``size`` counts each line as ``name: value CRLF``; the request line is capped separately (414).
    """

    __slots__ = ("count", "max_count", "max_size", "size")

    def __init__(self, max_count: int, max_size: int) -> None:
        self.max_count = max_count
        self.max_size = max_size
        self.count = 0
        self.size = 0

    def add(self, name: bytes, value: bytes) -> None:
        self.count += 1
        self.size += len(name) + len(value) + 4
        if self.count > self.max_count:
            raise HeadError(431, "too many header lines")
        if self.size > self.max_size:
            raise HeadError(431, "header block too large")

    def reset(self) -> None:
        """Empty again, for the next head held to the same caps (a backend connection's next response)."""
        self.count = 0
        self.size = 0


def measured_budget(headers: list[tuple[bytes, bytes]]) -> HeaderBudget:
    """A budget without caps holding the size of ``headers``, counted as ``add`` counts (an h2 request's
    fields, already held to the connection's own limits: only the size is read later, the WAF's cost
    estimate). One call for the whole list instead of one ``add`` per field."""
    budget = HeaderBudget(1 << 30, 1 << 30)
    size = 0
    for name, value in headers:
        size += len(name) + len(value) + 4
    budget.count = len(headers)
    budget.size = size
    return budget


class RequestHead:
    """A validated request head, ready for routing and forwarding."""

    __slots__ = (
        "acme",
        "authority",
        "chunked",
        "content_length",
        "expect_continue",
        "headers",
        "host",
        "keep_alive",
        "method",
        "path",
        "target",
        "version",
        "websocket",
        "websocket_key",
    )

    def __init__(
        self,
        method: bytes,
        target: bytes,
        version: str,
        headers: list[Header],
        host: str,
        authority: bytes,
        content_length: int | None,
        chunked: bool,
        keep_alive: bool,
        websocket: bool,
        websocket_key: bytes = b"",
        acme: int = NOT_ACME,
        expect_continue: bool = False,
    ) -> None:
        self._fill(
            method, target, version, headers, host, authority, content_length, chunked, keep_alive, websocket,
            websocket_key, acme, expect_continue,
        )  # fmt: skip

    def _fill(
        self,
        method: bytes,
        target: bytes,
        version: str,
        headers: list[Header],
        host: str,
        authority: bytes,
        content_length: int | None,
        chunked: bool,
        keep_alive: bool,
        websocket: bool,
        websocket_key: bytes,
        acme: int,
        expect_continue: bool,
    ) -> None:
        """The fields, for both ways in: ``__init__`` and ``new_request_head``."""
        self.method = method
        self.target = target  # origin-form (or "*"), what goes upstream
        q = _find(target, b"?") if _COMPILED else target.find(b"?")  # noqa: F821 (bytes.find: the tuple protocol)
        self.path = target if q < 0 else target[:q]
        self.version = version
        self.headers = headers
        self.host = host  # lower case, no port, no trailing dot; "" when absent (HTTP/1.0)
        self.authority = authority  # the Host value as received (X-Forwarded-Host)
        self.content_length = content_length
        self.chunked = chunked
        self.keep_alive = keep_alive
        self.websocket = websocket
        self.websocket_key = websocket_key  # Sec-WebSocket-Key as sent, checked against the 101's Accept
        self.acme = acme  # acme.CHALLENGE / NOT_A_CHALLENGE / NOT_ACME
        self.expect_continue = expect_continue  # Expect: 100-continue on HTTP/1.1 (ignored on 1.0)

    @property
    def has_body(self) -> bool:
        return self.chunked or bool(self.content_length)


def new_request_head(
    method: bytes,
    target: bytes,
    version: str,
    headers: list[Header],
    host: str,
    authority: bytes,
    content_length: int | None,
    chunked: bool,
    keep_alive: bool,
    websocket: bool,
    websocket_key: bytes,
    acme: int,
    expect_continue: bool,
) -> RequestHead:
    """``RequestHead(...)`` for the per-request validators (h1 and h2), every field given. Compiled, a C call:
    ``__new__`` and ``_fill``, without the generic call protocol's parsing of 13 arguments (~1.5k
    instructions a request; a .pxd cannot type ``__init__``)."""
    head = RequestHead.__new__(RequestHead)
    head._fill(
        method, target, version, headers, host, authority, content_length, chunked, keep_alive, websocket,
        websocket_key, acme, expect_continue,
    )  # fmt: skip
    return head


# reg-name restricted to DNS characters (plus "_"), or an IP literal; optional port.
_HOST = re.compile(rb"(\[[0-9A-Fa-f:.]{2,45}\]|[A-Za-z0-9._-]{1,253})(?::([0-9]{1,5}))?")
_ABSOLUTE = re.compile(rb"(?i:https?)://([^/?#]*)(.*)", re.S)
_DIGITS = re.compile(rb"[0-9]{1,18}")
_NO_FIELDS: list[bytes] = []  # shared, never appended to (validate_request appends only when upgrade is set)


_host_cache: dict[bytes, str | None] = {}
_HOST_CACHE_MAX = 4096  # a client sending random Host values only churns this bounded dict


def split_host(value: bytes) -> str | None:
    """``Example.COM.:8443`` -> ``example.com``; ``[::1]:443`` -> ``::1``; None when it is not a valid Host."""
    # Pure function of the value, and keep-alive clients repeat the same Host: cache the answers.
    try:
        return _host_cache[value]
    except KeyError:
        pass
    host = _split_host(value)
    if len(_host_cache) >= _HOST_CACHE_MAX:
        _host_cache.clear()
    _host_cache[bytes(value)] = host
    return host


def _split_host(value: bytes) -> str | None:
    m = _HOST.fullmatch(value)
    if m is None:
        return None
    port = m.group(2)
    if port is not None and int(port) > 65535:
        return None
    name = m.group(1)
    if name[:1] == b"[":
        return name[1:-1].decode("ascii").lower()
    return name.decode("ascii").lower().rstrip(".")


def validate_request(
    method: bytes,
    url: bytes,
    version: str,
    headers: list[Header],
    *,
    keep_alive: bool,
    upgrade: bool,
) -> RequestHead:
    """Decide the framing of a parsed request head, or raise ``HeadError`` (400/405).

    ``upgrade`` is the parser's word that the request asked to switch protocols (``Upgrade`` with
    ``Connection: upgrade``): llhttp stops parsing HTTP there, so a WebSocket tunnel needs it as well as
    ``websocket_handshake``'s own reading of the two lists."""
    if version != "1.1" and version != "1.0":
        raise HeadError(400, "unsupported HTTP version")
    if method == b"CONNECT":
        raise HeadError(405, "CONNECT is not served")
    host_value: bytes | None = None
    hosts = 0
    content_length: int | None = None
    te_count = 0
    te_value = b""
    # The upgrade's own fields, collected only when the parser saw one (no lists for the other requests).
    upgrades: list[bytes] = [] if upgrade else _NO_FIELDS
    connections: list[bytes] = [] if upgrade else _NO_FIELDS
    ws_keys: list[bytes] = [] if upgrade else _NO_FIELDS
    expect = False
    for name, value in headers:
        n = len(name)
        # Only the few names that decide framing or routing; length first keeps this loop cheap.
        if n == 4 and name.lower() == b"host":
            hosts += 1
            host_value = value.strip(b" \t")
        elif n == 14 and name.lower() == b"content-length":
            v = value.strip(b" \t")
            # llhttp already refuses duplicates and non-digits; kept as a guard should leniency ever be on.
            if content_length is not None or not _DIGITS.fullmatch(v):
                raise HeadError(400, "invalid Content-Length")
            content_length = int(v)
        elif n == 17 and name.lower() == b"transfer-encoding":
            te_count += 1
            te_value = value
        elif n == 6 and name.lower() == b"expect":
            expect = expect or value.strip(b" \t").lower() == b"100-continue"
        elif upgrade:
            if n == 7 and name.lower() == b"upgrade":
                upgrades.append(value)
            elif n == 10 and name.lower() == b"connection":
                connections.append(value)
            elif n == 17 and name.lower() == b"sec-websocket-key":
                ws_keys.append(value.strip(b" \t"))
    chunked = False
    if te_count:
        if version == "1.0":
            raise HeadError(400, "Transfer-Encoding on HTTP/1.0")
        if te_count > 1 or te_value.strip(b" \t").lower() != b"chunked":
            raise HeadError(400, "Transfer-Encoding must be exactly chunked")
        if content_length is not None:
            raise HeadError(400, "Content-Length with Transfer-Encoding")
        chunked = True
    if hosts > 1:
        raise HeadError(400, "more than one Host")
    if host_value is None and version == "1.1":
        raise HeadError(400, "missing Host")
    host = ""
    authority = b""
    if host_value is not None:
        parsed = split_host(host_value)
        if parsed is None:
            raise HeadError(400, "invalid Host")
        host, authority = parsed, host_value
    target = url
    origin_form = url.startswith(b"/")  # typed (framing.pxd): a C compare, no slice
    if not origin_form:
        if url == b"*":
            if method != b"OPTIONS":
                raise HeadError(400, "asterisk-form is for OPTIONS only")
        else:
            m = _ABSOLUTE.fullmatch(url)
            if m is None:
                raise HeadError(400, "invalid request target")
            uri_host = split_host(m.group(1))
            # RFC 9112 §3.2.2: the target's authority wins over Host; we refuse a disagreement instead,
            # so routing, the SNI check and X-Forwarded-Host all see one name.
            if uri_host is None or uri_host != host:
                raise HeadError(400, "request target authority does not match Host")
            target = m.group(2) or b"/"
            if target[:1] == b"?":
                target = b"/" + target
            if target[:1] != b"/":
                raise HeadError(400, "invalid request target")
    has_body = chunked or bool(content_length)
    websocket = False
    if upgrade:
        if websocket_handshake(method, version, upgrades, connections):
            if has_body:
                raise HeadError(400, "websocket upgrade with a body", "upgrade_refused")
            if len(ws_keys) != 1 or not valid_websocket_key(ws_keys[0]):
                # RFC 6455 §4.2.1: without exactly one 16-byte nonce the backend cannot prove it speaks
                # WebSocket, and a tunnel opened on a bare 101 is the WebSocket-smuggling shape.
                raise HeadError(400, "websocket upgrade without a valid Sec-WebSocket-Key", "upgrade_refused")
            websocket = True
        elif has_body:
            # llhttp would stop parsing HTTP after the body; bodyless ones are served as plain requests.
            raise HeadError(400, "upgrade with a body", "upgrade_refused")
    acme = NOT_ACME
    if target.startswith(_ACME_PREFIX):  # the one test most requests pay
        acme = acme_challenge(method, target, origin_form=origin_form, body=has_body, upgrade=upgrade)
    return new_request_head(
        method,
        target,
        version,
        headers,
        host,
        authority,
        content_length,
        chunked,
        keep_alive,
        websocket,
        ws_keys[0] if websocket else b"",
        acme,
        expect and version == "1.1",  # RFC 9110 §10.1.1: an HTTP/1.0 request's expectation is ignored
    )


def request_line_is_http(raw: bytes, method: bytes, url: bytes) -> bool:
    """False when this request's line ``method SP url SP`` in ``raw`` names ``RTSP/`` or ``ICE/``.

    llhttp accepts ``RTSP/1.0`` and ``ICE/1.0`` request lines and reports them as version 1.0 without saying
    which protocol it saw; only HTTP/1.x may be forwarded as HTTP. ``raw`` holds the bytes read since the
    request began (it may hold a neighbouring pipelined message too, whose identical line with another
    protocol then also refuses this one: a client mixing protocols on one connection gets a 400, never a
    forward). Those are the only two protocol names llhttp lets through, so positive evidence is enough.
    """
    # Nearly every request: one scan of the bytes per name. Compiled, glibc's memmem (framing.pxd): bytes.find
    # parses its arguments through the old tuple protocol, ~250 instructions a call (callgrind). find(), not
    # `in`: Python 3.11 tries the needle of `bytes in bytes` as an int first and formats the TypeError it gets.
    if _COMPILED:
        if not _occurs(raw, b"RTSP/") and not _occurs(raw, b"ICE/"):  # noqa: F821
            return True
    elif raw.find(b"RTSP/") < 0 and raw.find(b"ICE/") < 0:
        return True
    line = method + b" " + url + b" "
    for proto in (b"RTSP/", b"ICE/"):
        at = raw.find(line + proto)
        while at >= 0:
            if at == 0 or raw[at - 1] == 0x0A:  # at a line start: a request line, not a header value
                return False
            at = raw.find(line + proto, at + 1)
    return True

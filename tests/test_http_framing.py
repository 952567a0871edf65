"""Request framing, sans-IO: raw bytes through httptools + validate_request, then the message builders.

Each smuggling shape is pinned to the layer that rejects it: ``HttpParserError`` (httptools/llhttp already
refuses it) or ``HeadError`` (what httptools lets through and framing.py adds). If an httptools upgrade ever
relaxes a check, the first group fails here rather than in production.
"""

from __future__ import annotations

import httptools
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sentin8.http.framing import (
    HeaderBudget,
    HeadError,
    RequestHead,
    measured_budget,
    request_line_is_http,
    split_host,
    validate_request,
    websocket_accept,
)
from sentin8.http.head_writer import REASONS, error_response, request_head, response_head


class _Collector:
    def __init__(self, budget: HeaderBudget | None) -> None:
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.done = False
        self.budget = budget
        self.parser: httptools.HttpRequestParser | None = None
        self.facts: dict = {}

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.done:
            if self.budget is not None:
                self.budget.add(name, value)
            self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        # llhttp resets these once the message completes: read them here, as the bridge does.
        p = self.parser
        assert p is not None
        self.facts = {
            "method": p.get_method(),
            "version": p.get_http_version(),
            "keep_alive": p.should_keep_alive(),
            "upgrade": p.should_upgrade(),
        }
        self.done = True


def parse(raw: bytes, max_headers: int = 100, max_bytes: int = 65536) -> RequestHead:
    """What the bridge does for one head: httptools callbacks, the caps, then validate_request."""
    c = _Collector(HeaderBudget(max_headers, max_bytes))
    p = httptools.HttpRequestParser(c)
    c.parser = p
    try:
        p.feed_data(raw)
    except httptools.HttpParserUpgrade:
        pass
    except httptools.HttpParserCallbackError as exc:
        if isinstance(exc.__context__, HeadError):
            raise exc.__context__ from None
        raise
    assert c.done, "head incomplete"
    f = c.facts
    return validate_request(
        f["method"], c.url, f["version"], c.headers, keep_alive=f["keep_alive"], upgrade=f["upgrade"]
    )


H = b"Host: shop.example.com\r\n"
WS_KEY = b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"

# Shapes llhttp (strict mode, as httptools runs it) already rejects.
REJECTED_BY_HTTPTOOLS = {
    "cl+te": b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "te+cl": b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n",
    "te-gzip+cl": b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: gzip\r\nContent-Length: 3\r\n\r\nabc",
    "dup-cl-same": b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
    "dup-cl-differ": b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
    "dup-cl-case": b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 3\r\ncontent-length: 3\r\n\r\nabc",
    "cl-list": b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 3, 3\r\n\r\nabc",
    "cl-plus": b"POST / HTTP/1.1\r\n" + H + b"Content-Length: +3\r\n\r\nabc",
    "cl-negative": b"POST / HTTP/1.1\r\n" + H + b"Content-Length: -3\r\n\r\n",
    "cl-hex": b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 0x3\r\n\r\nabc",
    "cl-empty": b"POST / HTTP/1.1\r\n" + H + b"Content-Length: \r\n\r\n",
    "cl-overflow": b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 99999999999999999999999\r\n\r\n",
    "te-gzip-only": b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: gzip\r\n\r\n",
    "te-identity": b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: identity\r\n\r\n",
    "te-chunked-then-gzip": b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked, gzip\r\n\r\n0\r\n\r\n",
    "te-xchunked": b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: xchunked\r\n\r\n",
    "te-chunked-param": b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked;q=1\r\n\r\n",
    "te-chunked-twice": b"POST / HTTP/1.1\r\n"
    + H
    + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
    "te-space-before-colon": b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n",
    "te-vertical-tab": b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: \x0bchunked\r\n\r\n0\r\n\r\n",
    "te-empty": b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: \r\n\r\n",
    "obs-fold-space": b"GET / HTTP/1.1\r\n" + H + b"X-A: b\r\n c\r\n\r\n",
    "obs-fold-tab": b"GET / HTTP/1.1\r\n" + H + b"X-A: b\r\n\tc\r\n\r\n",
    "bare-lf-request-line": b"GET / HTTP/1.1\n" + H + b"\r\n",
    "bare-lf-header": b"GET / HTTP/1.1\r\nHost: a\nX: y\r\n\r\n",
    "bare-lf-end": b"GET / HTTP/1.1\r\n" + H + b"\n",
    "bare-cr-header": b"GET / HTTP/1.1\r\nHost: a\rX: y\r\n\r\n",
    "cr-in-value": b"GET / HTTP/1.1\r\n" + H + b"X: y\rz\r\n\r\n",
    "nul-in-value": b"GET / HTTP/1.1\r\n" + H + b"X: y\x00z\r\n\r\n",
    "ctl-in-value": b"GET / HTTP/1.1\r\n" + H + b"X: y\x01z\r\n\r\n",
    "del-in-value": b"GET / HTTP/1.1\r\n" + H + b"X: y\x7fz\r\n\r\n",
    "space-in-name": b"GET / HTTP/1.1\r\n" + H + b"X Y: z\r\n\r\n",
    "at-in-name": b"GET / HTTP/1.1\r\n" + H + b"X@Y: z\r\n\r\n",
    "nul-in-name": b"GET / HTTP/1.1\r\n" + H + b"X\x00: z\r\n\r\n",
    "high-byte-in-name": b"GET / HTTP/1.1\r\n" + H + b"X\xe9: z\r\n\r\n",
    "empty-name": b"GET / HTTP/1.1\r\n" + H + b": z\r\n\r\n",
    "no-colon": b"GET / HTTP/1.1\r\n" + H + b"XYZ\r\n\r\n",
    "space-before-first-header": b"GET / HTTP/1.1\r\n Host: a\r\n\r\n",
    "space-in-target": b"GET /a b HTTP/1.1\r\n" + H + b"\r\n",
    "ctl-in-target": b"GET /a\x01b HTTP/1.1\r\n" + H + b"\r\n",
    "tab-in-target": b"GET /a\tb HTTP/1.1\r\n" + H + b"\r\n",
    "version-1.2": b"GET / HTTP/1.2\r\n" + H + b"\r\n",
    "lowercase-method": b"get / HTTP/1.1\r\n" + H + b"\r\n",
    "unknown-method": b"FOO / HTTP/1.1\r\n" + H + b"\r\n",
    "trailing-space-version": b"GET / HTTP/1.1 \r\n" + H + b"\r\n",
    "h2-preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
}

# Shapes httptools lets through; framing.py refuses them.
REJECTED_BY_FRAMING = {
    "te-gzip-chunked": b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
    "te-comma-chunked": b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: ,chunked\r\n\r\n0\r\n\r\n",
    "te-two-headers": b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n",
    "te-on-http10": b"POST / HTTP/1.0\r\n" + H + b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "http2-version": b"GET / HTTP/2.0\r\n" + H + b"\r\n",
    "http09": b"GET /\r\n\r\n",
    "missing-host": b"GET / HTTP/1.1\r\nAccept: */*\r\n\r\n",
    "two-hosts": b"GET / HTTP/1.1\r\n" + H + b"Host: evil.example.com\r\n\r\n",
    "host-with-path": b"GET / HTTP/1.1\r\nHost: a.example.com/evil\r\n\r\n",
    "host-with-userinfo": b"GET / HTTP/1.1\r\nHost: user@a.example.com\r\n\r\n",
    "host-bad-port": b"GET / HTTP/1.1\r\nHost: a.example.com:99999\r\n\r\n",
    "host-empty": b"GET / HTTP/1.1\r\nHost: \r\n\r\n",
    "absolute-form-other-host": b"GET http://evil.example.com/x HTTP/1.1\r\n" + H + b"\r\n",
    "absolute-form-bad-scheme": b"GET ftp://shop.example.com/x HTTP/1.1\r\n" + H + b"\r\n",
    "asterisk-not-options": b"GET * HTTP/1.1\r\n" + H + b"\r\n",
    "connect": b"CONNECT shop.example.com:443 HTTP/1.1\r\nHost: shop.example.com:443\r\n\r\n",
    "websocket-with-body": b"GET / HTTP/1.1\r\n" + H + b"Connection: Upgrade\r\nUpgrade: websocket\r\n"
    b"Content-Length: 3\r\n\r\nabc",
    "h2c-with-body": b"POST / HTTP/1.1\r\n"
    + H
    + b"Connection: Upgrade\r\nUpgrade: h2c\r\nContent-Length: 3\r\n\r\nabc",
}


@pytest.mark.parametrize("raw", list(REJECTED_BY_HTTPTOOLS.values()), ids=list(REJECTED_BY_HTTPTOOLS))
def test_httptools_rejects(raw):
    with pytest.raises(httptools.HttpParserError):
        parse(raw)


@pytest.mark.parametrize("raw", list(REJECTED_BY_FRAMING.values()), ids=list(REJECTED_BY_FRAMING))
def test_framing_rejects_what_httptools_lets_through(raw):
    with pytest.raises(HeadError) as info:
        parse(raw)
    assert info.value.status in (400, 405)


def test_connect_is_405():
    with pytest.raises(HeadError) as info:
        parse(REJECTED_BY_FRAMING["connect"])
    assert info.value.status == 405


def test_header_count_cap_includes_host():
    hundred = b"GET / HTTP/1.1\r\n" + H + b"".join(b"X-%d: v\r\n" % i for i in range(99)) + b"\r\n"
    assert len(parse(hundred).headers) == 100
    with pytest.raises(HeadError) as info:
        parse(hundred.replace(b"\r\n\r\n", b"\r\nX-Last: v\r\n\r\n"))
    assert info.value.status == 431


def test_header_bytes_cap():
    line = b"X-Big: " + b"a" * 1000 + b"\r\n"
    ok = b"GET / HTTP/1.1\r\n" + H + line * 60 + b"\r\n"
    parse(ok)
    with pytest.raises(HeadError) as info:
        parse(b"GET / HTTP/1.1\r\n" + H + line * 70 + b"\r\n")
    assert info.value.status == 431
    with pytest.raises(HeadError):
        parse(ok, max_bytes=1024)


def test_content_length_framing():
    head = parse(b"POST /p?q=1 HTTP/1.1\r\n" + H + b"Content-Length: 5 \r\n\r\nhello")
    assert head.content_length == 5 and not head.chunked and head.has_body
    assert head.target == b"/p?q=1" and head.path == b"/p"
    assert head.host == "shop.example.com" and head.keep_alive


def test_chunked_framing_any_case():
    head = parse(b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: ChunKed \r\n\r\n0\r\n\r\n")
    assert head.chunked and head.content_length is None and head.has_body


def test_no_body_framing():
    head = parse(b"GET / HTTP/1.1\r\n" + H + b"Connection: close\r\n\r\n")
    assert not head.has_body and not head.keep_alive


def test_http10_without_host_is_allowed():
    head = parse(b"GET / HTTP/1.0\r\n\r\n")
    assert head.host == "" and head.version == "1.0" and not head.keep_alive


def test_absolute_form_becomes_origin_form():
    head = parse(b"GET https://SHOP.example.com:443/x?y=1 HTTP/1.1\r\n" + H + b"\r\n")
    assert head.target == b"/x?y=1"
    head = parse(b"GET http://shop.example.com HTTP/1.1\r\n" + H + b"\r\n")
    assert head.target == b"/"
    head = parse(b"GET http://shop.example.com?a HTTP/1.1\r\n" + H + b"\r\n")
    assert head.target == b"/?a"


def test_options_asterisk():
    assert parse(b"OPTIONS * HTTP/1.1\r\n" + H + b"\r\n").target == b"*"


def test_websocket_and_other_upgrades():
    ws = parse(
        b"GET /ws HTTP/1.1\r\n" + H + b"Connection: keep-alive, Upgrade\r\nUpgrade: WebSocket\r\n" + WS_KEY + b"\r\n"
    )
    assert ws.websocket and ws.websocket_key == b"dGhlIHNhbXBsZSBub25jZQ=="
    h2c = parse(b"GET / HTTP/1.1\r\n" + H + b"Connection: Upgrade\r\nUpgrade: h2c\r\n\r\n")
    assert not h2c.websocket  # served as a plain request; hygiene drops the Upgrade
    post_ws = parse(b"POST / HTTP/1.1\r\n" + H + b"Connection: Upgrade\r\nUpgrade: websocket\r\n" + WS_KEY + b"\r\n")
    assert not post_ws.websocket
    no_conn = parse(b"GET / HTTP/1.1\r\n" + H + b"Upgrade: websocket\r\n\r\n")
    assert not no_conn.websocket


@pytest.mark.parametrize(
    ("value", "host"),
    [
        (b"Shop.Example.COM", "shop.example.com"),
        (b"shop.example.com.", "shop.example.com"),
        (b"shop.example.com:8443", "shop.example.com"),
        (b"[::1]:443", "::1"),
        (b"[2001:DB8::1]", "2001:db8::1"),
        (b"10.0.0.1:80", "10.0.0.1"),
        (b"under_score.example.com", "under_score.example.com"),
    ],
)
def test_split_host(value, host):
    assert split_host(value) == host


@pytest.mark.parametrize("value", [b"", b"a b", b"a/b", b"a@b", b"a:b:c", b"[::1", b"a:99999", b"a:", b"\xe9.com"])
def test_split_host_rejects(value):
    assert split_host(value) is None


@pytest.mark.parametrize("status", [400, 403, 404, 405, 408, 414, 421, 429, 431, 502, 503, 504])
def test_error_response(status):
    msg = error_response(status)
    head, _, body = msg.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"HTTP/1.1 %d %s" % (status, REASONS[status])
    assert b"Connection: close" in lines
    assert b"Content-Length: %d" % len(body) in lines
    assert body == b"%d %s\n" % (status, REASONS[status])
    head_only = error_response(status, head_only=True)
    assert head_only == head + b"\r\n\r\n"
    parser_events: list[str] = []

    class P:
        def on_message_complete(self) -> None:
            parser_events.append("done")

    httptools.HttpResponseParser(P()).feed_data(msg)
    assert parser_events == ["done"]


def test_request_head_serialization():
    raw = request_head(b"POST", b"/x", [(b"Host", b"a"), (b"X", b"1")], framing=(b"Content-Length", b"3"))
    assert raw == b"POST /x HTTP/1.1\r\nHost: a\r\nX: 1\r\nContent-Length: 3\r\n\r\n"
    assert request_head(b"GET", b"/", [], framing=None) == b"GET / HTTP/1.1\r\n\r\n"


_FIELD = st.tuples(st.binary(min_size=1, max_size=40), st.binary(max_size=300))


@settings(max_examples=400, deadline=None)
@given(
    method=st.binary(min_size=1, max_size=10),
    target=st.binary(min_size=1, max_size=200),
    fields=st.lists(_FIELD, max_size=30),
    framing=st.none() | _FIELD,
    status=st.integers(100, 599),
    reason=st.binary(max_size=30),
    extra=st.lists(_FIELD, max_size=3),
)
def test_a_head_is_its_pieces_in_order_whatever_they_hold(method, target, fields, framing, status, reason, extra):
    """Both heads byte for byte as the fields say, on both builds (compiled: one sized copy, not a join)."""
    lines = b"".join(name + b": " + value + b"\r\n" for name, value in fields)
    framed = b"" if framing is None else framing[0] + b": " + framing[1] + b"\r\n"
    assert request_head(method, target, fields, framing=framing) == (
        method + b" " + target + b" HTTP/1.1\r\n" + lines + framed + b"\r\n"
    )
    extra_lines = b"".join(name + b": " + value + b"\r\n" for name, value in extra)
    status_line = response_head(status, reason, [])[:-2]
    assert status_line.startswith(b"HTTP/1.1 %d " % status) and status_line.endswith(b"\r\n")
    assert response_head(status, reason, fields, extra) == status_line + lines + extra_lines + b"\r\n"
    assert response_head(status, reason, tuple(fields), tuple(extra)) == status_line + lines + extra_lines + b"\r\n"


def test_a_head_of_other_buffer_types_or_a_generator_is_still_written():
    # what the join took, the head still takes: a bytearray or memoryview value, fields from a generator
    fields = [(b"A", bytearray(b"1")), (b"B", memoryview(b"22"))]
    expected = b"GET / HTTP/1.1\r\nA: 1\r\nB: 22\r\n\r\n"
    assert request_head(b"GET", b"/", fields, framing=None) == expected
    assert request_head(b"GET", b"/", iter(fields), framing=None) == expected
    assert response_head(200, b"OK", iter([(b"A", b"1")]), iter([(b"C", b"x")])).endswith(b"\r\nA: 1\r\nC: x\r\n\r\n")
    with pytest.raises(TypeError):
        request_head(b"GET", b"/", [(b"A", "text")], framing=None)  # a str is not bytes, compiled or not
    with pytest.raises(TypeError):
        request_head(b"GET", b"/", [(b"A", None)], framing=None)
    with pytest.raises(ValueError):
        request_head(b"GET", b"/", [(b"A", b"1", b"2")], framing=None)


def test_response_head_serialization():
    raw = response_head(200, b"OK", [(b"A", b"1")], [(b"Connection", b"close")])
    assert raw == b"HTTP/1.1 200 OK\r\nA: 1\r\nConnection: close\r\n\r\n"
    assert response_head(421, b"", []) == b"HTTP/1.1 421 Misdirected Request\r\n\r\n"


# --- the front door: WebSocket handshakes and request-line protocols (issue 12) -----------------------------

WS = b"GET /ws HTTP/1.1\r\n" + H + b"Connection: Upgrade\r\nUpgrade: websocket\r\n"


@pytest.mark.parametrize(
    "keys",
    [
        b"",
        b"Sec-WebSocket-Key: k\r\n",
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ\r\n",  # padding missing
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZXg=\r\n",  # 17 bytes
        b"Sec-WebSocket-Key: \r\n",
        WS_KEY + WS_KEY,
    ],
    ids=["missing", "short", "unpadded", "17-bytes", "empty", "twice"],
)
def test_websocket_upgrade_needs_one_valid_key(keys):
    with pytest.raises(HeadError) as err:
        parse(WS + keys + b"\r\n")
    assert err.value.status == 400


def test_websocket_accept_matches_rfc6455_example():
    assert websocket_accept(b"dGhlIHNhbXBsZSBub25jZQ==") == b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo="


@pytest.mark.parametrize("line", [b"GET / RTSP/1.0", b"DESCRIBE / RTSP/1.0", b"SOURCE / ICE/1.0"])
def test_llhttp_takes_rtsp_and_ice_as_version_1_0(line):
    """Why request_line_is_http exists: the parser alone cannot tell these from HTTP/1.0."""
    c = _Collector(None)
    p = httptools.HttpRequestParser(c)
    c.parser = p
    p.feed_data(line + b"\r\n" + H + b"\r\n")
    assert c.facts["version"] == "1.0"


@pytest.mark.parametrize(
    "raw, method, url",
    [
        (b"GET / RTSP/1.0\r\n" + H + b"\r\n", b"GET", b"/"),
        (b"DESCRIBE / RTSP/1.0\r\n" + H + b"\r\n", b"DESCRIBE", b"/"),
        (b"SOURCE / ICE/1.0\r\n" + H + b"\r\n", b"SOURCE", b"/"),
        (b"\r\nGET /a RTSP/1.0\r\n" + H + b"\r\n", b"GET", b"/a"),
        (b"0\r\n\r\nGET /a RTSP/1.0\r\n" + H + b"\r\n", b"GET", b"/a"),  # after a chunked body's end
        # the same line pipelined with both protocols: refused (a client mixing them gets no forward)
        (b"GET /a HTTP/1.1\r\n" + H + b"\r\n" + b"GET /a RTSP/1.0\r\n" + H + b"\r\n", b"GET", b"/a"),
    ],
)
def test_rtsp_and_ice_request_lines_are_not_http(raw, method, url):
    assert not request_line_is_http(raw, method, url)


@pytest.mark.parametrize(
    "raw, method, url",
    [
        (b"GET / HTTP/1.1\r\n" + H + b"\r\n", b"GET", b"/"),
        (b"GET / HTTP/1.0\r\n\r\n", b"GET", b"/"),
        (b"GET / HTTP/1.1\r\n" + H + b"X-Note: GET / RTSP/1.0\r\n\r\n", b"GET", b"/"),  # a value, not a line
        (b"GET /RTSP/ICE/ HTTP/1.1\r\n" + H + b"\r\n", b"GET", b"/RTSP/ICE/"),
        (b"GET / HTTP/1.1\r\n" + H + b"\r\nGET /b RTSP/1.0\r\n\r\n", b"GET", b"/"),  # its own 400 later
    ],
)
def test_http_request_lines_pass(raw, method, url):
    assert request_line_is_http(raw, method, url)


def test_measured_budget_counts_a_field_list_as_add_does():
    """An h2 request's fields are measured in one call: the same count and size as one ``add`` per field."""
    fields = [(b"host", b"a.example"), (b"user-agent", b"h2load"), (b"accept", b"*/*"), (b"cookie", b"")]
    one_by_one = HeaderBudget(100, 1 << 20)
    for name, value in fields:
        one_by_one.add(name, value)
    measured = measured_budget(fields)
    assert (measured.count, measured.size) == (one_by_one.count, one_by_one.size) == (4, 60)
    assert (measured_budget([]).count, measured_budget([]).size) == (0, 0)

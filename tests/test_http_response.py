"""Response framing, sans-IO: a backend's raw response through httptools and sentin8.http.response, byte for
byte what the client gets, for every framing case (RFC 9112 §6.3) and both client versions."""

from __future__ import annotations

import httptools
import pytest

from sentin8.http.framing import HeadError
from sentin8.http.head_writer import response_head
from sentin8.http.headers import response_headers
from sentin8.http.response import (
    INTERIM_MAX_BYTES,
    INTERIM_MAX_COUNT,
    LAST_CHUNK,
    chunk_size_line,
    coalesce,
    encode_chunks,
    heads_within_budget,
    interim_within_budget,
    response_framing,
    split,
    status_line_acceptable,
    upstream_reusable,
    without_content_length,
)

LIMIT = 16 * 1024


class _Relay:
    """What the bridge does with one response: parse, frame, re-encode the (decoded) body."""

    def __init__(self, head_only: bool, version: str, keep_alive: bool, websocket: bool, draining: bool) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.req = {
            "head_only": head_only,
            "version": version,
            "keep_alive": keep_alive,
            "websocket": websocket,
            "draining": draining,
        }
        self.headers: list[tuple[bytes, bytes]] = []
        self.reason = b""
        self.out: list[bytes] = []
        self.framing = None
        self.complete = False

    def on_status(self, reason: bytes) -> None:
        self.reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        f = self.framing = response_framing(status, self.headers, **self.req)
        headers = response_headers(self.headers)
        if f.drop_content_length:
            headers = without_content_length(headers)
        self.out.append(response_head(status, self.reason, headers, f.extra))

    def on_body(self, body: bytes) -> None:
        assert self.framing is not None
        self.out += encode_chunks(body, LIMIT) if self.framing.chunked_out else split(body, LIMIT)

    def on_message_complete(self) -> None:
        assert self.framing is not None
        if self.framing.chunked_out:
            self.out.append(LAST_CHUNK)
        self.complete = True


def relay(
    raw: bytes,
    *,
    head_only: bool = False,
    version: str = "1.1",
    keep_alive: bool = True,
    websocket: bool = False,
    draining: bool = False,
    backend_closes: bool = False,
) -> tuple[bytes, _Relay]:
    r = _Relay(head_only, version, keep_alive, websocket, draining)
    try:
        r.parser.feed_data(raw)
        if backend_closes:
            r.parser.feed_data(b"")  # httptools: EOF ends a close-delimited body
    except httptools.HttpParserCallbackError as exc:
        if isinstance(exc.__context__, HeadError):
            raise exc.__context__ from None
        raise
    if backend_closes and r.framing is not None and r.framing.close_delimited and not r.complete:
        r.on_message_complete()  # the bridge: the upstream close ends the body
    return b"".join(r.out), r


def test_content_length_passes_through_and_keeps_the_connection():
    out, r = relay(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\n\r\nhello")
    assert out == b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\n\r\nhello"
    f = r.framing
    assert not f.chunked_out and not f.close_delimited and not f.close_client


def test_chunked_is_rechunked_and_its_extensions_and_trailers_dropped():
    raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nT: x\r\n\r\n"
    out, r = relay(raw)
    assert out == b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    assert r.framing.chunked_out and not r.framing.close_client


def test_close_delimited_becomes_chunked_for_http11():
    out, r = relay(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nstream", backend_closes=True)
    assert out == b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nstream\r\n0\r\n\r\n"
    f = r.framing
    assert f.close_delimited and f.chunked_out and not f.close_client


def test_close_delimited_stays_close_delimited_for_http10():
    out, r = relay(b"HTTP/1.1 200 OK\r\n\r\nstream", version="1.0", keep_alive=False, backend_closes=True)
    assert out == b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nstream"
    assert r.framing.close_delimited and not r.framing.chunked_out and r.framing.close_client


def test_chunked_to_an_http10_client_is_sent_decoded_and_closed():
    raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
    out, r = relay(raw, version="1.0", keep_alive=True)
    assert out == b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nabc"
    assert not r.framing.chunked_out and r.framing.close_client


def test_content_length_beside_chunked_is_dropped():
    # llhttp refuses CL with TE in a response too, unless lenient; the rule still lives here for other parsers.
    f = response_framing(
        200,
        [(b"Content-Length", b"3"), (b"Transfer-Encoding", b"chunked")],
        head_only=False,
        version="1.1",
        keep_alive=True,
        websocket=False,
        draining=False,
    )
    assert f.drop_content_length and f.chunked_out
    assert without_content_length([(b"content-LENGTH", b"3"), (b"X", b"y")]) == [(b"X", b"y")]


@pytest.mark.parametrize("status", [204, 304])
def test_no_body_statuses_get_no_framing(status):
    out, r = relay(b"HTTP/1.1 %d X\r\nETag: 1\r\n\r\n" % status)
    assert out == b"HTTP/1.1 %d X\r\nETag: 1\r\n\r\n" % status
    assert not r.framing.chunked_out and not r.framing.close_delimited


def test_head_keeps_content_length_and_adds_nothing():
    f = response_framing(
        200, [(b"Content-Length", b"99")], head_only=True, version="1.1", keep_alive=True, websocket=False,
        draining=False,
    )  # fmt: skip
    assert not f.chunked_out and not f.close_delimited and f.extra == ()
    f = response_framing(200, [], head_only=True, version="1.1", keep_alive=True, websocket=False, draining=False)
    assert not f.chunked_out and not f.close_delimited and not f.close_client


@pytest.mark.parametrize(
    "req",
    [
        {"draining": True},
        {"keep_alive": False},
        {"websocket": True},  # a refused upgrade: the client's connection was meant to become a tunnel
        {"version": "1.0"},
    ],
)
def test_connection_close_is_added_when_the_client_connection_ends(req):
    out, r = relay(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nok", **req)
    assert out == b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
    assert r.framing.close_client


def test_chunked_and_close_are_both_added_in_order():
    out, _ = relay(b"HTTP/1.1 200 OK\r\n\r\nxy", draining=True, backend_closes=True)
    assert out == b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n2\r\nxy\r\n0\r\n\r\n"


@pytest.mark.parametrize("coding", [b"gzip", b"gzip, chunked", b"identity"])
def test_other_transfer_codings_are_refused(coding):
    headers = [(b"Transfer-Encoding", coding)]
    with pytest.raises(HeadError) as exc:
        response_framing(200, headers, head_only=False, version="1.1", keep_alive=True, websocket=False, draining=False)
    assert exc.value.status == 502


def test_chunk_encoding_keeps_every_framed_piece_within_the_limit():
    assert encode_chunks(b"", LIMIT) == []  # never a premature last-chunk
    assert encode_chunks(b"abc", LIMIT) == [b"3\r\nabc\r\n"]
    data = bytes(range(256)) * 200  # 51,200 bytes
    pieces = encode_chunks(data, LIMIT)
    assert all(len(p) <= LIMIT for p in pieces) and len(pieces) == 4
    decoded = b""
    for p in pieces:
        size_line, _, rest = p.partition(b"\r\n")
        assert rest.endswith(b"\r\n") and int(size_line, 16) == len(rest) - 2
        decoded += rest[:-2]
    assert decoded == data
    assert chunk_size_line(4096) == b"1000\r\n"


def test_split_and_coalesce():
    assert split(b"abc", 4) == [b"abc"]
    assert split(b"abcdefghij", 4) == [b"abcd", b"efgh", b"ij"]
    assert coalesce([b"abc"], 4) == [b"abc"]
    assert coalesce([b"ab", b"cd", b"e", b"fghij", b"k"], 4) == [b"abcd", b"e", b"fghij", b"k"]


def test_upstream_reuse_needs_a_clean_known_end():
    ok = {
        "backend_keep_alive": True,
        "extra_bytes": False,
        "head_only": False,
        "close_delimited": False,
        "request_complete": True,
    }
    assert upstream_reusable(**ok)
    for key in ok:
        assert not upstream_reusable(**{**ok, key: not ok[key]}), key


# --- issue 16: status lines and interim budgets ---------------------------------------------------------------


def _status_of(raw: bytes) -> list[int]:
    """The status the parser reports at each head of ``raw``, as the relay reads it."""
    seen: list[int] = []

    class P:
        def on_headers_complete(self) -> None:
            seen.append(p.get_status_code())

    p = httptools.HttpResponseParser(P())
    try:
        p.feed_data(raw)
    except httptools.HttpParserError:
        pass
    return seen


@pytest.mark.parametrize(
    ("line", "ok"),
    [
        (b"HTTP/1.1 200 OK", True),
        (b"HTTP/1.0 200 OK", True),
        (b"HTTP/1.1 100 Continue", True),
        (b"HTTP/1.1 599 Custom", True),
        (b"HTTP/1.1 200", True),
        (b"HTTP/2.0 200 OK", False),
        (b"HTTP/0.9 200 OK", False),
        (b"RTSP/1.0 200 OK", False),
        (b"ICE/1.0 200 OK", False),
        (b"HTTP/1.1 999 Nine", False),
        (b"HTTP/1.1 099 Low", False),
        (b"HTTP/1.1 000 Zero", False),
        (b"HTTP/1.1 600 Six", False),
    ],
)
def test_status_lines_as_the_parser_lets_them_through(line, ok):
    raw = line + b"\r\nContent-Length: 0\r\n\r\n"
    status, *_ = _status_of(raw)  # llhttp takes every one of these
    assert status_line_acceptable(raw, 0, status) is ok
    assert status_line_acceptable(b"\r\n\r\n" + raw, 0, status) is ok  # the empty lines llhttp skips


@pytest.mark.parametrize("final", [b"HTTP/1.1 200 OK", b"RTSP/1.0 200 OK", b"ICE/1.0 200 OK", b"HTTP/2.0 200 OK"])
def test_a_status_line_after_interim_responses_is_checked_too(final):
    raw = b"HTTP/1.1 100 Continue\r\n\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + final + b"\r\n\r\n"
    heads = _status_of(raw)
    assert len(heads) == 3
    assert status_line_acceptable(raw, 0, heads[0]) and status_line_acceptable(raw, 1, heads[1])
    assert status_line_acceptable(raw, 2, heads[2]) is (final == b"HTTP/1.1 200 OK")
    assert not status_line_acceptable(raw[:20], 2, 200)  # the head is not in raw: never a guess


def test_interim_budget():
    assert (INTERIM_MAX_COUNT, INTERIM_MAX_BYTES) == (8, 65536)
    assert interim_within_budget(8, 65536)
    assert not interim_within_budget(9, 100)
    assert not interim_within_budget(1, 65537)
    assert heads_within_budget(65536 + 131072, 131072)
    assert not heads_within_budget(65536 + 131073, 131072)


# --------------------------------------------------------------------------------------------------------
# The split: the exchange's half (upstream_body) and the client writer's (client_framing, H1Response)
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [200, 204, 304])
@pytest.mark.parametrize(
    "headers",
    [[], [(b"Content-Length", b"3")], [(b"Transfer-Encoding", b"chunked")],
     [(b"Transfer-Encoding", b"chunked"), (b"Content-Length", b"3")]],
)  # fmt: skip
@pytest.mark.parametrize("head_only", [False, True])
def test_upstream_body_says_where_the_body_ends_whatever_the_client(status, headers, head_only):
    from sentin8.http.response import upstream_body

    body = upstream_body(status, headers, head_only=head_only)
    chunked = any(n == b"Transfer-Encoding" for n, _ in headers)
    length = any(n == b"Content-Length" for n, _ in headers)
    assert body.no_body == (head_only or status in (204, 304))
    assert body.until_close == (not body.no_body and not chunked and not length)
    assert body.chunked == (chunked and not body.no_body)
    assert body.drop_content_length == (chunked and length)


def test_the_h1_writer_frames_the_client_half():
    from sentin8.http.framing import validate_request
    from sentin8.http.h1_response import CONTINUE, H1Response
    from sentin8.http.response import upstream_body

    def head(version: str, method: bytes = b"GET"):
        return validate_request(method, b"/", version, [(b"Host", b"a")], keep_alive=version == "1.1", upgrade=False)

    w = H1Response(head("1.1"), head_only=False)
    assert w.continue_() == CONTINUE and w.interim(100, b"Continue", []) is None  # our own 100 is not repeated
    assert w.interim(103, b"Early Hints", [(b"Link", b"</a>")]).startswith(b"HTTP/1.1 103 Early Hints\r\n")
    until_close = upstream_body(200, [], head_only=False)
    assert w.head(200, b"OK", [], until_close, draining=False).endswith(b"Transfer-Encoding: chunked\r\n\r\n")
    assert w.chunked and not w.close
    assert w.body(b"abc", LIMIT) == [b"3\r\nabc\r\n"] and w.end() == LAST_CHUNK
    w.abort()
    assert w.close  # a response cut off: only the close can tell the client

    old = H1Response(head("1.0"), head_only=False)
    assert old.interim(103, b"Early Hints", []) is None  # never a 1xx to HTTP/1.0 (RFC 9110 §15.2)
    assert old.head(200, b"OK", [], until_close, draining=False) == b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n"
    assert old.close and not old.chunked and old.body(b"abc", LIMIT) == [b"abc"] and old.end() is None

    err = H1Response(head("1.1", b"HEAD"), head_only=True)
    out = err.error(503)
    assert err.close and out.endswith(b"Connection: close\r\n\r\n")  # HEAD: no body
    kept = H1Response(head("1.1"), head_only=False)
    assert not kept.local(429, [(b"Retry-After", b"1")], keep=True, body=None).endswith(b"Connection: close\r\n\r\n")
    assert not kept.close
    assert b"Connection: close" in kept.local(429, [], keep=False, body=b"x") and kept.close

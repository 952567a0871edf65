"""Response framing towards the client, the keep-alive decisions and chunk encoding, sans-IO.

The bridge relays a backend's response with httptools, which hands over the body *decoded* (chunk framing
removed). What goes back to the client is framed again here, by one rule (RFC 9112 §6.3):

- no body (HEAD, 204, 304): the head only; a Content-Length is kept as information.
- ``Transfer-Encoding: chunked`` from the backend: re-chunked (a Content-Length beside it is dropped; the
  chunked framing wins, §6.3 item 3).
- a Content-Length and no Transfer-Encoding: passed through, the body relayed as it comes.
- neither: the body ends when the backend closes ("close-delimited"). An HTTP/1.1 client gets it chunked and
  keeps its connection; an HTTP/1.0 client gets it close-delimited too.
- any other transfer coding: refused (we would have to pass on a coding the client did not ask for) -> 502.

The client connection closes after the response when the proxy drains, the client asked (``Connection:
close``, HTTP/1.0 without keep-alive), the request was a WebSocket upgrade refused by the backend, or the body
is close-delimited towards the client. ``tests/test_http_response.py`` pins each case byte for byte.

Before any of that, each status line must be HTTP/1.x with a three-digit 1xx-5xx code
(``status_line_acceptable``): llhttp also takes ``HTTP/2.0``, ``HTTP/0.9``, ``RTSP/1.0`` and ``ICE/1.0``
status lines and any code from 000 to 999, and the bridge would relay them as HTTP/1.1. Interim (1xx)
responses are relayed but bounded (``interim_within_budget``): a backend cannot keep a client reading
informational heads forever. Either refusal is a 502 (nothing final has been sent yet).

An HTTP/2 client (``version`` ``H2_VERSION``) gets DATA frames, never chunk encoding, and its connection
outlives every response: the stream ends, and closing (drain included) is the connection's GOAWAY.
"""

from __future__ import annotations

from .framing import H2_VERSION, Header, HeadError

# Interim responses per request, and the bytes of their heads together (status lines and header lines as the
# header caps count them). A real server sends a 100 Continue and a 103 Early Hints or two; Go's HTTP client
# gives up after 5 (max1xxResponses). 64 KiB is one request head at the default policy.max_header_bytes.
INTERIM_MAX_COUNT = 8
INTERIM_MAX_BYTES = 64 * 1024

LAST_CHUNK = b"0\r\n\r\n"
CRLF = b"\r\n"
_CHUNKED: Header = (b"Transfer-Encoding", b"chunked")
_CLOSE: Header = (b"Connection", b"close")
# (chunked_out, close) -> the headers the proxy adds, prebuilt: the per-response path allocates none
_EXTRA: dict[tuple[bool, bool], tuple[Header, ...]] = {
    (False, False): (),
    (False, True): (_CLOSE,),
    (True, False): (_CHUNKED,),
    (True, True): (_CHUNKED, _CLOSE),
}


class ResponseFraming:
    """How one final (>= 200) response is framed towards the client. Shared instances: read, never write."""

    __slots__ = ("chunked_out", "close_client", "close_delimited", "drop_content_length", "extra")

    def __init__(
        self,
        chunked_out: bool,
        close_delimited: bool,
        close_client: bool,
        drop_content_length: bool,
        extra: tuple[Header, ...],
    ) -> None:
        self.chunked_out = chunked_out  # the body goes to the client chunk-encoded by us
        self.close_delimited = close_delimited  # the backend's body ends when it closes the connection
        self.close_client = close_client  # the client connection closes after this response
        self.drop_content_length = drop_content_length  # Content-Length beside chunked: not forwarded
        self.extra = extra  # headers the proxy adds after the forwarded ones


class UpstreamBody:
    """How the backend delimits one final response's body: the exchange's half of the framing (it needs to
    know when the body ends and whether the backend connection can be reused). Shared instances: read, never
    write."""

    __slots__ = ("chunked", "drop_content_length", "no_body", "until_close")

    def __init__(self, no_body: bool, chunked: bool, until_close: bool, drop_content_length: bool) -> None:
        self.no_body = no_body  # HEAD, 204, 304: the head only
        self.chunked = chunked  # a body the backend sends chunked (decoded by the parser)
        self.until_close = until_close  # neither chunked nor a Content-Length: the body ends when it closes
        self.drop_content_length = drop_content_length  # Content-Length beside chunked: not forwarded


# every shape, made once and indexed by its four flags as bits (no_body 8, chunked 4, until_close 2, drop 1):
# a response's lookup is a list index, not a tuple of four built and hashed
_BODIES = [UpstreamBody(bool(i & 8), bool(i & 4), bool(i & 2), bool(i & 1)) for i in range(16)]


def upstream_body(status: int, headers: list[Header], *, head_only: bool) -> UpstreamBody:
    """How the backend's final response delimits its body (``headers`` as received). Raises
    ``HeadError(502)`` for a transfer coding other than chunked."""
    chunked_in = False
    has_length = False
    for name, value in headers:
        n = len(name)  # length first: the common headers never reach .lower()
        if n == 17 and name.lower() == b"transfer-encoding":
            if value.strip(b" \t").lower() != b"chunked":
                raise HeadError(502, "a transfer coding other than chunked")
            chunked_in = True
        elif n == 14 and name.lower() == b"content-length":
            has_length = True
    no_body = head_only or status == 204 or status == 304
    until_close = not no_body and not chunked_in and not has_length
    bodies = _BODIES  # typed in response.pxd: a C list index
    return bodies[
        (8 if no_body else 0)
        | (4 if chunked_in and not no_body else 0)
        | (2 if until_close else 0)
        | (1 if chunked_in and has_length else 0)
    ]


def client_framing(
    body: UpstreamBody, *, version: str, keep_alive: bool, websocket: bool, draining: bool
) -> ResponseFraming:
    """The client's half: how a final response whose body is delimited as ``body`` is framed towards the
    client. ``version``, ``keep_alive`` and ``websocket`` describe the client's request."""
    chunked_out = (body.chunked or body.until_close) and version == "1.1"
    close_delimited = body.until_close
    if version == H2_VERSION:
        close = False  # a stream ends with END_STREAM; the connection is closed by its own GOAWAY
    else:
        close = draining or not keep_alive or version != "1.1" or websocket or (close_delimited and not chunked_out)
    return _FRAMINGS[chunked_out, close_delimited, close, body.drop_content_length]


def response_framing(
    status: int,
    headers: list[Header],
    *,
    head_only: bool,
    version: str,
    keep_alive: bool,
    websocket: bool,
    draining: bool,
) -> ResponseFraming:
    """Frame a final response: ``upstream_body`` (the exchange's half) then ``client_framing`` (the client
    writer's). ``headers`` are the backend's as received. Raises ``HeadError(502)`` for a transfer coding
    other than chunked."""
    body = upstream_body(status, headers, head_only=head_only)
    return client_framing(body, version=version, keep_alive=keep_alive, websocket=websocket, draining=draining)


# Every outcome prebuilt (16 of them, immutable by convention): framing a response allocates nothing.
_FRAMINGS = {
    (chunked, delimited, close, drop): ResponseFraming(chunked, delimited, close, drop, _EXTRA[chunked, close])
    for chunked in (False, True)
    for delimited in (False, True)
    for close in (False, True)
    for drop in (False, True)
}


def status_line_acceptable(raw: bytes, index: int, status: int) -> bool:
    """Whether the ``index``-th message of a response stream (0 = the first) has an ``HTTP/1.1`` or
    ``HTTP/1.0`` status line with a 1xx-5xx code. ``status`` is the parser's (it also takes 000-999); ``raw``
    holds the stream's bytes from its first one through that message's head. The messages before it are
    interim heads, which have no body, so message ``index`` starts after ``index`` head terminators (and the
    empty lines llhttp skips). The protocol and version are read from ``raw``: the parser reports ``RTSP/1.0``
    and ``ICE/1.0`` as version 1.0, and takes ``HTTP/2.0`` and ``HTTP/0.9``.
    """
    if not 100 <= status <= 599:
        return False
    if index == 0 and raw[:9] in _HTTP1:  # a slice and a tuple scan: startswith parses its arguments per call
        return True  # nearly every response
    at = _past_empty_lines(raw, 0)
    for _ in range(index):
        end = raw.find(b"\r\n\r\n", at)
        if end < 0:
            return False
        at = _past_empty_lines(raw, end + 4)
    return raw.startswith(_HTTP1, at)


_HTTP1 = (b"HTTP/1.1 ", b"HTTP/1.0 ")  # the only HTTP/1.x versions llhttp accepts


def _past_empty_lines(raw: bytes, at: int) -> int:
    """Where a message starts: llhttp skips any CR and LF before a status line."""
    while raw[at : at + 1] in (b"\r", b"\n"):
        at += 1
    return at


def interim_within_budget(count: int, head_bytes: int) -> bool:
    """Whether ``count`` interim responses whose heads took ``head_bytes`` in all may still be relayed."""
    return count <= INTERIM_MAX_COUNT and head_bytes <= INTERIM_MAX_BYTES


def heads_within_budget(held: int, head_cap: int) -> bool:
    """Whether ``held`` bytes of response heads, received before the final head is complete, are within
    what the interim budget and one final head (``head_cap``, the response header caps) may take: a
    head line that never ends is cut off here rather than buffered without end."""
    return held <= INTERIM_MAX_BYTES + head_cap


def without_content_length(headers: list[Header]) -> list[Header]:
    return [h for h in headers if h[0].lower() != b"content-length"]


def upstream_reusable(
    *, backend_keep_alive: bool, extra_bytes: bool, head_only: bool, close_delimited: bool, request_complete: bool
) -> bool:
    """Whether the backend connection may carry another request after this response: the backend keeps it
    alive, sent nothing past the response, the response's end was known from its framing (after a HEAD the
    parser cannot know, so a body the backend sent anyway could still be coming), and the whole request went
    out (a response before the request's end leaves the request body unsent)."""
    return backend_keep_alive and not extra_bytes and not head_only and not close_delimited and request_complete


def chunk_size_line(size: int) -> bytes:
    """``b"1a\\r\\n"``: what precedes ``size`` bytes of chunk data (the data is followed by CRLF)."""
    return b"%x\r\n" % size


def chunk(data: bytes) -> tuple[bytes, ...]:
    """``data`` as one chunk of a chunked body: size line, data, CRLF; nothing at all for no data. A zero-size
    chunk is the last-chunk marker: written for an empty read (an HTTP/2 client's empty DATA frame with
    END_STREAM is one) it would end the body there, and the peer would take every byte after it for a request
    (or response) of its own: framing it carries is smuggled."""
    if not data:
        return ()
    return (chunk_size_line(len(data)), data, CRLF)


def encode_chunks(data: bytes, limit: int) -> list[bytes]:
    """``data`` as chunks, each framed chunk (size line, data, CRLF) at most ``limit`` bytes (one TLS record)."""
    step = limit - 16  # room for the size line and the CRLF: a framed piece stays within limit
    if not data:
        return []  # an empty chunk would be the last-chunk marker
    if len(data) <= step:
        return [b"%x\r\n%b\r\n" % (len(data), data)]
    return [b"%x\r\n%b\r\n" % (len(p), p) for p in (data[i : i + step] for i in range(0, len(data), step))]


def split(data: bytes, limit: int) -> list[bytes]:
    """``data`` in pieces of at most ``limit`` bytes."""
    if len(data) <= limit:
        return [data]
    return [data[i : i + limit] for i in range(0, len(data), limit)]


def coalesce(pieces: list[bytes], limit: int) -> list[bytes]:
    """Join consecutive pieces into as few writes as possible, none over ``limit`` bytes (a piece already
    larger than ``limit`` stays whole)."""
    if len(pieces) == 1:
        return pieces
    out: list[bytes] = []
    group: list[bytes] = []
    size = 0
    for piece in pieces:
        if size + len(piece) > limit and group:
            out.append(group[0] if len(group) == 1 else b"".join(group))
            group, size = [], 0
        group.append(piece)
        size += len(piece)
    if group:
        out.append(group[0] if len(group) == 1 else b"".join(group))
    return out

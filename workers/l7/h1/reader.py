"""The request half of a client connection: the httptools request callbacks. They cap the head (431/414),
validate it (400 and the smuggling shapes, ``sentin8/http/framing.py``), queue a complete head, and hand body
bytes to the request's exchange (or hold them until it has one). A malformed request stops the parser: it is
answered in its turn, and the connection closes. The body is bounded here as it streams
(``sentin8/http/body.py``): a chunk size that cannot be real (400), a body over
``limits.max_request_body_bytes`` (413; a declared Content-Length is refused at admission).

``RequestReader`` is the base of ``L7Bridge`` (connection.py): one object per connection, this module the
parser's side of it.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging

import httptools

from sentin8 import refusals
from sentin8.http.body import body_over_limit, chunk_size_acceptable
from sentin8.http.framing import HeaderBudget, HeadError, request_line_is_http, validate_request
from sentin8.http.llhttp_private import VERSIONS, chunk_size_view, version_view

from ...deadline import BODY, HEADER, Deadline
from ..contract import L7Context
from ..request import Request, Stop
from .flow import STOPPED, ReadPause
from .writer import ResponseWriter

log = logging.getLogger("sentin8.l7")

_NO_VIEW = ctypes.c_uint64(0)  # chunk sizes cannot be read (llhttp_private): every chunk looks small
_NO_VERSION = ctypes.c_uint16(0)  # versions cannot be read so (llhttp_private): the parser formats each one
_VIEW_NEXT = ctypes.c_uint16(0)  # the first head was formatted by the parser: the second makes the view


class RequestReader(ResponseWriter):
    # Provided by L7Bridge.
    ctx: L7Context
    loop: asyncio.AbstractEventLoop
    _closing: bool
    _read: ReadPause
    _req: Request | None
    _upgrade_req: Request | None
    _max_headers: int
    _max_header_bytes: int
    _feeding: bytes
    _head_raw: int
    _parser: httptools.HttpRequestParser
    _progress: bool
    _completed_in_feed: bool
    _deadline: Deadline
    _body_cap: int  # limits.max_request_body_bytes (0 = none)
    _chunk_size: ctypes.c_uint64 | None  # the parser's current chunk size, looked up at the first chunk
    _version: ctypes.c_uint16 | None  # the parser's HTTP version, looked up at the second head

    def _enqueue(self, req: Request) -> None:
        raise NotImplementedError

    def _abort(self) -> None:
        raise NotImplementedError

    def hold_body(self, req: Request, body: bytes) -> None:
        raise NotImplementedError

    # -- httptools request callbacks -------------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self._closing or self._read.bits & STOPPED:
            raise Stop
        req = self._req = Request(HeaderBudget(self._max_headers, self._max_header_bytes))
        req.line_raw.append(self._feeding)
        self._head_raw = 0

    def on_url(self, url: bytes) -> None:
        req = self._req
        assert req is not None
        req.url += url
        if len(req.url) > self._max_header_bytes:
            self._reject(414)
            raise Stop

    def on_header(self, name: bytes, value: bytes) -> None:
        req = self._req
        assert req is not None
        if req.head is None:
            try:
                req.budget.add(name, value)
            except HeadError as exc:
                self._reject(exc.status)
                raise Stop from None
            req.headers.append((name, value))
        else:
            # Trailers are dropped (a recipient may discard them, RFC 9110 §6.5.1); still bounded.
            req.trailer_bytes += len(name) + len(value) + 4
            if req.trailer_bytes > self._max_header_bytes:
                self._body_failed(400)
                raise Stop

    def on_headers_complete(self) -> None:
        req = self._req
        assert req is not None
        if self._closing:
            raise Stop
        self._progress = True
        p = self._parser
        raw, req.line_raw = req.line_raw, []
        view = self._version
        if view is None:  # the connection's first head: a view costs two of get_http_version's formattings
            self._version = _VIEW_NEXT
            version = p.get_http_version()
        else:
            if view is _VIEW_NEXT:
                view = self._version = version_view(p) or _NO_VERSION
            version = VERSIONS.get(view.value) or p.get_http_version()
        method = p.get_method()  # once: each call is a method looked up by name and a new bytes object
        if not request_line_is_http(raw[0] if len(raw) == 1 else b"".join(raw), method, req.url):
            self._reject(400)  # RTSP/1.x or ICE/1.0: llhttp reports them as HTTP versions, but they are not HTTP
            raise Stop
        upgrade = p.should_upgrade()
        try:
            req.head = head = validate_request(
                method, req.url, version, req.headers, keep_alive=p.should_keep_alive(), upgrade=upgrade
            )
        except HeadError as exc:
            if exc.counter:
                self.ctx.count(exc.counter)
            self._reject(exc.status)
            raise Stop from None
        self._deadline.disarm_if(HEADER)
        if head.websocket:
            self._upgrade_req = req  # bytes after this head belong to the websocket, not to HTTP
        elif upgrade:
            self.ctx.count("upgrade_ignored")  # h2c, HTTP/1.0, not GET...: a plain request, Upgrade stripped
        self._enqueue(req)

    def on_chunk_header(self) -> None:
        view = self._chunk_size
        if view is None:
            view = self._chunk_size = chunk_size_view(self._parser) or _NO_VIEW
        size = view.value
        if not chunk_size_acceptable(size):
            self.ctx.count("chunk_size_invalid")
            self._body_failed(400)
            raise Stop
        req = self._req
        # The chunk would take the body over the cap: refused now, not after streaming up to the cap.
        if req is not None and body_over_limit(req.received + size, self._body_cap):
            self.ctx.refused(refusals.BODY_CAP)
            self._body_failed(413)
            raise Stop

    def on_body(self, body: bytes) -> None:
        self._progress = True
        req = self._req
        assert req is not None
        # A declared length is admission's to refuse (before a byte is read); here only a chunked body, as it
        # streams (a fallback for when on_chunk_header cannot read chunk sizes).
        if self._body_cap and req.head is not None and req.head.chunked:
            req.received += len(body)
            if body_over_limit(req.received, self._body_cap):
                self.ctx.refused(refusals.BODY_CAP)
                self._body_failed(413)
                raise Stop
        ex = req.exchange
        if ex is not None:
            ex.client_body(body)
        else:
            self.hold_body(req, body)

    def on_message_complete(self) -> None:
        req = self._req
        assert req is not None
        self._req = None
        req.complete = True
        self._progress = True
        self._completed_in_feed = True
        self._deadline.disarm_if(BODY)
        ex = req.exchange
        if ex is not None:
            ex.client_body_end()
            if ex is not self._ex:  # answered before this body ended, and over: break request <-> exchange
                req.exchange = None

    def _reject(self, status: int) -> None:
        """Stop parsing; answer ``status`` (after whatever is in flight) and close. A cap (431, 414) is a
        policy block, counted here where it is decided, not by the status answered (a backend's 431 is none)."""
        refusal = refusals.for_head_status(status)
        if refusal is not None:
            self.ctx.refused(refusal)
        self._read.pause(STOPPED)
        self._deadline.disarm_if(HEADER)
        req = self._req
        self._req = None
        if req is None or req.head is not None:
            req = Request(HeaderBudget(0, 0))
        req.reject = status
        self._enqueue(req)

    def _body_failed(self, status: int) -> None:
        """The body of a request whose head was accepted turned out malformed (400) or too large (413)."""
        req = self._req
        self._req = None
        self._read.pause(STOPPED)
        if req is None:
            return
        ex = req.exchange
        if ex is not None:
            ex.respond_error(status)  # 400, or a plain close when the response already started
        else:
            req.reject = status  # queued behind another request; its turn will answer and close

    def _parse_failed(self, exc: httptools.HttpParserError) -> None:
        cause = exc.__context__
        if self._closing or (isinstance(cause, Stop) and self._read.bits & STOPPED):
            return  # a callback already decided
        if cause is not None and not isinstance(cause, Stop):
            log.error("L7 bridge callback failed", exc_info=cause)
            self.ctx.count("bridge_errors")
            self._abort()
            return
        req = self._req
        if req is not None and req.head is not None:
            self._body_failed(400)
        else:
            self._reject(400)

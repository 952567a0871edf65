"""One HTTP/2 stream as the ``Downstream`` of its exchange (``../downstream.py``): the same events an HTTP/1.1
connection gets, answered with frames through the connection's engine (``sentin8/http/h2_engine.py``).

Response: HEADERS (hop-by-hop fields already dropped by ``response_headers``; a Content-Length beside a
chunked body dropped), DATA within the client's windows (the engine queues), END_STREAM; an abort is
RST_STREAM INTERNAL_ERROR. No chunk encoding, never a connection close: the stream ends, the connection stays.

Request body: DATA bytes count against the stream's and the connection's receive windows until the upstream
takes them. While the exchange has no upstream connection (connecting, or the WAF waits for the whole body)
they are held and consumed up to the hold limit (the WAF's body limit, else 64 KiB); once attached they are
consumed as they are written upstream, unless the upstream's write buffer is full (``pause_body``): then the
windows stay shut, and only this stream waits.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from sentin8.http import h2_codes
from sentin8.http.head_writer import REASONS
from sentin8.http.headers import Header
from sentin8.http.response import UpstreamBody, without_content_length

from ...deadline import Deadline
from ..downstream import ConnectionFacts, Downstream
from ..request import Request

if TYPE_CHECKING:
    from workers.upstream import UpstreamConn

    from ..contract import L7Context
    from ..exchange import Exchange
    from .connection import H2Bridge

BODY_HOLD = 64 * 1024  # request body bytes consumed (windows opened) while no upstream connection takes them
WRITE_HIGH = 64 * 1024  # response bytes queued for one stream before its upstream stops being read

_TEXT: list[Header] = [(b"content-type", b"text/plain; charset=utf-8"), (b"cache-control", b"no-store")]


class H2Stream(Downstream):
    """The client side of one request on an h2 connection."""

    __slots__ = (
        "_conn",
        "body_deadline",
        "continue_sent",
        "ctx",
        "ended",
        "ex",
        "facts",
        "head_only",
        "hold",
        "loop",
        "paused",
        "req",
        "sid",
        "submitted",
        "unconsumed",
        "write_paused",
    )

    track_buffers = False

    def __init__(self, conn: H2Bridge, sid: int, req: Request) -> None:
        self._conn = conn
        self.ctx: L7Context = conn.ctx
        self.loop: asyncio.AbstractEventLoop = conn.loop
        self.facts: ConnectionFacts = conn.facts
        self.sid = sid
        self.req = req
        self.ex: Exchange | None = None
        self.head_only = req.head is not None and req.head.method == b"HEAD"
        self.continue_sent = False
        self.ended = False  # the response is complete (or the stream reset): nothing more is sent
        self.unconsumed = 0  # DATA bytes received and not yet given back to the windows
        self.submitted = 0  # response body bytes given to the engine (send_deadline.py counts what left)
        self.hold = BODY_HOLD
        self.paused = False  # the upstream's write buffer is full
        self.write_paused = False  # our queue for the client is above WRITE_HIGH
        self.body_deadline: Deadline | None = None  # the request body's idle deadline, while one is to come

    def stop_body_deadline(self) -> None:
        d, self.body_deadline = self.body_deadline, None
        if d is not None:
            d.stop()

    # -- what the connection feeds -------------------------------------------------------------------
    def data(self, data: bytes, flow: int) -> None:
        """Body bytes from the client (``flow``: what they count against the windows, padding included)."""
        self.unconsumed += flow
        ex = self.ex
        if ex is not None:
            ex.client_body(data)
        self._consume()

    def _consume(self) -> None:
        """Give received bytes back to the windows as far as the upstream (or the hold) takes them."""
        n = self.unconsumed
        if not n or self.paused:
            return
        ex = self.ex
        if ex is not None and ex.conn is None and self.req.buffered > self.hold:
            return  # held for the WAF or a connect: past the hold, the client waits
        self.unconsumed = 0
        self._conn.engine.consume(self.sid, n)

    # -- Downstream: facts and state -----------------------------------------------------------------
    @property
    def draining(self) -> bool:
        return self._conn.draining

    @property
    def writing_paused(self) -> bool:
        return self.write_paused

    # -- Downstream: the response, as events ---------------------------------------------------------
    def send_interim(self, status: int, reason: bytes, headers: list[Header]) -> None:
        if self.ended or (status == 100 and self.continue_sent):
            return
        self._conn.engine.send_interim(self.sid, status, headers)

    def send_head(self, status: int, reason: bytes, headers: list[Header], body: UpstreamBody) -> None:
        if self.ended:
            return
        if body.drop_content_length:
            headers = without_content_length(headers)
        self._conn.engine.send_head(self.sid, status, headers, end_stream=body.no_body)
        if body.no_body:
            self.ended = True

    def send_body(self, data: bytes) -> None:
        if self.ended or not data:
            return
        engine = self._conn.engine
        engine.send_data(self.sid, data)
        self.submitted += len(data)
        if not self.write_paused and engine.buffered(self.sid) > WRITE_HIGH:
            self.write_paused = True
            self._conn.stream_write_paused(self)

    def send_end(self) -> None:
        if not self.ended:
            self.ended = True
            self._conn.engine.end_stream(self.sid)

    def send_trailers(self, headers: list[Header]) -> None:
        """The backend's trailers (a chunked body's): a HEADERS frame with END_STREAM after the body."""
        if not self.ended:
            self.ended = True
            self._conn.engine.send_trailers(self.sid, [(n.lower(), v) for n, v in headers])

    def send_abort(self) -> None:
        if not self.ended:
            self.ended = True
            self._conn.engine.reset(self.sid, h2_codes.INTERNAL_ERROR)

    def flush(self) -> None:
        self._conn.flush_soon()  # one write for all the streams answered in this loop turn

    # -- Downstream: the proxy's own answers ---------------------------------------------------------
    def send_continue(self) -> None:
        self.continue_sent = True
        self._conn.engine.send_interim(self.sid, 100, [])
        self._conn.flush()

    def _answer(self, status: int, headers: list[Header], body: bytes) -> None:
        if self.ended:
            return
        self.ended = True
        engine = self._conn.engine
        fields = [*_TEXT, (b"content-length", b"%d" % len(body)), *headers]
        if self.head_only or not body:
            engine.send_head(self.sid, status, fields, end_stream=True)
        else:
            engine.send_head(self.sid, status, fields)
            engine.send_data(self.sid, body, end_stream=True)
        self._conn.flush()

    def answer_error(self, status: int) -> None:
        self._answer(status, [], b"%d %s\n" % (status, REASONS.get(status, b"Error")))

    def answer_local(self, status: int, headers: list[Header], *, keep_alive: bool, body: bytes | None) -> bool:
        """The stream is answered; the rest of its body is not read (the engine ends the request with
        RST_STREAM NO_ERROR once the answer has left), so the exchange is done now: False."""
        if body is None:
            body = b"%d %s\n" % (status, REASONS.get(status, b"Error"))
        self._answer(status, [(n.lower(), v) for n, v in headers], body)
        return False

    # -- Downstream: the request body ----------------------------------------------------------------
    def hold_body(self, req: Request, data: bytes) -> None:
        req.body.append(data)
        req.buffered += len(data)

    def hold_limit(self, limit: int, held: int) -> None:
        self.hold = max(BODY_HOLD, limit)
        self._consume()

    def body_taken(self) -> None:
        self._consume()

    def pause_body(self) -> None:
        self.paused = True

    def resume_body(self) -> None:
        self.paused = False
        self._consume()
        self._conn.flush()

    # -- Downstream: the end -------------------------------------------------------------------------
    def open_tunnel(self, ex: Exchange, conn: UpstreamConn, reason: bytes, headers: list[Header], first: bytes) -> None:
        raise RuntimeError("no WebSocket over HTTP/2 (RFC 8441 is not served): map_request never asks for one")

    def exchange_done(self, ex: Exchange) -> None:
        if not self.ended:  # abandoned without an answer: the client must not wait for one
            self.send_abort()
        self._conn.stream_done(self)

    def track(self, held: int) -> None:
        pass

"""One asyncio Protocol per HTTP/1.1 client connection: the L7 bridge (ARCHITECTURE.md §3 step 6).

It works over any transport: plain TCP in tests, the TLS layer's plaintext transport in production (which
adds ``get_extra_info("sni")`` and ``("peercert")``). httptools callbacks drive everything; there are no
asyncio streams and no polling on the data path. The connection parses requests, queues them (pipelining:
heads that arrive while a request is in flight queue up, reading pauses, and they are answered in order),
keeps the client deadlines (``deadline.py``) and the reasons reading is paused (``flow.py``), and hands each
request at the front of the queue to an ``Exchange`` (``exchange.py``), which answers it. After a 101 the
connection's bytes go to a ``Tunnel`` (``tunnel.py``) instead of the parser. Every error response closes the
connection. A client that takes no response byte for ``limits.send_timeout_s`` (its write buffer above the
high-water mark all that time: nginx's ``send_timeout``) is aborted, counted ``send_timeout``.

The connection is the ``Downstream`` (``../downstream.py``) of the request in flight: what an exchange may
ask of it is that protocol, nothing else. Its facts (``ConnectionFacts``: SNI, TLS, client address, client
certificate...) are read once in ``connection_made``; the request half is ``reader.py``, the response half
(the client's framing, written by ``sentin8/http/h1_response.py``) ``writer.py``.
"""

from __future__ import annotations

import asyncio
from collections import deque

import httptools

from sentin8.http.h1_response import H1Response
from sentin8.http.head_writer import response_head
from sentin8.http.headers import Header
from workers.upstream import UpstreamConn

from ...deadline import BODY, HEADER, IDLE, NONE, Deadline
from ...unread import peer_spoke
from ..contract import L7Context
from ..downstream import NO_FACTS, ConnectionFacts
from ..exchange import Exchange
from ..linger import LINGER_BYTES, LINGER_S
from ..request import Request
from .flow import BODY_BUFFER_LIMIT, BODY_HELD, CLIENT_WRITE_HIGH_WATER, PIPELINED, STOPPED, UPSTREAM_FULL, ReadPause
from .reader import RequestReader
from .tunnel import Tunnel
from .writer import NO_RESPONSE

_CLOSED_PARSER = httptools.HttpRequestParser(None)  # a closed connection's: nothing is ever fed to it


class L7Bridge(RequestReader, asyncio.Protocol):
    """One client connection. ``client_addr`` None = take the transport's peername. The three class knobs below
    are set by the worker before the connection is made, then frozen into ``facts``."""

    acme_only = False  # the :80 listener (PlainHTTPListener)
    external = True  # the client's side (network.internal_cidrs); :443 bridges only ever serve external clients
    refuse_status = 0  # answer every request with this status and close (over the per-client connection cap)
    track_buffers = False  # tests: record the most bytes held in buffers at once in ``max_buffered``

    def __init__(
        self, ctx: L7Context, loop: asyncio.AbstractEventLoop, client_addr: tuple | None = None, scheme: str = "https"
    ) -> None:
        self.ctx = ctx
        self.loop = loop
        self.client_addr = client_addr
        self.scheme = scheme
        cfg = ctx.cfg
        self._max_headers = cfg.policy.max_headers
        self._max_header_bytes = cfg.policy.max_header_bytes
        # httptools holds an unfinished header line internally; this bounds it (request line + headers + slack)
        self._raw_head_cap = 2 * cfg.policy.max_header_bytes + 16384
        self._header_timeout = cfg.limits.header_timeout_s
        self._idle_timeout = cfg.limits.idle_timeout_s
        self._linger_timer: asyncio.TimerHandle | None = None
        self._lingered = 0  # bytes read and dropped since the lingering close began
        self._body_cap = cfg.limits.max_request_body_bytes
        self._chunk_size = None  # a view of the parser's chunk size (reader.py), made at the first chunk
        self._version = None  # a view of the parser's HTTP version (reader.py), made at the second head
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._req: Request | None = None  # the request whose head or body is being parsed
        self._queue: deque[Request] = deque()  # heads complete, answered in order; [0] is in flight
        self._ex: Exchange | None = None
        self._tunnel: Tunnel | None = None
        self._upgrade_req: Request | None = None
        self._read = ReadPause()
        self._write_paused = False
        self._deadline = Deadline(loop, self._deadline_passed)
        self._body_activity = 0.0
        self._closing = False
        self._eof = False
        self._draining = False
        self._drain_grace = min(cfg.fleet.drain_idle_grace_s, cfg.fleet.drain_timeout_s)
        self._drain_timer: asyncio.TimerHandle | None = None
        self._idle_since = loop.time()  # when the connection last became idle (the drain grace counts from it)
        self._send_timeout = cfg.limits.send_timeout_s
        self._send_timer: asyncio.TimerHandle | None = None  # armed while the client's write buffer is full
        self._head_raw = 0
        self._progress = False
        self._completed_in_feed = False
        self._feeding = b""  # the chunk being fed to the parser (a new request's line starts in it)
        self.facts: ConnectionFacts = NO_FACTS
        self._resp: H1Response = NO_RESPONSE  # the client half of the response in flight (writer.py)
        self._out: list[bytes] = []  # response bytes of one upstream read, written by flush()
        self.max_buffered = 0

    # -- what an exchange reads --------------------------------------------------------------------------
    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def writing_paused(self) -> bool:
        """The client's write buffer is full: an upstream connection attached now starts paused."""
        return self._write_paused

    @property
    def idle(self) -> bool:
        return self._ex is None and not self._queue and self._req is None and self._tunnel is None

    # -- asyncio.Protocol: client side -----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        # responses leave at the end of the loop turn over TLS (TLSAppTransport.write_soon), at once over TCP
        self._send = getattr(transport, "write_soon", None) or transport.write  # type: ignore[attr-defined]
        self._read.transport = self.transport
        try:
            transport.set_write_buffer_limits(high=CLIENT_WRITE_HIGH_WATER)  # type: ignore[attr-defined]
        except (AttributeError, NotImplementedError):
            pass
        self.facts = ConnectionFacts.of(
            transport,
            self.client_addr,
            scheme=self.scheme,
            external=self.external,
            acme_only=self.acme_only,
            refuse_status=self.refuse_status,
            protocol="h1",
        )
        self.ctx.count("l7_connections_h1")
        # The first head must arrive within the header deadline too (a silent connection is a slowloris).
        self._deadline.arm(HEADER, self._header_timeout)
        self._idle_since = self._deadline.now()
        if self._draining:  # the handshake finished in a draining worker: answer, with Connection: close
            self._arm_drain_grace()

    def data_received(self, data: bytes) -> None:
        if self._closing:  # lingering (or closed): dropped, within a bound
            self._lingered += len(data)
            if self._lingered > LINGER_BYTES and self.transport is not None:
                self.transport.close()
            return
        if self._tunnel is not None:
            self._tunnel.client_data(data)
            return
        if self._upgrade_req is not None:
            self._hold_upgrade_data(data)
            return
        if self._read.bits & STOPPED:
            return
        kind = self._deadline.kind
        if kind == BODY:
            self._body_activity = self._deadline.now()
        elif kind == IDLE or (kind == NONE and self._ex is None and self._req is None):
            self._deadline.arm(HEADER, self._header_timeout)  # the first byte of a new head
        req = self._req
        in_head = req is not None and req.head is None
        if in_head:
            req.line_raw.append(data)  # type: ignore[union-attr]
        self._progress = False
        self._completed_in_feed = False
        while True:
            self._feeding = data
            try:
                self._parser.feed_data(data)
            except httptools.HttpParserUpgrade as exc:
                rest = data[exc.args[0] :]
                if self._upgrade_req is not None:  # websocket: what follows is the peer's first frames
                    if rest:
                        self._hold_upgrade_data(rest)
                    return
                if rest and not self._closing:  # an upgrade we do not take: keep parsing HTTP
                    data = rest
                    continue
            except httptools.HttpParserError as exc:
                self._parse_failed(exc)
                return
            break
        req = self._req
        if req is None or self._closing:
            return
        # Bound what httptools buffers for an unfinished header line (it only reports complete lines).
        if req.head is None:
            if in_head or not self._completed_in_feed:
                self._head_raw += len(data)
            if self._head_raw > self._raw_head_cap:
                self._reject(431)
        elif not self._progress:
            self._head_raw += len(data)  # a body that yields nothing: a giant trailer or chunk extension
            if self._head_raw > self._raw_head_cap:
                self._body_failed(400)
        else:
            self._head_raw = 0

    def eof_received(self) -> bool | None:
        ex = self._ex
        if self._tunnel is None and ex is not None and self._req is None and ex.req.complete:
            self._eof = True  # a half-close after a whole request: answer it, then close
            return True
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._read.transport = None
        self._deadline.stop()
        for timer in (self._drain_timer, self._linger_timer, self._send_timer):
            if timer is not None:
                timer.cancel()
        self._drain_timer = self._linger_timer = self._send_timer = None
        ex, self._ex = self._ex, None
        self._tunnel = None
        if ex is not None:
            ex.client_gone()
        while self._queue:
            self._end_request(self._queue.popleft())
        self._req = None
        self._upgrade_req = None
        # the parser holds our bound callbacks: without it, a closed connection is freed by refcount alone
        self._parser = _CLOSED_PARSER
        self._chunk_size = self._version = None  # they viewed the old parser's memory

    def pause_writing(self) -> None:
        self._write_paused = True
        if self._send_timer is None:
            self._send_timer = self.loop.call_later(self._send_timeout, self._send_timed_out)
        ex = self._ex
        if ex is not None:
            ex.client_write_paused()

    def resume_writing(self) -> None:
        self._write_paused = False
        timer, self._send_timer = self._send_timer, None
        if timer is not None:
            timer.cancel()
        ex = self._ex
        if ex is not None:
            ex.client_write_resumed()

    # -- the worker's ----------------------------------------------------------------------------------
    def begin_drain(self) -> None:
        """Worker drain: every response from now on says Connection: close and ends the connection. An idle
        keep-alive connection is kept until it has been idle for a whole drain grace, so a request already
        on its way is answered instead of racing the close (HAProxy's idle-close-on-response); only then,
        with nothing unread in its socket, is it closed. HTTP/1.1 has no GOAWAY: a client that sends just
        as that close leaves has sent on a connection idle for the grace, the one race left, which RFC 9112
        §9.3.1 lets it retry (the close came before any byte of a response).
        May run before ``connection_made`` (a handshake completing in a draining worker): the grace then
        starts when the connection is made."""
        self._draining = True
        if self.transport is not None and not self._closing:
            self._arm_drain_grace()

    def _arm_drain_grace(self) -> None:
        if self._drain_timer is None:
            self._drain_timer = self.loop.call_later(self._drain_grace, self._drain_grace_over)

    def _drain_grace_over(self) -> None:
        self._drain_timer = None
        if self._closing or not self.idle:
            return  # busy: its response says Connection: close (or, promised keep-alive before, re-arms)
        idle_for = self._deadline.now() - self._idle_since
        if idle_for < self._drain_grace:
            # idle only since a response that ended during the grace: its client gets a whole grace too
            self._drain_timer = self.loop.call_later(self._drain_grace - idle_for, self._drain_grace_over)
            return
        if self.transport is not None and peer_spoke(self.transport):
            # The client's next bytes are in the socket, unread: the loop runs expired timers before it
            # polls, so a busy loop meets the grace's end first. Read them; look again after a grace.
            self.ctx.count("drain_idle_spoke")
            self._idle_since = self._deadline.now()
            self._arm_drain_grace()
            return
        self.ctx.count("drain_idle_closed")
        self._close()

    # -- request bookkeeping ---------------------------------------------------------------------------
    def _enqueue(self, req: Request) -> None:
        req.counted = True
        req.t0 = self._deadline.now()
        self.ctx.inflight(1)
        self.ctx.count("requests")
        self._queue.append(req)
        if self._ex is None:
            self._start(req)
        else:
            self._read.pause(PIPELINED)

    def _end_request(self, req: Request) -> None:
        if req.counted:
            req.counted = False
            self.ctx.inflight(-1)

    def _start(self, req: Request) -> None:
        ex = Exchange(self, req)
        self._ex = ex
        head = req.head
        self._resp = H1Response(head, head_only=not req.reject and head is not None and head.method == b"HEAD")
        req.exchange = ex
        if req.reject:
            ex.respond_error(req.reject)
            return
        assert head is not None
        if head.has_body and not req.complete and req is self._req:
            self._body_activity = self._deadline.now()
            self._deadline.arm(BODY, self._idle_timeout)
        ex.begin()

    def exchange_done(self, ex: Exchange) -> None:
        """The response to ``ex.req`` is fully written (or abandoned): move on to the next request, unless the
        response's framing (or its abort) said the connection closes."""
        if self._ex is not ex:
            return
        self._ex = None
        close = self._resp.close
        self._resp = NO_RESPONSE
        tunnel, self._tunnel = self._tunnel, None
        req = ex.req
        if self._queue and self._queue[0] is req:
            self._queue.popleft()
        self._end_request(req)
        if req.complete:  # the reader is done with it: break request <-> exchange, freed by refcount alone
            req.exchange = None
        self._deadline.disarm_if(BODY)
        if self._closing:
            return
        # A backend may answer before the request's body has all arrived (it did not need it). The rest is
        # then read and dropped (the finished exchange drops what reaches it) so that the connection carries
        # the client's next request, when the body is small enough (``may_keep``); otherwise close. Not after
        # ``Expect: 100-continue``: a final answer there tells the client not to send the body at all.
        head = req.head
        drain_rest = (
            not req.complete
            and req is self._req
            and head is not None
            and not head.expect_continue
            and self.may_keep(req)
        )
        if close or not (req.complete or drain_rest) or tunnel is not None or (self._eof and not self._queue):
            self._close(at_once=self._said_its_last(req))
            return
        # Draining, but this response went out before the drain and promised keep-alive: closing now would
        # race the client's next request. Keep the connection; that request gets Connection: close, and a
        # connection still idle when the grace ends is closed.
        if self._draining:
            self._arm_drain_grace()
        self.resume_reading(UPSTREAM_FULL | BODY_HELD | (PIPELINED if len(self._queue) <= 1 else 0))
        if self._queue:
            self._start(self._queue[0])
        elif drain_rest:
            self._body_activity = self._deadline.now()
            self._deadline.arm(BODY, self._idle_timeout)  # the rest must keep coming, as any body
        elif self._req is not None:
            self._deadline.arm(HEADER, self._header_timeout)
        else:
            self._idle_since = self._deadline.now()
            self._deadline.arm(IDLE, self._idle_timeout)

    def open_tunnel(self, ex: Exchange, conn: UpstreamConn, reason: bytes, headers: list[Header], first: bytes) -> None:
        """After a 101: the client gets it, then its bytes go to a tunnel, never to the parser again; no deadline
        applies. ``first``: the backend's bytes that followed its 101."""
        self.write(response_head(101, reason, headers))
        self._tunnel = Tunnel(ex, self, conn, first, ex.req.take_upgrade_data())
        self._upgrade_req = None
        self._deadline.disarm()
        self.resume_reading(BODY_HELD | STOPPED | PIPELINED)

    # -- body bytes held for an exchange ---------------------------------------------------------------
    def hold_body(self, req: Request, body: bytes) -> None:
        """Keep body bytes until an upstream connection (or the WAF) takes them; reading pauses past the limit."""
        req.body.append(body)
        req.buffered += len(body)
        self._read.held(req.buffered)
        if self.track_buffers:
            self.track(req.buffered)

    def hold_limit(self, limit: int, held: int) -> None:
        """Hold up to ``limit`` body bytes (the WAF's body limit) instead of the default; with ``held`` bytes
        held now, reading resumes when that is within the new limit."""
        if self._read.raise_hold_limit(limit, held):
            self._body_activity = self._deadline.now()

    def _hold_upgrade_data(self, data: bytes) -> None:
        req = self._upgrade_req
        assert req is not None
        req.upgrade_data.append(data)
        req.buffered += len(data)
        if req.buffered > BODY_BUFFER_LIMIT:  # the WAF's limit does not apply: it never sees these
            self._read.pause(BODY_HELD)

    # -- flow control, deadlines, writes ---------------------------------------------------------------
    def pause_reading(self, bit: int) -> None:
        """Stop reading from the client for reason ``bit`` (``flow.UPSTREAM_FULL`` ...)."""
        self._read.pause(bit)

    def resume_reading(self, bit: int) -> None:
        """``bit``'s reason is gone; reading resumes when no other is left."""
        if self._read.bits & bit and self._read.resume(bit):  # the usual case: not paused for it, no call
            self._body_activity = self._deadline.now()

    # the Downstream's request-body flow
    def body_taken(self) -> None:
        self.resume_reading(BODY_HELD)

    def pause_body(self) -> None:
        self._read.pause(UPSTREAM_FULL)

    def resume_body(self) -> None:
        self.resume_reading(UPSTREAM_FULL)

    def _deadline_passed(self, kind: int) -> None:
        if self._closing:
            return
        if kind == HEADER:
            self.ctx.count("slowloris_closed")
            self._abort()
        elif kind == IDLE:
            self.ctx.count("idle_closed")
            self._close()
        elif kind == BODY:
            quiet = self._deadline.now() - self._body_activity
            if self._read.bits or quiet < self._idle_timeout:
                # We paused reading ourselves, or bytes came since: the body is not idle yet.
                delay = self._idle_timeout - quiet if not self._read.bits else self._idle_timeout
                self._deadline.arm(BODY, delay)
                return
            self.ctx.count("body_timeout")
            ex = self._ex
            if ex is not None:
                ex.respond_error(408)
            else:
                self._abort()

    def _send_timed_out(self) -> None:
        """The client took nothing for ``limits.send_timeout_s``: abort (a close would wait for it to read)."""
        self._send_timer = None
        self.ctx.count("send_timeout")
        if self.transport is not None:
            self._closing = True
            self._read.transport = None
            self._deadline.stop()
            self.transport.abort()

    def _said_its_last(self, req: Request) -> bool:
        """The client said ``req`` was its last request (``Connection: close``, or HTTP/1.0 without keep-alive;
        RFC 9112 §9.6: it sends no other), ``req`` was read to its end and nothing after it waits here (no
        request begun or queued, reading never left paused with bytes held below). Then only its
        close_notify and FIN can still come, and the close need not linger for them."""
        head = req.head
        return (
            head is not None
            and not head.keep_alive
            and req.complete
            and self._req is None
            and not self._queue
            and not self._read.bits
        )

    def _close(self, at_once: bool = False) -> None:
        """The graceful close, lingering (``../linger.py``): our FIN (after the response, and close_notify over
        TLS) goes first, and reading goes on, dropping what the client still sends (``data_received`` while
        closing), until its FIN, ``LINGER_S`` or ``LINGER_BYTES``. Closed at once, a socket with unread bytes
        (a request sent before ours said close, the rest of a refused body) answers with a reset, and a reset
        may destroy the response in the client's buffers before it reads it (RFC 9112 §9.6).
        ``at_once`` (``_said_its_last``): the client promised nothing more, so unless its socket already holds
        bytes (``peer_spoke``), the connection closes without lingering, as nginx's ``lingering_close on``
        does: no ``shutdown``, no linger timer, no wake-up for the client's own close."""
        if self._closing:
            return
        self._closing = True
        self._read.transport = None
        self._deadline.stop()
        if self._ex is None:
            while self._queue:  # pipelined requests after the one that closed it: never answered now
                self._end_request(self._queue.popleft())
        transport = self.transport
        if transport is None:
            return
        if self._eof or not transport.can_write_eof():
            transport.close()  # the client's FIN came already: nothing more can arrive to linger for
            return
        if at_once and not peer_spoke(transport):
            transport.close()
            return
        transport.write_eof()
        self._linger_timer = self.loop.call_later(LINGER_S, transport.close)
        try:
            transport.resume_reading()  # drop what comes, whatever had paused reading
        except (AttributeError, RuntimeError):
            pass

    def _abort(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self._closing = True
            self._read.transport = None
            self._deadline.stop()
            self.transport.abort()
        self._close()


class PlainHTTPListener(L7Bridge):
    """The :80 listener: ``/.well-known/acme-challenge/*`` goes to the acme service, everything else is 404."""

    acme_only = True

    def __init__(
        self, ctx: L7Context, loop: asyncio.AbstractEventLoop, client_addr: tuple | None = None, scheme: str = "http"
    ) -> None:
        super().__init__(ctx, loop, client_addr, scheme)

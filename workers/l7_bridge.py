"""The L7 bridge: one asyncio Protocol per external client connection (ARCHITECTURE.md §3 step 6).

It works over any transport: plain TCP in tests, the TLS layer's plaintext transport in production (which
adds ``get_extra_info("sni")`` and ``("peercert")``). httptools callbacks drive everything; there are no
asyncio streams and no polling on the data path. Per request:

    parse (caps -> 431, malformed -> 400) -> Host vs SNI (421) -> ACME challenge -> acme service, untouched
    -> resolve Host (421) -> ctx.policy (429/403/...) -> header hygiene -> pooled upstream -> stream back

Bodies stream both ways with backpressure: when the far side's write buffer passes its high-water mark the
near side stops reading until it drains, so a connection holds a bounded number of bytes whatever the body
size. Responses go to the client in pieces of at most 16 KiB. ``Upgrade: websocket`` becomes a raw pipe
after a 101. Client deadlines are timers reset by events: header read (first byte of a head to its end),
keep-alive idle between requests, and body idle while a request body is being read.

Pipelining is supported: heads that arrive while a request is in flight queue up (reading pauses) and are
answered in order. Every error response closes the connection.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Protocol

import httptools

from sentin8.config import Config
from sentin8.http.framing import (
    REASONS,
    HeaderBudget,
    HeadError,
    RequestHead,
    error_response,
    local_response,
    request_head,
    request_line_is_http,
    response_head,
    validate_request,
    websocket_accept,
)
from sentin8.http.headers import Header, forward_headers, passthrough_headers, response_headers
from sentin8.http.response import (
    CRLF,
    LAST_CHUNK,
    chunk_size_line,
    coalesce,
    encode_chunks,
    response_framing,
    split,
    upstream_reusable,
    without_content_length,
)
from sentin8.policy import Verdict
from sentin8.routing import Instance, Route
from sentin8.waf import WafEngine, WafRequest, WafVerdict
from workers.upstream import UpstreamConn, UpstreamPool
from workers.waf_gate import WafGate

log = logging.getLogger("sentin8.l7")

ACME_PREFIX = b"/.well-known/acme-challenge/"
CLIENT_WRITE_HIGH_WATER = 64 * 1024
BODY_BUFFER_LIMIT = 64 * 1024  # request body held while the upstream connects; reading pauses above it
LOCAL_DRAIN_MAX = 64 * 1024  # a refused request's body read and dropped to keep the connection; above it, close
CHUNK = 16 * 1024  # response pieces written to the client (one TLS record each)
IDEMPOTENT = frozenset({b"GET", b"HEAD", b"OPTIONS", b"TRACE", b"PUT", b"DELETE"})
_STATUS_CLASS = {1: "status_1xx", 2: "status_2xx", 3: "status_3xx", 4: "status_4xx", 5: "status_5xx"}

# Why the client transport is not being read (any bit set = paused).
_P_UPSTREAM = 1  # the upstream write buffer is full
_P_BUFFER = 2  # body bytes are waiting for the upstream connection
_P_PIPELINE = 4  # a further request is queued behind the one in flight
_P_STOPPED = 8  # no more requests will be parsed on this connection

# Timer kinds: one timer per connection, re-armed as the connection changes state.
_T_NONE, _T_HEADER, _T_IDLE, _T_BODY = 0, 1, 2, 3


class RequestInfo:
    """What the policy hook sees (rate limit, WAF). ``headers`` are as received, before hygiene."""

    __slots__ = ("client_ip", "headers", "host", "method", "path", "route", "scheme", "target")

    def __init__(
        self,
        method: bytes,
        target: bytes,
        path: bytes,
        host: str,
        client_ip: str,
        route: Route,
        headers: list[Header],
        scheme: str,
    ) -> None:
        self.method = method
        self.target = target
        self.path = path
        self.host = host
        self.client_ip = client_ip
        self.route = route
        self.headers = headers
        self.scheme = scheme


class L7Context(Protocol):
    """What the worker provides to every bridge (the lead implements it)."""

    cfg: Config
    pool: UpstreamPool  # one per worker: UpstreamPool.from_config(loop, cfg)

    def resolve(self, host: str) -> Route | None: ...
    def candidates(self, service: str) -> list[Instance]: ...  # ordered, healthy first
    def backend_failed(self, instance: Instance) -> None: ...  # unreachable: suspect for every worker, counted
    def count(self, name: str, n: int = 1) -> None: ...
    def service_id(self, service: str) -> int: ...  # metrics index of a service with no Route (ACME)
    def upstream(self, sidx: int, name: str) -> None: ...  # upstream_warm | upstream_cold | upstream_stale_retry
    def request_done(self, ex: _Exchange, seconds: float) -> None: ...  # answered: status, timing, access log
    def inflight(self, delta: int) -> None: ...
    def policy(self, request: RequestInfo) -> Verdict | int | None: ...  # a refusal (429, 403...), or None
    def upstream_tls(self, instance: Instance) -> object | None: ...  # SSLContext or wrap(inner) -> Protocol
    def waf_gate(self) -> WafGate | None: ...  # where inspections run; None: no WAF in this context
    def upstream_result(self, instance_id: str, ok: bool) -> None: ...  # for the instance's circuit breaker
    def overloaded(self) -> bool: ...  # over the worker's in-flight request cap


class _Stop(Exception):
    """Raised inside a parser callback to stop parsing; the state says why."""


class _Request:
    __slots__ = (
        "body",
        "budget",
        "buffered",
        "complete",
        "counted",
        "exchange",
        "head",
        "headers",
        "line_raw",
        "reject",
        "t0",
        "trailer_bytes",
        "upgrade_data",
        "url",
    )

    def __init__(self, budget: HeaderBudget) -> None:
        self.url = b""
        self.headers: list[Header] = []
        self.line_raw: list[bytes] = []  # bytes read while the head was incomplete: its request line is in them
        self.budget = budget
        self.head: RequestHead | None = None
        self.reject = 0  # a status to answer instead of forwarding
        self.body: list[bytes] = []  # body bytes not yet handed to an upstream connection
        self.buffered = 0
        self.upgrade_data: list[bytes] = []  # websocket bytes that arrived before the 101
        self.complete = False
        self.counted = False  # inflight(+1) done; the -1 must follow exactly once
        self.exchange: _Exchange | None = None
        self.t0 = 0.0
        self.trailer_bytes = 0


class L7Bridge(asyncio.Protocol):
    """One client connection. ``client_addr`` None = take the transport's peername."""

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
        self._acme_service = cfg.acme.service
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._req: _Request | None = None  # the request whose head or body is being parsed
        self._queue: deque[_Request] = deque()  # heads complete, answered in order; [0] is in flight
        self._ex: _Exchange | None = None
        self._tunnel: _Exchange | None = None
        self._upgrade_req: _Request | None = None
        self._paused = 0
        self._write_paused = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_kind = _T_NONE
        self._timer_when = 0.0  # when the armed handle fires
        self._deadline = 0.0  # when the current kind's deadline is (>= _timer_when while armed)
        self._body_activity = 0.0
        self._closing = False
        self._eof = False
        self._draining = False
        self._drain_grace = min(cfg.fleet.drain_idle_grace_s, cfg.fleet.drain_timeout_s)
        self._drain_timer: asyncio.TimerHandle | None = None
        self._head_raw = 0
        self._progress = False
        self._completed_in_feed = False
        self._client_ip = ""
        self._sni: str | None = None
        self._tls = False  # the transport is the TLS layer: SNI is the routing key and must be present
        self._hold_limit = BODY_BUFFER_LIMIT  # body bytes held before reading pauses (more with the WAF on)
        self._feeding = b""  # the chunk being fed to the parser (a new request's line starts in it)
        self._client_cert: bytes | bool | None = False  # False = not looked up yet
        self.max_buffered = 0

    # -- asyncio.Protocol: client side -----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        try:
            transport.set_write_buffer_limits(high=CLIENT_WRITE_HIGH_WATER)  # type: ignore[attr-defined]
        except (AttributeError, NotImplementedError):
            pass
        addr = self.client_addr or transport.get_extra_info("peername")
        self._client_ip = str(addr[0]) if addr else ""
        sni = transport.get_extra_info("sni")
        if isinstance(sni, bytes):
            sni = sni.decode("ascii", "replace")
        self._sni = sni.lower().rstrip(".") if sni else None
        self._tls = transport.get_extra_info("tls_version") is not None
        # The first head must arrive within the header deadline too (a silent connection is a slowloris).
        self._arm(_T_HEADER, self._header_timeout)
        if self._draining:  # the handshake finished in a draining worker: answer, with Connection: close
            self._arm_drain_grace()

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        if self._tunnel is not None:
            self._tunnel.client_raw(data)
            return
        if self._upgrade_req is not None:
            self._hold_upgrade_data(data)
            return
        if self._paused & _P_STOPPED:
            return
        kind = self._timer_kind
        if kind == _T_BODY:
            self._body_activity = self.loop.time()
        elif kind == _T_IDLE or (kind == _T_NONE and self._ex is None and self._req is None):
            self._arm(_T_HEADER, self._header_timeout)  # the first byte of a new head
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
        self._stop_timer()
        timer, self._drain_timer = self._drain_timer, None
        if timer is not None:
            timer.cancel()
        ex, self._ex = self._ex, None
        if ex is not None:
            ex.client_gone()
        tunnel, self._tunnel = self._tunnel, None
        if tunnel is not None and tunnel is not ex:
            tunnel.client_gone()
        while self._queue:
            self._end_request(self._queue.popleft())
        self._req = None
        self._upgrade_req = None

    def pause_writing(self) -> None:
        self._write_paused = True
        ex = self._tunnel or self._ex
        if ex is not None and ex.conn is not None:
            ex.conn.pause_reading()
            self.ctx.count("backpressure_upstream_paused")

    def resume_writing(self) -> None:
        self._write_paused = False
        ex = self._tunnel or self._ex
        if ex is not None and ex.conn is not None:
            ex.conn.resume_reading()

    # -- public ----------------------------------------------------------------------------------------
    def begin_drain(self) -> None:
        """Worker drain: every response from now on says Connection: close and ends the connection. An idle
        keep-alive connection is kept for the drain grace, so a request already on its way is answered
        instead of racing the close (HAProxy's idle-close-on-response); still idle then, it is closed.
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
        if not self._closing and self.idle:
            self.ctx.count("drain_idle_closed")
            self._close()

    @property
    def idle(self) -> bool:
        return self._ex is None and not self._queue and self._req is None and self._tunnel is None

    # -- httptools request callbacks -------------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self._closing or self._paused & _P_STOPPED:
            raise _Stop
        req = self._req = _Request(HeaderBudget(self._max_headers, self._max_header_bytes))
        req.line_raw.append(self._feeding)
        self._head_raw = 0

    def on_url(self, url: bytes) -> None:
        req = self._req
        assert req is not None
        req.url += url
        if len(req.url) > self._max_header_bytes:
            self._reject(414)
            raise _Stop

    def on_header(self, name: bytes, value: bytes) -> None:
        req = self._req
        assert req is not None
        if req.head is None:
            try:
                req.budget.add(name, value)
            except HeadError as exc:
                self._reject(exc.status)
                raise _Stop from None
            req.headers.append((name, value))
        else:
            # Trailers are dropped (a recipient may discard them, RFC 9110 §6.5.1); still bounded.
            req.trailer_bytes += len(name) + len(value) + 4
            if req.trailer_bytes > self._max_header_bytes:
                self._body_failed(400)
                raise _Stop

    def on_headers_complete(self) -> None:
        req = self._req
        assert req is not None
        if self._closing:
            raise _Stop
        self._progress = True
        p = self._parser
        raw, req.line_raw = req.line_raw, []
        version = p.get_http_version()
        if not request_line_is_http(raw[0] if len(raw) == 1 else b"".join(raw), p.get_method(), req.url):
            self._reject(400)  # RTSP/1.x or ICE/1.0: llhttp reports them as HTTP versions, but they are not HTTP
            raise _Stop
        try:
            req.head = validate_request(
                p.get_method(),
                req.url,
                version,
                req.headers,
                keep_alive=p.should_keep_alive(),
                upgrade=p.should_upgrade(),
            )
        except HeadError as exc:
            self._reject(exc.status)
            raise _Stop from None
        if self._timer_kind == _T_HEADER:
            self._disarm()
        if req.head.websocket:
            self._upgrade_req = req  # bytes after this head belong to the websocket, not to HTTP
        self._enqueue(req)

    def on_body(self, body: bytes) -> None:
        self._progress = True
        req = self._req
        assert req is not None
        ex = req.exchange
        if ex is not None:
            ex.client_body(body)
        else:
            self._hold_body(req, body)

    def on_message_complete(self) -> None:
        req = self._req
        assert req is not None
        self._req = None
        req.complete = True
        self._progress = True
        self._completed_in_feed = True
        if self._timer_kind == _T_BODY:
            self._disarm()
        ex = req.exchange
        if ex is not None:
            ex.client_body_end()

    # -- request bookkeeping ---------------------------------------------------------------------------
    def _enqueue(self, req: _Request) -> None:
        req.counted = True
        req.t0 = self.loop.time()
        self.ctx.inflight(1)
        self.ctx.count("requests")
        self._queue.append(req)
        if self._ex is None:
            self._start(req)
        else:
            self._pause(_P_PIPELINE)

    def _end_request(self, req: _Request) -> None:
        if req.counted:
            req.counted = False
            self.ctx.inflight(-1)

    def _start(self, req: _Request) -> None:
        ex = _Exchange(self, req)
        self._ex = ex
        req.exchange = ex
        if req.reject:
            ex.respond_error(req.reject)
            return
        head = req.head
        assert head is not None
        if head.has_body and not req.complete and req is self._req:
            self._body_activity = self.loop.time()
            self._arm(_T_BODY, self._idle_timeout)
        ex.begin()

    def _exchange_done(self, ex: _Exchange, close: bool) -> None:
        """The response to ``ex.req`` is fully written (or abandoned): move on to the next request."""
        if self._ex is not ex:
            return
        self._ex = None
        if self._tunnel is ex:
            self._tunnel = None
        req = ex.req
        if self._queue and self._queue[0] is req:
            self._queue.popleft()
        self._end_request(req)
        if self._timer_kind == _T_BODY:
            self._disarm()
        if self._closing:
            return
        if close or not req.complete or ex.tunnel or (self._eof and not self._queue):
            self._close()
            return
        # Draining, but this response went out before the drain and promised keep-alive: closing now would
        # race the client's next request. Keep the connection; that request gets Connection: close, and a
        # connection still idle when the grace ends is closed.
        if self._draining:
            self._arm_drain_grace()
        self._unpause(_P_UPSTREAM | _P_BUFFER)
        if len(self._queue) <= 1:
            self._unpause(_P_PIPELINE)
        if self._queue:
            self._start(self._queue[0])
        elif self._req is not None:
            self._arm(_T_HEADER, self._header_timeout)
        else:
            self._arm(_T_IDLE, self._idle_timeout)

    def _reject(self, status: int) -> None:
        """Stop parsing; answer ``status`` (after whatever is in flight) and close."""
        self._pause(_P_STOPPED)
        if self._timer_kind == _T_HEADER:
            self._disarm()
        req = self._req
        self._req = None
        if req is None or req.head is not None:
            req = _Request(HeaderBudget(0, 0))
        req.reject = status
        self._enqueue(req)

    def _body_failed(self, status: int) -> None:
        """The body of a request whose head was accepted turned out malformed."""
        req = self._req
        self._req = None
        self._pause(_P_STOPPED)
        if req is None:
            return
        ex = req.exchange
        if ex is not None:
            ex.respond_error(status)  # 400, or a plain close when the response already started
        else:
            req.reject = status  # queued behind another request; its turn will answer and close

    def _parse_failed(self, exc: httptools.HttpParserError) -> None:
        cause = exc.__context__
        if self._closing or (isinstance(cause, _Stop) and self._paused & _P_STOPPED):
            return  # a callback already decided
        if cause is not None and not isinstance(cause, _Stop):
            log.error("L7 bridge callback failed", exc_info=cause)
            self.ctx.count("bridge_errors")
            self._abort()
            return
        req = self._req
        if req is not None and req.head is not None:
            self._body_failed(400)
        else:
            self._reject(400)

    def _hold_body(self, req: _Request, body: bytes) -> None:
        req.body.append(body)
        req.buffered += len(body)
        if req.buffered > self._hold_limit:
            self._pause(_P_BUFFER)
        if self.track_buffers:
            self._track(req.buffered)

    def _hold_upgrade_data(self, data: bytes) -> None:
        req = self._upgrade_req
        assert req is not None
        req.upgrade_data.append(data)
        req.buffered += len(data)
        if req.buffered > BODY_BUFFER_LIMIT:
            self._pause(_P_BUFFER)

    def _client_cert_der(self) -> bytes | None:
        cert = self._client_cert
        if cert is False:
            cert = None
            value = self.transport.get_extra_info("peercert") if self.transport is not None else None
            if isinstance(value, bytes | bytearray):
                cert = bytes(value)
            elif value is not None:
                from cryptography.hazmat.primitives.serialization import Encoding

                if hasattr(value, "to_cryptography"):  # pyOpenSSL X509
                    value = value.to_cryptography()
                if hasattr(value, "public_bytes"):
                    cert = value.public_bytes(Encoding.DER)
            self._client_cert = cert
        return cert  # type: ignore[return-value]

    # -- flow control, timers, writes ------------------------------------------------------------------
    def _pause(self, bit: int) -> None:
        was = self._paused
        self._paused = was | bit
        if not was and self.transport is not None and not self._closing:
            self.transport.pause_reading()

    def _unpause(self, bit: int) -> None:
        if self._paused & bit:
            self._paused &= ~bit
            if not self._paused and self.transport is not None and not self._closing:
                self._body_activity = self.loop.time()
                self.transport.resume_reading()

    # The deadline moves on every request (header -> none -> idle -> header ...). Cancelling and creating a
    # loop timer each time cost ~4% of a worker; instead one timer handle stays armed, a later deadline just
    # records itself, and the handle, on firing early, re-arms for the rest. Only an earlier deadline (or a
    # close) replaces the handle.
    def _arm(self, kind: int, delay: float) -> None:
        deadline = self.loop.time() + delay
        self._timer_kind = kind
        self._deadline = deadline
        timer = self._timer
        if timer is not None:
            if self._timer_when <= deadline:
                return  # fires first; _on_timer re-arms for what remains
            timer.cancel()
        self._timer_when = deadline
        self._timer = self.loop.call_at(deadline, self._on_timer)

    def _disarm(self) -> None:
        self._timer_kind = _T_NONE  # the handle may stay armed: firing with nothing to do costs nothing

    def _stop_timer(self) -> None:
        self._timer_kind = _T_NONE
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()  # the connection is gone: no handle may keep it alive

    def _on_timer(self) -> None:
        self._timer = None
        kind = self._timer_kind
        if kind == _T_NONE or self._closing:
            return
        if self._deadline > self._timer_when:  # re-armed for later since this handle was made
            self._timer_when = self._deadline
            self._timer = self.loop.call_at(self._deadline, self._on_timer)
            return
        self._timer_kind = _T_NONE
        if kind == _T_HEADER:
            self.ctx.count("slowloris_closed")
            self._abort()
        elif kind == _T_IDLE:
            self.ctx.count("idle_closed")
            self._close()
        elif kind == _T_BODY:
            quiet = self.loop.time() - self._body_activity
            if self._paused or quiet < self._idle_timeout:
                # We paused reading ourselves, or bytes came since: the body is not idle yet.
                self._arm(_T_BODY, self._idle_timeout - quiet if not self._paused else self._idle_timeout)
                return
            self.ctx.count("body_timeout")
            ex = self._ex
            if ex is not None:
                ex.respond_error(408)
            else:
                self._abort()

    def _close(self) -> None:
        if not self._closing:
            self._closing = True
            self._stop_timer()
            if self.transport is not None:
                self.transport.close()

    def _abort(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self._closing = True
            self._stop_timer()
            self.transport.abort()
        self._close()

    def _write(self, data: bytes) -> None:
        self.transport.write(data)  # type: ignore[union-attr]
        if self.track_buffers:
            self._track(0)

    def _write_split(self, data: bytes) -> None:
        """Raw bytes (tunnel) to the client, in pieces of at most CHUNK."""
        for piece in split(data, CHUNK):
            self._write(piece)

    def _track(self, held: int) -> None:
        total = held
        if self.transport is not None:
            total += self.transport.get_write_buffer_size()
        ex = self._ex or self._tunnel
        if ex is not None and ex.conn is not None and ex.conn.transport is not None:
            total += ex.conn.transport.get_write_buffer_size()
        if total > self.max_buffered:
            self.max_buffered = total


class PlainHTTPListener(L7Bridge):
    """The :80 listener: ``/.well-known/acme-challenge/*`` goes to the acme service, everything else is 404."""

    acme_only = True

    def __init__(
        self, ctx: L7Context, loop: asyncio.AbstractEventLoop, client_addr: tuple | None = None, scheme: str = "http"
    ) -> None:
        super().__init__(ctx, loop, client_addr, scheme)


def _expects_continue(headers: list[Header]) -> bool:
    for name, value in headers:
        if len(name) == 6 and name.lower() == b"expect" and value.strip(b" \t").lower() == b"100-continue":
            return True
    return False


class _Exchange:
    """One request and its response: routing, the upstream connection, both body directions, a tunnel."""

    __slots__ = (
        "_cand_idx",
        "_candidates",
        "_out",
        "_task",
        "_waf",
        "body_written",
        "bridge",
        "chunked_out",
        "close_client",
        "close_delimited",
        "conn",
        "continue_sent",
        "corr",
        "done",
        "head_bytes",
        "head_only",
        "instance",
        "interim",
        "local_pending",
        "req",
        "resp_body_bytes",
        "resp_budget",
        "resp_complete",
        "resp_extra",
        "resp_head_sent",
        "resp_headers",
        "resp_headers_done",
        "resp_keep_alive",
        "resp_parser",
        "resp_reason",
        "resp_started",
        "retried",
        "service",
        "sidx",
        "status",
        "tunnel",
        "upgrading",
        "waf_waiting",
        "warm",
    )

    def __init__(self, bridge: L7Bridge, req: _Request) -> None:
        self.bridge = bridge
        self.req = req
        self.service = ""
        self.sidx = 0  # metrics index: 0 = "_none" until a service is known
        self.corr = b""  # the correlation id sent upstream (a routed request only)
        self.resp_body_bytes = 0
        self.status = 0
        self.done = False
        self.conn: UpstreamConn | None = None
        self.instance: Instance | None = None
        self.warm = False
        self.retried = False
        self._task: asyncio.Task | None = None
        self._candidates: list[Instance] = []
        self._cand_idx = 0
        self.head_bytes = b""
        self.body_written = 0
        self.head_only = False
        self.tunnel = False
        self.upgrading = False
        self.close_client = False
        self.local_pending = False  # answered locally; the rest of the request body is read and dropped
        self.waf_waiting = False  # the WAF waits for the body (held in req.body) before inspecting
        self.continue_sent = False  # we answered Expect: 100-continue ourselves
        self._waf: tuple[WafGate, WafEngine, str, bytes] | None = None  # an inspection to come or running
        self.resp_parser: httptools.HttpResponseParser | None = None
        self._out: list[bytes] | None = None  # response bytes batched during one upstream read
        self._reset_response()

    def _reset_response(self) -> None:
        self.resp_started = False
        self.resp_headers: list[Header] = []
        self.resp_reason = b""
        self.resp_headers_done = False
        self.resp_head_sent = False
        self.resp_complete = False
        self.resp_extra = False
        self.resp_keep_alive = False
        self.interim = False
        self.chunked_out = False
        self.close_delimited = False
        cfg = self.bridge.ctx.cfg.policy
        self.resp_budget = HeaderBudget(cfg.max_headers * 2, cfg.max_header_bytes * 2)

    # -- routing ---------------------------------------------------------------------------------------
    def begin(self) -> None:
        b = self.bridge
        ctx = b.ctx
        head = self.req.head
        assert head is not None
        self.head_only = head.method == b"HEAD"
        if b.refuse_status:
            self.respond_error(b.refuse_status)
            return
        if ctx.overloaded():
            # fail fast instead of queueing (rsx-gateway): the client may retry in a second, on this connection
            ctx.count("refused_inflight")
            self.respond_local(503, [(b"Retry-After", b"1")], keep_alive=True)
            return
        is_acme = head.path.startswith(ACME_PREFIX)
        if b.acme_only and not is_acme:
            self.respond_error(404)
            return
        if b._tls and b._sni is None:
            # SNI is the routing key (ARCHITECTURE.md §3 step 4): a TLS client that sent none got the bootstrap
            # certificate so that it can read this answer; it is never routed by Host alone.
            ctx.count("no_sni")
            self.respond_error(421)
            return
        host = head.host or (b._sni or "")
        if not host:
            self.respond_error(400)  # HTTP/1.0 without Host and no SNI to stand in for it: nothing to route by
            return
        if b._sni is not None and head.host and head.host != b._sni:
            self.respond_error(421)  # a connection is bound to the name it was opened for
            return
        if is_acme:
            # HTTP-01 challenges: straight to the acme service, before any host lookup; nothing injected.
            self.service = b._acme_service
            self.sidx = ctx.service_id(self.service)
            headers = passthrough_headers(head.headers, websocket=head.websocket)
            ctx.count("acme_requests")
        else:
            route = ctx.resolve(host) if host else None
            if route is None:
                self.respond_error(421)
                return
            self.service = route.service
            self.sidx = route.sidx
            verdict = ctx.policy(
                RequestInfo(head.method, head.target, head.path, host, b._client_ip, route, head.headers, b.scheme)
            )
            if verdict is not None:
                ctx.count("policy_blocked")
                if isinstance(verdict, int):
                    self.respond_error(verdict)
                else:
                    self.respond_local(verdict.status, verdict.headers, keep_alive=verdict.keep_alive)
                return
            headers, corr = forward_headers(
                head.headers,
                route,
                client_ip=b._client_ip,
                proto=b.scheme,
                host=head.authority or host.encode(),
                hostname=host,
                websocket=head.websocket,
                client_cert=b._client_cert_der(),
            )
            self.corr = corr
        if head.chunked:
            framing: Header | None = (b"Transfer-Encoding", b"chunked")
        elif head.content_length is not None:
            framing = (b"Content-Length", b"%d" % head.content_length)
        else:
            framing = None
        if not head.authority:
            headers.append((b"Host", host.encode()))  # HTTP/1.0 without Host: upstream is 1.1, Host is the SNI
        self.head_bytes = request_head(head.method, head.target, headers, framing=framing)
        if not is_acme:  # ACME challenges always pass (ARCHITECTURE.md §3 step 6)
            gate = ctx.waf_gate()
            if gate is not None and gate.enabled():
                gate.when_ready(lambda engine: self._waf_engine_ready(gate, engine, host, corr))
                return
        self._forward()

    def _forward(self) -> None:
        """Pick the backend and send the request: a pooled connection now, or a connect task."""
        b = self.bridge
        ctx = b.ctx
        self._candidates = ctx.candidates(self.service)
        if not self._candidates:
            ctx.count("upstream_unavailable")
            self.respond_error(503)
            return
        conn = ctx.pool.acquire(self._candidates[0].id)
        if conn is not None:
            ctx.upstream(self.sidx, "upstream_warm")
            self._attach(conn, self._candidates[0], warm=True)
        else:
            self._task = b.loop.create_task(self._connect(fresh=False))

    # -- the WAF: the body is buffered (up to waf_body_max) and inspected before anything goes upstream ------
    def _waf_engine_ready(
        self, gate: WafGate, engine: WafEngine | BaseException | None, host: str, corr: bytes
    ) -> None:
        if self.done:
            return  # the client went away while the rules loaded
        if isinstance(engine, BaseException):
            log.error("WAF rule set failed to load: failing closed", exc_info=engine)
            self.bridge.ctx.count("waf_errors")
            self.respond_error(503)
        elif engine is None:
            self._forward()  # turned off meanwhile
        else:
            self._waf_begin(gate, engine, host, corr)

    def _waf_begin(self, gate: WafGate, engine: WafEngine, host: str, corr: bytes) -> None:
        head = self.req.head
        assert head is not None
        s = engine.settings
        if head.content_length is not None and head.content_length > s.body_max and not s.partial_bodies:
            self.bridge.ctx.count("waf_body_too_large")
            self.respond_error(413)  # refused before a byte of it is read
            return
        self._waf = (gate, engine, host, corr)
        b = self.bridge
        b._hold_limit = max(BODY_BUFFER_LIMIT, s.body_max)
        if b._paused & _P_BUFFER and self.req.buffered <= b._hold_limit:
            b._unpause(_P_BUFFER)  # held at the default limit while the rules loaded: room for more now
        self.waf_waiting = True
        req = self.req
        if not req.complete and head.has_body and head.version == "1.1" and _expects_continue(head.headers):
            # The WAF needs the body before anything goes upstream, so the backend cannot say 100 Continue:
            # we do, or the client would wait for it (curl: 1 s) before sending the body we wait for.
            self.continue_sent = True
            self.bridge._write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self._waf_body_progress()

    def _waf_body_progress(self) -> None:
        """Inspect once the body is complete, or as soon as it is known to be longer than the limit."""
        req = self.req
        if self.waf_waiting and (req.complete or req.buffered > self._waf[1].settings.body_max):  # type: ignore[index]
            self._waf_run()

    def _waf_run(self) -> None:
        self.waf_waiting = False
        b = self.bridge
        gate, engine, host, _corr = self._waf  # type: ignore[misc]
        req = self.req
        head = req.head
        assert head is not None
        s = engine.settings
        body = (req.body[0] if len(req.body) == 1 else b"".join(req.body)) if req.body else b""
        truncated = not req.complete or len(body) > s.body_max
        if truncated:
            if not s.partial_bodies:
                b.ctx.count("waf_body_too_large")
                self.respond_error(413)
                return
            body = body[: s.body_max]
        wreq = WafRequest(
            head.method, head.target, head.version, head.headers, host, b._client_ip, body=body, truncated=truncated
        )
        gate.inspect(engine, wreq, len(head.target) + req.budget.size + len(body), self._waf_done)

    def _waf_done(self, result: WafVerdict | BaseException) -> None:
        if self.done or self._waf is None:
            return  # the client went away meanwhile
        b = self.bridge
        ctx = b.ctx
        gate, _engine, _host, corr = self._waf
        self._waf = None
        if isinstance(result, BaseException):
            log.error("WAF inspection failed: failing closed", exc_info=result)
            ctx.count("waf_errors")
            self.respond_error(503)
            return
        gate.report(result, self.service, corr)
        if result.blocked:
            ctx.count("policy_waf")
            ctx.count("policy_blocked")
            status = 400 if result.status == 400 else 403  # 400: a body that claims a format and does not parse
            body = b"%d %s\nrequest id: %s\n" % (status, REASONS[status], corr)
            self.respond_local(status, [(b"X-Correlation-Id", corr)], keep_alive=False, body=body)
            return
        self._forward()

    async def _connect(self, fresh: bool) -> None:
        """Try the candidates from the current one on; connect failures mark suspects. Ends in a 502."""
        b = self.bridge
        ctx = b.ctx
        try:
            while self._cand_idx < len(self._candidates) and not self.done:
                inst = self._candidates[self._cand_idx]
                if not fresh:
                    conn = ctx.pool.acquire(inst.id)
                    if conn is not None:
                        ctx.upstream(self.sidx, "upstream_warm")
                        self._attach(conn, inst, warm=True)
                        return
                fresh = False
                tls = None
                if inst.tls:
                    tls = ctx.upstream_tls(inst)  # BRIDGE HOOK: the lead wires the TLS helper's client here
                    if tls is None:
                        log.warning("instance %s wants TLS and no upstream TLS is configured", inst.id)
                        ctx.count("upstream_errors")
                        self._cand_idx += 1
                        continue
                try:
                    conn = await ctx.pool.connect(inst, tls)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    ctx.backend_failed(inst)
                    self._cand_idx += 1
                    continue
                if self.done:
                    ctx.pool.release(conn)  # unused and healthy: someone else can have it
                    return
                ctx.upstream(self.sidx, "upstream_cold")
                self._attach(conn, inst, warm=False)
                return
            if not self.done:
                ctx.count("upstream_errors")
                self.respond_error(502)
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("upstream connect failed unexpectedly")
            if not self.done:
                self.respond_error(502)
        finally:
            self._task = None

    def _attach(self, conn: UpstreamConn, inst: Instance, warm: bool) -> None:
        b = self.bridge
        self.conn = conn
        self.instance = inst
        self.warm = warm
        conn.owner = self
        self.body_written = 0
        self.resp_parser = httptools.HttpResponseParser(self)
        if b._write_paused:
            conn.pause_reading()
        req = self.req
        transport = conn.transport
        assert transport is not None
        head = req.head
        assert head is not None
        if head.websocket:
            transport.write(self.head_bytes)
            self._await_response()
            return  # its bytes wait for the 101
        parts = [self.head_bytes]
        if req.body:
            body, req.body = req.body, []
            req.buffered = 0
            for chunk in body:
                self.body_written += len(chunk)
                if head.chunked:
                    parts += (chunk_size_line(len(chunk)), chunk, CRLF)
                else:
                    parts.append(chunk)
        if req.complete and head.chunked:
            parts.append(LAST_CHUNK)
        if len(parts) == 1:
            transport.write(parts[0])
        else:
            transport.writelines(parts)  # one vectored write on uvloop
        if req.complete:
            self._await_response()
        if body_held := b._paused & _P_BUFFER:
            b._unpause(body_held)
        if b.track_buffers:
            b._track(0)

    # -- request body (client -> upstream) -------------------------------------------------------------
    def client_body(self, data: bytes) -> None:
        if self.done or self.local_pending:
            return  # answered already (an early response or an error): the rest is dropped
        if self.conn is None:
            self.bridge._hold_body(self.req, data)
            if self.waf_waiting:
                self._waf_body_progress()
            return
        self._write_body(data)
        if self.bridge.track_buffers:
            self.bridge._track(0)

    def client_body_end(self) -> None:
        if self.waf_waiting:
            self._waf_run()
            return
        if self.local_pending:
            self.local_pending = False
            self._finish(reuse=False, close_client=False)  # the body is read: the next request may follow
            return
        if not self.done and self.conn is not None:
            self._write_body_end()
            self._await_response()

    def _await_response(self) -> None:
        """The request is all sent: the backend has ``upstream.response_timeout_s`` to start answering (the
        connection keeps the deadline; its first byte or its release ends it)."""
        if not self.resp_started and self.conn is not None:
            self.conn.expect_response()

    def upstream_timeout(self) -> None:
        if self.done or self.resp_started:
            return
        self.bridge.ctx.count("upstream_timeout")
        self.respond_error(504)  # the connection is closed, never pooled: a late answer must not leak

    def _write_body(self, data: bytes) -> None:
        transport = self.conn.transport  # type: ignore[union-attr]
        self.body_written += len(data)
        if self.req.head.chunked:  # type: ignore[union-attr]
            transport.writelines((chunk_size_line(len(data)), data, CRLF))
        else:
            transport.write(data)

    def _write_body_end(self) -> None:
        if self.req.head.chunked:  # type: ignore[union-attr]
            self.conn.transport.write(LAST_CHUNK)  # type: ignore[union-attr]

    # -- upstream connection events ----------------------------------------------------------------------
    def upstream_data(self, data: bytes) -> None:
        if self.done:
            return
        self.resp_started = True
        if self.tunnel:
            self.bridge._write_split(data)
            return
        parser = self.resp_parser
        assert parser is not None
        self._out = []
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            self._flush()
            self._switch_to_tunnel(data[exc.args[0] :])
            return
        except httptools.HttpParserError as exc:
            self._flush()
            if not self.resp_complete or not isinstance(exc.__context__, _Stop):
                cause = exc.__context__
                if cause is not None and not isinstance(cause, _Stop | HeadError):
                    log.error("L7 bridge response callback failed", exc_info=cause)
                self._upstream_failed()
                return
        self._flush()
        if self.resp_complete and not self.done:
            self._response_done()

    def upstream_lost(self, conn: UpstreamConn, exc: Exception | None) -> None:
        if self.done or conn is not self.conn:
            return
        self.conn = None
        b = self.bridge
        if self.tunnel:
            self._finish(reuse=False, close_client=True)
            return
        if not self.resp_started:
            if self.warm and not self.retried and self.body_written == 0 and self.req.head.method in IDEMPOTENT:  # type: ignore[union-attr]
                # A pooled connection the backend had closed: replay once on a fresh one (RFC 9110 §9.2.2).
                self.retried = True
                b.ctx.upstream(self.sidx, "upstream_stale_retry")
                b._unpause(_P_UPSTREAM)
                self._task = b.loop.create_task(self._connect(fresh=True))
                return
            b.ctx.count("upstream_errors")
            self.respond_error(502)
            return
        if self.resp_headers_done and self.close_delimited:
            # The body was delimited by the close: this is its end.
            if self.chunked_out:
                b._write(LAST_CHUNK)
            self._finish(reuse=False, close_client=self.close_client)
            return
        self._upstream_failed()

    def upstream_pause_writing(self) -> None:
        self.bridge._pause(_P_UPSTREAM)
        self.bridge.ctx.count("backpressure_client_paused")

    def upstream_resume_writing(self) -> None:
        self.bridge._unpause(_P_UPSTREAM)

    def _upstream_failed(self) -> None:
        """The backend broke the response: 502 if nothing was sent yet, else cut the client off."""
        b = self.bridge
        if not self.resp_head_sent:
            b.ctx.count("upstream_errors")
            self.respond_error(502)
        else:
            b.ctx.count("upstream_truncated")
            self._finish(reuse=False, close_client=True)

    # -- httptools response callbacks ------------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self.resp_complete:
            self.resp_extra = True  # bytes after a complete response: the connection is not reusable
            raise _Stop

    def on_status(self, reason: bytes) -> None:
        self.resp_reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.resp_headers_done:
            return  # trailers are dropped
        self.resp_budget.add(name, value)  # HeadError -> parser error -> 502
        self.resp_headers.append((name, value))

    def on_headers_complete(self) -> None:
        b = self.bridge
        parser = self.resp_parser
        assert parser is not None
        status = parser.get_status_code()
        req_head = self.req.head
        assert req_head is not None
        self.resp_headers_done = True
        if status < 200:
            if status == 101:
                if not req_head.websocket:
                    raise _Stop  # a 101 nobody asked for: a broken backend
                if not self._accept_matches(req_head.websocket_key):
                    # No proof the backend speaks WebSocket (RFC 6455 §4.2.2): opening the tunnel anyway is how
                    # a client smuggles raw HTTP past the proxy's framing (WebSocket smuggling). 502.
                    b.ctx.count("websocket_bad_accept")
                    raise _Stop
                self.upgrading = True
                return
            self.interim = True
            if status == 100 and self.continue_sent:
                return  # the client has had its 100 Continue from us (the WAF asked for the body)
            if req_head.version == "1.1":
                self._emit(response_head(status, self.resp_reason, response_headers(self.resp_headers)))
            return
        self.status = status
        self.resp_keep_alive = parser.should_keep_alive()
        framing = response_framing(  # HeadError (another transfer coding) -> parser error -> 502
            status,
            self.resp_headers,
            head_only=self.head_only,
            version=req_head.version,
            keep_alive=req_head.keep_alive,
            websocket=req_head.websocket,
            draining=b._draining,
        )
        self.chunked_out = framing.chunked_out
        self.close_delimited = framing.close_delimited
        if framing.close_client:
            self.close_client = True
        headers = response_headers(self.resp_headers)
        if framing.drop_content_length:
            headers = without_content_length(headers)
        self._emit(response_head(status, self.resp_reason, headers, framing.extra))
        self.resp_head_sent = True
        if self.head_only:
            self.resp_complete = True
            raise _Stop  # httptools cannot be told a HEAD response has no body

    def _accept_matches(self, key: bytes) -> bool:
        accepts = [v for n, v in self.resp_headers if len(n) == 20 and n.lower() == b"sec-websocket-accept"]
        return len(accepts) == 1 and accepts[0].strip(b" \t") == websocket_accept(key)

    def on_body(self, body: bytes) -> None:
        self.resp_body_bytes += len(body)
        emit = self._emit
        if not self.chunked_out and len(body) <= CHUNK:
            emit(body)  # the common case, without a list
            return
        for piece in encode_chunks(body, CHUNK) if self.chunked_out else split(body, CHUNK):
            emit(piece)

    def on_message_complete(self) -> None:
        if self.interim:
            self._reset_response()
            self.resp_started = True
            return
        if self.upgrading:
            return  # HttpParserUpgrade follows
        if self.chunked_out:
            self._emit(LAST_CHUNK)
        self.resp_complete = True

    def _emit(self, data: bytes) -> None:
        out = self._out
        if out is None:
            self.bridge._write(data)
        else:
            out.append(data)

    def _flush(self) -> None:
        """Write what one upstream read produced: as few writes as possible, none over CHUNK bytes."""
        out, self._out = self._out, None
        if not out:
            return
        write = self.bridge._write
        for data in coalesce(out, CHUNK):
            write(data)

    def _response_done(self) -> None:
        reuse = upstream_reusable(
            backend_keep_alive=self.resp_keep_alive,
            extra_bytes=self.resp_extra,
            head_only=self.head_only,
            close_delimited=self.close_delimited,
            request_complete=self.req.complete,
        )
        self._finish(reuse=reuse, close_client=self.close_client)

    # -- websocket tunnel -------------------------------------------------------------------------------
    def _switch_to_tunnel(self, rest: bytes) -> None:
        b = self.bridge
        if not self.upgrading:
            self._upstream_failed()
            return
        b._write(response_head(101, self.resp_reason, response_headers(self.resp_headers, upgrade=True)))
        self.resp_head_sent = True
        self.status = 101
        self.tunnel = True
        b._tunnel = self
        b._upgrade_req = None
        b._disarm()
        b.ctx.count("websocket_upgrades")
        b.ctx.count("status_1xx")
        b.ctx.request_done(self, b.loop.time() - self.req.t0)
        if rest:
            b._write_split(rest)
        req = self.req
        held, req.upgrade_data = req.upgrade_data, []
        req.buffered = 0
        transport = self.conn.transport  # type: ignore[union-attr]
        for data in held:
            transport.write(data)
        b._unpause(_P_BUFFER | _P_STOPPED | _P_PIPELINE)

    def client_raw(self, data: bytes) -> None:
        conn = self.conn
        if conn is not None and conn.transport is not None:
            conn.transport.write(data)
            if self.bridge.track_buffers:
                self.bridge._track(0)

    # -- endings -----------------------------------------------------------------------------------------
    def respond_error(self, status: int) -> None:
        """Answer ``status`` and close the client connection (or just close, mid-response)."""
        if self.done:
            return
        b = self.bridge
        if not self.resp_head_sent:
            self.status = status
            b.ctx.count(f"http_{status}")
            if not b._closing:
                b._write(error_response(status, head_only=self.head_only))
        self._finish(reuse=False, close_client=True)

    def respond_local(self, status: int, headers: list[Header], *, keep_alive: bool, body: bytes | None = None) -> None:
        """Answer ``status`` ourselves; keep the connection when asked to and the client allows it.

        A body still to come is read and dropped first (``local_pending``), up to ``LOCAL_DRAIN_MAX`` bytes
        declared; a bigger or chunked body is not worth reading: the connection closes after the answer.
        """
        if self.done:
            return
        b = self.bridge
        req = self.req
        head = req.head
        assert head is not None
        keep = (
            keep_alive
            and head.keep_alive
            and head.version == "1.1"
            and not head.websocket
            and not b._draining
            and (req.complete or (not head.chunked and (head.content_length or 0) <= LOCAL_DRAIN_MAX))
        )
        self.status = status
        b.ctx.count(f"http_{status}")
        if not b._closing:
            b._write(local_response(status, headers, close=not keep, head_only=self.head_only, body=body))
        self.resp_head_sent = True
        if not keep:
            self._finish(reuse=False, close_client=True)
        elif req.complete:
            self._finish(reuse=False, close_client=False)
        else:
            self.local_pending = True

    def client_gone(self) -> None:
        """The client connection closed under us."""
        if self.done:
            return
        self.done = True
        self.bridge.ctx.count("client_aborted")
        self._cancel_connect()
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.close()

    def _cancel_connect(self) -> None:
        task, self._task = self._task, None
        # Not the task we are running in: it is about to return by itself.
        if task is not None and not task.done() and task is not asyncio.current_task(self.bridge.loop):
            task.cancel()

    def _finish(self, reuse: bool, close_client: bool) -> None:
        if self.done:
            return
        self.done = True
        b = self.bridge
        self._cancel_connect()
        conn, self.conn = self.conn, None
        if conn is not None:
            if reuse and not conn.closed:
                b.ctx.pool.release(conn)
            else:
                conn.close()
        status = self.status
        if self.instance is not None and status:
            # the backend's own 502/503/504 and the ones we answered for it (broken response, timeout)
            b.ctx.upstream_result(self.instance.id, status not in (502, 503, 504))
        if status and status != 101:  # counted and timed at the switch
            b.ctx.count(_STATUS_CLASS.get(status // 100, "status_other"))
            b.ctx.request_done(self, b.loop.time() - self.req.t0)
        b._exchange_done(self, close_client)

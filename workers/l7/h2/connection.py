"""One asyncio Protocol per HTTP/2 client connection (ALPN ``h2``): the engine's events to streams, each
stream the ``Downstream`` of one ``Exchange`` (``stream.py``), so every request takes the same admission,
WAF, hygiene, upstream pool, relay and accounting as an HTTP/1.1 one.

The loop per read: ``StreamBudget.begin_read``, ``ServerConnection.receive``, each event acted on (a new
stream is opened against the budget, mapped by ``map_request`` into the h1 ``RequestHead`` and handed to an
exchange; a malformed one is a stream error, counted, never forwarded), ``after_read`` (the traffic rule),
then one write of ``data_to_send``. At the concurrency cap reading stops until a stream's exchange is done
(a stream holds its place until then, not until its RST). A verdict to close ends the connection with
GOAWAY and no stream is served further.

Drain, the idle deadline and the lingering close are the connection's ``ConnectionLifecycle`` (``lifecycle.py``).
Deadlines: the handshake's is the TLS layer's; the connection's idle deadline runs while no stream is open;
a header block left open (HEADERS without END_HEADERS, or a frame trickled) must end within
``limits.header_timeout_s`` (``HeaderBlockWatch``), else GOAWAY ENHANCE_YOUR_CALM and close; a request body
idle for ``limits.idle_timeout_s`` (as HTTP/1.1's) ends its stream alone: 408 if no response has started, else
RST_STREAM. A body the proxy itself holds back (windows shut) is not idle. The response side has
``limits.send_timeout_s``, per stream (windows held shut) and per connection (socket not read):
``send_deadline.py``.
"""

from __future__ import annotations

import asyncio
import functools
import logging

from sentin8.http import h2_codes
from sentin8.http.framing import measured_budget
from sentin8.http.h2_blocks import HeaderBlockWatch
from sentin8.http.h2_budget import CLOSE, GOAWAY, REFUSE, StreamBudget, Verdict
from sentin8.http.h2_engine import (
    FIELDS_CHECKED,
    ConnectionEnded,
    GoAwaySent,
    H2Limits,
    RequestData,
    RequestHeaders,
    RequestTrailers,
    ServerConnection,
    StreamRefused,
    StreamReset,
    WindowOpened,
)
from sentin8.http.h2_request import STREAM_ERROR, H2Refusal, check_body_length, check_trailers, map_request

from ...deadline import BODY, Deadline
from ..contract import L7Context
from ..downstream import NO_FACTS, ConnectionFacts
from ..exchange import Exchange
from ..linger import LINGER_BYTES
from ..request import Request
from .lifecycle import ConnectionLifecycle
from .send_deadline import SendDeadlines
from .stream import WRITE_HIGH, H2Stream

log = logging.getLogger("sentin8.l7")


class H2Bridge(ConnectionLifecycle, asyncio.Protocol):
    """One h2 client connection. The class knobs are the worker's, as for ``L7Bridge``."""

    acme_only = False
    external = True
    refuse_status = 0

    def __init__(
        self, ctx: L7Context, loop: asyncio.AbstractEventLoop, client_addr: tuple | None = None, scheme: str = "https"
    ) -> None:
        self.ctx = ctx
        self.loop = loop
        self.client_addr = client_addr
        self.scheme = scheme
        cfg = ctx.cfg
        self._max_headers = cfg.policy.max_headers
        self._idle_timeout = cfg.limits.idle_timeout_s
        self._header_timeout = cfg.limits.header_timeout_s
        self.blocks = HeaderBlockWatch()
        self._header_timer: asyncio.TimerHandle | None = None  # armed while a header block is open
        self._drain_grace = min(cfg.fleet.drain_idle_grace_s, cfg.fleet.drain_timeout_s)
        limits = H2Limits.from_config(cfg)  # [http2] and [policy]: a reload's new workers take the new values
        self.engine = ServerConnection(limits)
        self.budget = StreamBudget.of(limits)
        self.facts: ConnectionFacts = NO_FACTS
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, H2Stream] = {}
        self.draining = False
        self._closing = False
        self._reading = True
        self._write_paused = False
        self._final_sent = False  # the drain's final GOAWAY has gone
        self._paused_streams = 0  # streams whose queued response is above stream.WRITE_HIGH
        self._timer: asyncio.TimerHandle | None = None
        self._lingered = 0  # bytes read and discarded since the lingering close began
        self.send_deadlines = SendDeadlines(self, loop, cfg.limits.send_timeout_s)
        self._flush_soon = False  # a flush is scheduled for the end of this loop turn

    # -- asyncio.Protocol ----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.facts = ConnectionFacts.of(
            transport,
            self.client_addr,
            scheme=self.scheme,
            external=self.external,
            acme_only=self.acme_only,
            refuse_status=self.refuse_status,
            protocol="h2",
        )
        self.ctx.count("l7_connections_h2")
        self.flush()  # our SETTINGS
        self._arm_idle()
        if self.draining:
            self.draining = False
            self.begin_drain()

    def data_received(self, data: bytes) -> None:
        if self._closing:  # lingering: read and discard, within a bound
            self._lingered += len(data)
            if self._lingered > LINGER_BYTES:
                self._linger_over()
            return
        budget = self.budget
        engine = self.engine
        if self.blocks.feed(data):
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(self._header_timeout, self._header_over)
        elif self._header_timer is not None:
            self._cancel_header_timer()
        budget.begin_read()
        try:
            for ev in engine.receive(data):
                verdict = self._event(ev)
                if verdict is not None:
                    if verdict.action == CLOSE:
                        self._close_with(verdict)
                        break
                    self.ctx.count(verdict.counter)  # GOAWAY: the streams so far are served, no new one
                    engine.goaway(verdict.code)
            if engine.ended is None:
                verdict = budget.after_read(engine.received, engine.payload, engine.control)
                if verdict is not None:
                    self._close_with(verdict)
        except Exception:
            log.exception("h2 bridge callback failed")
            self.ctx.count("bridge_errors")
            self.engine.close(h2_codes.INTERNAL_ERROR, "h2_engine_error")
        self.flush()
        if budget.at_cap and self._reading and self.transport is not None:
            self._reading = False  # at the concurrency cap: read again when a stream's exchange is done
            self.transport.pause_reading()

    def eof_received(self) -> bool | None:
        return None  # the TLS layer closes (close_notify first); a lingering close ends here too

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._cancel_timer()
        self._cancel_header_timer()
        self.send_deadlines.stop()
        streams, self.streams = self.streams, {}
        for st in streams.values():
            st.stop_body_deadline()
            self._end_stream_request(st)
            ex = st.ex
            if ex is not None:
                ex.client_gone()

    def pause_writing(self) -> None:
        self._write_paused = True
        self.send_deadlines.socket_paused()
        for st in self.streams.values():
            if st.ex is not None:
                st.ex.client_write_paused()

    def resume_writing(self) -> None:
        self._write_paused = False
        self.send_deadlines.socket_resumed()
        for st in self.streams.values():
            if st.ex is not None and not st.write_paused:
                st.ex.client_write_resumed()

    # -- events ---------------------------------------------------------------------------------------
    def _event(self, ev: object) -> Verdict | None:
        t = type(ev)
        if t is RequestData:
            st = self.streams.get(ev.stream_id)  # type: ignore[attr-defined]
            if st is None:
                return None
            req = st.req
            req.received += len(ev.data)  # type: ignore[attr-defined]
            if st.body_deadline is not None:
                st.body_deadline.arm(BODY, self._idle_timeout)  # activity: the idle time starts again
            try:
                check_body_length(req.head.content_length, req.received, ev.end_stream)  # type: ignore[attr-defined,union-attr]
            except H2Refusal as exc:
                return self._stream_error(st, exc.reason)
            st.data(ev.data, ev.flow)  # type: ignore[attr-defined]
            if ev.end_stream:  # type: ignore[attr-defined]
                self._request_complete(st)
        elif t is RequestHeaders:
            return self._open(ev)  # type: ignore[arg-type]
        elif t is RequestTrailers:
            st = self.streams.get(ev.stream_id)  # type: ignore[attr-defined]
            if st is not None:
                try:
                    check_trailers(ev.fields)  # type: ignore[attr-defined]
                    check_body_length(st.req.head.content_length, st.req.received, True)  # type: ignore[union-attr]
                except H2Refusal as exc:
                    return self._stream_error(st, exc.reason)
                self._request_complete(st)  # trailers are dropped, as h1's are
        elif t is StreamReset:
            sid = ev.stream_id  # type: ignore[attr-defined]
            st = self.streams.get(sid)
            if st is not None:
                st.ended = True
                ex = st.ex
                if ex is not None:
                    ex.client_gone()
                self._forget(st)
            if ev.remote:  # type: ignore[attr-defined]
                return self.budget.reset_by_peer(sid, self.loop.time())
            if ev.error_code == h2_codes.PROTOCOL_ERROR:  # type: ignore[attr-defined]
                # the engine's own check (content-length vs DATA...): the client made us reset it, which is
                # MadeYouReset's way, so it counts as a premature reset
                self.ctx.count("h2_stream_errors")
                verdict = self.budget.reset_by_peer(sid, self.loop.time())
                self.budget.done(sid)
                return verdict
            self.budget.reset_by_us(sid)
        elif t is StreamRefused:  # the engine refused a malformed stream (RST_STREAM): never forwarded
            self.ctx.count(ev.reason)  # type: ignore[attr-defined]
            self.ctx.count("h2_stream_errors")
            return self.budget.refused(self.loop.time())
        elif t is WindowOpened:
            self._windows_opened()
        elif t is GoAwaySent:
            self.ctx.count("h2_goaway_sent")
            self._final_sent = True
            self._cancel_timer()
        elif t is ConnectionEnded and ev.reason:  # type: ignore[attr-defined]
            self.ctx.count(ev.reason)  # type: ignore[attr-defined]  # the engine's own limit
        return None

    def _open(self, ev: RequestHeaders) -> Verdict | None:
        sid = ev.stream_id
        verdict = self.budget.opened(sid, self.loop.time())
        if verdict is not None:
            if verdict.action == CLOSE:
                return verdict
            self.ctx.count(verdict.counter)
            if verdict.action == REFUSE:
                self.engine.refuse(sid)
                return None
            if verdict.action == GOAWAY:
                self.engine.goaway(verdict.code)
        self.ctx.count("h2_streams")
        try:
            head = map_request(ev.fields, ev.end_stream, max_headers=self._max_headers, fields_checked=FIELDS_CHECKED)
        except H2Refusal as exc:
            self.ctx.count(exc.reason)
            verdict = None
            if exc.status == STREAM_ERROR:
                self.ctx.count("h2_stream_errors")
                self.engine.reset(sid, h2_codes.PROTOCOL_ERROR)
                verdict = self.budget.reset_by_peer(sid, self.loop.time())  # provoked: premature
            else:
                self.ctx.count(f"http_{exc.status}")
                self.engine.send_head(sid, exc.status, [(b"content-length", b"0")], end_stream=True)
            self.budget.done(sid)
            return verdict
        req = Request(measured_budget(head.headers))
        req.head = head
        req.complete = ev.end_stream
        req.counted = True
        req.t0 = self.loop.time()
        self.ctx.inflight(1)
        self.ctx.count("requests")
        st = H2Stream(self, sid, req)
        self.streams[sid] = st
        self._cancel_timer()
        if not ev.end_stream:
            # a partial, not a lambda: _open stays free of closures, so it compiles to a C method (connection.pxd)
            st.body_deadline = Deadline(self.loop, functools.partial(self._body_idle, st))
            st.body_deadline.arm(BODY, self._idle_timeout)
        ex = Exchange(st, req)
        st.ex = ex
        req.exchange = ex
        ex.begin()
        return None

    def _body_idle(self, st: H2Stream, kind: int) -> None:
        """No DATA on ``st`` for ``limits.idle_timeout_s``: unless we hold its body back (its windows shut, or
        reading paused at the cap), the stream ends alone: 408, or RST_STREAM once a response has started."""
        if self._closing or self.streams.get(st.sid) is not st or st.req.complete:
            return
        if st.unconsumed or st.paused or not self._reading:
            st.body_deadline.arm(BODY, self._idle_timeout)  # type: ignore[union-attr]
            return
        self.ctx.count("h2_body_timeout")
        ex = st.ex
        if ex is not None:
            ex.respond_error(408)  # the stream's end (exchange_done) frees it
        else:
            self.cancel_stream(st)
        self.flush()

    def cancel_stream(self, st: H2Stream) -> None:
        """RST_STREAM CANCEL: ``st`` ends alone, its exchange (if it still runs) aborted."""
        st.ended = True
        self.engine.reset(st.sid, h2_codes.CANCEL)
        if self.streams.get(st.sid) is st:
            ex = st.ex
            if ex is not None:
                ex.client_gone()  # the upstream connection closed, never pooled
            self._forget(st)
        self.flush()

    def send_stalled(self) -> None:
        """The socket took nothing for ``limits.send_timeout_s``: GOAWAY (queued, best effort), then abort:
        a close (a lingering one too) would wait for a buffer this client never drains."""
        if self.transport is None:
            return
        if not self._closing:
            self.engine.close(h2_codes.NO_ERROR, "")
            self.flush()
        self._closing = True
        self.transport.abort()

    def _header_over(self) -> None:
        """A header block open for ``limits.header_timeout_s`` (h2's slowloris): GOAWAY and close."""
        self._header_timer = None
        if self._closing or self.engine.ended is not None:
            return
        self.ctx.count("h2_header_timeout")
        self.engine.close(h2_codes.ENHANCE_YOUR_CALM, "h2_header_timeout")
        self.flush()

    def _request_complete(self, st: H2Stream) -> None:
        st.stop_body_deadline()
        req = st.req
        req.complete = True
        ex = st.ex
        if ex is not None:
            ex.client_body_end()

    def _stream_error(self, st: H2Stream, reason: str) -> Verdict | None:
        """A malformed request body (content-length vs DATA, bad trailers): RST_STREAM PROTOCOL_ERROR, a
        premature reset the client provoked (MadeYouReset)."""
        self.ctx.count(reason)
        self.ctx.count("h2_stream_errors")
        st.ended = True
        self.engine.reset(st.sid, h2_codes.PROTOCOL_ERROR)
        verdict = self.budget.reset_by_peer(st.sid, self.loop.time())
        ex = st.ex
        if ex is not None:
            ex.client_gone()
        self._forget(st)
        return verdict

    def _windows_opened(self) -> None:
        for st in self.streams.values():
            if st.write_paused and self.engine.buffered(st.sid) <= WRITE_HIGH:
                st.write_paused = False
                self._paused_streams -= 1
                if st.ex is not None and not self._write_paused:
                    st.ex.client_write_resumed()

    # -- what streams ask -----------------------------------------------------------------------------
    def stream_write_paused(self, st: H2Stream) -> None:
        self._paused_streams += 1
        self.send_deadlines.stream_paused(st)
        if st.ex is not None:
            st.ex.client_write_paused()

    def stream_done(self, st: H2Stream) -> None:
        """The stream's exchange is over: its place under the cap is free."""
        if self.streams.get(st.sid) is st:
            self._forget(st)
        self.flush_soon()

    def _forget(self, st: H2Stream) -> None:
        del self.streams[st.sid]
        st.stop_body_deadline()
        if st.write_paused:
            st.write_paused = False
            self._paused_streams -= 1
        sd = self.send_deadlines
        sd.stream_done(st, self.engine.buffered(st.sid))
        self._end_stream_request(st)
        st.req.exchange = None
        st.ex = None
        self.budget.done(st.sid)
        if not self._reading and not self.budget.at_cap and self.transport is not None and not self._closing:
            self._reading = True
            self.transport.resume_reading()
        if not self.streams:
            self._arm_idle()

    def _end_stream_request(self, st: H2Stream) -> None:
        if st.req.counted:
            st.req.counted = False
            self.ctx.inflight(-1)

    # -- writes, drain, close -------------------------------------------------------------------------
    def flush_soon(self) -> None:
        """What the streams queued leaves at the end of this loop turn, in one write: the responses of every
        upstream read in one turn share one TLS record and one send, where a flush per response cost a
        record, a send and a client wake-up each (bench/README.md, "The kernel share")."""
        if not self._flush_soon:
            self._flush_soon = True
            self.loop.call_soon(self._flush_now)

    def _flush_now(self) -> None:
        self._flush_soon = False
        self.flush()

    def flush(self) -> None:
        engine = self.engine
        transport = self.transport
        if transport is None or self._closing:
            return
        out = engine.data_to_send()
        while engine.events_waiting:
            for ev in engine.take_events():
                self._event(ev)
            out += engine.data_to_send()
        if out:
            transport.write(out)
            if self._paused_streams:
                self._windows_opened()  # what was queued has left within the windows: read the upstreams again
        sd = self.send_deadlines
        if sd.stalled:  # with no output too: a finished stream still queued is window-bound
            sd.progress()
        if engine.ended is not None or (self._final_sent and not self.streams):
            self._close()  # after the last bytes: the transport writes them, then close_notify

    def _close_with(self, verdict: Verdict) -> None:
        self.ctx.count(verdict.counter)
        self.engine.close(verdict.code, verdict.counter)

"""One request and its response (uvicorn's request-response cycle, h11's named states): admission, the
upstream connection, both body directions, the response relayed and re-framed, the hand-over to a tunnel.

Its lifecycle is one ``ExchangeState`` (state.py: the states, the transition table, the check).

It never sees the client's wire protocol: what it asks of the client side of its request is the
``Downstream`` protocol (downstream.py): the response as events, the proxy's own answers, the request body's
flow. The upstream half of the framing (where the backend's body ends, whether its connection is reusable) is
decided here; the client half (chunking, closing, interim responses a client may see) by the downstream.
"""

from __future__ import annotations

import asyncio
import logging

import httptools

from sentin8.http.framing import HeadError
from sentin8.http.headers import Header, response_headers
from sentin8.http.response import LAST_CHUNK, chunk, upstream_reusable
from sentin8.routing import Instance
from workers.upstream import UpstreamConn

from .admission import Refuse, admit
from .downstream import Downstream
from .relay import ResponseParser, ResponseRelay
from .request import Request, Stop
from .state import (
    ANSWERED,
    AWAITING,
    CONNECTING,
    DONE,
    HEAD_SENT,
    INSPECTING,
    LEGAL,
    RECEIVED,
    RESPONSE_HEAD,
    ROUTING,
    SENDING,
    STREAMING,
    TUNNEL,
    UPGRADING,
    VERDICT,
    ExchangeState,
    ExchangeStateError,
)
from .waf_wait import WafWait

log = logging.getLogger("sentin8.l7")

IDEMPOTENT = frozenset({b"GET", b"HEAD", b"OPTIONS", b"TRACE", b"PUT", b"DELETE"})
_STATUS_CLASS = {1: "status_1xx", 2: "status_2xx", 3: "status_3xx", 4: "status_4xx", 5: "status_5xx"}


class Exchange(ResponseRelay):
    """One request and its response; its states and their transitions are in state.py."""

    __slots__ = (
        "_cand_idx",
        "_candidates",
        "_task",
        "_waf",
        "body_written",
        "client",
        "close_delimited",
        "conn",
        "corr",
        "head_bytes",
        "head_only",
        "host",
        "instance",
        "req",
        "resp_body_bytes",
        "resp_budget",
        "resp_extra",
        "resp_headers",
        "resp_keep_alive",
        "resp_parser",
        "resp_reason",
        "retried",
        "service",
        "sidx",
        "state",
        "status",
        "warm",
    )

    def __init__(self, client: Downstream, req: Request) -> None:
        self.client = client
        self.req = req
        self.state = ROUTING
        self.service = ""
        self.sidx = 0  # metrics index: 0 = "_none" until a service is known
        self.host = ""
        self.corr = b""  # the correlation id sent upstream (a routed request only)
        self.resp_body_bytes = 0
        self.status = 0
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
        self._waf: WafWait | None = None
        self.resp_parser: httptools.HttpResponseParser | None = None
        self.resp_raw, self.interims, self.interim_bytes = b"", 0, 0  # the response's heads (relay.py)
        self.resp_trailers: list[Header] = []  # a chunked body's trailers (relay.py)
        self.resp_budget = None  # the caps of the response head: its connection's, lent at the attach
        self._reset_response()

    def _to(self, state: ExchangeState) -> None:
        mask, bit = LEGAL[self.state], state  # C integers when compiled (exchange.pxd): no int objects per step
        if not mask >> bit & 1:
            raise ExchangeStateError(f"exchange {self.state.name} -> {state.name}")
        self.state = state

    # -- admission and the way upstream ------------------------------------------------------------------
    def begin(self) -> None:
        head = self.req.head
        assert head is not None
        self.head_only = head.method == b"HEAD"
        client = self.client
        outcome = admit(client.ctx, client.facts, head)
        if isinstance(outcome, Refuse):
            refused = outcome  # typed in exchange.pxd, as ``admitted`` below: its fields are C struct reads
            self.routed(refused.service, refused.sidx, refused.host)
            if refused.local:
                self.respond_local(refused.status, refused.headers or [], keep_alive=refused.keep_alive)
            else:
                self.respond_error(refused.status)
            return
        admitted = outcome
        self.routed(admitted.service, admitted.sidx, admitted.host)
        self.head_bytes, self.corr = admitted.head_bytes, admitted.corr
        if admitted.inspect:
            gate = client.ctx.waf_gate()
            if gate is not None and gate.enabled():
                self._waf = WafWait(self, gate)
                self._waf.start()
                return
        self.forward()

    def routed(self, service: str, sidx: int, host: str) -> None:
        """Admission found the service: counted per service from here on, even when a later step refuses."""
        self.service = service
        self.sidx = sidx
        self.host = host

    def forward(self) -> None:
        """Pick the backend and send the request: a pooled connection now, or a connect task."""
        ctx = self.client.ctx
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
            self._to(CONNECTING)
            self._task = self.client.loop.create_task(self._connect(fresh=False))

    async def _connect(self, fresh: bool) -> None:
        """Try the candidates from the current one on; connect failures mark suspects. Ends in a 502."""
        ctx = self.client.ctx
        try:
            while self._cand_idx < len(self._candidates) and self.state is not DONE:
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
                    tls = ctx.upstream_tls(inst)
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
                if self.state is DONE:
                    ctx.pool.release(conn)  # unused and healthy: someone else can have it
                    return
                ctx.upstream(self.sidx, "upstream_cold")
                self._attach(conn, inst, warm=False)
                return
            if self.state is not DONE:
                ctx.count("upstream_errors")
                self.respond_error(502)
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("upstream connect failed unexpectedly")
            if self.state is not DONE:
                self.respond_error(502)
        finally:
            self._task = None

    def _attach(self, conn: UpstreamConn, inst: Instance, warm: bool) -> None:
        client = self.client
        self.conn = conn
        self.instance = inst
        self.warm = warm
        conn.owner = self
        self.body_written = 0
        parser = conn.response_parser
        if parser is None:
            limits = client.ctx.cfg.policy  # a response head may be twice the size of a request's
            parser = conn.response_parser = ResponseParser(limits.max_headers * 2, limits.max_header_bytes * 2)
        self.resp_parser = parser.lend(self)
        self.resp_budget = parser.budget
        if client.writing_paused:
            conn.pause_reading()
        req = self.req
        head = req.head
        assert head is not None
        if head.websocket:
            conn.send(self.head_bytes)
            self._to(AWAITING)
            conn.expect_response()
            return  # its bytes wait for the 101
        parts = [self.head_bytes]
        if req.body:
            for piece in req.take_body():
                self.body_written += len(piece)
                if head.chunked:
                    parts += chunk(piece)
                else:
                    parts.append(piece)
        if req.complete and head.chunked:
            parts.append(LAST_CHUNK)
        if len(parts) == 1:
            conn.send(parts[0])
        else:
            conn.send_lines(parts)
        if req.complete:
            self._to(AWAITING)
            conn.expect_response()
        else:
            self._to(SENDING)
        client.body_taken()
        if client.track_buffers:
            client.track(0)

    # -- request body (client -> upstream) -------------------------------------------------------------
    def client_body(self, data: bytes) -> None:
        state = self.state
        if state is DONE or state is ANSWERED:
            return  # answered already (an early response or an error): the rest is dropped
        if self.conn is None:
            self.client.hold_body(self.req, data)
            if state is INSPECTING:
                self._waf.body_progress()  # type: ignore[union-attr]
            return
        self._write_body(data)
        if self.client.track_buffers:
            self.client.track(0)

    def client_body_end(self) -> None:
        state = self.state
        if state is INSPECTING:
            self._waf.run()  # type: ignore[union-attr]
        elif state is ANSWERED:
            self._finish(reuse=False)  # the body is read: the next request may follow
        elif state is not DONE and self.conn is not None:
            if self.req.head.chunked:  # type: ignore[union-attr]
                self.conn.send(LAST_CHUNK)
            if state is SENDING:
                self._to(AWAITING)  # the backend has upstream.response_timeout_s to start answering
                self.conn.expect_response()

    def _write_body(self, data: bytes) -> None:
        conn = self.conn
        self.body_written += len(data)
        if self.req.head.chunked:  # type: ignore[union-attr]
            conn.send_lines(chunk(data))  # type: ignore[union-attr]
        else:
            conn.send(data)  # type: ignore[union-attr]

    # -- the WAF's wait (waf_wait.py) --------------------------------------------------------------------
    def await_body(self, limit: int) -> None:
        """The WAF needs the body first: hold up to ``limit`` bytes of it."""
        self._to(INSPECTING)
        self.client.hold_limit(limit, self.req.buffered)

    def send_continue(self) -> None:
        """Answer ``Expect: 100-continue`` ourselves (the backend cannot: it has not seen the request)."""
        self.client.send_continue()

    def inspecting(self) -> None:
        self._to(VERDICT)

    # -- upstream connection events ----------------------------------------------------------------------
    def upstream_data(self, data: bytes) -> None:
        state = self.state
        if state is DONE:
            return
        if state is SENDING or state is AWAITING:
            self._to(RESPONSE_HEAD)
            self.resp_raw = data  # where the status lines are checked (relay.py); no copy while one read holds it
        elif state is RESPONSE_HEAD and not self._more_heads(data):  # interims, or a head spread over reads
            self._upstream_failed()
            return
        parser = self.resp_parser
        assert parser is not None
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            self.client.flush()
            self._switch_to_tunnel(data[exc.args[0] :])
            return
        except httptools.HttpParserError as exc:
            self.client.flush()
            if self.state is not RECEIVED or not isinstance(exc.__context__, Stop):
                cause = exc.__context__
                if cause is not None and not isinstance(cause, Stop | HeadError):
                    log.error("L7 bridge response callback failed", exc_info=cause)
                self._upstream_failed()
                return
        self.client.flush()
        if self.state is RECEIVED:
            self._response_done()

    def upstream_lost(self, conn: UpstreamConn, exc: Exception | None) -> None:
        state = self.state
        if state is DONE or conn is not self.conn:
            return
        self.conn = None
        if state is SENDING or state is AWAITING:
            if self.warm and not self.retried and self.body_written == 0 and self.req.head.method in IDEMPOTENT:  # type: ignore[union-attr]
                # A pooled connection the backend had closed: replay once on a fresh one (RFC 9110 §9.2.2).
                self.retried = True
                self.client.ctx.upstream(self.sidx, "upstream_stale_retry")
                self.client.resume_body()
                self._to(CONNECTING)
                self._task = self.client.loop.create_task(self._connect(fresh=True))
                return
            self.client.ctx.count("upstream_errors")
            self.respond_error(502)
            return
        if state is STREAMING and self.close_delimited:
            # The body was delimited by the close: this is its end.
            self.client.send_end()
            self.client.flush()
            self._finish(reuse=False)
            return
        self._upstream_failed()

    def upstream_pause_writing(self) -> None:
        self.client.pause_body()
        self.client.ctx.count("backpressure_client_paused")

    def upstream_resume_writing(self) -> None:
        self.client.resume_body()

    # -- the client side's write buffer (downstream) -----------------------------------------------------
    def client_write_paused(self) -> None:
        """The client cannot take more now: stop reading the backend's response."""
        conn = self.conn
        if conn is not None:
            conn.pause_reading()
            self.client.ctx.count("backpressure_upstream_paused")

    def client_write_resumed(self) -> None:
        conn = self.conn
        if conn is not None:
            conn.resume_reading()

    def upstream_timeout(self) -> None:
        if self.state is not AWAITING:
            return
        self.client.ctx.count("upstream_timeout")
        self.respond_error(504)  # the connection is closed, never pooled: a late answer must not leak

    def _upstream_failed(self) -> None:
        """The backend broke the response: 502 if nothing was sent yet, else cut the client off."""
        if self.state not in HEAD_SENT:
            self.client.ctx.count("upstream_errors")
            self.respond_error(502)
        else:
            self.client.ctx.count("upstream_truncated")
            self._finish(reuse=False, abort=True)

    def _response_done(self) -> None:
        reuse = upstream_reusable(
            backend_keep_alive=self.resp_keep_alive,
            extra_bytes=self.resp_extra,
            head_only=self.head_only,
            close_delimited=self.close_delimited,
            request_complete=self.req.complete,
        )
        self._finish(reuse=reuse)

    # -- the switch to a tunnel ----------------------------------------------------------------------------
    def _switch_to_tunnel(self, rest: bytes) -> None:
        if self.state is not UPGRADING:
            self._upstream_failed()
            return
        client = self.client
        conn = self.conn
        assert conn is not None
        self.status = 101
        self._to(TUNNEL)
        client.ctx.count("websocket_upgrades")
        client.ctx.count("status_1xx")
        client.open_tunnel(self, conn, self.resp_reason, response_headers(self.resp_headers, upgrade=True), rest)
        client.ctx.request_done(self, client.loop.time() - self.req.t0)

    def tunnel_closed(self) -> None:
        """The backend closed the tunnel: so does the client side."""
        self.conn = None
        self._finish(reuse=False, abort=True)

    # -- endings -----------------------------------------------------------------------------------------
    def respond_error(self, status: int) -> None:
        """Answer ``status`` (an HTTP/1.1 client's connection closes after it), or cut the response off when its
        head has gone already."""
        if self.state is DONE:
            return
        if self.state in HEAD_SENT:
            self._finish(reuse=False, abort=True)
            return
        self.status = status
        self.client.ctx.count(f"http_{status}")
        self.client.answer_error(status)
        self._finish(reuse=False)

    def respond_local(self, status: int, headers: list[Header], *, keep_alive: bool, body: bytes | None = None) -> None:
        """Answer ``status`` ourselves; the client side says whether it stays (``keep_alive`` asks it to). A
        body still to come is then read and dropped (ANSWERED) before the exchange is done."""
        if self.state is DONE:
            return
        self.status = status
        self.client.ctx.count(f"http_{status}")
        kept = self.client.answer_local(status, headers, keep_alive=keep_alive, body=body)
        if not kept or self.req.complete:
            self._finish(reuse=False)
        else:
            self._to(ANSWERED)

    def client_gone(self) -> None:
        """The client connection closed under us."""
        if self.state is DONE:
            return
        self._to(DONE)
        self.client.ctx.count("client_aborted")
        self._cancel_connect()
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.close()

    def _cancel_connect(self) -> None:
        task, self._task = self._task, None
        # Not the task we are running in: it is about to return by itself.
        if task is not None and not task.done() and task is not asyncio.current_task(self.client.loop):
            task.cancel()

    def _finish(self, reuse: bool, abort: bool = False) -> None:
        if self.state is DONE:
            return
        self._to(DONE)
        client = self.client
        ctx = client.ctx
        if abort:
            client.send_abort()
        if self._task is not None:
            self._cancel_connect()
        conn, self.conn = self.conn, None
        if conn is not None:
            parser = conn.response_parser
            if parser is not None:
                parser.give_back(self)  # the connection's, lent to us: no callback of its reaches us any more
            if reuse and not conn.closed:
                ctx.pool.release(conn)
            else:
                conn.close()
        status = self.status
        if self.instance is not None and status:
            # the backend's own 502/503/504 and the ones we answered for it (broken response, timeout)
            ctx.upstream_result(self.instance.id, status not in (502, 503, 504))
        if status and status != 101:  # counted and timed at the switch
            classes = _STATUS_CLASS  # a local: no bound .get made per request when compiled
            ctx.count(classes.get(status // 100, "status_other"))
            ctx.request_done(self, client.loop.time() - self.req.t0)
        client.exchange_done(self)
        # The parser's callbacks may still name us (a connection lost before this ending) and we hold the
        # parser: break the cycle so this exchange is freed by reference counting now, not by the cyclic GC.
        self.resp_parser = None

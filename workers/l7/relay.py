"""The response half of an exchange: the backend's response parsed (httptools callbacks), checked, and relayed
to the client side as events (``downstream.py``: interim, head, body, end). Where the backend's body ends is
decided here (``upstream_body``, ``sentin8/http/response.py``); how the client gets it framed is the
downstream's (an HTTP/1.1 client: ``sentin8/http/h1_response.py``), which writes one upstream read's events in
as few writes as it can.

Every status line must be HTTP/1.x with a 1xx-5xx code, interim (1xx) responses stay within their budget,
and a 101 must prove the WebSocket switch (``sentin8/http/response.py``, ``websocket.py``); else 502. Interim
responses go to the client side without framing headers; no response carries ``X-Sentin8-*``
(``response_headers``).

``ResponseRelay`` is the base of ``Exchange`` (one object per request, as in uvicorn's cycle): this module
holds the parser callbacks, ``exchange.py`` what happens around them. The callbacks move the exchange's state
(``state.py``) from RESPONSE_HEAD to STREAMING, UPGRADING or RECEIVED, nothing else.

The parser belongs to the backend connection, not to the request (``ResponseParser``): a keep-alive
connection's responses follow one another on one llhttp parser, each exchange lent it while it owns the
connection, as llhttp itself parses consecutive messages.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import httptools

from sentin8.http.framing import HeaderBudget
from sentin8.http.headers import Header, response_headers
from sentin8.http.response import (
    heads_within_budget,
    interim_within_budget,
    status_line_acceptable,
    upstream_body,
)
from sentin8.http.websocket import switch_refusal

from .request import Request, Stop
from .state import RECEIVED, RESPONSE_HEAD, STREAMING, UPGRADING, ExchangeState

if TYPE_CHECKING:
    from .downstream import Downstream


class ResponseParser:
    """One backend connection's response parser, kept for the connection's life (``UpstreamConn.response_parser``)
    and lent to each exchange that owns the connection. Building an ``HttpResponseParser`` per request (llhttp's
    state, a bound method looked up per callback, all freed again) cost ~3% of a plain h1 request's
    instructions and ~1.5% of an h2 one's (bench/README.md, "2026-12-06").

    Invariant: it is lent only at a message boundary. A connection goes back to the pool only after its
    exchange saw a complete response and nothing after it (``upstream_reusable``); any other ending closes the
    connection, and this parser with it. Between owners a callback stops the parser (``Stop``): bytes a backend
    sends then are never relayed to anyone (the connection closes them anyway: ``UpstreamConn.data_received``).
    """

    __slots__ = ("budget", "callbacks", "parser")

    def __init__(self, max_headers: int, max_header_bytes: int) -> None:
        # the callbacks object holds no reference back, so connection, parser and callbacks make no cycle
        self.callbacks = ResponseCallbacks()
        self.parser = httptools.HttpResponseParser(self.callbacks)
        # the caps of one response head (and of a chunked body's trailers), emptied for each response
        self.budget = HeaderBudget(max_headers, max_header_bytes)

    def lend(self, owner: ResponseRelay) -> httptools.HttpResponseParser:
        """``owner`` takes the callbacks from now on, and ``budget`` emptied; the parser is returned for its
        status and keep-alive queries."""
        self.callbacks.owner = owner
        self.budget.reset()
        return self.parser

    def give_back(self, owner: ResponseRelay) -> None:
        if self.callbacks.owner is owner:
            self.callbacks.owner = None


class ResponseCallbacks:
    """httptools' protocol object for a ``ResponseParser``: each callback goes to the current owner (a C call
    when compiled: relay.pxd), or stops the parser when there is none."""

    __slots__ = ("owner",)

    def __init__(self) -> None:
        self.owner: ResponseRelay | None = None

    def on_message_begin(self) -> None:
        owner = self.owner
        if owner is None:
            raise Stop
        owner.on_message_begin()

    def on_status(self, reason: bytes) -> None:
        owner = self.owner
        if owner is None:
            raise Stop
        owner.on_status(reason)

    def on_header(self, name: bytes, value: bytes) -> None:
        owner = self.owner
        if owner is None:
            raise Stop
        owner.on_header(name, value)

    def on_headers_complete(self) -> None:
        owner = self.owner
        if owner is None:
            raise Stop
        owner.on_headers_complete()

    def on_body(self, body: bytes) -> None:
        owner = self.owner
        if owner is None:
            raise Stop
        owner.on_body(body)

    def on_message_complete(self) -> None:
        owner = self.owner
        if owner is None:
            raise Stop
        owner.on_message_complete()


class ResponseRelay:
    __slots__ = ("interim_bytes", "interims", "resp_raw", "resp_trailers")  # set by Exchange.__init__

    # Provided by Exchange (its slots).
    client: Downstream
    req: Request
    state: ExchangeState
    status: int
    head_only: bool
    close_delimited: bool
    resp_body_bytes: int
    resp_budget: HeaderBudget | None
    resp_extra: bool
    resp_headers: list[Header]
    resp_keep_alive: bool
    resp_parser: httptools.HttpResponseParser | None
    resp_reason: bytes

    # Own fields: the response's bytes until its final head is complete (from exchange.upstream_data), the
    # interim (1xx) responses so far and the bytes of their heads.
    resp_raw: bytes
    interims: int
    interim_bytes: int

    def _to(self, state: ExchangeState) -> None:
        raise NotImplementedError

    def _reset_response(self) -> None:
        self.resp_headers: list[Header] = []
        self.resp_reason = b""
        self.resp_extra = False
        self.resp_keep_alive = False
        self.close_delimited = False
        budget = self.resp_budget  # the connection's (ResponseParser.budget), from the attach on
        if budget is not None:
            budget.reset()

    def _more_heads(self, data: bytes) -> bool:
        """More response bytes before the final head is complete: kept for the status-line check, within
        the heads' budget (False: over it, counted; the caller answers 502)."""
        if not heads_within_budget(len(self.resp_raw), self.resp_budget.max_size):
            self.client.ctx.count("upstream_interim_refused")
            return False
        self.resp_raw += data
        return True

    # -- httptools response callbacks ------------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self.state is RECEIVED:
            self.resp_extra = True  # bytes after a complete response: the connection is not reusable
            raise Stop

    def on_status(self, reason: bytes) -> None:
        self.resp_reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.state is not RESPONSE_HEAD:
            # a chunked body's trailers, within the same budget as the head: the client side relays them
            # (HTTP/2) or drops them (HTTP/1.1, as RFC 9110 §6.5.1 allows)
            self.resp_budget.add(name, value)
            self.resp_trailers.append((name, value))
            return
        self.resp_budget.add(name, value)  # HeadError -> parser error -> 502
        self.resp_headers.append((name, value))

    def on_headers_complete(self) -> None:
        parser = self.resp_parser
        if parser is None:
            raise Stop  # finished meanwhile (_finish drops the parser): nothing more to relay
        status = parser.get_status_code()
        req_head = self.req.head
        assert req_head is not None
        if not status_line_acceptable(self.resp_raw, self.interims, status):
            self.client.ctx.count("upstream_bad_status")  # HTTP/2.0, RTSP/1.0, 999, 099...: 502
            raise Stop
        if status < 200 and status != 101:
            self.interims += 1
            self.interim_bytes += 15 + len(self.resp_reason) + self.resp_budget.size  # status line + header lines
            if not interim_within_budget(self.interims, self.interim_bytes):
                self.client.ctx.count("upstream_interim_refused")
                raise Stop
            # The client side decides whether its client sees it (never HTTP/1.0; not our own 100 Continue twice).
            self.client.send_interim(status, self.resp_reason, response_headers(self.resp_headers, interim=True))
            return
        self.resp_raw = b""  # the last head: no status line is left to check, nothing held for a tunnel's life
        if status == 101:
            if not req_head.websocket:
                raise Stop  # a 101 nobody asked for: a broken backend
            refusal = switch_refusal(self.resp_headers, req_head.websocket_key)
            if refusal is not None:
                # No proof the backend speaks WebSocket (RFC 6455 §4.1): opening the tunnel anyway is how a
                # client smuggles raw HTTP past the proxy's framing (WebSocket smuggling). 502.
                self.client.ctx.count(refusal)
                raise Stop
            self._to(UPGRADING)
            return
        self.status = status
        self.resp_keep_alive = parser.should_keep_alive()
        # HeadError (another transfer coding) -> parser error -> 502
        body = upstream_body(status, self.resp_headers, head_only=self.head_only)
        self.close_delimited = body.until_close
        self.client.send_head(status, self.resp_reason, response_headers(self.resp_headers), body)
        self._to(STREAMING)
        if self.head_only:
            self._to(RECEIVED)
            raise Stop  # httptools cannot be told a HEAD response has no body

    def on_body(self, body: bytes) -> None:
        self.resp_body_bytes += len(body)
        self.client.send_body(body)

    def on_message_complete(self) -> None:
        state = self.state
        if state is RESPONSE_HEAD:  # an interim (1xx) response: the final one follows
            self._reset_response()
            return
        if state is UPGRADING:
            return  # HttpParserUpgrade follows
        trailers = self.resp_trailers
        if trailers:
            self.client.send_trailers(response_headers(trailers, interim=True))  # no framing fields in them
        else:
            self.client.send_end()
        self._to(RECEIVED)

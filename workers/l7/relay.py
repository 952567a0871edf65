"""The response half of an exchange: the backend's response parsed (httptools callbacks), checked and
re-framed for the client (``sentin8/http/response.py`` decides the framing), and written in as few writes as
one upstream read allows, none over ``CHUNK`` bytes (one TLS record each).

``ResponseRelay`` is the base of ``Exchange`` (one object per request, as in uvicorn's cycle): this module
holds the parser callbacks, ``exchange.py`` what happens around them. The callbacks move the exchange's state
(``state.py``) from RESPONSE_HEAD to STREAMING, UPGRADING or RECEIVED, nothing else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import httptools

from sentin8.http.framing import HeaderBudget, response_head, websocket_accept
from sentin8.http.headers import Header, response_headers
from sentin8.http.response import (
    LAST_CHUNK,
    coalesce,
    encode_chunks,
    response_framing,
    split,
    without_content_length,
)

from .request import Request, Stop
from .state import RECEIVED, RESPONSE_HEAD, STREAMING, UPGRADING, ExchangeState

if TYPE_CHECKING:
    from .connection import L7Bridge

CHUNK = 16 * 1024  # response pieces written to the client (one TLS record each)


class ResponseRelay:
    __slots__ = ()

    # Provided by Exchange (its slots).
    bridge: L7Bridge
    req: Request
    state: ExchangeState
    status: int
    head_only: bool
    continue_sent: bool
    close_client: bool
    chunked_out: bool
    close_delimited: bool
    resp_body_bytes: int
    resp_budget: HeaderBudget
    resp_extra: bool
    resp_headers: list[Header]
    resp_keep_alive: bool
    resp_parser: httptools.HttpResponseParser | None
    resp_reason: bytes
    _out: list[bytes] | None

    def _to(self, state: ExchangeState) -> None:
        raise NotImplementedError

    def _reset_response(self) -> None:
        self.resp_headers: list[Header] = []
        self.resp_reason = b""
        self.resp_extra = False
        self.resp_keep_alive = False
        self.chunked_out = False
        self.close_delimited = False
        cfg = self.bridge.ctx.cfg.policy
        self.resp_budget = HeaderBudget(cfg.max_headers * 2, cfg.max_header_bytes * 2)

    # -- httptools response callbacks ------------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self.state is RECEIVED:
            self.resp_extra = True  # bytes after a complete response: the connection is not reusable
            raise Stop

    def on_status(self, reason: bytes) -> None:
        self.resp_reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.state is not RESPONSE_HEAD:
            return  # trailers are dropped
        self.resp_budget.add(name, value)  # HeadError -> parser error -> 502
        self.resp_headers.append((name, value))

    def on_headers_complete(self) -> None:
        parser = self.resp_parser
        if parser is None:
            raise Stop  # finished meanwhile (_finish drops the parser): nothing more to relay
        status = parser.get_status_code()
        req_head = self.req.head
        assert req_head is not None
        if status < 200:
            if status == 101:
                if not req_head.websocket:
                    raise Stop  # a 101 nobody asked for: a broken backend
                if not self._accept_matches(req_head.websocket_key):
                    # No proof the backend speaks WebSocket (RFC 6455 §4.2.2): opening the tunnel anyway is how
                    # a client smuggles raw HTTP past the proxy's framing (WebSocket smuggling). 502.
                    self.bridge.ctx.count("websocket_bad_accept")
                    raise Stop
                self._to(UPGRADING)
                return
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
            draining=self.bridge.draining,
        )
        self.chunked_out = framing.chunked_out
        self.close_delimited = framing.close_delimited
        if framing.close_client:
            self.close_client = True
        headers = response_headers(self.resp_headers)
        if framing.drop_content_length:
            headers = without_content_length(headers)
        self._emit(response_head(status, self.resp_reason, headers, framing.extra))
        self._to(STREAMING)
        if self.head_only:
            self._to(RECEIVED)
            raise Stop  # httptools cannot be told a HEAD response has no body

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
        state = self.state
        if state is RESPONSE_HEAD:  # an interim (1xx) response: the final one follows
            self._reset_response()
            return
        if state is UPGRADING:
            return  # HttpParserUpgrade follows
        if self.chunked_out:
            self._emit(LAST_CHUNK)
        self._to(RECEIVED)

    def _emit(self, data: bytes) -> None:
        out = self._out
        if out is None:
            self.bridge.write(data)
        else:
            out.append(data)

    def _flush(self) -> None:
        """Write what one upstream read produced: as few writes as possible, none over CHUNK bytes."""
        out, self._out = self._out, None
        if not out:
            return
        write = self.bridge.write
        for data in coalesce(out, CHUNK):
            write(data)

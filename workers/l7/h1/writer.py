"""The response half of an HTTP/1.1 client connection: the ``Downstream`` response events turned into bytes
(``sentin8/http/h1_response.py`` decides them, one ``H1Response`` per request) and written.

The events of one upstream read are batched and written by ``flush`` in as few writes as possible, none over
``CHUNK`` bytes (one TLS record each); the proxy's own answers (an error, a local answer, ``100 Continue``,
the 101 of a tunnel) are written when made. Over TLS every write is the layer's ``write_soon``: encrypted at
once, its socket write at the end of the loop turn with the turn's other writes, so the responses one turn
relays to many clients leave in one burst (``workers/tls_layer.py``); a close writes them first.
``ResponseWriter`` is the ``Downstream`` base of ``RequestReader`` (reader.py), the first base of
``L7Bridge`` (connection.py): one line of bases, so that compiled they are one C layout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from sentin8.http.h1_response import H1Response
from sentin8.http.headers import Header
from sentin8.http.response import UpstreamBody, coalesce, split

from ..downstream import Downstream

if TYPE_CHECKING:
    from ..exchange import Exchange
    from ..request import Request

CHUNK = 16 * 1024  # response pieces written to the client (one TLS record each)
LOCAL_DRAIN_MAX = 64 * 1024  # a refused request's body read and dropped to keep the connection; above it, close

NO_RESPONSE = H1Response(None, head_only=False)  # between requests: never written to


class ResponseWriter(Downstream):
    # Set by L7Bridge (fields declared in writer.pxd when compiled).
    transport: asyncio.Transport | None
    # and ``track_buffers``, L7Bridge's class-level knob
    max_buffered: int
    _resp: H1Response
    _out: list[bytes]
    _send: Callable[[bytes], None]
    _ex: Exchange | None
    _closing: bool
    _draining: bool

    # -- the response, as events ----------------------------------------------------------------------
    def send_interim(self, status: int, reason: bytes, headers: list[Header]) -> None:
        data = self._resp.interim(status, reason, headers)
        if data is not None:
            self._out.append(data)

    def send_head(self, status: int, reason: bytes, headers: list[Header], body: UpstreamBody) -> None:
        self._out.append(self._resp.head(status, reason, headers, body, draining=self._draining))

    def send_body(self, data: bytes) -> None:
        resp = self._resp
        if not resp.chunked and len(data) <= CHUNK:
            self._out.append(data)  # the common case, without a list
        else:
            self._out += resp.body(data, CHUNK)

    def send_end(self) -> None:
        data = self._resp.end()
        if data is not None:
            self._out.append(data)

    def send_trailers(self, headers: list[Header]) -> None:
        self.send_end()  # dropped, as RFC 9110 §6.5.1 allows: the client never asked for them (TE: trailers)

    def send_abort(self) -> None:
        self._resp.abort()

    def flush(self) -> None:
        """Write what one upstream read produced: as few writes as possible, none over CHUNK bytes."""
        out = self._out
        if not out:
            return
        self._out = []
        if len(out) == 1:
            self.write(out[0])
            return
        for data in coalesce(out, CHUNK):
            self.write(data)

    # -- the proxy's own answers ----------------------------------------------------------------------
    def send_continue(self) -> None:
        self.write(self._resp.continue_())

    def answer_error(self, status: int) -> None:
        data = self._resp.error(status)
        if not self._closing:
            self.write(data)

    def answer_local(self, status: int, headers: list[Header], *, keep_alive: bool, body: bytes | None) -> bool:
        """Keep the connection when asked to and the client allows it (``may_keep``). A body still to come is
        read and dropped first, up to ``LOCAL_DRAIN_MAX`` bytes declared; a bigger or chunked body is not worth
        reading: the connection closes after the answer."""
        ex = self._ex
        assert ex is not None
        keep = keep_alive and self.may_keep(ex.req)
        data = self._resp.local(status, headers, keep=keep, body=body)
        if not self._closing:
            self.write(data)
        return keep

    def may_keep(self, req: Request) -> bool:
        """Whether the connection can carry the next request once ``req`` is answered: a keep-alive HTTP/1.1
        request, no WebSocket handshake, no drain under way, and a body already read whole or small enough
        (``LOCAL_DRAIN_MAX`` declared) to read and drop first (RFC 9112 §9.6). The rule for a local answer and
        for a backend's answer that came before the body ended (connection.py's ``exchange_done``)."""
        head = req.head
        return (
            head is not None
            and head.keep_alive
            and head.version == "1.1"
            and not head.websocket
            and not self._draining
            and (req.complete or (not head.chunked and (head.content_length or 0) <= LOCAL_DRAIN_MAX))
        )

    # -- writes ---------------------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        self._send(data)  # the transport's write_soon when it has one (connection.py)
        if self.track_buffers:
            self.track(0)

    def write_split(self, data: bytes) -> None:
        """Raw bytes (tunnel) to the client, in pieces of at most CHUNK."""
        for piece in split(data, CHUNK):
            self.write(piece)

    def track(self, held: int) -> None:
        """Tests (``track_buffers``): note the bytes held in buffers now, ``held`` plus both write buffers."""
        total = held
        if self.transport is not None:
            total += self.transport.get_write_buffer_size()
        ex = self._ex
        if ex is not None and ex.conn is not None and ex.conn.transport is not None:
            total += ex.conn.transport.get_write_buffer_size()
        if total > self.max_buffered:
            self.max_buffered = total

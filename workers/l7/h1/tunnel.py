"""A WebSocket tunnel after the backend's 101: raw bytes both ways, unparsed, until either side closes.

HTTP/1.1 only (WebSocket over HTTP/2, RFC 8441, is not served). The exchange that upgraded stays the client
connection's current exchange (in TUNNEL) so that the request
stays counted in flight; the tunnel owns the upstream connection's events. Backpressure works as for bodies:
a full write buffer on one side pauses reading on the other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workers.upstream import UpstreamConn

from . import flow

if TYPE_CHECKING:
    from ..exchange import Exchange
    from .connection import L7Bridge


class Tunnel:
    __slots__ = ("client", "exchange", "upstream")

    def __init__(
        self, exchange: Exchange, client: L7Bridge, upstream: UpstreamConn, first: bytes, held: list[bytes]
    ) -> None:
        """``first``: the backend's bytes that followed its 101; ``held``: the client's that followed its
        request head (both read before the switch)."""
        self.exchange = exchange
        self.client = client
        self.upstream = upstream
        upstream.owner = self
        if first:
            client.write_split(first)
        transport = upstream.transport
        assert transport is not None
        for data in held:
            transport.write(data)

    def client_data(self, data: bytes) -> None:
        transport = self.upstream.transport
        if not self.upstream.closed and transport is not None:
            transport.write(data)
            if self.client.track_buffers:
                self.client.track(0)

    # -- UpstreamOwner ------------------------------------------------------------------------------------
    def upstream_data(self, data: bytes) -> None:
        self.client.write_split(data)

    def upstream_lost(self, conn: UpstreamConn, exc: Exception | None) -> None:
        if conn is self.upstream:
            self.exchange.tunnel_closed()

    def upstream_pause_writing(self) -> None:
        self.client.pause_reading(flow.UPSTREAM_FULL)
        self.client.ctx.count("backpressure_client_paused")

    def upstream_resume_writing(self) -> None:
        self.client.resume_reading(flow.UPSTREAM_FULL)

    def upstream_timeout(self) -> None:
        pass  # a tunnel has no response deadline (none is set once the 101 came)

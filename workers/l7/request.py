"""One client request as the connection parses it: its head, the body bytes held for it, its place in the
pipelining queue. The exchange that answers it is attached once the request reaches the front of the queue."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sentin8.http.framing import HeaderBudget, RequestHead
from sentin8.http.headers import Header

if TYPE_CHECKING:
    from .exchange import Exchange


class Stop(Exception):
    """Raised inside a parser callback to stop parsing; the connection's or exchange's state says why."""


class Request:
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
        "received",
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
        self.received = 0  # body bytes received so far (counted only under limits.max_request_body_bytes)
        self.upgrade_data: list[bytes] = []  # websocket bytes that arrived before the 101
        self.complete = False
        self.counted = False  # inflight(+1) done; the -1 must follow exactly once
        self.exchange: Exchange | None = None
        self.t0 = 0.0
        self.trailer_bytes = 0

    def take_body(self) -> list[bytes]:
        """The held body bytes, handed over (to the upstream connection or the WAF); none are held after."""
        body, self.body = self.body, []
        self.buffered = 0
        return body

    def take_upgrade_data(self) -> list[bytes]:
        """The WebSocket bytes that arrived before the 101, handed over to the tunnel."""
        held, self.upgrade_data = self.upgrade_data, []
        self.buffered = 0
        return held

"""Flow control of one client connection: why its reading is paused, and how many body bytes it may hold.

Reading from the client stops for several independent reasons at once; each is one bit, and the transport
reads again only when no bit is left. Every body byte the connection holds (waiting for the upstream
connection, or for the WAF) counts against a hold limit: past it reading pauses, so a connection holds a
bounded number of bytes whatever the body size.
"""

from __future__ import annotations

import asyncio

CLIENT_WRITE_HIGH_WATER = 64 * 1024
BODY_BUFFER_LIMIT = 64 * 1024  # request body held while the upstream connects; reading pauses above it

# Why the client transport is not being read (any bit set = paused).
UPSTREAM_FULL = 1  # the upstream write buffer is full
BODY_HELD = 2  # body bytes are waiting for the upstream connection
PIPELINED = 4  # a further request is queued behind the one in flight
STOPPED = 8  # no more requests will be parsed on this connection


class ReadPause:
    """The pause bits of one client transport. ``transport`` is None until the connection is made and after it
    is closing: the bits still move, the transport is left alone."""

    __slots__ = ("bits", "hold_limit", "transport")

    def __init__(self) -> None:
        self.bits = 0
        self.transport: asyncio.Transport | None = None
        self.hold_limit = BODY_BUFFER_LIMIT  # body bytes held before reading pauses (more with the WAF on)

    def pause(self, bit: int) -> None:
        was = self.bits
        self.bits = was | bit
        if not was and self.transport is not None:
            self.transport.pause_reading()

    def resume(self, bit: int) -> bool:
        """Clear ``bit``; True when that resumed reading (no other bit left)."""
        if not self.bits & bit:
            return False
        self.bits &= ~bit
        if self.bits or self.transport is None:
            return False
        self.transport.resume_reading()
        return True

    def held(self, total: int) -> None:
        """``total`` body bytes are held now: past the hold limit, reading pauses."""
        if total > self.hold_limit:
            self.pause(BODY_HELD)

    def raise_hold_limit(self, limit: int, held: int) -> bool:
        """Hold up to ``limit`` bytes (never fewer than the default); True when that resumed reading."""
        self.hold_limit = max(BODY_BUFFER_LIMIT, limit)
        return held <= self.hold_limit and self.resume(BODY_HELD)

"""A connection's one deadline, re-armed lazily: a client connection's (header read, keep-alive idle, request
body idle) and a backend connection's (idle in the pool, awaiting a response).

The deadline moves on every request (header -> none -> idle -> header ...). Cancelling and creating a loop
timer each time cost ~4% of a worker; instead one timer handle stays armed, a later deadline only records
itself, and the handle, on firing early, re-arms for the rest. Only an earlier deadline (or a close) replaces
the handle. With ``horizon`` (a backend connection: its shortest timeout) the handle is never armed further
ahead than that, so every later deadline falls at or after it and a request never cancels or creates a timer.
``on_expired(kind)`` runs when the current kind's deadline has passed.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

# What a deadline currently guards: nothing, a client connection's, a backend connection's.
NONE = 0
HEADER, IDLE, BODY = 1, 2, 3  # workers/l7/h1/connection.py
POOL_IDLE, RESPONSE = 4, 5  # workers/upstream.py


def _nothing(kind: int) -> None:
    pass


class Deadline:
    """``kind`` is public: setting it to ``NONE`` is the cheapest disarm (the handle may stay armed: firing with
    nothing to do costs nothing)."""

    __slots__ = ("_at", "_handle", "_handle_at", "_horizon", "_loop", "_on_expired", "_time", "kind")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, on_expired: Callable[[int], None], horizon: float = math.inf
    ) -> None:
        self._loop = loop
        self._time = loop.time  # bound once: read on every arm, i.e. several times per request
        self._on_expired = on_expired
        self._horizon = horizon
        self.kind = NONE
        self._handle: asyncio.TimerHandle | None = None
        self._handle_at = 0.0  # when the armed handle fires
        self._at = 0.0  # when the current kind's deadline is (>= _handle_at while armed)

    def arm(self, kind: int, delay: float) -> None:
        now = self._time()
        self.kind = kind
        self._at = now + delay
        handle = self._handle
        if handle is not None:
            if self._handle_at <= self._at:
                return  # fires first; _fired re-arms for what remains
            handle.cancel()
        self._arm(now)

    def now(self) -> float:
        """The loop's time, through the bound ``time`` the deadline keeps (its owner's per-request clock reads)."""
        return self._time()

    def disarm(self) -> None:
        self.kind = NONE

    def disarm_if(self, kind: int) -> None:
        if self.kind == kind:
            self.kind = NONE

    def stop(self) -> None:
        """The connection is gone: no handle, and not our callback (its bound method), may keep it alive."""
        self.kind = NONE
        self._on_expired = _nothing
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.cancel()

    def _arm(self, now: float) -> None:
        at = self._at if self._at - now <= self._horizon else now + self._horizon
        self._handle_at = at
        self._handle = self._loop.call_at(at, self._fired)

    def _fired(self) -> None:
        self._handle = None
        kind = self.kind
        if kind == NONE:
            return
        if self._at > self._handle_at:  # moved on since this handle was made
            self._arm(self._time())
            return
        self.kind = NONE
        self._on_expired(kind)

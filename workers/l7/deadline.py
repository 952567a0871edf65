"""The one client-side deadline of a connection: header read (slowloris), keep-alive idle, request-body idle.

The deadline moves on every request (header -> none -> idle -> header ...). Cancelling and creating a loop
timer each time cost ~4% of a worker; instead one timer handle stays armed, a later deadline just records
itself, and the handle, on firing early, re-arms for the rest. Only an earlier deadline (or a close) replaces
the handle. ``on_expired(kind)`` runs when the current kind's deadline has passed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

# What the deadline currently guards.
NONE, HEADER, IDLE, BODY = 0, 1, 2, 3


def _nothing(kind: int) -> None:
    pass


class Deadline:
    __slots__ = ("_at", "_handle", "_handle_at", "_loop", "_on_expired", "kind")

    def __init__(self, loop: asyncio.AbstractEventLoop, on_expired: Callable[[int], None]) -> None:
        self._loop = loop
        self._on_expired = on_expired
        self.kind = NONE
        self._handle: asyncio.TimerHandle | None = None
        self._handle_at = 0.0  # when the armed handle fires
        self._at = 0.0  # when the current kind's deadline is (>= _handle_at while armed)

    def arm(self, kind: int, delay: float) -> None:
        at = self._loop.time() + delay
        self.kind = kind
        self._at = at
        handle = self._handle
        if handle is not None:
            if self._handle_at <= at:
                return  # fires first; _fired re-arms for what remains
            handle.cancel()
        self._handle_at = at
        self._handle = self._loop.call_at(at, self._fired)

    def disarm(self) -> None:
        self.kind = NONE  # the handle may stay armed: firing with nothing to do costs nothing

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

    def _fired(self) -> None:
        self._handle = None
        kind = self.kind
        if kind == NONE:
            return
        if self._at > self._handle_at:  # re-armed for later since this handle was made
            self._handle_at = self._at
            self._handle = self._loop.call_at(self._at, self._fired)
            return
        self.kind = NONE
        self._on_expired(kind)

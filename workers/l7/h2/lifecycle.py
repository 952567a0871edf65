"""The life of an h2 client connection outside its streams: the drain's two-step GOAWAY, the idle deadline,
the lingering close. ``ConnectionLifecycle`` is a base of ``H2Bridge`` (connection.py), as ``ResponseWriter``
is of the h1 bridge: the fields it reads are the bridge's, set in its ``__init__``.

Drain: GOAWAY(2^31-1) + PING; the ACK (the engine's ``GoAwaySent``) or the drain grace sends the final GOAWAY
naming the last stream; every stream up to it is served to its end, then ``_close``. Idle: while no stream is
open the idle deadline runs, its first ``_SETTLE_S`` spent before the engine's idle memory goes back.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from sentin8.http import h2_codes

from ..linger import LINGER_S

if TYPE_CHECKING:
    from sentin8.http.h2_engine import ServerConnection

    from ..contract import L7Context
    from .stream import H2Stream

# An idle spell this long gives the engine's idle memory back (release_idle_memory, ~18 us with the pages the
# next frame faults in again): a connection idle only between bursts (h2load -m10) never pays it; every
# keep-alive connection that waits for its next request does, once per spell.
_SETTLE_S = 0.25


class ConnectionLifecycle:
    # Provided by H2Bridge.
    ctx: L7Context
    loop: asyncio.AbstractEventLoop
    engine: ServerConnection
    transport: asyncio.Transport | None
    streams: dict[int, H2Stream]
    draining: bool
    _closing: bool
    _reading: bool
    _final_sent: bool
    _drain_grace: float
    _idle_timeout: float
    _timer: asyncio.TimerHandle | None
    _header_timer: asyncio.TimerHandle | None

    if TYPE_CHECKING:

        def flush(self) -> None: ...

    # H2Bridge's: a stream (stream.pxd holds its connection as this base) calls them per response, in C
    def stream_done(self, st: H2Stream) -> None:
        raise NotImplementedError

    def flush_soon(self) -> None:
        raise NotImplementedError

    def begin_drain(self) -> None:
        """Step one of the two-step GOAWAY; the PING's ACK (or the grace) sends the final one."""
        if self.draining:
            return
        self.draining = True
        if self.transport is None or self._closing:
            return  # the handshake finished in a draining worker: connection_made drains
        self.ctx.count("h2_drain_goaway")
        self.engine.drain()
        self.flush()
        self._cancel_timer()
        self._timer = self.loop.call_later(self._drain_grace, self._drain_grace_over)

    def _drain_grace_over(self) -> None:
        """No ACK within the grace: send the final GOAWAY now."""
        self._timer = None
        if not self._closing and not self._final_sent:
            self.engine.finish_drain()
            self.ctx.count("h2_goaway_sent")
            self._final_sent = True
            self.flush()

    def _arm_idle(self) -> None:
        """No stream is open: the idle deadline runs, its first ``_SETTLE_S`` to let the engine's memory go."""
        if self._closing or self.draining:
            return
        self._cancel_timer()
        if self._idle_timeout > _SETTLE_S:
            self._timer = self.loop.call_later(_SETTLE_S, self._idle_settled)
        else:
            self._timer = self.loop.call_later(self._idle_timeout, self._idle_over)

    def _idle_settled(self) -> None:
        """Idle for ``_SETTLE_S``: the engine's frame buffer goes back to the kernel (``release_idle_memory``),
        then the rest of the idle deadline runs. A stream opened since cancelled this timer."""
        self._timer = None
        if self.streams or self._closing:
            return
        self.engine.release_idle_memory()
        self._timer = self.loop.call_later(self._idle_timeout - _SETTLE_S, self._idle_over)

    def _idle_over(self) -> None:
        self._timer = None
        if not self.streams and not self._closing:
            self.ctx.count("idle_closed")
            self.engine.goaway(h2_codes.NO_ERROR)
            self.flush()
            self._close()

    def _cancel_timer(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()

    def _cancel_header_timer(self) -> None:
        timer, self._header_timer = self._header_timer, None
        if timer is not None:
            timer.cancel()

    def _close(self) -> None:
        """A lingering close (nginx's ``lingering_close``): close_notify and FIN after the last bytes, then
        read and discard what the client still sends, for at most ``LINGER_S`` or ``LINGER_BYTES``. Closing
        at once with unread bytes in the kernel's buffer would send a TCP reset, and the client's stack
        would drop our GOAWAY with its receive buffer: the client must see why it was closed."""
        if self._closing:
            return
        self._closing = True
        self._cancel_timer()
        self._cancel_header_timer()  # the send deadline runs on: a close waits for the client to read
        transport = self.transport
        if transport is None:
            return
        transport.write_eof()
        if not self._reading:
            self._reading = True
            transport.resume_reading()
        self._timer = self.loop.call_later(LINGER_S, self._linger_over)

    def _linger_over(self) -> None:
        self._timer = None
        if self.transport is not None:
            self.transport.close()

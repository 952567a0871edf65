"""An external connection's way in once the door has handed it over: the PQ TLS layer that terminates it, then
the bridge its ALPN picks (h2, else HTTP/1.1), both tracked by the worker until the connection ends.

This runs for every external connection, so it is compiled (``sentin8.native``) like the door before it and the
TLS layer after it; the worker keeps the listeners, the drain and the :80 path. ``Bridges`` is the worker's set
of live bridges: a drain asks each to finish, and a bridge made during a drain starts out draining.

``adopt`` gives an accepted socket to a uvloop transport without a Task (the :80 path uses it too).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from OpenSSL import SSL

from sentin8 import tls, tls_connection
from sentin8.holds import Hold
from sentin8.metrics.scales import handshake_reason

from .l7 import L7Bridge
from .l7.h2.connection import H2Bridge
from .timer_queue import TimerQueue
from .tls_layer import TLSServerProtocol

_B = TypeVar("_B")


def adopt(
    loop: asyncio.AbstractEventLoop,
    protocol_factory: Callable[[], asyncio.BaseProtocol],
    sock: socket.socket,
    on_failure: Callable[[BaseException], None],
) -> None:
    """Give ``sock`` to a uvloop transport of ``protocol_factory``'s protocol, driving uvloop's
    ``connect_accepted_socket`` without a Task.

    That coroutine does all its work at once (the transport made and owning the socket, ``connection_made``
    scheduled), then awaits a future that ``connection_made``'s turn resolves, only to return the pair. A Task
    to drive it cost more than the work (asyncio registers every Task in a WeakSet, interpreted Python, and
    each awaiting caller adds a coroutine frame): here its first step runs now, and the awaited future's done
    callback runs the last one. That is the protocol any Task follows (PEP 492: an asyncio future's
    ``__await__`` yields the future itself), and nothing more.

    Invariant: when this returns, the transport owns the socket; a raise means it never did (the caller closes
    it). A failed last step (its future cancelled: uvloop has closed the transport then, maybe before
    ``connection_made``) goes to ``on_failure``, which must release what the connection holds. Nothing here
    cancels that future, and nothing else holds it: uvloop 0.23 crashes (SIGSEGV, seen in a test) when a
    transport closed that way meets its ``connection_made`` turn."""
    steps = loop.connect_accepted_socket(protocol_factory, sock=sock)
    try:
        waiting = steps.send(None)
    except StopIteration:
        return
    waiting.add_done_callback(_LastStep(steps, on_failure).run)


class _LastStep:
    """The awaited future is done: the coroutine returns (or raises what uvloop met)."""

    __slots__ = ("on_failure", "steps")

    def __init__(self, steps: Coroutine[Any, Any, Any], on_failure: Callable[[BaseException], None]) -> None:
        self.steps = steps
        self.on_failure = on_failure

    def run(self, _done: asyncio.Future[Any]) -> None:
        try:
            self.steps.send(None)
        except StopIteration:
            pass
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # CancelledError included: the transport is closed, the hold is ours
            self.on_failure(exc)


class Bridges:
    """The worker's live bridges (h1, h2, :80), each from its creation to its connection's end."""

    def __init__(self) -> None:
        self.live: set[object] = set()
        self.draining = False

    def add(self, bridge: _B) -> _B:
        self.live.add(bridge)
        if self.draining:
            bridge.begin_drain()  # type: ignore[attr-defined]
        return bridge

    def discard(self, bridge: object) -> None:
        self.live.discard(bridge)

    def begin_drain(self) -> None:
        """Every live bridge finishes: busy ones after their response, idle ones after the drain grace."""
        self.draining = True
        for bridge in list(self.live):
            bridge.begin_drain()  # type: ignore[attr-defined]


class TLSEntry:
    """Serves the door's external connections (``serve``): the counters of their handshakes, and the bridges
    they get. ``front`` is the TLS front context (``SNIContexts.front``), ``l7`` the worker's ``L7Context``."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        counters: object,
        l7: object,
        front: SSL.Context,
        handshake_timeout: float,
        bridges: Bridges,
    ) -> None:
        self.loop = loop
        self.counters = counters
        self.l7 = l7
        self.front = front
        self.handshake_timeout = handshake_timeout
        self.bridges = bridges
        self.timers = TimerQueue(loop)  # the handshakes' deadlines: one length, so one loop timer for all

    def close(self) -> None:
        self.timers.close()

    def serve(
        self,
        conn: socket.socket,
        addr: tuple,
        hold: Hold,
        over_cap: bool,
        on_failure: Callable[[BaseException], None],
    ) -> None:
        """Terminate PQ TLS (certificate per SNI, bootstrap when none) and bridge at L7. The peeked ClientHello
        is still in the socket, so the TLS layer reads it as if nothing happened. Returns once the transport
        owns the socket (``adopt``: a raise means it does not); its ``connection_lost`` releases the hold,
        ``on_failure`` when the hand-off fails after that."""
        self.counters.inc("connections_l7")  # type: ignore[attr-defined]
        layer = TrackedTLS(self, hold, addr, over_cap)
        adopt(self.loop, lambda: layer, conn, on_failure)

    def handshake_error(self, reason: str) -> None:
        counters = self.counters
        counters.inc("handshake_errors")  # type: ignore[attr-defined]
        counters.handshake_error(handshake_reason(reason))  # type: ignore[attr-defined]
        if reason == "timeout":
            counters.inc("handshake_timeout")  # type: ignore[attr-defined]
        elif reason == tls.NO_APPLICATION_PROTOCOL_REASON:
            counters.inc("tls_alpn_refused")  # type: ignore[attr-defined]

    def handshake_done(self, conn: tls_connection.RecordIO) -> None:
        self.counters.inc("handshake_ok")  # type: ignore[attr-defined]
        if tls_connection.session_reused(conn):
            self.counters.inc("tls_resumed")  # type: ignore[attr-defined]


class TrackedTLS(TLSServerProtocol):
    """The TLS layer of one external connection: its bridge is made once the handshake is done (h2 when ALPN
    chose it, which only an ``[http2] enabled`` front offers; HTTP/1.1 otherwise, ALPN or not), and the
    connection's end releases its hold and takes the bridge out of the worker's set."""

    def __init__(self, entry: TLSEntry, hold: Hold, addr: tuple, over_cap: bool) -> None:
        super().__init__(
            entry.front,
            self._bridge,
            loop=entry.loop,
            handshake_timeout=entry.handshake_timeout,
            on_handshake_error=entry.handshake_error,
            on_handshake_done=entry.handshake_done,
            timers=entry.timers,
        )
        self._entry = entry
        self._hold = hold
        self._addr = addr
        self._over_cap = over_cap

    def _bridge(self) -> L7Bridge | H2Bridge:
        entry = self._entry
        kind = H2Bridge if self.extra_info("alpn", None) == b"h2" else L7Bridge
        made = entry.bridges.add(kind(entry.l7, entry.loop, self._addr, "https"))
        if self._over_cap:
            made.refuse_status = 503  # over the per-client connection cap: every request gets 503 + close
        return made

    def connection_lost(self, exc: Exception | None) -> None:
        app = self.app
        try:
            super().connection_lost(exc)
        finally:
            if app is not None:
                self._entry.bridges.discard(app)
            self._hold.release()

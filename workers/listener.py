"""Listening sockets (every worker binds the same address itself with SO_REUSEPORT) and a worker's accept loop."""

from __future__ import annotations

import asyncio
import errno
import socket
import time
from collections.abc import Callable

from sentin8.config import parse_hostport
from sentin8.eventlog import event
from sentin8.holds import Hold, OpenConnections

ACCEPT_BATCH = 64  # connections taken per readable event: a burst drains without a loop turn for each
ACCEPT_PAUSE_S = 0.1  # how long a listener rests after running out of descriptors or memory
# what a listener's connections are for (Acceptor.watch)
HTTPS = 0  # the door: L4 or L7 by source and ClientHello
INTERNAL_L4 = 1  # the door, L4 whatever the source
HTTP = 2  # :80 (ACME HTTP-01)
_PAUSING = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class Listener(socket.socket):
    """A listening socket whose ``accept`` builds the accepted socket from the listener's family and type kept
    as plain ints. ``socket.socket.accept`` reads both through properties that convert them to enums, for
    every connection: ~10k of the ~185k instructions a new L4 connection costs the worker
    (``bench.profile.l4``). Otherwise a ``socket.socket``: the accepted socket is one too, in the blocking mode
    the kernel gives it (as the stdlib's accept leaves it for a non-blocking listener)."""

    __slots__ = ("_kind",)

    def __init__(self, family: int = -1, type: int = -1, proto: int = -1, fileno: int | None = None) -> None:
        super().__init__(family, type, proto, fileno)  # socket.socket's signature: dup() builds one this way
        self._kind = (int(self.family), int(self.type), self.proto)

    def accept(self) -> tuple[socket.socket, object]:
        fd, addr = self._accept()
        family, kind, proto = self._kind
        return socket.socket(family, kind, proto, fd), addr


def bind_reuseport(
    address: str, key: str, backlog: int = 4096, defer_accept_s: int = 0, reuseport: bool = True
) -> Listener:
    """``defer_accept_s`` > 0: the kernel hands a connection to accept() only once its first bytes arrived
    (or the seconds passed), so a silent peer costs no accept and a ClientHello is usually ready to peek.
    ``reuseport=False``: one owner only (the management port, bound once by the supervisor)."""
    host, port = parse_hostport(address, key)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = Listener(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuseport:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # "[::]" is dual stack
        if defer_accept_s:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, defer_accept_s)
        sock.bind((host, port))
        sock.listen(backlog)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class Acceptor:
    """A worker's accept loop. On each readable event of a listener, up to ``ACCEPT_BATCH`` connections: each
    made non-blocking, counted (``accepted``), held (``OpenConnections``: drain waits for every hold) and handed
    on, to ``enter`` (the door) or, from the :80 listener, to ``serve_http``. It runs for every connection, so
    it is compiled with the door (``sentin8.native``); the worker only says which listener is which.

    Out of descriptors or memory, a listener stays readable and a level-triggered loop would spin on accept():
    it is unwatched for ``ACCEPT_PAUSE_S`` instead (the queued connections wait in the kernel), counted in
    ``accept_errors`` and logged at most once a second."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        counters: object,
        connections: OpenConnections,
        enter: Callable[..., None],
        serve_http: Callable[[socket.socket, tuple, Hold], None],
        worker: int,
    ) -> None:
        self.loop = loop
        self.counters = counters
        self.connections = connections
        self.enter = enter
        self.serve_http = serve_http
        self.worker = worker
        self._last_warning = 0.0

    def watch(self, listener: Listener, kind: int) -> None:
        """Accept from ``listener`` (HTTPS, INTERNAL_L4 or HTTP) whenever it is readable, until it is closed."""
        self.loop.add_reader(listener.fileno(), self._readable, listener, kind)

    def _readable(self, listener: Listener, kind: int) -> None:
        counters = self.counters
        for _ in range(ACCEPT_BATCH):
            try:
                conn, addr = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._failed(listener, kind, exc)
                return
            conn.setblocking(False)  # TCP_NODELAY: uvloop sets it on every transport; the L4 pipe its own
            counters.inc("accepted")  # type: ignore[attr-defined]
            hold = self.connections.hold()
            if kind == HTTP:
                self.serve_http(conn, addr, hold)
            else:
                self.enter(conn, addr, hold, guaranteed_l4=kind == INTERNAL_L4)

    def _failed(self, listener: Listener, kind: int, exc: OSError) -> None:
        self.counters.inc("accept_errors")  # type: ignore[attr-defined]
        if exc.errno not in _PAUSING:
            return  # ECONNABORTED and friends concern one connection only
        now = time.monotonic()
        if now - self._last_warning > 1.0:
            self._last_warning = now
            pause_ms = int(ACCEPT_PAUSE_S * 1000)
            event("accept_paused", "warning", worker=self.worker, pause_ms=pause_ms, error=exc.strerror or str(exc))
        self.loop.remove_reader(listener.fileno())
        self.loop.call_later(ACCEPT_PAUSE_S, self._resume, listener, kind)

    def _resume(self, listener: Listener, kind: int) -> None:
        if listener.fileno() >= 0:  # not closed meanwhile (a drain closes the listeners)
            self.watch(listener, kind)

"""Every connection on listen.https and listen.internal_l4 goes through here, from accept to its owner: the
PROXY header a trusted balancer sends, the ClientHello peek, the source's class and connection cap, then the
raw L4 pipe to a backend or the worker's L7 TLS layer.

One ``Arrival`` per connection, driven by callbacks: with TCP_DEFER_ACCEPT the ClientHello is in the socket at
accept, so one recv and one parse decide the connection, and an L4 backend's connect is one epoll watch and
one timer (``BackendConnect``) until the pipe takes both sockets. A Task is made only where something must be
awaited: a PROXY header still arriving, a ClientHello still arriving, a backend named by a host name (the L7
hand-off to uvloop's transport is driven without one: ``tls_entry.adopt``). Measured on the bench's
new-connection row, the Task, its coroutine frames and their futures cost more than the rest of the L4 path's
Python.

Invariant: until an owner has the socket (the pipe, or the transport of the TLS layer), the arrival owns it
and its hold; whatever ends it early (a refusal, a failed peek, a bug) closes the socket through the lingering
close (a FIN the peer can read, not a reset) and releases the hold, exactly once.
"""

from __future__ import annotations

import _socket
import asyncio
import socket
from collections.abc import Callable
from socket import IPPROTO_TCP, TCP_NODELAY

from sentin8 import proxy_protocol, refusals
from sentin8.backends import Backends
from sentin8.clienthello import ClientHello
from sentin8.config import Config
from sentin8.eventlog import event
from sentin8.holds import Hold
from sentin8.netclass import Classifier
from sentin8.routing import Instance
from sentin8.shm.conncap import ConnectionCounts
from sentin8.shm.counters import WorkerCounters

from .connect import BackendConnect
from .l4_pipe import PipePool, SplicePipe
from .peek import HelloPeek, PeekFailed, read_proxy_header, refuse_hello
from .poll_set import PollSet
from .socket_linger import SocketLinger

# (socket, client address, hold, over the per-client cap, what a hand-off that fails later calls)
ServeExternal = Callable[[socket.socket, tuple, Hold, bool, Callable[[BaseException], None]], None]


class Door:
    """What every arrival of one worker shares: the config, the counters, the backends, the L4 sockets' epoll
    set and pipe pool, and the L7 hand-off (``serve_external``: the TLS layer takes the socket)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        cfg: Config,
        counters: WorkerCounters,
        backends: Backends,
        conncap: ConnectionCounts,
        poll: PollSet,
        pipes: PipePool,
        lingering: SocketLinger,
        serve_external: ServeExternal,
        index: int,
        classifier: Classifier,
    ) -> None:
        self.loop = loop
        self.cfg = cfg
        self.limits = cfg.limits
        self.counters = counters
        self.backends = backends
        self.conncap = conncap
        self.poll = poll
        self.pipes = pipes
        self.lingering = lingering
        self.serve_external = serve_external
        self.index = index
        self.classifier = classifier  # network.internal_cidrs: the worker's, which its :80 listener uses too
        # the balancers whose connections start with a PROXY v2 header (None: no one's do)
        self.proxy_sources = Classifier(cfg.listen.proxy_protocol_from) if cfg.listen.proxy_protocol_from else None

    def enter(self, conn: socket.socket, addr: tuple, hold: Hold, guaranteed_l4: bool = False) -> None:
        """A connection accepted on listen.https, or on listen.internal_l4 (``guaranteed_l4``): there every
        connection is SNI-routed and piped raw, never decrypted, whatever its source; a source outside
        network.internal_cidrs is refused before a byte is read unless internal_l4_any_source allows it."""
        Arrival(self, conn, addr, hold, guaranteed_l4).start()

    def peek_failed(self, exc: PeekFailed) -> None:
        if exc.refusal is not None:
            self.counters.refused(exc.refusal)
        else:
            self.counters.inc(exc.reason)

    def connection_error(self, exc: BaseException) -> None:
        """A bug costs one connection, never the worker: the type and where it was raised, not its text (an
        exception message may quote client bytes)."""
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        where = f"{tb.tb_frame.f_code.co_filename.rsplit('/', 1)[-1]}:{tb.tb_lineno}" if tb is not None else ""
        event("connection_error", "error", worker=self.index, error=type(exc).__name__, where=where)


class Arrival:
    """One accepted connection until an owner has it. From a balancer of listen.proxy_protocol_from it starts
    with a PROXY v2 header, read first (within the same peek deadline as the ClientHello): from then on
    ``addr`` is the client it names, for every decision below and in the bridge; a LOCAL header leaves the
    balancer's own address."""

    __slots__ = (
        "addr",
        "conn",
        "deadline",
        "door",
        "guaranteed_l4",
        "handed_off",
        "hold",
        "local",
        "over_cap",
        "sidx",
    )

    def __init__(self, door: Door, conn: socket.socket, addr: tuple, hold: Hold, guaranteed_l4: bool) -> None:
        self.door = door
        self.conn = conn
        self.addr = addr
        self.hold = hold
        self.guaranteed_l4 = guaranteed_l4
        self.deadline = door.loop.time() + door.limits.peek_timeout_s
        self.local: tuple | None = None  # where the client connected to, when a PROXY header said so
        self.over_cap = False
        self.handed_off = False
        self.sidx = -1  # the L4 route's service index, for its counters

    def start(self) -> None:
        door = self.door
        try:
            if door.proxy_sources is not None and door.proxy_sources.contains(self.addr[0]):
                door.loop.create_task(self._after_proxy_header())
                return
            self._peek(trusted=False)
        except Exception as exc:
            self._error(exc)

    def _end(self) -> None:
        """Ended before any owner took it: a FIN (a reset could destroy the alert or FIN before the peer reads
        it), and the hold with its cap place (a no-op when a half-done hand-off already released it)."""
        if not self.handed_off:
            self.handed_off = True  # once
            self.door.lingering.close(self.conn)
            self.hold.release()

    def _error(self, exc: BaseException) -> None:
        self.door.connection_error(exc)
        self._end()

    async def _after_proxy_header(self) -> None:
        door = self.door
        try:
            try:
                header = await read_proxy_header(door.loop, self.conn, self.deadline)
            except PeekFailed as exc:
                door.peek_failed(exc)
                self._end()
                return
            client = header.client()
            if client is None:
                door.counters.inc("proxy_header_local")  # a health check: served as from the balancer
            else:
                door.counters.inc("proxy_header_ok")
                self.addr, self.local = client, header.destination()
            self._peek(trusted=True)
        except Exception as exc:
            self._error(exc)

    def _peek(self, trusted: bool) -> None:
        """Classify the source, take its cap place, then the ClientHello: at once when it is in (nearly
        always), else in a Task that waits for it (``refuse_proxy=False`` after a PROXY header: a second one
        is only garbage)."""
        door = self.door
        internal = door.classifier.is_internal(self.addr[0])
        if self.guaranteed_l4 and not internal and not door.cfg.network.internal_l4_any_source:
            door.counters.refused(refusals.INTERNAL_L4_SOURCE)
            self._end()
            return
        cap = door.limits.max_connections_per_ip
        if cap:
            ip = self.addr[0]
            if door.conncap.acquire(ip, cap):
                self.hold.also(_cap_release(door.conncap, ip))  # given back with the hold: once
            else:
                self.over_cap = True
        peek = HelloPeek(self.conn, door.limits.peek_max_bytes, refuse_proxy=not trusted)
        try:
            hello = peek.attempt()
        except PeekFailed as exc:
            door.peek_failed(exc)
            self._end()
            return
        if hello is None:
            door.loop.create_task(self._wait_hello(peek, internal))
            return
        self._route(hello, internal)

    async def _wait_hello(self, peek: HelloPeek, internal: bool) -> None:
        door = self.door
        try:
            try:
                hello = await peek.wait(door.loop, self.deadline - door.loop.time())
            except PeekFailed as exc:
                door.peek_failed(exc)
                self._end()
                return
            self._route(hello, internal)
        except Exception as exc:
            self._error(exc)

    def _route(self, hello: ClientHello, internal: bool) -> None:
        """External: the L7 TLS layer (over the cap: answered 503 + close once it speaks HTTP). Internal, or
        any source on listen.internal_l4: the raw pipe (over the cap: refused now)."""
        door = self.door
        counters = door.counters
        counters.traffic(not internal)
        if not internal and not self.guaranteed_l4:
            if self.over_cap:
                counters.refused(refusals.CONN_CAP_L7)
            self._serve_external()
            return
        if self.over_cap:
            counters.refused(refusals.CONN_CAP_L4)
            refuse_hello(self.conn)
            self._end()
            return
        counters.inc("connections_internal_l4" if self.guaranteed_l4 else "connections_l4")
        self._serve_l4(hello.sni)

    def _serve_external(self) -> None:
        try:
            self.door.serve_external(self.conn, self.addr, self.hold, self.over_cap, self._handoff_failed)
        except Exception as exc:
            self._error(exc)
        else:
            self.handed_off = True  # the transport owns the socket, its connection_lost the hold

    def _handoff_failed(self, exc: BaseException) -> None:
        """The hand-off's last step failed: uvloop closed the transport, maybe before ``connection_made``, so
        no ``connection_lost`` may come to release the hold."""
        self.door.connection_error(exc)
        self.hold.release()

    # ---- L4 --------------------------------------------------------------------------------------------

    def _serve_l4(self, sni: str | None) -> None:
        """Pipe raw to the route's first answering instance (fail closed: no SNI or no route is refused,
        never a default mapping)."""
        door = self.door
        counters = door.counters
        if sni is None:
            counters.inc("no_sni")
            self._refuse()
            return
        table = door.backends.table()
        route = table.resolve(sni) if table is not None else None
        if route is None:
            counters.inc("unknown_sni")
            self._refuse()
            return
        counters.l4_connection(route.sidx)
        order = door.backends.candidates(route.service, table)
        if not order:
            counters.inc("no_backend")
            self._refuse()
            return
        self.sidx = route.sidx
        BackendConnect(door.poll, door.backends, order, door.cfg.upstream.connect_timeout_s, self._connected).start()

    def _refuse(self) -> None:
        refuse_hello(self.conn)
        self._end()

    def _connected(self, inst: Instance | None, backend: _socket.socket | None) -> None:
        """The backend answered (``backend``) or none did. An instance whose ``proxy_protocol`` is "v2" first
        gets a PROXY v2 header: the client (the peer, or the client a trusted balancer named) to the balancer's
        destination, else the address this connection reached."""
        if inst is None or backend is None:
            self._refuse()
            return
        door = self.door
        try:
            preface = b""
            if inst.proxy_protocol == "v2":
                try:
                    local = self.local or self.conn.getsockname()[:2]
                except OSError:  # the client is gone already
                    door.poll.drop(backend.fileno())  # the connect left it in the set
                    backend.close()
                    self._end()
                    return
                preface = proxy_protocol.encode_proxy(self.addr[:2], local)
            try:  # not contextlib.suppress: an interpreted context manager per connection
                self.conn.setsockopt(IPPROTO_TCP, TCP_NODELAY, 1)
            except OSError:
                pass  # a client already gone: the pipe finds out on its own
            pipe = SplicePipe(door.poll, self.conn, backend, door.pipes, self._pipe_closed)
        except Exception as exc:
            door.poll.drop(backend.fileno())
            backend.close()
            self._error(exc)
            return
        self.handed_off = True  # the pipe owns both sockets and the hold from here
        door.counters.add_gauge("l4_active", 1)
        try:
            pipe.start(preface)
        except Exception as exc:
            door.connection_error(exc)
            pipe.abort()
            return
        if preface and not pipe.closed:
            door.counters.inc("proxy_header_sent")  # the backend took it whole (else the pipe aborted)

    def _pipe_closed(self, pipe: SplicePipe) -> None:
        counters = self.door.counters
        counters.l4_closed(self.sidx, pipe.upstream.bytes, pipe.downstream.bytes)
        counters.add_gauge("l4_active", -1)
        self.hold.release()


def _cap_release(conncap: ConnectionCounts, ip: str) -> Callable[[], None]:
    return lambda: conncap.release(ip)

"""Listening sockets (every worker binds the same address itself with SO_REUSEPORT) and a worker's accept loop."""

from __future__ import annotations

import _socket
import asyncio
import errno
import os
import socket
import time
from collections.abc import Callable

try:
    import cython  # the compiled build accepts with one C call (Cython decides it at compile time)
except ImportError:  # a pure install without Cython: the stdlib's accept

    class cython:  # type: ignore[no-redef]
        compiled = False


from sentin8.config import parse_hostport
from sentin8.eventlog import event
from sentin8.holds import Hold, OpenConnections
from sentin8.shm.counters import WorkerCounters

ACCEPT_BATCH = 64  # connections taken per readable event: a burst drains without a loop turn for each
ACCEPT_PAUSE_S = 0.1  # how long a listener rests after running out of descriptors or memory
# what a listener's connections are for (Acceptor.watch)
HTTPS = 0  # the door: L4 or L7 by source and ClientHello
INTERNAL_L4 = 1  # the door, L4 whatever the source
HTTP = 2  # :80 (ACME HTTP-01)
_PAUSING = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class AcceptedSocket(socket.socket):
    """An accepted connection's socket. Its ``family`` and ``type`` are the C socket's ints, not the stdlib's
    properties, which convert each read to an enum in interpreted code: uvloop's ``connect_accepted_socket``
    reads them three times for every L7 connection (~13k instructions, callgrind). The values compare equal to
    the enums (``IntEnum``); everything else is ``socket.socket``'s, uvloop's detach on close included."""

    __slots__ = ()
    family = _socket.socket.family  # type: ignore[assignment]
    type = _socket.socket.type  # type: ignore[assignment]


class Listener(socket.socket):
    """A listening socket whose ``accept`` hands out the next connection already non-blocking, or None when the
    queue is empty. Otherwise a ``socket.socket``.

    Compiled, that is one ``accept4(SOCK_NONBLOCK)``: no ``ioctl(FIONBIO)`` after it, and the empty queue that
    ends every burst is a return value. The stdlib's accept raises and the caller catches ``BlockingIOError``
    there, and it reads the listener's family and type through properties that convert them to enums: ~10k of
    the ~137k instructions a new L4 connection cost the worker (``bench.profile.l4``, callgrind). Pure, the
    stdlib's ``_accept``, then ``setblocking(False)``. The peer address is the tuple the stdlib gives in both."""

    __slots__ = ("_kind",)

    def __init__(self, family: int = -1, type: int = -1, proto: int = -1, fileno: int | None = None) -> None:
        super().__init__(family, type, proto, fileno)  # socket.socket's signature: dup() builds one this way
        self._kind = (int(self.family), int(self.type), self.proto)

    def accept(self) -> tuple[AcceptedSocket, object] | None:  # type: ignore[override]
        family, kind, proto = self._kind
        if cython.compiled:
            taken = _accept4(self.fileno())
            if taken is None:
                return None
            fd, addr = taken
            try:  # SOCK_NONBLOCK in the type: the socket object starts non-blocking without a syscall of its own
                return AcceptedSocket(family, kind | c_SOCK_NONBLOCK, proto, fd), addr  # noqa: F821
            except BaseException:
                os.close(fd)  # no socket object took it: the connection is closed, not leaked
                raise
        try:
            fd, addr = self._accept()
        except (BlockingIOError, InterruptedError):
            return None
        try:
            conn = AcceptedSocket(family, kind, proto, fd)
        except BaseException:
            os.close(fd)
            raise
        conn.setblocking(False)  # a failure here closes the socket with the object
        return conn, addr


def _accept4(listener_fd: int) -> tuple[int, object] | None:
    """Compiled only: the next connection's descriptor and peer address, None when none is waiting, OSError
    (the subclass its errno names, as the stdlib raises) when accept fails. The C names are listener.pxd's."""
    peer = cython.declare(sockaddr_in6)  # noqa: F821 (the larger of the two families a listener has)
    any_peer = cython.cast(cython.pointer(sockaddr), cython.address(peer))  # noqa: F821
    size = cython.declare(socklen_t, cython.sizeof(peer))  # noqa: F821
    text = cython.declare(cython.char[48])  # INET6_ADDRSTRLEN (46), rounded up
    while True:
        fd = accept4(listener_fd, any_peer, cython.address(size), c_SOCK_NONBLOCK | c_SOCK_CLOEXEC)  # noqa: F821
        if fd >= 0:
            break
        err = c_errno  # noqa: F821
        if err == c_EINTR:  # noqa: F821
            continue
        if err == c_EAGAIN:  # noqa: F821
            return None
        raise OSError(err, os.strerror(err))
    if any_peer.sa_family == c_AF_INET:  # noqa: F821
        v4 = cython.cast(cython.pointer(sockaddr_in), any_peer)  # noqa: F821
        octets = cython.cast(cython.p_uchar, cython.address(v4.sin_addr))
        return fd, (_ipv4_text(octets), ntohs(v4.sin_port))  # noqa: F821
    if any_peer.sa_family == c_AF_INET6:  # noqa: F821
        inet_ntop(c_AF_INET6, cython.address(peer.sin6_addr), text, 48)  # noqa: F821
        host = cython.cast(cython.p_char, text).decode("ascii")
        if peer.sin6_scope_id:  # a link-local peer: the stdlib names its interface, as getnameinfo does
            host = f"{host}%{_interface_name(peer.sin6_scope_id)}"
        return fd, (host, ntohs(peer.sin6_port), ntohl(peer.sin6_flowinfo), peer.sin6_scope_id)  # noqa: F821
    os.close(fd)  # a family no listener here is bound to (bind_reuseport makes IPv4 and IPv6 ones only)
    raise OSError(errno.EAFNOSUPPORT, os.strerror(errno.EAFNOSUPPORT))


def _ipv4_text(octets) -> str:  # octets: a C pointer (listener.pxd)
    """Compiled only: dotted-quad text, as inet_ntop writes it, in a tenth of glibc's instructions (it formats
    through sprintf)."""
    text = cython.declare(cython.char[16])
    n = cython.declare(cython.int, 0)
    for i in range(4):
        octet = cython.declare(cython.int, octets[i])
        if octet >= 100:
            text[n] = 48 + octet // 100
            n += 1
        if octet >= 10:
            text[n] = 48 + octet // 10 % 10
            n += 1
        text[n] = 48 + octet % 10
        n += 1
        text[n] = 46  # "."
        n += 1
    return cython.cast(cython.p_char, text)[: n - 1].decode("ascii")


def _interface_name(index: int) -> str:
    try:
        return socket.if_indextoname(index)
    except OSError:
        return str(index)


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
        counters: WorkerCounters,
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
        for _ in range(ACCEPT_BATCH):
            try:
                taken = listener.accept()  # non-blocking; TCP_NODELAY: uvloop sets it, the L4 pipe its own
            except OSError as exc:
                self._failed(listener, kind, exc)
                return
            if taken is None:
                return
            conn, addr = taken
            self.counters.inc("accepted")  # a C call compiled (listener.pxd types the fields)
            hold = self.connections.hold()
            if kind == HTTP:
                self.serve_http(conn, addr, hold)
            else:
                self.enter(conn, addr, hold, guaranteed_l4=kind == INTERNAL_L4)

    def _failed(self, listener: Listener, kind: int, exc: OSError) -> None:
        self.counters.inc("accept_errors")
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

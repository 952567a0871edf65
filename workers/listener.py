"""Listening sockets: every worker binds the same address itself with SO_REUSEPORT."""

from __future__ import annotations

import socket

from sentin8.config import parse_hostport


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

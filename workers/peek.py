"""Peek the ClientHello without consuming it: MSG_PEEK until the whole handshake message is buffered.

Event-driven: the loop wakes us when the socket is readable, and SO_RCVLOWAT is raised to the bytes still
missing so a level-triggered loop does not spin on a half-arrived ClientHello. A deadline timer and a byte
cap bound what a slow or garbage peer can cost.
"""

from __future__ import annotations

import asyncio
import select
import socket

from sentin8 import clienthello
from sentin8.clienthello import BadRecordVersion, ClientHello, ClientHelloError, Incomplete, alert_record


class PeekFailed(Exception):
    def __init__(self, reason: str) -> None:  # reason is a counter name
        super().__init__(reason)
        self.reason = reason


def _refuse(sock: socket.socket, peeked: int, alert: int | None) -> None:
    """Answer bytes that are not a ClientHello the way a reference OpenSSL server does: consume what was
    read (so the close is a FIN, not a reset for unread data), send its fatal alert if it sends one. The
    caller closes."""
    try:
        sock.recv(peeked)
        if alert is not None:
            sock.send(alert_record(alert))  # 7 bytes into an empty send buffer: never partial
    except OSError:
        pass  # the peer is gone already: nothing to tell it


def _peer_closed(fd: int) -> bool:
    p = select.poll()
    p.register(fd, select.POLLRDHUP | select.POLLHUP | select.POLLERR)
    return bool(p.poll(0))


class _Peek:
    """One connection's peek: ``attempt`` runs whenever the socket is readable (first at once, then from the
    loop), and keeps what the next attempt needs: the bytes seen last time and the SO_RCVLOWAT set."""

    __slots__ = ("fut", "lowat", "max_bytes", "seen", "sock")

    def __init__(self, sock: socket.socket, max_bytes: int) -> None:
        self.sock = sock
        self.max_bytes = max_bytes
        self.seen = 0
        self.lowat = 1
        self.fut: asyncio.Future[ClientHello] | None = None

    def attempt(self) -> ClientHello | None:
        """The ClientHello once it is all in the socket, None while more is expected; ``PeekFailed`` else."""
        sock = self.sock
        try:
            data = sock.recv(self.max_bytes, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            raise PeekFailed("peek_eof") from None
        if not data:
            raise PeekFailed("peek_eof")
        try:
            result = clienthello.parse(data)
        except ClientHelloError as exc:
            _refuse(sock, len(data), exc.alert)
            raise PeekFailed("peek_bad_version" if isinstance(exc, BadRecordVersion) else "peek_garbage") from None
        if not isinstance(result, Incomplete):
            return result
        if len(data) >= self.max_bytes:
            raise PeekFailed("peek_oversize")
        if len(data) == self.seen and _peer_closed(sock.fileno()):
            raise PeekFailed("peek_eof")  # FIN with a partial hello: readable forever, never complete
        self.seen = len(data)
        want = min(len(data) + result.missing, self.max_bytes)
        if want != self.lowat:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, want)
            self.lowat = want
        return None

    async def wait(self, loop: asyncio.AbstractEventLoop, timeout: float) -> ClientHello:
        """Attempt on every readable event until the hello is complete, it fails, or ``timeout`` passes."""
        fd = self.sock.fileno()
        self.fut = loop.create_future()
        loop.add_reader(fd, self._on_readable)
        timer = loop.call_later(timeout, self._fail, PeekFailed("peek_timeout"))
        try:
            return await self.fut
        finally:
            timer.cancel()
            loop.remove_reader(fd)
            if self.lowat != 1:
                try:
                    self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
                except OSError:
                    pass

    def _on_readable(self) -> None:
        fut = self.fut
        if fut is None or fut.done():
            return
        try:
            hello = self.attempt()
        except PeekFailed as exc:
            fut.set_exception(exc)
            return
        if hello is not None:
            fut.set_result(hello)

    def _fail(self, exc: PeekFailed) -> None:
        if self.fut is not None and not self.fut.done():
            self.fut.set_exception(exc)


async def peek_client_hello(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, max_bytes: int, timeout: float
) -> ClientHello:
    peek = _Peek(sock, max_bytes)
    # With TCP_DEFER_ACCEPT the hello is nearly always there at accept: one recv and one parse, and no
    # future, reader or timer (this runs once per connection, before every full handshake).
    hello = peek.attempt()
    if hello is not None:
        return hello
    return await peek.wait(loop, timeout)

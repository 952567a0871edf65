"""Peek the ClientHello without consuming it: MSG_PEEK until the whole handshake message is buffered.

Event-driven: the loop wakes us when the socket is readable, and SO_RCVLOWAT is raised to the bytes still
missing so a level-triggered loop does not spin on a half-arrived ClientHello. A deadline timer and a byte
cap bound what a slow or garbage peer can cost. Whatever ends the peek early (bytes that are no ClientHello,
a hello over the cap, the peer's FIN, the deadline) is answered as a reference OpenSSL server answers it:
the alert ``sentin8.clienthello`` names, after reading what the peer sent, so the caller's close is a FIN.
"""

from __future__ import annotations

import asyncio
import select
import socket

from sentin8 import clienthello
from sentin8.clienthello import BadRecordVersion, ClientHello, ClientHelloError, HelloTooLarge, Incomplete


class PeekFailed(Exception):
    def __init__(self, reason: str) -> None:  # reason is a counter name
        super().__init__(reason)
        self.reason = reason


_DRAIN_MAX = 256 * 1024  # a peer still sending after this much is flooding: its close may be a reset


def _refuse(sock: socket.socket, alert: bytes) -> None:
    """End a connection whose ClientHello is refused (or never came) the way the reference OpenSSL server
    does: it has read everything the peer sent, so read what is in the socket (a close with unread bytes is
    a reset, not a FIN), then send its fatal alert when it sends one. The caller closes."""
    drained = 0
    try:
        while drained < _DRAIN_MAX:
            got = len(sock.recv(65536))
            if not got:
                break
            drained += got
    except (BlockingIOError, InterruptedError):
        pass
    except OSError:
        return  # reset by the peer: nothing to tell it
    if alert:
        try:
            sock.send(alert)  # 7 bytes into an empty send buffer: never partial
        except OSError:
            pass  # the peer is gone already


def _failed(exc: ClientHelloError) -> PeekFailed:
    if isinstance(exc, BadRecordVersion):
        return PeekFailed("peek_bad_version")
    if isinstance(exc, HelloTooLarge):
        return PeekFailed("peek_oversize")
    return PeekFailed("peek_garbage")


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
        """The ClientHello once it is all in the socket, None while more is expected; ``PeekFailed`` else
        (the connection already answered as the reference would: the caller only closes it)."""
        sock = self.sock
        try:
            data = sock.recv(self.max_bytes, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            raise PeekFailed("peek_eof") from None  # reset by the peer: nothing to answer
        try:
            result = clienthello.parse(data, self.max_bytes)
        except ClientHelloError as exc:
            _refuse(sock, exc.alert_bytes())
            raise _failed(exc) from None
        if not isinstance(result, Incomplete):
            return result
        if not data or (len(data) == self.seen and _peer_closed(sock.fileno())):
            # FIN before the hello was complete (a partial hello is readable forever, never complete)
            _refuse(sock, clienthello.truncated().alert_bytes())
            raise PeekFailed("peek_eof")
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
        timer = loop.call_later(timeout, self._timed_out)
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

    def _timed_out(self) -> None:
        if self.fut is not None and not self.fut.done():
            _refuse(self.sock, b"")  # no alert: the reference has no deadline to answer for; a FIN, not a reset
            self.fut.set_exception(PeekFailed("peek_timeout"))


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

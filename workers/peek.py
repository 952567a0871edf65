"""Peek the ClientHello without consuming it: MSG_PEEK until the whole handshake message is buffered.

Event-driven: the loop wakes us when the socket is readable, and SO_RCVLOWAT is raised to the bytes still
missing so a level-triggered loop does not spin on a half-arrived ClientHello. A deadline timer and a byte
cap bound what a slow or garbage peer can cost. Whatever ends the peek early (bytes that are no ClientHello,
a hello over the cap, the peer's FIN, the deadline) is answered as a reference OpenSSL server answers it:
the alert ``sentin8.clienthello`` names, after reading what the peer sent, so the caller's close is a FIN.

From a balancer of ``listen.proxy_protocol_from``, ``read_proxy_header`` runs first, the same way (peek until
the header is whole, then consume exactly its bytes, so the TLS layer still reads the ClientHello as sent);
both share one deadline, ``limits.peek_timeout_s``. Any other peer whose first bytes are a PROXY signature is
refused as it arrives. Neither answers a PROXY refusal: it is no TLS peer's mistake, and a balancer only needs
the close.
"""

from __future__ import annotations

import asyncio
import select
import socket
from typing import Generic, TypeVar

from sentin8 import clienthello, proxy_protocol, refusals
from sentin8.clienthello import BadRecordVersion, ClientHello, ClientHelloError, HelloTooLarge, Incomplete
from sentin8.clienthello import parse as parse_client_hello
from sentin8.proxy_protocol import ProxyHeader, ProxyProtocolError
from sentin8.refusals import Refusal

_T = TypeVar("_T")


class PeekFailed(Exception):
    """The peek (or the PROXY header read before it) ended the connection: ``reason`` is the counter to add,
    or ``refusal`` the refusal to count (``sentin8.refusals``) when it is one."""

    def __init__(self, reason: str, refusal: Refusal | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.refusal = refusal


def _refused(refusal: Refusal) -> PeekFailed:
    return PeekFailed(refusal.name or "", refusal)


_DRAIN_MAX = 256 * 1024  # read before the alert; the lingering close (socket_linger.py) reads the rest


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


def refuse_hello(sock: socket.socket) -> None:
    """Refuse a connection whose ClientHello was peeked whole but will not be served (L4: no SNI, a name with
    no route, no backend that answers, a cap): read the hello, so the caller's close is a FIN. The design's
    "internal: fail closed, close" is a close, not an alert (the backend's TLS is the one to speak TLS); and a
    close with the hello unread would be a reset, which a client cannot tell from a lost connection."""
    _refuse(sock, b"")


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


class _Wait(Generic[_T]):
    """Wait for something at the start of a socket's bytes: ``attempt`` runs whenever the socket is readable
    (first at once, then from the loop) and keeps what the next attempt needs: the bytes seen last time and
    the SO_RCVLOWAT set. One timer bounds the whole wait; nothing blocks and nothing polls."""

    __slots__ = ("fut", "lowat", "max_bytes", "seen", "sock")

    def __init__(self, sock: socket.socket, max_bytes: int) -> None:
        self.sock = sock
        self.max_bytes = max_bytes
        self.seen = 0
        self.lowat = 1
        self.fut: asyncio.Future[_T] | None = None

    def attempt(self) -> _T | None:  # pragma: no cover - each kind has its own
        raise NotImplementedError

    def expired(self) -> PeekFailed:  # pragma: no cover
        raise NotImplementedError

    def closed_early(self, data: bytes) -> bool:
        """The peer's FIN came before what we wait for was whole (a partial one is readable forever)."""
        return not data or (len(data) == self.seen and _peer_closed(self.sock.fileno()))

    def want(self, have: int, missing: int) -> None:
        """Wake up only once ``missing`` more bytes are in (at most the cap)."""
        self.seen = have
        want = min(have + missing, self.max_bytes)
        if want != self.lowat:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, want)
            self.lowat = want

    async def wait(self, loop: asyncio.AbstractEventLoop, timeout: float) -> _T:
        """Attempt on every readable event until it is complete, it fails, or ``timeout`` passes."""
        fd = self.sock.fileno()
        self.fut = loop.create_future()
        loop.add_reader(fd, self._on_readable)
        timer = loop.call_later(max(timeout, 0.0), self._timed_out)
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
            got = self.attempt()
        except PeekFailed as exc:
            fut.set_exception(exc)
            return
        if got is not None:
            fut.set_result(got)

    def _timed_out(self) -> None:
        if self.fut is not None and not self.fut.done():
            _refuse(self.sock, b"")  # no alert: the reference has no deadline to answer for; a FIN, not a reset
            self.fut.set_exception(self.expired())


class HelloPeek(_Wait[ClientHello]):
    """One connection's ClientHello peek. ``refuse_proxy``: a PROXY signature where the hello belongs is a
    PROXY header from a source that may not send one (refused, counted as such, never a garbage hello)."""

    __slots__ = ("refuse_proxy",)

    def __init__(self, sock: socket.socket, max_bytes: int, refuse_proxy: bool = True) -> None:
        super().__init__(sock, max_bytes)
        self.refuse_proxy = refuse_proxy

    def expired(self) -> PeekFailed:
        return PeekFailed("peek_timeout")

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
            result = parse_client_hello(data, self.max_bytes)
        except ClientHelloError as exc:
            if self.refuse_proxy and data[:1] in (b"\r", b"P") and self._proxy_signature(data):
                return None  # the start of a signature: wait for the rest of it
            _refuse(sock, exc.alert_bytes())
            raise _failed(exc) from None
        if not isinstance(result, Incomplete):
            return result
        if self.closed_early(data):
            _refuse(sock, clienthello.truncated().alert_bytes())
            raise PeekFailed("peek_eof")
        self.want(len(data), result.missing)
        return None

    def _proxy_signature(self, data: bytes) -> bool:
        """Refuse a whole PROXY signature; True while ``data`` may still become one."""
        if proxy_protocol.has_signature(data):
            _refuse(self.sock, b"")
            raise _refused(refusals.PROXY_UNTRUSTED)
        if not proxy_protocol.signature_prefix(data) or self.closed_early(data):
            return False  # garbage after all (or a FIN mid-way): refused as a hello would be
        self.want(len(data), len(proxy_protocol.SIGNATURE) - len(data))
        return True


class _ProxyRead(_Wait[ProxyHeader]):
    """A trusted balancer's PROXY v2 header: peeked until whole, then exactly its bytes consumed."""

    __slots__ = ()

    def expired(self) -> PeekFailed:
        return _refused(refusals.PROXY_TIMEOUT)

    def attempt(self) -> ProxyHeader | None:
        sock = self.sock
        try:
            data = sock.recv(self.max_bytes, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            raise _refused(refusals.PROXY_TRUNCATED) from None  # reset by the peer
        try:
            result = proxy_protocol.parse(data, self.max_bytes)
        except ProxyProtocolError as exc:
            _refuse(sock, b"")
            raise _refused(refusals.for_proxy_error(exc.reason)) from None
        if isinstance(result, ProxyHeader):
            # the header's bytes are in the socket (just peeked): this takes them, and only them
            if len(sock.recv(result.length)) != result.length:
                raise _refused(refusals.PROXY_TRUNCATED)  # pragma: no cover - peeked bytes do not vanish
            return result
        if self.closed_early(data):
            _refuse(sock, b"")
            raise _refused(refusals.PROXY_TRUNCATED)
        self.want(len(data), result.missing)
        return None


async def read_proxy_header(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, deadline: float, max_bytes: int = proxy_protocol.MAX_BYTES
) -> ProxyHeader:
    """Consume the PROXY v2 header a trusted balancer starts its connection with, by ``deadline`` (loop time);
    ``PeekFailed`` (with its refusal) when it is missing, malformed, oversized, truncated or late."""
    read = _ProxyRead(sock, max_bytes)
    header = read.attempt()  # with TCP_DEFER_ACCEPT it is nearly always there at accept
    if header is not None:
        return header
    return await read.wait(loop, deadline - loop.time())


async def peek_client_hello(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, max_bytes: int, timeout: float, refuse_proxy: bool = True
) -> ClientHello:
    """``refuse_proxy=False`` after a PROXY header was consumed: a second one is only garbage."""
    peek = HelloPeek(sock, max_bytes, refuse_proxy)
    # With TCP_DEFER_ACCEPT the hello is nearly always there at accept: one recv and one parse, and no
    # future, reader or timer (this runs once per connection, before every full handshake).
    hello = peek.attempt()
    if hello is not None:
        return hello
    return await peek.wait(loop, timeout)

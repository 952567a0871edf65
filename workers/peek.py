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


async def peek_client_hello(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, max_bytes: int, timeout: float
) -> ClientHello:
    fd = sock.fileno()
    fut: asyncio.Future[ClientHello] = loop.create_future()
    state = {"seen": 0, "lowat": 1}

    def fail(reason: str) -> None:
        if not fut.done():
            fut.set_exception(PeekFailed(reason))

    def on_readable() -> None:
        try:
            data = sock.recv(max_bytes, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            fail("peek_eof")
            return
        if not data:
            fail("peek_eof")
            return
        try:
            result = clienthello.parse(data)
        except ClientHelloError as exc:
            _refuse(sock, len(data), exc.alert)
            fail("peek_bad_version" if isinstance(exc, BadRecordVersion) else "peek_garbage")
            return
        if isinstance(result, Incomplete):
            if len(data) >= max_bytes:
                fail("peek_oversize")
                return
            if len(data) == state["seen"] and _peer_closed(fd):
                fail("peek_eof")  # FIN with a partial hello: readable forever, never complete
                return
            state["seen"] = len(data)
            want = min(len(data) + result.missing, max_bytes)
            if want != state["lowat"]:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, want)
                state["lowat"] = want
            return
        if not fut.done():
            fut.set_result(result)

    # With TCP_DEFER_ACCEPT the hello is usually there at accept: try once before involving the loop.
    on_readable()
    if fut.done():
        if state["lowat"] != 1:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
        return fut.result()
    loop.add_reader(fd, on_readable)
    timer = loop.call_later(timeout, fail, "peek_timeout")
    try:
        return await fut
    finally:
        timer.cancel()
        loop.remove_reader(fd)
        if state["lowat"] != 1:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
            except OSError:
                pass

"""The lingering close of a raw accepted socket the worker will not serve (a refused or failed ClientHello
peek, an L4 refusal): the same bounds as the client shells' (``l7/linger.py``), for a socket no transport
owns.

The peek path reads what the peer has sent before it answers (``peek._refuse``), but a peer may still be
sending: the rest of a hello over ``limits.peek_max_bytes`` arrives after that read. Closed at once, the
socket answers those bytes with a TCP reset, which may destroy the alert (and the FIN) before the client has
read them, and a client cannot tell a reset from a lost connection. So: FIN first (``shutdown(SHUT_WR)``),
then read and discard until the peer's FIN, ``LINGER_S`` or ``LINGER_BYTES``, then close. Event-driven (a
reader callback and one timer), never a poll. At most ``MAX_LINGERING`` sockets linger per worker; past that
a refused socket is closed at once (a flood of bad hellos must not hold descriptors).
"""

from __future__ import annotations

import asyncio
import socket

from .l7.linger import LINGER_BYTES, LINGER_S

MAX_LINGERING = 1024


class SocketLinger:
    """The worker's lingering refused sockets."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._open: dict[int, tuple[socket.socket, asyncio.TimerHandle]] = {}

    @property
    def lingering(self) -> int:
        return len(self._open)

    def close(self, sock: socket.socket) -> None:
        """Send our FIN now, close once the peer is done (or the bounds pass)."""
        fd = sock.fileno()
        if fd < 0 or len(self._open) >= MAX_LINGERING or fd in self._open:
            sock.close()
            return
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:  # reset or never connected: nothing to wait for
            sock.close()
            return
        read = [0]

        def readable() -> None:
            try:
                while True:
                    got = len(sock.recv(65536))
                    if not got:
                        break  # the peer's FIN: done
                    read[0] += got
                    if read[0] >= LINGER_BYTES:
                        break
            except (BlockingIOError, InterruptedError):
                return  # more to come: wait for it
            except OSError:
                pass
            self._done(fd)

        self._loop.add_reader(fd, readable)
        self._open[fd] = (sock, self._loop.call_later(LINGER_S, self._done, fd))

    def _done(self, fd: int) -> None:
        entry = self._open.pop(fd, None)
        if entry is None:
            return
        sock, timer = entry
        timer.cancel()
        self._loop.remove_reader(fd)
        sock.close()

    def close_all(self) -> None:
        for fd in list(self._open):
            self._done(fd)

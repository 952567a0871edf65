"""Whether the peer of an idle connection has spoken since the loop last read it.

The loop learns of a peer's bytes, FIN or reset only when it polls, and uvloop (libuv) runs the timers whose
time has come before it polls: a timer that decides "this idle connection can be closed" (a pooled backend
connection taken for a request, a draining client connection at the end of its grace) may run while the
peer's request or close already sits in the kernel. One non-blocking ``MSG_PEEK`` at the socket settles it.
"""

from __future__ import annotations

import asyncio
import socket


def peer_spoke(transport: asyncio.BaseTransport) -> bool:
    """True when the socket under ``transport`` (the raw TCP one under a TLS layer) holds unread bytes, the
    peer's FIN or a reset; False when nothing is there (or no socket can be seen)."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    try:
        fd = sock.fileno()
    except (OSError, ValueError):
        return True  # already closed under us
    if fd < 0:
        return True
    # uvloop's transport socket refuses recv(): a socket object over the same descriptor, detached after
    probe = socket.socket(sock.family, sock.type, 0, fd)
    try:
        probe.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except (BlockingIOError, InterruptedError):
        return False  # nothing there
    except OSError:
        return True  # reset
    finally:
        probe.detach()
    return True  # b"" (the FIN) or bytes

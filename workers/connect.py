"""A non-blocking TCP connect to a registry host, which may be a name: the loop never waits on DNS.

``socket.connect_ex((name, port))`` resolves the name with a blocking ``getaddrinfo`` on the calling thread,
which for a worker means every connection it holds stalls for as long as DNS takes. Here an IP literal (the
common case, recognised once per host string) is connected directly; a name is resolved with
``loop.getaddrinfo`` (uvloop runs it in libuv's thread pool) and its addresses are tried in order, all within
one deadline.

The wait for the connect is a ONESHOT watch in the worker's ``PollSet``, and a connected socket stays in the
set, disarmed, so the pipe that takes it over re-arms it with one ``epoll_ctl`` MOD: whoever closes it
instead drops it from the set first.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import ipaddress
import os
import socket

from sentin8.backends import Backends
from sentin8.routing import Instance

from .poll_set import ONESHOT, OUT, PollSet


@functools.lru_cache(maxsize=4096)
def literal_family(host: str) -> int | None:
    """AF_INET / AF_INET6 for an IP literal, None for a name (which needs a lookup)."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    return socket.AF_INET6 if ip.version == 6 else socket.AF_INET


async def connect_first(
    poll: PollSet, backends: Backends, order: list[Instance], timeout: float
) -> tuple[Instance, socket.socket] | None:
    """The first instance of ``order`` that accepts a TCP connection, with its socket; each one that does
    not is reported to ``backends`` (suspect for every worker, counted, a failure for its breaker), the one
    that does as a success. None when none answers."""
    for inst in order:
        try:
            sock = await connect_tcp(poll, inst.host, inst.port, timeout)
        except OSError:  # TimeoutError included
            backends.failed(inst)
            continue
        backends.result(inst.id, True)
        return inst, sock
    return None


async def connect_tcp(poll: PollSet, host: str, port: int, timeout: float) -> socket.socket:
    """A connected non-blocking socket with TCP_NODELAY, still in ``poll`` (disarmed); raises OSError or
    TimeoutError (after ``timeout`` seconds in all, the lookup included)."""
    loop = poll.loop
    deadline = loop.time() + timeout
    family = literal_family(host)
    if family is not None:
        return await _connect_addr(poll, family, (host, port), deadline)
    async with asyncio.timeout_at(deadline):
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    if not infos:
        raise OSError(errno.EHOSTUNREACH, f"{host}: no address")
    last: OSError | None = None
    for fam, _type, _proto, _name, addr in infos:
        try:
            return await _connect_addr(poll, fam, addr, deadline)
        except OSError as exc:  # the next address may answer (localhost: ::1 refused, 127.0.0.1 listening)
            last = exc
    assert last is not None
    raise last


async def _connect_addr(poll: PollSet, family: int, addr: tuple, deadline: float) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
    try:
        await _connect(poll, sock, addr, deadline)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except BaseException:
        poll.drop(sock.fileno())
        sock.close()
        raise
    return sock


async def _connect(poll: PollSet, sock: socket.socket, addr: tuple, deadline: float) -> None:
    """A non-blocking connect to a resolved address with a deadline timer (no extra Task, unlike
    asyncio.wait_for)."""
    loop = poll.loop
    err = sock.connect_ex(addr)
    if err == 0:
        return
    if err not in (errno.EINPROGRESS, errno.EAGAIN):
        raise OSError(err, os.strerror(err))
    fd = sock.fileno()
    done: asyncio.Future[None] = loop.create_future()

    def writable(events: int) -> None:
        if not done.done():
            done.set_result(None)

    def expired() -> None:
        if not done.done():
            done.set_exception(TimeoutError())

    poll.watch(fd, OUT | ONESHOT, writable)
    timer = loop.call_at(deadline, expired)
    try:
        await done
    finally:
        timer.cancel()
    err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if err:
        raise OSError(err, os.strerror(err))
